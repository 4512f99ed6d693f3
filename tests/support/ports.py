"""Free local ports for the servers a test starts."""

from bench.devstack import free_port

__all__ = ["free_port"]
