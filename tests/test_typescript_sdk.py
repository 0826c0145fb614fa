"""A runner plugin in TypeScript (sdk/typescript): installed with the real CLI from a directory and from the
tarball `npm pack` makes, started by the real host in the same sandbox as a Python plugin, and run; the spawn
protocol's edges (a bad configuration line, the lifeline, SIGTERM); a missing node runtime said at install and at
start; the SDK's wire constants equal to agenthost.protos.wire's."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from agenthost.host.server import Host
from agenthost.plugins import sandbox
from agenthost.protos import wire
from tests.cli_process import acli
from tests.typescript import ECHO, WORKSPACE, build

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def workspace() -> object:
    return build()


@pytest.fixture(scope="module")
def echo_tarball(workspace, tmp_path_factory):
    out = tmp_path_factory.mktemp("npm-pack")
    subprocess.run(
        ["npm", "pack", "--pack-destination", str(out)], cwd=ECHO, check=True, capture_output=True, timeout=120
    )
    return next(out.glob("agenthost-echo-runner-*.tgz"))


@pytest.fixture
async def host(tmp_path):
    h = Host(tmp_path / "data", builtin_plugins=False)
    await h.start()
    yield h
    await h.stop()


async def test_install_from_a_directory_with_the_cli_and_run(workspace, host):
    data = host.data_dir
    code, out, err = await acli(data, "plugins", "install", str(ECHO), "--offline", timeout=300)
    assert code == 0, err
    assert "installed agenthost-echo-runner 0.1.0 (ready); runners: agenthost-echo-runner/echo" in out
    launch = json.loads((data / "plugins" / "agenthost-echo-runner" / "env" / "launch.json").read_text())
    assert launch["command"] == ["node", "dist/main.js"]
    pp = host.supervisor.processes["agenthost-echo-runner"]
    # The same walls as a Python plugin: a bubblewrap sandbox (its first process is bwrap), no network namespace
    # shared with the host.
    assert host.supervisor.sandboxed and pp.proc is not None
    assert open(f"/proc/{pp.proc.pid}/comm").read().strip() == "bwrap"
    argv = open(f"/proc/{pp.proc.pid}/cmdline").read().split("\0")
    app = str(data / "plugins" / "agenthost-echo-runner" / "env" / "app")
    binds = {(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv[:-2]) if a == "--ro-bind"}
    assert (app, app) in binds  # the package, read-only
    assert "--unshare-net" in argv  # no network: the manifest did not ask, the user did not accept
    # Not the host's Python environment: a node plugin sees its runtime and its package instead.
    assert not any(sys.prefix in path for _, path in binds)
    inside = sandbox._descendant_in_other_mount_namespace(pp.proc.pid)
    assert inside is not None and os.readlink(f"/proc/{inside}/ns/net") != os.readlink("/proc/self/ns/net")
    code, out, err = await acli(data, "bots", "create", "tsbot")
    assert code == 0, err
    code, out, err = await acli(
        data, "bots", "bind", "tsbot", "--runner", "agenthost-echo-runner/echo", "--config", "prefix=> "
    )
    assert code == 0, err
    code, out, err = await acli(data, "send", "tsbot", "hello there", "--json")
    assert code == 0, err
    assert "> hello there" in out
    code, out, err = await acli(data, "send", "tsbot", "again", "--json")
    assert code == 0, err
    assert "turn 2" in out  # the conversation-scoped state, written with compare-and-set, persisted


async def test_install_from_an_npm_pack_tarball(echo_tarball, host):
    from agenthost.host.api.client import HostClient
    from agenthost.protos import host_pb2 as hpb

    tarball = echo_tarball
    async with HostClient(host.admin_address, token=host.admin_token) as c:
        info = await c.call("InstallPlugin", hpb.InstallPluginRequest(source=str(tarball), offline=True), timeout=300)
        assert (info.plugin_id, info.version, info.state) == ("agenthost-echo-runner", "0.1.0", "ready")
        await c.call("CreateBot", hpb.CreateBotRequest(name="t"))
        await c.bind("t", "agenthost-echo-runner/echo")
        result = await c.send("t", "from a tarball")
        assert result.run.status == "completed" and result.text == "from a tarball"


async def test_a_missing_node_runtime_is_said_at_install_and_at_start(workspace, host, tmp_path, monkeypatch):
    from agenthost.host.api.client import HostClient
    from agenthost.protos import errors
    from agenthost.protos import host_pb2 as hpb

    async with HostClient(host.admin_address, token=host.admin_token) as c:
        monkeypatch.setenv("AGENTHOST_NODE", str(tmp_path / "no-node"))
        with pytest.raises(errors.FailedPrecondition, match=r"needs the node runtime.*install Node\.js"):
            await c.call("InstallPlugin", hpb.InstallPluginRequest(source=str(ECHO), offline=True), timeout=300)
        assert not list((host.data_dir / "plugins").glob("*/env"))  # nothing left behind
        monkeypatch.delenv("AGENTHOST_NODE")
        await c.call("InstallPlugin", hpb.InstallPluginRequest(source=str(ECHO), offline=True), timeout=300)
        # The node it was installed with goes away (and none is on PATH): the start says what to install.
        launch_file = host.data_dir / "plugins" / "agenthost-echo-runner" / "env" / "launch.json"
        launch = json.loads(launch_file.read_text())
        launch_file.write_text(json.dumps({**launch, "runtime_path": str(tmp_path / "gone" / "node")}))
        monkeypatch.setenv("PATH", str(tmp_path))
        off = hpb.SetPluginEnabledRequest(plugin_id="agenthost-echo-runner", enabled=False)
        await c.call("SetPluginEnabled", off)
        on = hpb.SetPluginEnabledRequest(plugin_id="agenthost-echo-runner", enabled=True)
        with pytest.raises(errors.FailedPrecondition, match=r"needs the node runtime, which is not on PATH"):
            await c.call("SetPluginEnabled", on, timeout=120)


def _spawn(tmp_path) -> subprocess.Popen[bytes]:
    node = shutil.which("node")
    assert node is not None
    return subprocess.Popen(
        [node, str(ECHO / "dist" / "main.js"), "serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )


def _config(tmp_path) -> bytes:
    config = {
        "plugin_id": "p",
        "distribution": "d",
        "listen": f"unix:{tmp_path / 'r.sock'}",
        "host": f"unix:{tmp_path / 'api.sock'}",
        "secret": "s",
        "data_dir": str(tmp_path / "data"),
    }
    return (json.dumps(config) + "\n").encode()


@pytest.mark.parametrize(
    "line", [b"not json\n", b"[1, 2]\n", b'{"plugin_id": "p"}\n', b'{"plugin_id": 1, "listen": "x"}\n', b""]
)
def test_a_bad_configuration_line_exits_2(workspace, tmp_path, line):
    proc = _spawn(tmp_path)
    out, err = proc.communicate(line, timeout=60)
    assert proc.returncode == 2, err
    assert b"bad configuration line on stdin" in err and out == b""


@pytest.mark.parametrize("stop", ["lifeline", "sigterm", "shutdown"])
def test_handshake_health_and_every_stop(workspace, tmp_path, stop):
    """The handshake line names the assigned address; health is SERVING for "" and the Runner service; each way the
    host stops a plugin (EOF on stdin, SIGTERM, the Shutdown RPC) ends the process with exit code 0."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from agenthost.protos import runner_pb2, runner_pb2_grpc

    proc = _spawn(tmp_path)
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(_config(tmp_path))
        proc.stdin.flush()
        line = proc.stdout.readline().decode()
        listen = f"unix:{tmp_path / 'r.sock'}"
        assert line == f"{wire.HANDSHAKE_PREFIX}|{wire.PROTOCOL_VERSION}|{listen}\n"
        with grpc.insecure_channel(listen) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", wire.RUNNER_HEALTH_SERVICE):
                reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=30)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
            described = runner_pb2_grpc.RunnerStub(channel).Describe(runner_pb2.DescribeRequest(), timeout=30)
            assert described.protocol_version == wire.PROTOCOL_VERSION
            assert [json.loads(m)["name"] for m in described.manifests_json] == ["echo"]
            if stop == "shutdown":
                runner_pb2_grpc.RunnerStub(channel).Shutdown(runner_pb2.ShutdownRequest(grace_seconds=1), timeout=30)
        if stop == "lifeline":
            proc.stdin.close()
        elif stop == "sigterm":
            proc.terminate()
        assert proc.wait(timeout=60) == 0
        assert proc.stdout.read() == b""  # nothing but the handshake ever went to stdout
    finally:
        proc.kill()
        proc.wait()


