"""A Telegram world for end-to-end tests: a fake Bot API on loopback, a real host with a scripted in-process
runner bound to bot `support`, and the real Telegram adapter in its supervised, sandboxed process."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agenthost.host.processes.channels import PROCESS_PREFIX
from agenthost.host.processes.supervisor import SupervisorPolicy
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.local_agent.approvals import summary as local_agent_summary
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, events
from agenthost.runners.sdk.testing import HostHarness

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fixtures"))

from fake_telegram import FakeTelegram  # noqa: E402

TOKEN = "123456:TEST-token-for-the-fake-api"


@dataclass
class Seen:
    conversation_id: str
    text: str
    actor_id: str
    display_name: str
    source: str
    attachments: list[Any] = field(default_factory=list)


class Scripted(Runner):
    """Answers by the message: `slow …` streams word by word, `long N` writes N characters in paragraphs,
    `approve-me [TIMEOUT]` asks for an approval and answers with the decision, `link URL` writes URL with a
    secret in its query, `fail` raises; anything else is echoed back in a few deltas. Every run is recorded in
    `seen`."""

    manifest = RunnerManifest(name="scripted", description="scripted replies for channel tests")
    seen: list[Seen] = []
    gate: asyncio.Event | None = None

    async def run(self, run: RunContext):  # type: ignore[no-untyped-def]
        ctx = run.context
        Scripted.seen.append(
            Seen(
                run.conversation_id,
                run.text,
                ctx.actor.actor_id,
                ctx.actor.display_name,
                ctx.event.source if ctx.HasField("event") else "",
                list(ctx.input.attachments),
            )
        )
        text = run.text
        if text.startswith("slow"):
            for word in ("Streaming", "this", "reply", "word", "by", "word."):
                yield events.text(word + " ")
                await asyncio.sleep(0.3)  # a model's pace between tokens, so edits can happen in between
            return
        if text.startswith("long"):
            n = int(text.split()[1])
            paragraph = ("lorem ipsum dolor sit amet " * 12).strip() + ".\n\n"
            body = (paragraph * (n // len(paragraph) + 1))[:n]
            for i in range(0, n, 2000):
                yield events.text(body[i : i + 2000])
            return
        if text == "wait":
            assert Scripted.gate is not None
            await Scripted.gate.wait()
            yield events.text("done waiting")
            return
        if run.context.input.attachments:
            # Files in: say what arrived; files out: send each back, flipped, as a file this run made.
            refs = list(run.context.input.attachments)
            yield events.text(f"got {len(refs)} file(s): " + ", ".join(f"{r.name} ({r.mime_type})" for r in refs))
            for ref in refs:
                data = await run.api.artifact_read_all(ref.artifact_id)
                made = await run.api.artifact_create(data, name=f"back-{ref.name}", mime_type=ref.mime_type)
                yield events.artifact_created(made)
            report = await run.api.artifact_create(b"a report\n", name="report.txt", mime_type="text/plain")
            yield events.artifact_created(report)
            return
        if text.startswith(("approve-me", "approve-command ")):
            # A tool call that needs a person: the decision is the reply. `approve-command CMD`: the model's command,
            # summarised as the local agent does.
            command = text.removeprefix("approve-command ") if text.startswith("approve-command ") else ""
            timeout = float(text.split()[1]) if len(text.split()) > 1 and not command else 30.0
            decision = await run.request_approval(
                "shell",
                summary=local_agent_summary("shell", {"command": command}) if command else "rm -rf /tmp/build",
                arguments={"command": command or "rm -rf /tmp/build"},
                reason="matches approvals.commands 'rm *'",
                timeout_seconds=timeout,
                tool_call_id="call_1",
            )
            yield events.text(f"decision: {decision.outcome} ({decision.note or 'no note'})")
            return
        if text.startswith("link "):
            # A model steered (by a page it read, say) into writing a link that carries the conversation off.
            yield events.text("Here is your summary: ")
            yield events.text(f"{text.split()[1]}?notes=a+secret+plan")
            return
        if text == "fail":
            yield events.text("Let me think")
            raise RuntimeError("the model exploded\nwith a traceback nobody should see")
        yield events.text("You said: ")
        yield events.text(text)


@dataclass
class World:
    harness: HostHarness
    fake: FakeTelegram
    channel: str = "tg"

    @property
    def host(self) -> Any:
        return self.harness.host

    async def add_channel(self, name: str = "tg", **config: Any) -> hpb.ChannelInfo:
        settings = {
            "token_key": "TELEGRAM_BOT_TOKEN",
            "api_url": self.fake.url,
            "poll_timeout": 1,
            "edit_interval": 0.25,
            **config,
        }
        info = await self.harness.client.call(
            "AddChannel",
            hpb.AddChannelRequest(name=name, bot="support", adapter="telegram", config_json=json.dumps(settings)),
            timeout=60,
        )
        self.channel = name
        await self.ready()
        return info

    async def ready(self) -> None:
        """The adapter's process is up and polling."""
        await self.host.supervisor.wait_ready(PROCESS_PREFIX + self.channel, 30)
        polls = len(self.fake.of("getUpdates"))
        await self.fake.wait_for(lambda f: len(f.of("getUpdates")) > polls or bool(f.webhook), 30)

    @property
    def process(self) -> Any:
        return self.host.supervisor.processes[PROCESS_PREFIX + self.channel]

    def state(self) -> dict[str, Any]:
        path = self.host.data_dir / "channels" / self.channel / "state.json"
        return json.loads(path.read_text()) if path.exists() else {}

    async def settled(self) -> None:
        """Every reply the adapter owes is delivered (none pending in its state)."""
        await self.fake.wait_for(lambda f: not self.state().get("pending"))

    def log(self) -> str:
        path = self.host.data_dir / "logs" / f"{PROCESS_PREFIX}{self.channel}.log"
        return path.read_text() if path.exists() else ""


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    Scripted.seen = []
    Scripted.gate = asyncio.Event()
    fake = await FakeTelegram(TOKEN).start()
    policy = SupervisorPolicy(backoff_base=0.1, backoff_max=1.0, stable_after=2.0)
    try:
        async with HostHarness(tmp_path, runners=[Scripted], bot="support", policy=policy) as harness:
            await harness.client.call("SetKey", hpb.SetKeyRequest(name="TELEGRAM_BOT_TOKEN", value=TOKEN))
            yield World(harness, fake)
            Scripted.gate.set()
    finally:
        await fake.stop()
