"""The operator's side: the agenthost command, its typed client, terminal rendering, the demo."""
