"""Where the planner's decisions take effect: :mod:`planner.connectors.base` is the contract."""
