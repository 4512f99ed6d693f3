"""The engine conformance suite: every engine passes the same tests (see conftest.py)."""
