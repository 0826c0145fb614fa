"""The built-in external-harness runners: real Claude Code and Codex CLIs driven headless for a bot.

See README.md in this directory for the projection contract (files written into the working directory).
"""
