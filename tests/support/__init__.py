"""Test helpers: a private Redis server, stack launchers, factories."""
