"""Resource walls: a plugin that forks or allocates without bound meets its cgroup's caps; the host, other bots and
the plugin's next runs go on. Real host, real plugin processes (tests/fixtures/faulty-plugin's `forks`, `hog`,
`limits` commands), caps lowered through agenthost.host.limits.

The cgroup tests need a host that may manage cgroups (root, or a delegated cgroup); CI runs as root, where
`test_walls_are_on_as_root` makes sure they are not silently skipped.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from robustness.pids import alive

from agenthost.host import limits
from agenthost.host.api.client import HostClient
from agenthost.host.processes.resource_walls import ResourceWalls
from agenthost.host.processes.supervisor import SupervisorPolicy
from agenthost.host.server import Host
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.local_agent.testing import FakeProviderServer, openai_text, openai_tool_calls

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]
FAULTY = str(Path(__file__).parents[1] / "fixtures" / "faulty-plugin")
POLICY = SupervisorPolicy(
    start_timeout=20, health_timeout=5, shutdown_grace=0.5, term_grace=0.5, backoff_base=0.05, backoff_max=0.2
)
PLUGIN = "agenthost-faulty"


def _cgroups_here() -> str | None:
    """None when this process may manage cgroups, else why not."""
    walls = ResourceWalls.setup()
    try:
        return None if walls.on else walls.reason
    finally:
        walls.close()


_NO_CGROUPS = _cgroups_here()
needs_cgroups = pytest.mark.skipif(
    _NO_CGROUPS is not None and os.geteuid() != 0,
    reason=f"this user may not manage cgroups ({_NO_CGROUPS}); run as root or in a delegated cgroup",
)


@pytest.fixture
async def host(tmp_path, monkeypatch, reused_plugin_installs):
    monkeypatch.delenv("AGENTHOST_TEST_FAULT", raising=False)
    hosts: list[tuple[Host, HostClient]] = []

    async def make(*, builtin: bool = False, timeout: float = 0) -> tuple[Host, HostClient]:
        h = Host(tmp_path / f"data{len(hosts)}", policy=POLICY, builtin_plugins=builtin)
        await h.start()
        client = HostClient(h.admin_address, token=h.admin_token)
        hosts.append((h, client))
        await h.install_plugin(FAULTY, offline=True)
        await client.call("CreateBot", hpb.CreateBotRequest(name="b"))
        await client.bind("b", "agenthost-faulty/faulty", timeout_seconds=timeout)
        return h, client

    yield make
    for h, client in hosts:
        await client.close()
        await h.stop()


def _group_dirs(h: Host) -> list[Path]:
    return [d for d in h.resource_walls.host_dirs.values()]


def _plugin_group(h: Host):
    pp = h.supervisor.processes[PLUGIN]
    return h.resource_walls.groups[pp.proc.pid]


@needs_cgroups
async def test_walls_are_on_as_root(host):
    h, client = await host()
    assert h.resource_walls.on, h.resource_walls.reason
    status = await client.call("GetStatus", hpb.GetStatusRequest())
    rl = status.resource_limits
    assert rl.on and rl.mechanism.startswith("cgroup v")
    assert rl.memory_max_bytes == limits.PLUGIN_MEMORY_MAX_BYTES and rl.pids_max == limits.PLUGIN_PIDS_MAX
    # The plugin process (bwrap) is in its own group from before its first instruction, and so is the runner it
    # started: every process of the group is a descendant of it.
    group = _plugin_group(h)
    pid = h.supervisor.processes[PLUGIN].proc.pid
    assert pid in group.pids() and len(group.pids()) >= 2  # bwrap and, below it, the runner
    assert (await client.send("b", "limits")).run.status == "completed"


@needs_cgroups
async def test_a_fork_bomb_stops_at_the_pids_cap_and_nothing_else_notices(host, monkeypatch):
    monkeypatch.setattr(limits, "PLUGIN_PIDS_MAX", 64)
    # The run's deadline, as a user sets it on a binding: a runner whose gRPC runtime wedged at its cap (short of
    # threads) holds its run until then. Alone it aborts within ~11 s; at load 20 one stayed wedged past 150 s.
    h, client = await host(builtin=True, timeout=45)
    await client.call("CreateBot", hpb.CreateBotRequest(name="other"))
    await client.bind("other", "agenthost/local-agent", {"model": "demo/offline"})
    group = _plugin_group(h)
    assert all("pids" not in k or (d / "pids.max").read_text().strip() == "64" for k, d in group.dirs.items())

    dirs = list(group.dirs.values())
    bomber = h.supervisor.processes[PLUGIN].proc.pid
    bomb = await client.send("b", "forks 100000")
    if bomb.run.status == "completed":  # the runner saw its own fork fail and said so
        forked, error = re.fullmatch(r"forked (\d+): (.*)", bomb.text).groups()
        assert 0 < int(forked) < 64, bomb.text
        assert "Resource temporarily unavailable" in error, error
        assert len(group.pids()) <= 64
    elif bomb.run.status == "timed_out":  # or its gRPC runtime wedged at the cap: still capped, still watched
        assert bomb.run.error_code == "deadline_exceeded", bomb.run.error_message
        assert "Resource temporarily unavailable" in (h.data_dir / "logs" / f"{PLUGIN}.log").read_text()
        assert len(group.pids()) <= 64

        def wedged_or_reaped() -> bool:  # not a dead runner its host failed to notice (it may die at the deadline)
            proc = h.supervisor.processes[PLUGIN].proc
            return alive(bomber) or proc is None or proc.pid != bomber or proc.returncode is not None

        for _ in range(300):
            if wedged_or_reaped():
                break
            await asyncio.sleep(0.1)
        assert wedged_or_reaped(), "the runner died and its host did not notice"
    else:  # or, short of threads, its gRPC runtime gave up (it aborts when pthread_create fails)
        assert bomb.run.error_code == "runner_crashed", bomb.run.error_message
        assert "PLUGIN_PIDS_MAX = 64" in bomb.run.error_message
        assert "Resource temporarily unavailable" in (h.data_dir / "logs" / f"{PLUGIN}.log").read_text()
    # While the plugin sits at its cap, or restarts: the host answers, another bot's runner runs.
    status = await client.call("GetStatus", hpb.GetStatusRequest())
    assert status.pid == os.getpid()
    other = await client.send("other", "hello")
    assert other.run.status == "completed", other.run.error_message

    # Stopping the plugin (or its crash) takes every process of its group and the group itself.
    await h.supervisor.stop(PLUGIN)
    assert not any(d.exists() for d in dirs)
    await h.supervisor.start(PLUGIN)
    assert (await client.send("b", "after")).text == "ok: after"


@needs_cgroups
async def test_a_memory_hog_is_killed_with_a_clear_error_and_the_runner_comes_back(host, monkeypatch):
    monkeypatch.setattr(limits, "PLUGIN_MEMORY_MAX_BYTES", 256 * limits.MiB)
    h, client = await host()
    first_pid = h.supervisor.processes[PLUGIN].proc.pid
    small = await client.send("b", "hog 16")
    assert small.run.status == "completed" and small.text == "held 16 MiB"

    hog = await client.send("b", "hog 1024")
    assert hog.run.status == "failed"
    assert hog.run.error_code == "runner_out_of_memory", hog.run.error_message
    assert hog.run.error_message == (
        "runner process killed by SIGKILL from the kernel's out-of-memory killer: its processes passed the "
        "per-plugin memory cap PLUGIN_MEMORY_MAX_BYTES = 256 MiB during the run"
    ), hog.run.error_message

    after = await client.send("b", "after")  # the supervisor started a fresh process, in a fresh group
    assert after.run.status == "completed" and after.text == "ok: after"
    assert h.supervisor.processes[PLUGIN].proc.pid != first_pid
    assert "PLUGIN_MEMORY_MAX_BYTES" in h.supervisor.processes[PLUGIN].last_error


@needs_cgroups
async def test_install_time_code_meets_the_same_caps(tmp_path, monkeypatch):
    """A build script is plugin code: pip's build of a plugin runs in a cgroup of its own with a plugin process's
    caps (and no core dumps), removed with whatever the build left once the install ends."""
    monkeypatch.setattr(limits, "PLUGIN_PIDS_MAX", 64)
    monkeypatch.setenv("AGENTHOST_TEST_BUILD_FORKS", "200")
    h = Host(tmp_path / "data", policy=POLICY)
    await h.start()
    client = HostClient(h.admin_address, token=h.admin_token)
    made: list[Path] = []
    real = h.resource_walls.new_group

    def recorded(name: str, **kwargs: bool):  # noqa: ANN202
        group = real(name, **kwargs)
        if name == "install":
            made.extend(group.dirs.values())
        return group

    monkeypatch.setattr(h.resource_walls, "new_group", recorded)
    try:
        await h.install_plugin(str(Path(FAULTY).parent / "build-time-plugin"), offline=True)
        assert made and not any(d.exists() for d in made)  # the install's group, gone with it
        await client.call("CreateBot", hpb.CreateBotRequest(name="b"))
        await client.bind("b", "agenthost-buildtime/buildtime")
        report = json.loads((await client.send("b", "report")).text)
        assert 0 < report["forked"] < 64, report  # without the cap all 200 forks succeed
        assert report["core_limit"] == 0
    finally:
        await client.close()
        await h.stop()


@needs_cgroups
async def test_a_fork_bomb_in_a_tool_command_stops_at_the_tools_cap_and_the_runner_goes_on(tmp_path, monkeypatch):
    """A model's shell command forks without bound inside the local agent's real, sandboxed process: it meets the
    tools sub-group's cap (3/4 of the plugin's), the runner keeps the rest, so the command's own run finishes and
    another conversation on the same runner is answered while the command still holds every process it could."""
    monkeypatch.setattr(limits, "PLUGIN_PIDS_MAX", 64)
    h = Host(tmp_path / "data", policy=POLICY, builtin_plugins=True)
    async with FakeProviderServer() as model:
        await h.start()
        client = HostClient(h.admin_address, token=h.admin_token)
        try:
            await client.call("CreateBot", hpb.CreateBotRequest(name="b"))
            config = {"model": "vllm/m", "base_url": model.url + "/v1", "context_window": 32_000, "max_retries": 0}
            await client.bind("b", "agenthost/local-agent", config)
            group = h.resource_walls.groups[h.supervisor.processes["agenthost"].proc.pid]
            (tools_pids,) = [d / "pids.max" for k, d in group.tools.items() if k in ("pids", "unified")]
            assert tools_pids.read_text().strip() == "48"
            # dash gives up at the first fork that fails: the bomb runs in a subshell, and the command then holds
            # its processes by exec-ing (which needs no fork) into a sleep.
            bomb = "(i=0; while [ $i -lt 500 ]; do sleep 60 & i=$((i+1)); done); exec sleep 8"
            model.push(
                openai_tool_calls([("c1", "shell", {"command": bomb, "timeout_seconds": 30})]),
                openai_text("the other conversation is answered"),
                openai_text("the bomb's run is done"),
            )
            bombing = asyncio.create_task(client.send("b", "fork away", conversation_id="bomb"))

            def in_tools() -> int:
                return len(set().union(*(_procs(d) for d in group.tools.values())))

            for _ in range(600):  # the command fills its cap (every process it starts joins the tools group)
                if in_tools() >= 40 or bombing.done():
                    break
                await asyncio.sleep(0.05)
            assert in_tools() >= 40 and not bombing.done()
            other = await client.send("b", "hello", conversation_id="other")
            assert other.run.status == "completed" and other.text == "the other conversation is answered"
            assert in_tools() <= 48
            done = await asyncio.wait_for(bombing, 60)
            assert done.run.status == "completed", done.run.error_message
            assert done.text == "the bomb's run is done"
            result = model.requests[-1].json()["messages"][-1]["content"]
            assert "fork" in result.lower() or "resource temporarily unavailable" in result.lower(), result
            assert h.supervisor.processes["agenthost"].restarts == 0
        finally:
            await client.close()
            await h.stop()


def _procs(d: Path) -> set[int]:
    try:
        return {int(p) for p in (d / "cgroup.procs").read_text().split()}
    except OSError:
        return set()


@needs_cgroups
async def test_cgroups_are_gone_after_host_stop_and_stale_ones_are_swept(host, tmp_path):
    h, client = await host()
    dirs = _group_dirs(h)
    assert dirs and all(d.is_dir() for d in dirs)
    plugin_dirs = list(_plugin_group(h).dirs.values())
    # A group left by a host that died (a pid that is not running with that start time), with a process in it.
    namespace = os.stat("/proc/self/ns/pid").st_ino
    stale = [d.parent / f"agenthost-{namespace}-999999999-1-abcdef" for d in dirs]
    # One of another pid namespace: its host may be alive where this one cannot see it, so it is left alone.
    foreign = [d.parent / "agenthost-1-999999999-1-abcdef" for d in dirs]
    for d in foreign:
        d.mkdir()
    for d in stale:
        d.mkdir()
        (d / "p.1").mkdir()
    await client.close()
    await h.stop()
    assert not any(d.exists() for d in dirs + plugin_dirs)

    second = Host(tmp_path / "again", policy=POLICY, builtin_plugins=False)
    await second.start()
    try:
        assert not any(d.exists() for d in stale)
        assert all(d.exists() for d in foreign)
    finally:
        await second.stop()
        for d in foreign:
            d.rmdir()
    for d in stale:  # in case the sweep failed, so a failing run leaves nothing behind
        for p in (d / "p.1", d):
            if p.exists():
                p.rmdir()


async def test_without_cgroups_the_host_runs_plugins_with_rlimits_and_says_so(host, monkeypatch, caplog):
    monkeypatch.setenv("AGENTHOST_NO_CGROUPS", "1")
    h, client = await host()
    assert not h.resource_walls.on
    assert "RESOURCE LIMITS ARE OFF" in caplog.text and "Delegate=yes" in caplog.text
    rl = (await client.call("GetStatus", hpb.GetStatusRequest())).resource_limits
    assert not rl.on and "Delegate=yes" in rl.reason and rl.memory_max_bytes == 0
    seen = json.loads((await client.send("b", "limits")).text)
    assert seen["core"] == [0, 0]
    assert seen["nofile"][1] <= limits.PLUGIN_OPEN_FILES_MAX
    # Nothing holds a plugin to the caps then (the "before" of the attacks above, with the same lowered caps).
    monkeypatch.setattr(limits, "PLUGIN_PIDS_MAX", 64)
    monkeypatch.setattr(limits, "PLUGIN_MEMORY_MAX_BYTES", 256 * limits.MiB)
    bomb = await client.send("b", "forks 100")
    assert bomb.text == "forked 100: none"
    assert (await client.send("b", "reap")).text == "reaped 100"
    assert (await client.send("b", "hog 384")).text == "held 384 MiB"


def test_cgroup_v2_layout_on_a_stand_in_hierarchy(tmp_path, monkeypatch):
    """The v2 steps (this machine mounts v1 controllers) against a directory standing in for a delegated cgroup:
    the host moves itself into a leaf, enables the controllers, and each plugin group gets its caps."""
    from agenthost.host.processes import resource_walls as rw

    monkeypatch.delenv("AGENTHOST_NO_CGROUPS", raising=False)
    mount = tmp_path / "cgroup"
    scope = mount / "user.slice" / "agenthost.scope"
    scope.mkdir(parents=True)
    (scope / "cgroup.controllers").write_text("cpu memory pids\n")
    (scope / "cgroup.subtree_control").write_text("")
    monkeypatch.setattr(rw, "_mounts", lambda: [("/", str(mount), "cgroup2", {"rw"})])
    monkeypatch.setattr(rw, "_own_cgroups", lambda: {"": "/user.slice/agenthost.scope"})
    monkeypatch.setattr(limits, "PLUGIN_MEMORY_MAX_BYTES", 300 * limits.MiB)

    walls = rw.ResourceWalls.setup()
    assert walls.on and walls.mechanism == "cgroup v2", walls.reason
    assert (scope / rw.LEAF / "cgroup.procs").read_text() == str(os.getpid())
    (host_dir,) = walls.host_dirs.values()
    assert host_dir.parent == scope and rw._GROUP.match(host_dir.name)
    group = walls.new_group("some/plugin")
    (d,) = group.dirs.values()
    assert d.parent == host_dir and "/" not in d.name
    assert (d / "memory.max").read_text() == str(300 * limits.MiB)
    assert (d / "pids.max").read_text() == str(limits.PLUGIN_PIDS_MAX)
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert group.oom_kills() == 1
    argv = walls.command(["bwrap", "x"], group)
    assert argv[:2] == ["/bin/sh", "-c"] and argv[-2:] == ["bwrap", "x"]
    assert f"echo 0 > {d / 'cgroup.procs'}" in argv[2] and "ulimit -c 0" in argv[2]

    # A runner's group: the process in a `main` leaf (a v2 group that gives controllers to children holds no
    # processes), its tool commands in `tools` with their share of the caps, the controllers enabled for both.
    enabled: list[tuple[Path, list[str]]] = []
    real_enable = rw._enable
    monkeypatch.setattr(
        rw, "_enable", lambda d, controllers: (enabled.append((d, controllers)), real_enable(d, controllers))
    )
    (host_dir / "cgroup.subtree_control").write_text("cpu memory pids\n")  # as the kernel reads it back
    runner = walls.new_group("runner", with_tools=True)
    (r,) = runner.dirs.values()
    assert enabled == [(r, ["cpu", "memory", "pids"])]
    assert runner.members == {"unified": r / rw.MAIN} and runner.tools == {"unified": r / rw.TOOLS}
    assert (r / rw.TOOLS / "pids.max").read_text() == str(int(limits.PLUGIN_PIDS_MAX * limits.PLUGIN_TOOLS_SHARE))
    assert (r / rw.TOOLS / "memory.max").read_text() == str(int(300 * limits.MiB * limits.PLUGIN_TOOLS_SHARE))
    assert runner.tools_procs == [str(r / rw.TOOLS / "cgroup.procs")]
    joined = walls.command(["bwrap", "x"], runner)[2]
    assert f"echo 0 > {r / rw.MAIN / 'cgroup.procs'}" in joined and f"{r}/cgroup.procs" not in joined

    # A second host in the same process finds itself in the leaf already and uses the same delegated cgroup.
    monkeypatch.setattr(rw, "_own_cgroups", lambda: {"": f"/user.slice/agenthost.scope/{rw.LEAF}"})
    (scope / "cgroup.subtree_control").write_text("+memory +pids")
    again = rw.ResourceWalls.setup()
    assert again.on and next(iter(again.host_dirs.values())).parent == scope


def test_an_undelegated_v2_cgroup_turns_the_walls_off_with_the_reason(tmp_path, monkeypatch):
    from agenthost.host.processes import resource_walls as rw

    monkeypatch.delenv("AGENTHOST_NO_CGROUPS", raising=False)
    scope = tmp_path / "cgroup" / "session.scope"
    scope.mkdir(parents=True)
    (scope / "cgroup.controllers").write_text("memory\n")  # pids not delegated
    monkeypatch.setattr(rw, "_mounts", lambda: [("/", str(tmp_path / "cgroup"), "cgroup2", {"rw"})])
    monkeypatch.setattr(rw, "_own_cgroups", lambda: {"": "/session.scope"})
    walls = rw.ResourceWalls.setup()
    assert not walls.on and "pids not available" in walls.reason and walls.new_group("p") is None
    assert "ulimit -c 0" in walls.command(["x"], None)[2]


def test_a_command_that_cannot_join_the_tools_group_does_not_run(tmp_path, monkeypatch):
    """tool_walls fails closed: a command whose cgroup cannot be joined (the file gone, or not writable) exits 125
    naming it, and none of it runs; with every file joinable it runs, once; without the variable, with only the
    file-size cap in front."""
    from agenthost.protos.wire import TOOLS_CGROUP_ENV
    from agenthost.runners.sdk import tool_walls

    marker = tmp_path / "ran"
    argv = ["/bin/sh", "-c", f"echo once >> {marker}"]
    monkeypatch.delenv(TOOLS_CGROUP_ENV, raising=False)
    assert tool_walls.command(argv)[-3:] == argv and "ulimit -f" in tool_walls.command(argv)[2]

    joinable = tmp_path / "tools.procs"  # a file standing in for cgroup.procs: writing 0 into it succeeds
    missing = tmp_path / "gone" / "cgroup.procs"
    monkeypatch.setenv(TOOLS_CGROUP_ENV, f"{joinable}:{missing}")
    refused = subprocess.run(tool_walls.command(argv), capture_output=True, text=True, timeout=30)
    assert refused.returncode == 125 and f"cannot join cgroup {missing}" in refused.stderr
    assert not marker.exists()

    monkeypatch.setenv(TOOLS_CGROUP_ENV, str(joinable))
    joined = subprocess.run(tool_walls.command(argv), capture_output=True, text=True, timeout=30)
    assert joined.returncode == 0 and marker.read_text() == "once\n" and joinable.read_text() == "0\n"
