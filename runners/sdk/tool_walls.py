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
from agenthost.runners.sdk.workspace_budget import DEFAULT_MIB

# RLIMIT_FSIZE of everything a runner starts unless it says otherwise: the default workspace budget, since no
# single file may be larger than the whole workspace (runners.sdk.workspace_budget keeps the total).
FILE_SIZE_MAX_BYTES = DEFAULT_MIB * 1024 * 1024


def command(argv: list[str], *, max_file_bytes: int = FILE_SIZE_MAX_BYTES) -> list[str]:
    """`argv` behind a /bin/sh prologue that caps the size of any file it writes (RLIMIT_FSIZE: a write past it
    fails with EFBIG and SIGXFSZ), moves itself into the tools sub-group and then execs it, so every process of
    the command starts inside (or none does: it exits 125 saying why). Called where runners spawn:
    shell.run_command, the local agent's MCP servers, the harness CLI (external_harness.process)."""
    files = [f for f in os.environ.get(TOOLS_CGROUP_ENV, "").split(":") if f]
    # POSIX sh counts ulimit -f in 512-byte blocks (dash, and bash started as sh).
    fsize = f"ulimit -f {max(1, max_file_bytes // 512)} || exit 125"
    return ["/bin/sh", "-c", "\n".join([fsize, *join_cgroups(files), 'exec "$@"']), "agenthost-tools", *argv]
