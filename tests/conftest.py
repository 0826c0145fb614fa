from __future__ import annotations

# The `agenthost_harness` fixture. agenthost registers no auto-loaded pytest plugin: a runner author's suite opts in
# with this same line, so projects that merely have agenthost installed see nothing of it.
pytest_plugins = ["agenthost.runners.sdk.testing"]
