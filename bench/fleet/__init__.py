"""Simulated worker fleets: many mocker workers per process against one Redis (bench.fleet.sim), their
request stream (bench.fleet.workload), the command line that runs one fleet process (``python -m
bench.fleet``) and the parent's side of it (bench.fleet.processes)."""
