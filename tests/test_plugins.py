"""Installing plugins from a wheel and a requirement, and managing them: list, disable, enable, remove."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agenthost.host.api.client import HostClient
from agenthost.host.server import Host
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, events

pytestmark = pytest.mark.slow
NOTES = Path(__file__).resolve().parent.parent / "plugins" / "examples" / "notes-runner"


@pytest.fixture(scope="module")
def notes_wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheels")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(NOTES)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return next(out.glob("agenthost_notes-*.whl"))


@pytest.fixture
async def host(tmp_path):
    h = Host(tmp_path / "data", builtin_plugins=False)
    await h.start()
    client = HostClient(h.admin_address, token=h.admin_token)
    yield h, client
    await client.close()
    await h.stop()


@pytest.mark.parametrize("kind", ["wheel", "requirement"])
async def test_install_from_wheel_or_requirement_then_manage(host, notes_wheel, kind):
    h, c = host
    source = str(notes_wheel) if kind == "wheel" else f"agenthost-notes @ {notes_wheel.as_uri()}"
    info = await c.call("InstallPlugin", hpb.InstallPluginRequest(source=source, offline=True), timeout=300)
    assert (info.plugin_id, info.version, info.state) == ("agenthost-notes", "0.1.0", "ready")
    env = h.data_dir / "plugins" / "agenthost-notes" / "env"
    assert env.is_dir()
    # the plugin's code lives in its own env, not the host's
    assert list(env.rglob("agenthost_notes/__init__.py"))
    await c.call("CreateBot", hpb.CreateBotRequest(name="n"))
    await c.bind("n", "agenthost-notes/notes")
    assert (await c.send("n", "note a")).run.status == "completed"

    off = await c.call("SetPluginEnabled", hpb.SetPluginEnabledRequest(plugin_id="agenthost-notes", enabled=False))
    assert not off.enabled and off.state == "stopped"
    with pytest.raises(errors.FailedPrecondition, match="disabled"):
        await c.send("n", "note b")
    on = await c.call("SetPluginEnabled", hpb.SetPluginEnabledRequest(plugin_id="agenthost-notes", enabled=True))
    assert on.state == "ready"
    assert "2 notes" in (await c.send("n", "note b")).text

    await c.call("RemovePlugin", hpb.PluginRequest(plugin_id="agenthost-notes"))
    assert not env.exists()
    assert (await c.call("ListPlugins", hpb.ListPluginsRequest())).plugins == []
    with pytest.raises(errors.NotFound):
        await c.call("RemovePlugin", hpb.PluginRequest(plugin_id="agenthost-notes"))


async def test_install_failures_say_why(host, tmp_path):
    h, c = host
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "pyproject.toml").write_text('[project]\nname = "broken-plugin"\nversion = "1"\n')
    with pytest.raises(errors.FailedPrecondition, match="declares no \\[agenthost.runners\\] entry points"):
        await c.call("InstallPlugin", hpb.InstallPluginRequest(source=str(broken), offline=True), timeout=300)
    with pytest.raises(errors.FailedPrecondition, match="pip could not install"):
        await c.call(
            "InstallPlugin", hpb.InstallPluginRequest(source="surely-not-a-real-package-xyz", offline=True), timeout=300
        )
    assert not [p for p in (h.data_dir / "plugins").iterdir()] or all(
        not p.name.startswith(".staging") for p in (h.data_dir / "plugins").iterdir()
    )
    with pytest.raises(errors.InvalidArgument):
        await c.call("InstallPlugin", hpb.InstallPluginRequest(source=""))


async def test_builtin_plugins_cannot_be_removed(tmp_path):
    async with Host(tmp_path / "d") as h, HostClient(h.admin_address, token=h.admin_token) as c:
        with pytest.raises(errors.FailedPrecondition, match="built-in"):
            await c.call("RemovePlugin", hpb.PluginRequest(plugin_id="agenthost"))


class Hello(Runner):
    manifest = RunnerManifest(name="hello")

    async def run(self, run: RunContext):
        yield events.text(f"hello {run.text}")


async def test_the_pytest_fixture_for_runner_authors(agenthost_harness):
    async with agenthost_harness(runners=[Hello]) as h:
        result = await h.send("world")
        assert result.run.status == "completed" and result.text == "hello world"


async def test_hash_pinned_install(host, notes_wheel, tmp_path):
    """--require-hashes: a requirements file pinning the plugin by sha256 installs; a wrong or missing hash, or a
    source that is not a requirements file, is refused with pip's or our reason and leaves nothing installed."""
    import hashlib

    h, c = host
    digest = hashlib.sha256(notes_wheel.read_bytes()).hexdigest()
    pinned = tmp_path / "pinned.txt"
    pinned.write_text(f"agenthost-notes @ {notes_wheel.as_uri()} --hash=sha256:{digest}\n")
    tampered = tmp_path / "tampered.txt"
    tampered.write_text(f"agenthost-notes @ {notes_wheel.as_uri()} --hash=sha256:{'0' * 64}\n")
    unpinned = tmp_path / "unpinned.txt"
    unpinned.write_text(f"agenthost-notes @ {notes_wheel.as_uri()}\n")

    def request(source: Path | str) -> hpb.InstallPluginRequest:
        return hpb.InstallPluginRequest(source=str(source), offline=True, require_hashes=True)

    with pytest.raises(errors.FailedPrecondition, match="(?i)hash"):
        await c.call("InstallPlugin", request(tampered), timeout=300)
    with pytest.raises(errors.FailedPrecondition, match="(?i)hash"):
        await c.call("InstallPlugin", request(unpinned), timeout=300)
    with pytest.raises(errors.FailedPrecondition, match="requirements file"):
        await c.call("InstallPlugin", request(notes_wheel), timeout=300)
    assert [p.plugin_id for p in h.registry.plugins()] == []
    info = await c.call("InstallPlugin", request(pinned), timeout=300)
    assert (info.plugin_id, info.state) == ("agenthost-notes", "ready")