def test_the_sdk_wire_constants_are_agenthosts():
    """sdk/typescript's copy of the wire contract beyond the .proto files equals agenthost.protos.wire."""
    from agenthost.plugins import plugin_process
    from agenthost.runners.sdk import __main__ as sdk_main

    source = (WORKSPACE / "runner-sdk" / "src" / "wire.ts").read_text()
    found = {m[1]: m[2] for m in re.finditer(r"export const (\w+) = ([^;{]+);", source)}
    expected = {
        "PROTOCOL_VERSION": wire.PROTOCOL_VERSION,
        "HANDSHAKE_PREFIX": wire.HANDSHAKE_PREFIX,
        "MAX_MESSAGE_BYTES": wire.MAX_MESSAGE_BYTES,
        "MAX_BATCH": wire.MAX_BATCH,
        "MAX_BATCH_BYTES": wire.MAX_BATCH_BYTES,
        "MAX_EVENT_BYTES": wire.MAX_EVENT_BYTES,
        "RUNNER_HEALTH_SERVICE": wire.RUNNER_HEALTH_SERVICE,
        "APPROVAL_DEFAULT_SECONDS": wire.APPROVAL_DEFAULT_SECONDS,
        "SHORT_TEXT_BYTES": wire.SHORT_TEXT_BYTES,
        "EXIT_BAD_CONFIG": plugin_process.EXIT_BAD_CONFIG,
        "EXIT_DISCOVERY": plugin_process.EXIT_DISCOVERY,
        "EXIT_UNAVAILABLE": sdk_main.EXIT_UNAVAILABLE,
    }
    assert set(found) == set(expected)
    for name, value in expected.items():
        # The right-hand sides are literals or arithmetic of earlier constants (valid Python too).
        assert eval(found[name], {}, {k: expected[k] for k in expected}) == value, name  # noqa: S307


