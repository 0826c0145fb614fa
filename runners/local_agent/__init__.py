"""The built-in `local-agent` runner: a tool-using agent loop that talks to LLM providers over httpx.

Entry point for the plugin system is `agenthost.runners.local_agent.plugin`; the runner class is
`agenthost.runners.local_agent.runner.LocalAgentRunner`.
"""
