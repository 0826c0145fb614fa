"""The surfaces the host serves: the admin API, the run API (AgentRunAPIProxy), the HTTP gateway and console."""