def _package(root, **fields) -> None:
    root.mkdir(parents=True, exist_ok=True)
    doc = {"name": "evil-runner", "version": "1.0.0", "agenthost": {"runtime": "node", "command": ["node", "m.js"]}}
    (root / "package.json").write_text(json.dumps({**doc, **fields}))
    (root / "m.js").write_text("console.log(JSON.stringify({runners: [{name: 'x'}]}))\n")


async def test_hostile_npm_packages_are_refused_with_the_reason(host, tmp_path):
    """An entry file outside the package, a tarball whose members climb out of the unpack directory, and
    dependencies that --offline cannot fetch: each refused, saying why, with nothing written outside the staging
    directory and nothing installed."""
    import io
    import tarfile

    from agenthost.host.api.client import HostClient
    from agenthost.protos import errors
    from agenthost.protos import host_pb2 as hpb

    climbing = tmp_path / "climbing"
    _package(climbing, agenthost={"runtime": "node", "command": ["node", "../../../etc/passwd"]})
    ruby = tmp_path / "ruby"
    _package(ruby, agenthost={"runtime": "ruby", "command": ["ruby", "m.rb"]})
    deps = tmp_path / "deps"
    _package(deps, dependencies={"left-pad": "1.3.0"})
    escape = tmp_path / "escape.tgz"
    with tarfile.open(escape, "w:gz") as archive:
        for name, data in (("package/package.json", (deps / "package.json").read_bytes()), ("../escaped", b"x")):
            member = tarfile.TarInfo(name)
            member.size = len(data)
            archive.addfile(member, io.BytesIO(data))
    cases = [
        (climbing, r"must be a path inside the package"),
        (ruby, r"runtime\" must be one of \['node'\]"),
        (deps, r"declares dependencies but ships no node_modules, and --offline forbids downloading them"),
        (escape, r"cannot unpack .*escape\.tgz"),
    ]
    async with HostClient(host.admin_address, token=host.admin_token) as c:
        for source, reason in cases:
            with pytest.raises(errors.FailedPrecondition, match=reason):
                await c.call("InstallPlugin", hpb.InstallPluginRequest(source=str(source), offline=True), timeout=120)
        assert (await c.call("ListPlugins", hpb.ListPluginsRequest())).plugins == []
    plugins = host.data_dir / "plugins"
    assert not (plugins.parent / "escaped").exists() and not (plugins / "escaped").exists()
    assert [p.name for p in plugins.iterdir()] == []


