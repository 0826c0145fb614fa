"""The walls around plugin processes and the admin surface, attacked from inside a real installed plugin.

The intruder plugin (tests/fixtures/intruder-plugin) is installed the way a user installs any plugin, runs under
the host's supervisor in its sandbox, and reports what each attack reached. Every attack here was observed to
succeed before the walls (see the issue's list); each assertion names what it must not reach now.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import uuid
from pathlib import Path

import grpc
import pytest

from agenthost.host import limits
from agenthost.host.access.private_files import private_dir
from agenthost.host.api.client import HostClient
from agenthost.host.ops import logs
from agenthost.host.processes import plugin_sockets
from agenthost.host.server import Host
from agenthost.plugins import sandbox
from agenthost.protos import errors, host_pb2_grpc
from agenthost.protos import host_pb2 as hpb
from tests.gateway.helpers import until

ROOT = Path(__file__).resolve().parents[2]
INTRUDER = str(ROOT / "tests" / "fixtures" / "intruder-plugin")
FAULTY = str(ROOT / "tests" / "fixtures" / "faulty-plugin")
CROWDED = str(ROOT / "tests" / "fixtures" / "crowded-plugin")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sandbox.probe() is not None, reason=f"no sandbox here: {sandbox.probe()}"),
]


def _pgrep(marker: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


async def _wait_gone(marker: str, timeout: float = 15.0) -> list[int]:
    deadline = asyncio.get_running_loop().time() + timeout
    while (left := _pgrep(marker)) and asyncio.get_running_loop().time() < deadline:  # noqa: ASYNC110 — polls /proc
        await asyncio.sleep(0.1)
    return left


@pytest.fixture
async def host(tmp_path, monkeypatch):
    # A provider key in the host's environment, as a user who exported it before `agenthost serve` would have.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-host-env-0123456789")
    monkeypatch.setenv("AGENTHOST_SERVICE_TOKEN", "tok-host-env-0123456789")
    # The PostgreSQL backend's DSN, given in the environment as `serve` reads it (a DSN there may carry a password).
    monkeypatch.setenv("AGENTHOST_DATABASE_URL", "postgresql://agenthost:hunter2@db.internal/agenthost")
    monkeypatch.setenv("AGENTHOST_DATABASE_PASSWORD_FILE", "/etc/agenthost/db-password")
    h = Host(tmp_path / "data")
    await h.start()
    try:
        async with HostClient(h.admin_address, token=h.admin_token, timeout=120) as c:
            yield h, c
    finally:
        await h.stop()


async def _install(c: HostClient, source: str, *, allow_network: bool = False) -> hpb.PluginInfo:
    return await c.call(
        "InstallPlugin",
        hpb.InstallPluginRequest(source=source, offline=True, allow_network=allow_network),
        timeout=300,
    )


async def _attack(h: Host, c: HostClient, bot: str, *, tmp: Path, marker: str) -> dict:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    # Inside, the directories above a bound path exist on the sandbox's own tmpfs, so a write there "works" and
    # lands nowhere: what counts is that the host's real file never appears.
    outside = h.data_dir / "pwned.txt"
    targets = {
        "admin_sock": h.admin_address.removeprefix("unix:"),
        "api_sock": h.api_address.removeprefix("unix:"),
        "database": str(h.data_dir / "agenthost.db"),
        "admin_token": str(h.data_dir / "admin.token"),
        "keys_file": str(h.data_dir / "keys.json"),
        "other_plugin_data": str(h.data_dir / "plugins" / "agenthost-faulty" / "data"),
        "other_runner_sock": str(h.supervisor.processes["agenthost-faulty"].sock_dir / "r.sock"),
        "host_pid": os.getpid(),
        "tcp_port": listener.getsockname()[1],
        "outside_file": str(outside),
        "marker": marker,
    }
    try:
        result = await c.send(bot, json.dumps(targets))
    finally:
        listener.close()
    assert result.run.status == "completed", result.run.error_message
    assert not outside.exists()
    return json.loads(result.text)


async def test_a_plugin_reaches_nothing_beyond_its_own_walls(host, tmp_path, reused_plugin_installs):
    h, c = host
    await c.call("SetKey", hpb.SetKeyRequest(name="OPENAI_API_KEY", value="sk-stored-0123456789"))
    await _install(c, FAULTY)
    info = await _install(c, INTRUDER)
    assert info.state == "ready", info.last_error
    await c.call("CreateBot", hpb.CreateBotRequest(name="b"))
    await c.bind("b", "agenthost-intruder/intruder")
    marker = f"survivor-{uuid.uuid4().hex}"

    report = await _attack(h, c, "b", tmp=tmp_path, marker=marker)

    assert report["uid"] == sandbox.SANDBOX_UID
    assert report["env_secrets"] == []  # neither the host's OPENAI_API_KEY nor anything named like a secret
    assert report["env_database"] == []  # nor the host's database DSN or its password file's path
    for attack in (
        "admin_sock",
        "api_sock",  # the host's shared one: each plugin process sees only its own (below)
        "database",
        "admin_token",
        "keys_file",
        "other_plugin_data",
        "other_runner_sock",
        "host_proc",
        "host_environ",
        "shadow",
    ):
        assert report[attack]["reached"] is False, (attack, report[attack])
    # What it is meant to have: its own run API socket, its own data dir.
    assert report["own_api_sock"]["reached"] is True, report["own_api_sock"]
    assert report["own_data_write"]["reached"] is True, report["own_data_write"]
    # Installed without --allow-network: no network, although its manifest asks.
    assert report["tcp_loopback"]["reached"] is False, report["tcp_loopback"]
    # A double-forked, setsid'd process lives only as long as the plugin process: stopping the plugin ends it.
    assert report["survivor"]["reached"] is True and _pgrep(marker)
    await c.call("SetPluginEnabled", hpb.SetPluginEnabledRequest(plugin_id="agenthost-intruder", enabled=False))
    assert await _wait_gone(marker) == []


API_CAP = 16


@pytest.fixture
def low_api_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    # Before the host starts: its shared api.sock and each plugin process's socket take their cap from it.
    monkeypatch.setattr(limits, "API_MAX_CONNECTIONS", API_CAP)
    monkeypatch.setattr(plugin_sockets, "WATCH_SECONDS", 0.5)


async def test_a_plugin_flooding_the_run_api_starves_only_itself(low_api_cap, host, reused_plugin_installs, caplog):
    """The run API's connection cap used to be host-wide: one plugin holding it left every other plugin's runs
    without the run API. Now each plugin process has a socket and a cap of its own."""
    h, c = host
    caplog.set_level(logging.WARNING, logger=plugin_sockets.__name__)
    await _install(c, INTRUDER)
    await c.call("CreateBot", hpb.CreateBotRequest(name="b"))
    await c.bind("b", "agenthost-intruder/intruder")
    flood = json.loads((await c.send("b", json.dumps({"flood": 4 * API_CAP}))).text)
    print(f"\nflood: {flood}")
    assert flood["opened"] == 4 * API_CAP
    # A plugin started after the flood, on the same host: its runs' calls through the run API are served.
    await _install(c, FAULTY)
    await c.call("CreateBot", hpb.CreateBotRequest(name="f"))
    await c.bind("f", "agenthost-faulty/faulty")
    result = await c.send("f", "api 5")
    assert result.run.status == "completed", result.run.error_message
    assert result.text == "api done 5"
    # Its own calls are what the flooder starved.
    assert flood["own_call"] != "served", flood

    # The host's log names the plugin that sits at its cap, and no other.
    def logged() -> str:
        return caplog.text

    await until(lambda: "plugin agenthost-intruder holds" in logged(), "the flooder is named in the host's log")
    assert "its cap (API_MAX_CONNECTIONS)" in logged() and "plugin agenthost-faulty holds" not in logged()


async def test_a_plugin_sending_events_only_the_host_writes_cannot_flood_the_hosts_log(
    host, reused_plugin_installs, caplog
):
    """Each host-only event a runner sent (a subagent link, an approval) was dropped with a warning line of its own:
    2-byte events, up to RUN_MAX_EVENTS a run, each a ~200-byte line formatted on the host's loop, so one run could
    roll `host.log` (HOST_LOG_MAX_BYTES × backups) past every line before it. Now they are counted like refusals."""
    h, c = host
    caplog.set_level(logging.WARNING)
    await _install(c, INTRUDER)
    await c.call("CreateBot", hpb.CreateBotRequest(name="b"))
    await c.bind("b", "agenthost-intruder/intruder")
    forged = 20_000
    result = await c.send("b", json.dumps({"forge": forged}))
    assert result.run.status == "completed", result.run.error_message
    assert result.text == f"forged {forged}"
    events = await c.call("ListRunEvents", hpb.ListRunEventsRequest(run_id=result.run.run_id, limit=1000))
    assert not [e for e in events.events if e.WhichOneof("kind") == "subagent_started"]  # dropped, as before
    lines = [r for r in caplog.records if r.name.startswith("agenthost.host")]
    assert len(lines) <= 2 * logs.REFUSALS_PER_WINDOW, f"{len(lines)} host log lines for one run"
    assert any(
        "subagent_started" in r.getMessage() or "subagent_started" in str(getattr(r, "fields", "")) for r in lines
    )


async def test_forged_artifact_refs_cost_the_host_a_bounded_number_of_lookups(
    host, reused_plugin_installs, monkeypatch
):
    """A runner's artifact_created is checked against the artifact store (clients fetch what it names with wider
    credentials). Each forged ref with a fresh id cost a database read on the host's loop, 2 bytes on the wire, up to
    RUN_MAX_EVENTS a run. Now a run that has named RUN_MAX_ARTIFACT_MISSES artifacts it may not read gets the rest
    dropped unread (what it made itself is still announced: tests/channels/test_forged_artifact_refs.py)."""
    from agenthost.host import limits

    h, c = host
    lookups = 0
    get = h.artifacts.get

    def counted(artifact_id: str):  # noqa: ANN202
        nonlocal lookups
        lookups += 1
        return get(artifact_id)

    monkeypatch.setattr(h.artifacts, "get", counted)
    await _install(c, INTRUDER)
    await c.call("CreateBot", hpb.CreateBotRequest(name="b"))
    await c.bind("b", "agenthost-intruder/intruder")
    forged = 2_000
    result = await c.send("b", json.dumps({"forge": forged, "artifacts": True}))
    assert result.run.status == "completed", result.run.error_message
    assert result.text == f"forged {forged}"
    assert lookups <= limits.RUN_MAX_ARTIFACT_MISSES, f"{lookups} lookups for {forged} forged refs"
    events = await c.call("ListRunEvents", hpb.ListRunEventsRequest(run_id=result.run.run_id, limit=1000))
    assert not [e for e in events.events if e.WhichOneof("kind") == "artifact_created"]


async def test_a_plugin_offering_runners_by_the_thousand_is_refused_and_manifests_are_checked_off_the_loop(
    host, reused_plugin_installs, monkeypatch
):
    """Each runner's config schema is checked when its plugin is installed and at every start (milliseconds each,
    and schemas made to differ defeat the verdict cache). A plugin offering 1,000 runners was installed, and held the
    host's event loop for seconds at install and again at every start (a crash loop repeats it). Now a plugin
    offers at most MAX_RUNNERS_PER_PLUGIN, and manifests are checked off the event loop."""
    import threading

    from agenthost.plugins.manifest import MAX_RUNNERS_PER_PLUGIN, RunnerManifest

    h, c = host
    loop_thread = threading.get_ident()
    on_loop: list[str] = []
    parse = RunnerManifest.parse_json

    def watched(raw: str | bytes) -> RunnerManifest:
        manifest = parse(raw)
        if threading.get_ident() == loop_thread:
            on_loop.append(manifest.name)
        return manifest

    monkeypatch.setattr(RunnerManifest, "parse_json", staticmethod(watched))
    with pytest.raises(errors.AgentHostError) as refused:
        await _install(c, CROWDED)
    assert f"1000 runners; at most MAX_RUNNERS_PER_PLUGIN = {MAX_RUNNERS_PER_PLUGIN}" in refused.value.message
    assert not [
        p for p in (await c.call("ListPlugins", hpb.ListPluginsRequest())).plugins if p.plugin_id == "agenthost-crowded"
    ]
    # A plugin within the cap: installed and started with its manifests checked in a thread.
    await _install(c, INTRUDER)
    await c.call("CreateBot", hpb.CreateBotRequest(name="b"))
    await c.bind("b", "agenthost-intruder/intruder")
    assert (await c.send("b", json.dumps({"forge": 0}))).text == "forged 0"
    assert "intruder" not in on_loop, on_loop


async def test_network_only_when_the_manifest_asks_and_the_user_accepts(host, tmp_path, reused_plugin_installs):
    h, c = host
    await _install(c, FAULTY)
    await _install(c, INTRUDER, allow_network=True)
    await c.call("CreateBot", hpb.CreateBotRequest(name="b"))
    await c.bind("b", "agenthost-intruder/intruder")
    report = await _attack(h, c, "b", tmp=tmp_path, marker=f"net-{uuid.uuid4().hex}")
    assert report["tcp_loopback"] == {"reached": True, "value": "connected"}
    # Network changes nothing else.
    assert report["admin_sock"]["reached"] is False and report["database"]["reached"] is False


async def test_nothing_a_plugin_started_survives_a_kill_9_of_the_host(tmp_path):
    """A separate host process, killed with SIGKILL while the intruder's survivor runs."""
    env = {**os.environ, "AGENTHOST_HOME": str(tmp_path / "home")}
    marker = f"orphan-{uuid.uuid4().hex}"
    serve = subprocess.Popen(  # noqa: ASYNC220 — returns at once; the host runs on its own
        [str(Path(os.sys.executable)), "-m", "agenthost.host.cli", "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        home = tmp_path / "home"
        for _ in range(300):
            if (home / "host.json").exists():
                break
            await asyncio.sleep(0.1)
        async with HostClient.for_data_dir(home, timeout=300) as c:
            await _install(c, FAULTY)
            await _install(c, INTRUDER)
            await c.call("CreateBot", hpb.CreateBotRequest(name="b"))
            await c.bind("b", "agenthost-intruder/intruder")
            targets = {k: "/nonexistent" for k in ("admin_sock", "api_sock", "database", "admin_token", "keys_file")}
            targets |= {
                "other_plugin_data": "/nonexistent",
                "other_runner_sock": "/nonexistent",
                "host_pid": serve.pid,
                "tcp_port": 9,
                "outside_file": str(tmp_path / "x"),
                "marker": marker,
            }
            result = await c.send("b", json.dumps(targets))
            assert json.loads(result.text)["survivor"]["reached"] is True
        assert _pgrep(marker)
        serve.kill()
        serve.wait(30)
        assert await _wait_gone(marker) == []
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait(30)


# ---- the admin surface ----


def _stub(h: Host) -> tuple[grpc.aio.Channel, host_pb2_grpc.AgentHostStub]:
    channel = grpc.aio.insecure_channel(h.admin_address)
    return channel, host_pb2_grpc.AgentHostStub(channel)


async def test_admin_calls_need_a_credential(host):
    h, _ = host
    channel, stub = _stub(h)
    try:
        for metadata in ((), (("authorization", "Bearer nope"),), (("authorization", h.admin_token),)):
            with pytest.raises(grpc.RpcError) as info:
                await stub.ListBots(hpb.ListBotsRequest(), metadata=metadata, timeout=10)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # Streams are refused the same way, before any run starts.
        call = stub.SendMessage(hpb.SendMessageRequest(bot="b", text="x"), timeout=10)
        with pytest.raises(grpc.RpcError) as info:
            await call.read()
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert h.run_store.list(bot_id="", conversation_id="", status="", limit=10) == []
    finally:
        await channel.close()


async def test_a_send_credential_reaches_its_bots_and_nothing_else(host):
    h, admin = host
    for name in ("mine", "theirs"):
        await admin.call("CreateBot", hpb.CreateBotRequest(name=name))
        await admin.bind(name, "agenthost/local-agent", {"model": "demo/offline"})
    theirs = await admin.send("theirs", "hello")
    created = await admin.call("CreateCredential", hpb.CreateCredentialRequest(name="tg", scope="send", bots=["mine"]))
    async with HostClient(h.admin_address, token=created.token) as c:
        mine = await c.send("mine", "hello")
        assert mine.run.status == "completed"
        assert (await c.call("GetRun", hpb.RunRequestById(run_id=mine.run.run_id))).run_id == mine.run.run_id
        with pytest.raises(errors.PermissionDenied):
            await c.send("theirs", "hello")
        with pytest.raises(errors.NotFound):  # another bot's run does not exist for this credential
            await c.call("GetRun", hpb.RunRequestById(run_id=theirs.run.run_id))
        with pytest.raises(errors.NotFound):
            await c.call("ListRunEvents", hpb.ListRunEventsRequest(run_id=theirs.run.run_id))
        for method, request in (
            ("ListBots", hpb.ListBotsRequest()),
            ("InstallPlugin", hpb.InstallPluginRequest(source=FAULTY)),
            ("CreateBinding", hpb.CreateBindingRequest()),
            ("GetHistory", hpb.GetHistoryRequest(bot="mine")),
            ("SetKey", hpb.SetKeyRequest(name="X", value="y")),
            ("CreateCredential", hpb.CreateCredentialRequest(name="more", scope="admin")),
        ):
            with pytest.raises(errors.PermissionDenied):
                await c.call(method, request)
        await admin.call("RevokeCredential", hpb.RevokeCredentialRequest(name="tg"))
        with pytest.raises(errors.Unauthenticated):
            await c.send("mine", "again")


# ---- files ----


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


async def test_everything_the_host_writes_is_private(tmp_path):
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    leaked = data / "old.log"
    leaked.write_text("from an install made before the walls")
    leaked.chmod(0o644)
    os.umask(0o022)  # a permissive shell umask; the host must not inherit it
    async with Host(data) as h, HostClient(h.admin_address, token=h.admin_token) as c:
        await c.call("CreateBot", hpb.CreateBotRequest(name="b"))
        await c.bind("b", "agenthost/local-agent", {"model": "demo/offline"})
        await c.send("b", "hello")
        await c.call("SetKey", hpb.SetKeyRequest(name="K", value="secret-value-123"))
        assert _mode(data) == 0o700
        for path in data.rglob("*"):
            if path.is_symlink() or "env" in path.relative_to(data).parts:
                continue
            assert _mode(path) & 0o077 == 0, (path, oct(_mode(path)))
        assert _mode(data / "admin.token") == 0o600 and _mode(data / "keys.json") == 0o600
        assert b"secret-value-123" not in (data / "agenthost.db").read_bytes()
    assert _mode(leaked) == 0o600


async def test_a_squatted_socket_dir_is_never_used(tmp_path, monkeypatch):
    # A data dir deep enough that the sockets go under the temp dir, where another user could prepare the name. The
    # temp dir is a short one of the test's own: pytest's tmp_path (longer under xdist) would leave no room for a
    # socket name within the 107 bytes a unix socket path may have.
    deep = tmp_path / ("d" * 60) / ("e" * 40)
    shared_tmp = Path(tempfile.mkdtemp(prefix="sq", dir="/tmp"))
    monkeypatch.setattr("tempfile.tempdir", str(shared_tmp))
    digest = hashlib.sha256(str(deep.resolve()).encode()).hexdigest()[:12]
    squatted = shared_tmp / f"agenthost-{os.getuid()}-{digest}"
    squatted.mkdir(mode=0o777)
    squatted.chmod(0o777)
    (squatted / "admin.sock").write_text("a trap")
    async with Host(deep) as h:
        runtime = Path(h.admin_address.removeprefix("unix:")).parent
        assert runtime != squatted and private_dir(runtime)
    assert (squatted / "admin.sock").read_text() == "a trap"
    shutil.rmtree(shared_tmp)


# ---- keys ----


async def test_a_key_reaches_only_the_runs_of_bindings_that_name_it(tmp_path):
    from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, events
    from agenthost.runners.sdk.testing import HostHarness

    class Echo(Runner):
        manifest = RunnerManifest(name="echo")

        async def run(self, run: RunContext):  # noqa: ANN201
            yield events.text(json.dumps(run.secrets))

    async with HostHarness(tmp_path, runners=[Echo]) as harness:
        c = harness.client
        await c.call("SetKey", hpb.SetKeyRequest(name="OPENAI_API_KEY", value="sk-named-0123456789"))
        await c.call("CreateBot", hpb.CreateBotRequest(name="named"))
        await c.call("CreateBot", hpb.CreateBotRequest(name="unnamed"))
        await c.bind("named", "test/echo", keys=["OPENAI_API_KEY"])
        await c.bind("unnamed", "test/echo")
        assert json.loads((await c.send("named", "x")).text) == {"OPENAI_API_KEY": "sk-named-0123456789"}
        assert json.loads((await c.send("unnamed", "x")).text) == {}
        # Set on the running host, used by the next run: no restart.
        await c.call("SetKey", hpb.SetKeyRequest(name="OPENAI_API_KEY", value="sk-rotated-0123456789"))
        assert json.loads((await c.send("named", "x")).text) == {"OPENAI_API_KEY": "sk-rotated-0123456789"}
        listed = (await c.call("ListKeys", hpb.ListKeysRequest())).keys
        assert [(k.name, k.length) for k in listed] == [("OPENAI_API_KEY", 21)]
        await c.call("RemoveKey", hpb.RemoveKeyRequest(name="OPENAI_API_KEY"))
        failed = await c.send("named", "x")
        assert failed.run.status == "failed" and failed.run.error_code == "missing_key"
        assert "agenthost keys set" in failed.run.error_message


async def test_inline_secrets_in_a_binding_config_are_never_shown(host):
    h, c = host
    await c.call("CreateBot", hpb.CreateBotRequest(name="b"))
    config = {"model": "openai/gpt-4o-mini", "base_url": "http://127.0.0.1:9/v1", "api_key": "sk-inline-0123456789"}
    await c.bind("b", "agenthost/local-agent", config)
    (shown,) = (await c.call("ListBindings", hpb.BotRequest(bot="b"))).bindings
    assert json.loads(shown.config_json)["api_key"] == "[redacted]"
    assert json.loads(shown.config_json)["model"] == "openai/gpt-4o-mini"
    # The CLI as a user runs it (a separate process: the host serves on this test's event loop).
    cli = await asyncio.create_subprocess_exec(
        os.sys.executable,
        *("-m", "agenthost.host.cli", "--data-dir", str(h.data_dir), "bots", "bindings", "b"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(cli.communicate(), 60)
    assert cli.returncode == 0 and b"[redacted]" in out and b"sk-inline" not in out, out


async def test_install_time_code_reaches_nothing_of_the_host(host, monkeypatch):
    """setup.py runs during the install's build: inside the install sandbox it cannot write the host's files or
    read its secrets (it can only fail, or build)."""
    h, c = host
    target = h.data_dir / "written-at-build.txt"
    monkeypatch.setenv("AGENTHOST_TEST_BUILD_TARGET", str(target))
    await _install(c, str(ROOT / "tests" / "fixtures" / "build-time-plugin"))
    await c.call("CreateBot", hpb.CreateBotRequest(name="b"))
    await c.bind("b", "agenthost-buildtime/buildtime")
    report = json.loads((await c.send("b", "report")).text)
    assert report["read_admin_token"] != "reached" and report["read_database"] != "reached", report
    # The write "succeeds" onto the sandbox's own tmpfs (the directories above the staging dir exist only there);
    # the host's file never appears.
    assert not target.exists()
