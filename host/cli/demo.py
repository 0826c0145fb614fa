"""`agenthost demo`: the whole system on its embedded defaults, in a scratch data dir, with no accounts.

It starts a real host (the built-in runners as supervised processes), binds the local agent to a bot, talks to
it, then installs the example plugin into its own environment and uses it — the flow of the docs' Getting started,
end to end.
With a provider key in the environment (ANTHROPIC_API_KEY / OPENAI_API_KEY) the local agent uses that model;
with none it uses its offline demo model, which says so in every reply.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from agenthost.host.api.client import HostClient
from agenthost.host.cli.render import stream_reply
from agenthost.host.server import Host
from agenthost.protos import host_pb2 as hpb


def example_plugin() -> Path:
    """The example plugin's source, shipped inside the package (agenthost.plugins/examples/notes-runner), so the
    demo works from a wheel installed anywhere, not only from a checkout."""
    from importlib.resources import files

    return Path(str(files("agenthost.plugins").joinpath("examples", "notes-runner")))


def _say(text: str) -> None:
    print(f"\n\033[1m$ {text}\033[0m", flush=True)


async def run_demo(*, keep: bool = False) -> int:
    data_dir = Path(tempfile.mkdtemp(prefix="agenthost-demo-"))
    host = Host(data_dir)
    await host.start()
    try:
        async with HostClient(host.admin_address, token=host.admin_token, timeout=600) as c:
            _say("agenthost status")
            print(f"sandbox: {host.sandbox_status}")
            # Plugin processes never see the host's environment: a provider key reaches the local agent only
            # from the key store, through a binding that names it.
            keys = [name for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY") if os.environ.get(name)]
            for name in keys:
                _say(f"agenthost keys set {name}   # value from your environment, read on stdin")
                await c.call("SetKey", hpb.SetKeyRequest(name=name, value=os.environ[name].strip()))
            flags = "".join(f" --key {name}" for name in keys)
            _say("agenthost bots create assistant")
            _say(f"agenthost bots bind assistant --runner agenthost/local-agent{flags}")
            await c.call("CreateBot", hpb.CreateBotRequest(name="assistant"))
            await c.bind("assistant", "agenthost/local-agent", keys=keys)
            for text in ("Hello! What is in my workspace?", "Thanks. What did I ask you first?"):
                _say(f'agenthost send assistant "{text}"')
                await stream_reply(c, hpb.SendMessageRequest(bot="assistant", text=text, source="cli"))

            example = example_plugin()
            _say(f"agenthost plugins install {example} --offline")
            info = await c.call("InstallPlugin", hpb.InstallPluginRequest(source=str(example), offline=True))
            print(f"installed {info.plugin_id} {info.version} into its own environment ({info.state})")
            await c.call("CreateBot", hpb.CreateBotRequest(name="notes"))
            await c.bind("notes", "agenthost-notes/notes", {"greeting": "Noted."})
            for text in ("note water the plants", "note call the plumber", "list", "find plumber"):
                _say(f'agenthost send notes "{text}"')
                await stream_reply(c, hpb.SendMessageRequest(bot="notes", text=text, source="cli"))

            _say("agenthost runs list")
            for r in (await c.call("ListRuns", hpb.ListRunsRequest(limit=10))).runs:
                print(f"{r.run_id} {r.status:10} {r.runner_id}")
            host.audit.flush()
            await host.db.flush()
            audit = len(host.audit.rows())
            print(f"\n{audit} run-scoped API calls were checked against their run's grant and audited.")
            print(f"data dir: {data_dir}" + ("" if keep else " (removed on exit; --keep to keep it)"))
    finally:
        await host.stop()
        if not keep:
            shutil.rmtree(data_dir, ignore_errors=True)
    sys.stdout.flush()
    return 0
