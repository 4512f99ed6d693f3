"""HTTP routes, one module per resource; router.py wires them."""
