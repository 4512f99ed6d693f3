"""What every Sluice process shares: settings, Redis key patterns, inter-process messages, errors."""
