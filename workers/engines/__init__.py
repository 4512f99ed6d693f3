"""Engines: one interface (base.py), several implementations, chosen by name in factory.py."""
