"""A channel adapter's walls, attacked from inside a real adapter plugin: installed the way a user installs one,
run by the host in its sandboxed process with the credential the host gives it. It may send to its own bot and
nothing else of the host."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from conftest import Scripted

from agenthost.host.processes.channels import PROCESS_PREFIX
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.sdk.testing import HostHarness

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
INTRUDER = str(Path(__file__).resolve().parent.parent / "fixtures" / "intruder-channel")


async def test_adapter_credential_reaches_only_its_bot(tmp_path: Path) -> None:
    Scripted.seen = []
    async with HostHarness(tmp_path, runners=[Scripted], bot="support") as h:
        await h.client.call("CreateBot", hpb.CreateBotRequest(name="victim"))
        await h.client.bind("victim", "test/scripted")
        victim_run = (await h.client.send("victim", "secret business", conversation_id="private")).run.run_id
        await h.client.call("SetKey", hpb.SetKeyRequest(name="PROVIDER_API_KEY", value="sk-should-not-leak"))
        info = await h.client.call(
            "InstallPlugin", hpb.InstallPluginRequest(source=INTRUDER, offline=True), timeout=300
        )
        assert info.plugin_id == "agenthost-intruder-channel" and not info.runners  # a plugin of adapters only
        await h.client.call("SetKey", hpb.SetKeyRequest(name="INTRUDER_KEY", value="the-key-named-for-it"))
        config = {
            "victim_bot": "victim",
            "victim_run": victim_run,
            "host_data_dir": str(h.host.data_dir),
            "host_run_dir": str(h.host.runtime_dir),
        }
        # The adapter's schema defaults its secret setting to PROVIDER_API_KEY: unnamed by the operator, the add
        # is refused with what to pass, and nothing starts.
        with pytest.raises(errors.InvalidArgument, match=r"name it with `--set provider_key=NAME`"):
            await h.client.call(
                "AddChannel",
                hpb.AddChannelRequest(
                    name="evil",
                    bot="support",
                    adapter="agenthost-intruder-channel/intruder",
                    config_json=json.dumps(config),
                ),
                timeout=120,
            )
        assert not h.host.channels.list() and PROCESS_PREFIX + "evil" not in h.host.supervisor.processes
        config["provider_key"] = "INTRUDER_KEY"  # named by the operator: that key and no other
        await h.client.call(
            "AddChannel",
            hpb.AddChannelRequest(
                name="evil",
                bot="support",
                adapter="agenthost-intruder-channel/intruder",
                config_json=json.dumps(config),
            ),
            timeout=120,
        )
        await h.host.supervisor.wait_ready(PROCESS_PREFIX + "evil", 60)
        report_path = h.host.data_dir / "channels" / "evil" / "report.json"
        # Written by another process: polled (a condition, not a tuned sleep), bounded by the test's timeout.
        while not report_path.exists():  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        report = json.loads(report_path.read_text())
        assert report == {
            "list_bots": "refused: PermissionDenied",
            "create_bot": "refused: PermissionDenied",
            "bind_runner": "refused: PermissionDenied",
            "list_other_runs": "refused: PermissionDenied",
            "list_all_runs": "refused: InvalidArgument",  # a scoped caller must name its bot
            "get_other_run": "refused: NotFound",
            "other_run_events": "refused: NotFound",
            "cancel_other_run": "refused: NotFound",
            "history_other": "refused: PermissionDenied",
            "create_credential": "refused: PermissionDenied",
            "set_key": "refused: PermissionDenied",
            "list_keys": "refused: PermissionDenied",
            "add_channel": "refused: PermissionDenied",
            "install_plugin": "refused: PermissionDenied",
            "send_other_bot": "refused: PermissionDenied",
            "start_other_platform_chat": "refused: PermissionDenied",
            "send_own_bot": "ALLOWED",
            "file:admin.token": "absent",
            "file:keys.json": "absent",
            "file:credentials.json": "absent",
            "file:agenthost.db": "absent",
            "api.sock": "absent",
            "admin.sock": "visible",
            "secrets": "INTRUDER_KEY",
            "env_secrets": "none",
        }
        assert [s.text for s in Scripted.seen] == ["secret business", "hello"]
        # The credential is the host's own, for that bot alone; removing the channel revokes it.
        creds = {c.name: c for c in (await h.client.call("ListCredentials", hpb.ListCredentialsRequest())).credentials}
        support = h.host.registry.bot("support").bot_id
        assert list(creds["channel.evil"].bots) == [support] and creds["channel.evil"].scope == "send"
        with pytest.raises(errors.InvalidArgument):
            await h.client.call(
                "CreateCredential", hpb.CreateCredentialRequest(name="channel.evil2", scope="send", bots=["support"])
            )
        await h.client.call("RemoveChannel", hpb.RemoveChannelRequest(name="evil"))
        creds = (await h.client.call("ListCredentials", hpb.ListCredentialsRequest())).credentials
        assert "channel.evil" not in {c.name for c in creds}
        assert PROCESS_PREFIX + "evil" not in h.host.supervisor.processes


async def test_a_kept_adapter_description_is_used_until_the_plugin_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reused_plugin_installs: None
) -> None:
    """`channels add` describes a plugin's adapters in a sandboxed child; the report is kept by content
    (describe_cache), so the same files are not described twice, and a file changed on disk is described again."""
    from agenthost.plugins import install

    describes: list[str] = []
    real = install.describe

    async def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        describes.append(args[1])
        return await real(*args, **kwargs)

    monkeypatch.setattr(install, "describe", counted)
    async with HostHarness(tmp_path, runners=[Scripted], bot="support") as h:
        info = await h.client.call(
            "InstallPlugin", hpb.InstallPluginRequest(source=INTRUDER, offline=True), timeout=300
        )
        channels = h.host.channels
        source = channels.source(info.plugin_id)
        describes.clear()  # the install's own
        assert list(await channels.describe(source)) == ["intruder"]
        assert list(await channels.describe(source)) == ["intruder"]
        assert describes == ["agenthost-intruder-channel"]  # once: the second was kept
        module = next(Path(source.python).parents[1].rglob("agenthost_intruder_channel/__init__.py"))
        module.write_text(module.read_text().replace('name="intruder",', 'name="renamed",'))
        assert list(await channels.describe(source)) == ["renamed"]
        assert len(describes) == 2
