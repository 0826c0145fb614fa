"""Runner workers: the host's listener and sessions (hub.py), the worker process's side (agent.py)."""
