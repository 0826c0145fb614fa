"""The `compact` tool, end to end through the real host: the model asks for a compaction and gets the guarantees of
the automatic one (the transcript saved as a host artifact, the current request kept verbatim, never a summary
to act on), a result saying what happened, and a refusal when it asks again without the context having grown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agenthost.runners.local_agent.compaction import SUMMARIZER_SYSTEM
from agenthost.runners.local_agent.runner import LocalAgentRunner
from agenthost.runners.local_agent.testing import FakeProviderServer, openai_text, openai_tool_calls
from agenthost.runners.local_agent.tools.compact import REQUESTED
from agenthost.runners.local_agent.tools.files import file_tools
from agenthost.runners.sdk.testing import HostHarness

FIRST = "The code word is PELICAN-7. Remember it for later."
SECOND = "Start phase two: write notes.txt containing the code word."


def of_kind(events: list[Any], kind: str) -> list[Any]:
    return [getattr(e, kind) for e in events if e.WhichOneof("kind") == kind]


async def test_e2e_compact_tool(tmp_path: Path) -> None:
    async with FakeProviderServer() as server:
        config = {"model": "vllm/m", "base_url": server.url + "/v1", "context_window": 32_000, "max_retries": 0}
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=config) as h:
            server.push(openai_text("Noted. " + "background " * 300))
            assert (await h.send(FIRST, conversation_id="cc")).run.status == "completed"

            server.push(
                openai_tool_calls([("k1", "compact", {"focus": "the code word"})]),
                openai_text("SUMMARY: the user set the code word PELICAN-7.", usage=None),  # the summary call
                openai_tool_calls([("w1", "write_file", {"path": "notes.txt", "content": "PELICAN-7"})]),
                openai_tool_calls([("k2", "compact", {})]),
                openai_text("Wrote notes.txt."),
            )
            r = await h.send(SECOND, conversation_id="cc")
            assert r.run.status == "completed", r.run.error_message
            assert r.text == "Wrote notes.txt."

            # One compaction (the second call was refused), its transcript stored in the host.
            [compaction] = of_kind(r.events, "compaction")
            assert compaction.summary.startswith("SUMMARY: the user set the code word")
            assert compaction.tokens_after < compaction.tokens_before
            found = h.host.artifacts.get(compaction.artifact_id)
            assert found is not None
            ref, _ = found
            transcript = h.host.artifacts.read(ref.sha256, 0, ref.size_bytes).decode()
            lines = [json.loads(line) for line in transcript.splitlines()]
            assert {"role": "user", "content": FIRST} in [{k: m[k] for k in ("role", "content")} for m in lines]
            assert any("background" in m["content"] for m in lines if m["role"] == "assistant")

            # The summarizer was asked to keep what the model named.
            summary_calls = [
                q.json() for q in server.model_requests if SUMMARIZER_SYSTEM[:40] in q.json()["messages"][0]["content"]
            ]
            assert len(summary_calls) == 1 and "keep in particular: the code word" in str(summary_calls[0])

            # The first request after the compaction: the summary, then the current request verbatim as a user
            # message, then the compact exchange with a result that says what happened.
            after = server.model_requests[-3].json()["messages"]
            assert [m["role"] for m in after] == ["system", "user", "user", "assistant", "tool"]
            assert after[1]["content"].startswith("[CONTEXT SUMMARY") and FIRST not in after[1]["content"]
            assert after[2] == {"role": "user", "content": SECOND}
            assert not any(m["role"] == "user" and m["content"] == FIRST for m in after)
            result = after[4]["content"]
            assert result.startswith("Compacted:") and compaction.artifact_id in result
            assert "continue working on it" in result

            # The second compact call, right after the first, was refused and cost no summary call.
            final = server.model_requests[-1].json()["messages"]
            assert "Not compacted" in final[-1]["content"] and final[-1]["tool_call_id"] == "k2"
            # The host transcript holds what streamed when each call finished.
            finished = {e.tool_call_id: e.result for e in of_kind(r.events, "tool_finished")}
            assert finished["k1"] == REQUESTED

            workspace = next((tmp_path / "runner-data").rglob("notes.txt"))
            assert workspace.read_text() == "PELICAN-7"


async def test_compact_tool_is_not_offered_on_a_small_window_unless_listed(tmp_path: Path) -> None:
    async with FakeProviderServer() as server:
        base = {"model": "vllm/m", "base_url": server.url + "/v1", "max_retries": 0}
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config={**base, "context_window": 8192}) as h:
            server.push(openai_text("small"))
            assert (await h.send("hi", conversation_id="s")).run.status == "completed"
            offered = {t["function"]["name"] for t in server.model_requests[-1].json()["tools"]}
            assert "compact" not in offered and "task_create" not in offered and "read_file" in offered
            tools = [t.name for t in file_tools()] + ["compact", "task_list"]
            await h.client.bind(h.bot, "test/local-agent", {**base, "context_window": 8192, "tools": tools}, priority=5)
            server.push(openai_text("listed"))
            assert (await h.send("hi again", conversation_id="s2")).run.status == "completed"
            offered = {t["function"]["name"] for t in server.model_requests[-1].json()["tools"]}
            assert {"compact", "task_list"} <= offered and "task_create" not in offered
