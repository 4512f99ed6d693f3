"""The ``sluice`` command line (cli.py, accounts_cli.py), the ready line of ``sluice serve``
(ready.py), and the local stack launcher that tests and benchmarks use (devstack.py)."""
