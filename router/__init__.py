"""Routing: block hashing, the worker registry and leases, the Redis prefix index, scoring policies."""