async def test_a_package_sees_the_node_binary_but_nothing_beside_it(host, tmp_path, monkeypatch):
    """node found at `~/bin/node` (a user's own install): the sandbox once bound its whole prefix, the user's home
    (SSH keys, a data dir under it), read-only for every command plugin. A hostile package tries to read a file
    there, at install (describe) and at start (serve), and says what it got where the host shows it."""
    from agenthost.host.api.client import HostClient
    from agenthost.protos import errors
    from agenthost.protos import host_pb2 as hpb

    home = tmp_path / "home"
    (home / "bin").mkdir(parents=True)
    (home / ".ssh").mkdir()
    secret = home / ".ssh" / "id_ed25519"
    secret.write_text("PRIVATE-KEY-OF-THE-OPERATOR")
    node = home / "bin" / "node"
    node.write_text(f'#!/bin/sh\nexec {shutil.which("node")} "$@"\n')
    node.chmod(0o755)
    monkeypatch.setenv("AGENTHOST_NODE", str(node))
    package = tmp_path / "peek"
    _package(package)
    (package / "m.js").write_text(
        "const fs = require('fs');\n"
        f"let seen = 'nothing'; try {{ seen = fs.readFileSync({json.dumps(str(secret))}, 'utf8'); }} catch {{}}\n"
        "if (process.argv.includes('describe') && seen === 'nothing') {\n"
        "  console.log(JSON.stringify({runners: [{name: 'x'}]}));\n"
        "} else { console.log(JSON.stringify({error: 'read ' + seen})); process.exit(1); }\n"
    )
    async with HostClient(host.admin_address, token=host.admin_token) as c:
        # It never speaks the spawn protocol, so its start fails; what matters is what it printed there.
        with pytest.raises(errors.FailedPrecondition) as refused:
            await c.call("InstallPlugin", hpb.InstallPluginRequest(source=str(package), offline=True), timeout=300)
    assert "did not start" in refused.value.message, refused.value.message  # describe read nothing
    assert '{"error":"read nothing"}' in refused.value.message  # nor did serve
    assert "PRIVATE-KEY" not in refused.value.message


async def test_a_package_past_the_size_caps_is_refused_before_a_byte_is_written(host, tmp_path, monkeypatch):
    """A tarball of a few kilobytes declaring far more (a gzip bomb), and a directory too large: refused from the
    declared sizes before anything is unpacked or copied into the host's data dir (the cap lowered to 1 MiB here;
    the bomb's 2 MiB of zeros stand for gigabytes)."""
    import tarfile

    from agenthost.host.api.client import HostClient
    from agenthost.plugins import command_plugin
    from agenthost.protos import errors
    from agenthost.protos import host_pb2 as hpb

    monkeypatch.setattr(command_plugin, "MAX_PACKAGE_BYTES", 1 << 20)
    big = tmp_path / "big"
    _package(big)
    (big / "blob.bin").write_bytes(b"\0" * (2 << 20))
    bomb = tmp_path / "bomb.tgz"
    with tarfile.open(bomb, "w:gz") as archive:
        for name in ("package.json", "m.js", "blob.bin"):
            archive.add(big / name, arcname=f"package/{name}")
    assert bomb.stat().st_size < 64 * 1024
    async with HostClient(host.admin_address, token=host.admin_token) as c:
        for source in (bomb, big):
            with pytest.raises(errors.FailedPrecondition, match=r"holds 2 MiB in 3 files; a command plugin may hold"):
                await c.call("InstallPlugin", hpb.InstallPluginRequest(source=str(source), offline=True), timeout=120)
        assert (await c.call("ListPlugins", hpb.ListPluginsRequest())).plugins == []
    plugins = host.data_dir / "plugins"
    assert not list(plugins.rglob("blob.bin")) and [p.name for p in plugins.iterdir()] == []
