"""The built-in external-harness runners: real Claude Code and Codex CLIs driven headless for a bot.

See docs/runners/external-harness.md for the projection contract (files written into the working directory).
"""
