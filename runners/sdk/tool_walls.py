"""The commands a runner starts for a model (shell tool commands, MCP servers, harness CLIs) run in the tools
sub-group of the runner's cgroup, with their own share of its memory and process caps: a fork bomb or a memory
hog in one of them stops at that cap, and the runner, which serves other conversations too, keeps the rest.

The host names the sub-group's cgroup.procs files in wire.TOOLS_CGROUP_ENV (bound into the runner's sandbox at the
same paths). Without it (no cgroups on this host, or a runner started by hand) commands start as they are.
"""

from __future__ import annotations

import os
import shlex

from agenthost.protos.wire import TOOLS_CGROUP_ENV

EXIT_NOT_WALLED = 125  # what the command exits with when it could not join: it does not run outside the walls


def command(argv: list[str]) -> list[str]:
    """`argv` behind a /bin/sh prologue that moves itself into the tools sub-group and then execs it, so every
    process of the command starts inside. Called where runners spawn: shell.run_command, the local agent's MCP
    servers, the harness CLI (external_harness.process)."""
    files = [f for f in os.environ.get(TOOLS_CGROUP_ENV, "").split(":") if f]
    if not files:
        return argv
    lines = []
    for path in files:
        failed = shlex.quote(f"agenthost: cannot join the tool commands' cgroup ({path})")
        lines.append(f"echo 0 > {shlex.quote(path)} || {{ echo {failed} >&2; exit {EXIT_NOT_WALLED}; }}")
    lines.append('exec "$@"')
    return ["/bin/sh", "-c", "\n".join(lines), "agenthost-tools", *argv]
