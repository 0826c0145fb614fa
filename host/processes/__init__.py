"""The processes the host runs: plugin supervision, their resource walls, channel adapters."""
