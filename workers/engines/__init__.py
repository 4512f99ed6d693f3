"""Engines: one interface (base.py), several implementations, each a package that declares itself in its
``spec`` module (spec.py says what a declaration holds); registry.py lists them, factory.py builds the
configured one from its spec."""
