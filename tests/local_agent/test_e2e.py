"""End to end through the real host: gRPC AgentHost API → run orchestration → SDK server → LocalAgentRunner →
scripted provider on loopback, with the host's real stores behind the run API."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest

from agenthost.host.processes.supervisor import SupervisorPolicy
from agenthost.protos import common_pb2 as pb
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.local_agent.providers.demo import DEMO_LABEL
from agenthost.runners.local_agent.runner import LocalAgentRunner
from agenthost.runners.local_agent.testing import FakeProviderServer, openai_text, openai_tool_calls
from agenthost.runners.sdk.testing import HostHarness

# Unique to this process, so another test run on the same machine cannot be mistaken for ours.
SLEEP = f"31.{os.getpid() % 10000:04d}"


class Forgetful(LocalAgentRunner):
    """The local agent, with a handle on its instances so a test can wipe its disk between runs."""

    instances: ClassVar[list[LocalAgentRunner]] = []

    def __init__(self, data_dir: Path, **kwargs: Any) -> None:
        super().__init__(data_dir, **kwargs)
        Forgetful.instances.append(self)

    @classmethod
    def lose_disk(cls) -> None:
        for runner in cls.instances:
            runner._sessions.clear()
            shutil.rmtree(runner.data_dir / "sessions", ignore_errors=True)


def cfg(server: FakeProviderServer, **extra: object) -> dict[str, object]:
    return {"model": "vllm/m", "base_url": server.url + "/v1", "context_window": 32_000, "max_retries": 1, **extra}


async def history(h: HostHarness, conversation_id: str) -> list[pb.TranscriptItem]:
    resp = await h.client.call(
        "GetHistory", hpb.GetHistoryRequest(bot=h.bot, conversation_id=conversation_id, limit=100, direction=pb.FORWARD)
    )
    return list(resp.items)


async def test_e2e_multi_turn_with_tools(tmp_path: Path) -> None:
    async with FakeProviderServer() as server:
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=cfg(server)) as h:
            server.push(
                openai_tool_calls(
                    [("c1", "write_file", {"path": "a.txt", "content": "hi"}), ("c2", "read_file", {"path": "a.txt"})],
                    text="Writing.",
                ),
                openai_text("Wrote and read it."),
            )
            r = await h.send("make a file", conversation_id="conv")
            assert r.run.status == "completed", r.run.error_message
            assert r.text == "Writing.\n\nWrote and read it."
            finished = [e.tool_finished for e in r.events if e.WhichOneof("kind") == "tool_finished"]
            assert [f.tool_call_id for f in finished] == ["c1", "c2"] and "1\thi" in finished[1].result

            server.push(openai_text("You asked me to make a file."))
            r = await h.send("what did I ask?", conversation_id="conv")
            assert r.run.status == "completed"
            roles = [m["role"] for m in server.model_requests[-1].json()["messages"]]
            assert roles == ["system", "user", "assistant", "tool", "tool", "assistant", "user"]
            items = await history(h, "conv")
            assert [(i.role, i.item_type) for i in items] == [
                # write_file is not read-only, so the two calls ran one after the other
                ("user", "message"),
                ("assistant", "message"),
                ("assistant", "tool_call"),
                ("tool", "tool_result"),
                ("assistant", "tool_call"),
                ("tool", "tool_result"),
                ("assistant", "message"),
                ("user", "message"),
                ("assistant", "message"),
            ]


async def test_e2e_lost_session_rebuilt_from_host_history(tmp_path: Path) -> None:
    async with FakeProviderServer() as server:
        Forgetful.instances.clear()
        async with HostHarness(tmp_path, runners=[Forgetful], config=cfg(server)) as h:
            server.push(
                openai_tool_calls([("c1", "list_files", {}), ("c2", "glob", {"pattern": "*"})], text="Look."),
                openai_text("Nothing there."),
            )
            assert (await h.send("what is here?", conversation_id="lost")).run.status == "completed"
            Forgetful.lose_disk()
            server.push(openai_text("I remember."))
            r = await h.send("and before?", conversation_id="lost")
            assert r.run.status == "completed", r.run.error_message
            msgs = server.model_requests[-1].json()["messages"]
            assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "tool", "assistant", "user"]
            assert [tc["id"] for tc in msgs[2]["tool_calls"]] == ["c1", "c2"] and msgs[2]["content"] == "Look."
            assert [msgs[3]["tool_call_id"], msgs[4]["tool_call_id"]] == ["c1", "c2"]
            assert json.loads(msgs[2]["tool_calls"][1]["function"]["arguments"]) == {"pattern": "*"}
            assert msgs[-1]["content"] == "and before?" and msgs[1]["content"] == "what is here?"


async def test_e2e_offline_demo_by_default(tmp_path: Path) -> None:
    async with HostHarness(tmp_path, runners=[LocalAgentRunner], config={}) as h:
        r = await h.send("hello", conversation_id="d")
        assert r.run.status == "completed" and DEMO_LABEL in r.text
        assert "tool_started" in r.kinds() and r.run.usage.model == "demo/offline"


async def test_e2e_cancel_mid_stream(tmp_path: Path) -> None:
    async with FakeProviderServer() as server:
        slow = openai_text("z" * 2000, piece=4)
        slow.delay = 0.02
        server.push(slow)
        server.default = openai_text("should not be asked")
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=cfg(server)) as h:
            request = hpb.SendMessageRequest(bot=h.bot, text="long answer please", conversation_id="x", source="api")
            run_id, cancelled_at, finished = "", 0.0, None
            async for reply in h.client.stream(request, timeout=30):
                kind = reply.WhichOneof("kind")
                if kind == "run_started":
                    run_id = reply.run_started.run_id
                elif (
                    kind == "events"
                    and not cancelled_at
                    and any(e.WhichOneof("kind") == "text_delta" for e in reply.events.events)
                ):
                    cancelled_at = time.monotonic()
                    await h.client.call("CancelRun", hpb.RunRequestById(run_id=run_id))
                elif kind == "run_finished":
                    finished = reply.run_finished
                    break
            assert finished is not None and finished.status == "cancelled"
            assert time.monotonic() - cancelled_at < 2
            await asyncio.sleep(0.3)
            assert len(server.model_requests) == 1  # no retry after cancel
            # The conversation goes on after a cancelled run.
            server.default = None
            server.push(openai_text("back"))
            r = await h.send("still there?", conversation_id="x")
            assert r.run.status == "completed" and r.text == "back"


@pytest.mark.slow
async def test_e2e_compaction_in_a_long_conversation(tmp_path: Path) -> None:
    async with FakeProviderServer() as server:
        server.default = openai_text("SUMMARY: numbered questions about padding", usage=None)
        config = cfg(server, context_window=6000, compaction_watermark=0.6)
        Forgetful.instances.clear()
        async with HostHarness(tmp_path, runners=[Forgetful], config=config) as h:
            compactions = []
            for i in range(16):
                server.push(
                    openai_tool_calls([(f"t{i}", "list_files", {})], usage=None),
                    openai_text(f"answer {i} " + "a" * 500, usage=None),
                )
                r = await h.send(f"question {i} " + "q" * 500, conversation_id="long")
                assert r.run.status == "completed", (i, r.run.error_message)
                compactions += [e.compaction for e in r.events if e.WhichOneof("kind") == "compaction"]
            assert compactions and all(c.tokens_after < c.tokens_before for c in compactions)
            assert all(c.artifact_id for c in compactions)
            items = await history(h, "long")
            assert sum(i.item_type == "compaction" for i in items) == len(compactions)
            for req in server.model_requests:
                msgs = req.json()["messages"]
                calls = [tc["id"] for m in msgs if m["role"] == "assistant" for tc in m.get("tool_calls", [])]
                results = [m["tool_call_id"] for m in msgs if m["role"] == "tool"]
                assert calls == results  # paired in every request, across every compaction

            # The runner loses its disk: it continues from the checkpoint in host state plus the host transcript.
            Forgetful.lose_disk()
            server.push(openai_text("continuing from the summary"))
            r = await h.send("where were we?", conversation_id="long")
            assert r.run.status == "completed", r.run.error_message
            msgs = server.model_requests[-1].json()["messages"]
            assert "CONTEXT SUMMARY" in msgs[1]["content"] and msgs[-1]["content"] == "where were we?"
            assert len(msgs) < 2 + 4 * 16  # not the whole conversation again
            calls = [tc["id"] for m in msgs if m["role"] == "assistant" for tc in m.get("tool_calls", [])]
            assert calls == [m["tool_call_id"] for m in msgs if m["role"] == "tool"]


@pytest.mark.slow
async def test_e2e_runner_killed_mid_tool_call_and_restarted(tmp_path: Path) -> None:
    policy = SupervisorPolicy(backoff_base=0.05, backoff_max=0.2, stable_after=0.5)
    async with FakeProviderServer() as server:
        async with HostHarness(tmp_path, builtin=True, policy=policy) as h:
            pp = await h.host.supervisor.wait_ready("agenthost", 30)
            await h.bind("agenthost/local-agent", cfg(server, max_retries=0))
            server.push(openai_tool_calls([("k1", "shell", {"command": f"sleep {SLEEP}"})], text="Running it."))
            task = asyncio.create_task(h.send("run the slow job", conversation_id="k"))
            # Wait until the host has recorded the tool call: the runner is inside (or entering) the shell tool.
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:  # noqa: ASYNC110 — history is the observable signal
                if any(i.item_type == "tool_call" for i in await history(h, "k")):
                    break
                await asyncio.sleep(0.05)
            while not sleepers(SLEEP) and time.monotonic() < deadline:  # noqa: ASYNC110 — /proc is the signal
                await asyncio.sleep(0.05)
            assert pp.proc is not None
            first_pid = pp.proc.pid
            os.killpg(first_pid, signal.SIGKILL)
            r = await asyncio.wait_for(task, 20)
            assert r.run.status in ("failed", "interrupted"), r.run.status
            # The command's sandbox dies with the runner (bwrap --die-with-parent ends its pid namespace).
            deadline = time.monotonic() + 10
            while sleepers(SLEEP) and time.monotonic() < deadline:  # noqa: ASYNC110 — /proc is the signal
                await asyncio.sleep(0.05)
            assert not sleepers(SLEEP), "the shell command outlived the killed runner"
            # The run can fail before the supervisor has noticed the death; wait for the replacement process.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # noqa: ASYNC110 — the supervisor exposes no restart event
                pp = h.host.supervisor.processes["agenthost"]
                if pp.state == "ready" and pp.proc is not None and pp.proc.pid != first_pid:
                    break
                await asyncio.sleep(0.05)
            assert pp.proc is not None and pp.proc.pid != first_pid and pp.state == "ready"
            server.push(openai_text("The job was interrupted when I restarted."))
            r = await h.send("did the job finish?", conversation_id="k")
            assert r.run.status == "completed", r.run.error_message
            msgs = server.model_requests[-1].json()["messages"]
            assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "user"]
            assert msgs[2]["tool_calls"][0]["id"] == "k1"
            assert msgs[3]["tool_call_id"] == "k1" and "interrupted" in msgs[3]["content"]
            assert not sleepers(SLEEP)


def sleepers(marker: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().split(b"\0")
                state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if marker.encode() in cmdline and state != "Z":
                found.append(int(proc.name))
    return found
