"""The ``sluice`` command line."""
