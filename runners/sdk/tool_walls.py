"""The commands a runner starts for a model (shell tool commands, MCP servers, harness CLIs) run in the tools
sub-group of the runner's cgroup, with their own share of its memory and process caps: a fork bomb or a memory
hog in one of them stops at that cap, and the runner, which serves other conversations too, keeps the rest.

The host names the sub-group's cgroup.procs files in wire.TOOLS_CGROUP_ENV (bound into the runner's sandbox at the
same paths). Without it (no cgroups on this host, or a runner started by hand) commands start as they are.
"""

from __future__ import annotations

import os

from agenthost.plugins.sandbox import join_cgroups
from agenthost.protos.wire import TOOLS_CGROUP_ENV


def command(argv: list[str]) -> list[str]:
    """`argv` behind a /bin/sh prologue that moves itself into the tools sub-group and then execs it, so every
    process of the command starts inside (or none does: it exits 125 saying why). Called where runners spawn:
    shell.run_command, the local agent's MCP servers, the harness CLI (external_harness.process)."""
    files = [f for f in os.environ.get(TOOLS_CGROUP_ENV, "").split(":") if f]
    if not files:
        return argv
    return ["/bin/sh", "-c", "\n".join([*join_cgroups(files), 'exec "$@"']), "agenthost-tools", *argv]
