"""The SLA planner (``sluice planner``): each interval it reads the load the platform publishes, predicts
the next interval's, turns it into replicas per pool through a mode (throughput, latency, load, sla) and
applies them through a connector (local processes, Kubernetes, or decisions written for an external
orchestrator). docs/planner.md describes it."""
