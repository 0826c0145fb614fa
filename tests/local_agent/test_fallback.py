"""Fallback models, end to end: the real host drives the local agent against two or more scripted model servers on
loopback, one per model, so what each model was asked is observable on its own server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agenthost.protos import common_pb2 as pb
from agenthost.runners.local_agent.compaction import SUMMARIZER_SYSTEM
from agenthost.runners.local_agent.config import LocalAgentConfig
from agenthost.runners.local_agent.runner import LocalAgentRunner
from agenthost.runners.local_agent.testing import (
    FakeProviderServer,
    Reply,
    openai_error,
    openai_text,
    openai_tool_calls,
)
from agenthost.runners.sdk.testing import HostHarness

# Retry-After: 0 keeps the retry policy's real path (classify, count, back off) without a real wait.
NOW = {"retry-after": "0"}


def overloaded() -> Reply:
    return openai_error(529, "Overloaded", code="overloaded_error", headers=NOW)


def server_error() -> Reply:
    return openai_error(503, "upstream is down", headers=NOW)


def route(server: FakeProviderServer, name: str, **extra: Any) -> dict[str, Any]:
    return {"model": f"vllm/{name}", "base_url": server.url + "/v1", "context_window": 32_000, **extra}


def of_kind(events: list[pb.RunEvent], kind: str) -> list[Any]:
    return [getattr(e, kind) for e in events if e.WhichOneof("kind") == kind]


async def test_overloaded_primary_moves_the_run_to_the_fallback_with_a_notice(tmp_path: Path) -> None:
    async with FakeProviderServer() as primary, FakeProviderServer() as backup:
        config = {**route(primary, "big"), "max_retries": 1, "fallback_models": [route(backup, "small")]}
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=config) as h:
            primary.push(overloaded(), overloaded())
            backup.push(
                openai_tool_calls([("c1", "write_file", {"path": "a.txt", "content": "x"})]),
                openai_text("Done on the backup."),
            )
            r = await h.send("write a.txt", conversation_id="fb")
            assert r.run.status == "completed", r.run.error_message
            assert r.text == "Done on the backup."
            # The retry policy ran on the primary first (one retry), then gave up and moved on.
            assert len(primary.model_requests) == 2 and len(backup.model_requests) == 2
            retries = of_kind(r.events, "retry")
            assert len(retries) == 2
            assert "overloaded" in retries[0].reason and "fallback" not in retries[0].reason
            notice = retries[1].reason
            assert "vllm/big failed" in notice and "overloaded" in notice and "after 2 attempts" in notice
            assert "continuing on fallback model vllm/small" in notice
            # The fallback saw the whole conversation (the user message), and it is the model that answered.
            sent = backup.model_requests[0].json()
            assert sent["model"] == "small" and sent["messages"][-1] == {"role": "user", "content": "write a.txt"}
            assert r.run.usage.model == "vllm/small"
            assert {u.model for u in of_kind(r.events, "usage")} == {"vllm/small"}

            # The next run starts on the primary again.
            primary.push(openai_text("Primary is back."))
            r = await h.send("again", conversation_id="fb")
            assert r.run.status == "completed" and r.text == "Primary is back."
            assert len(backup.model_requests) == 2


async def test_auth_failure_does_not_fall_back(tmp_path: Path) -> None:
    async with FakeProviderServer() as primary, FakeProviderServer() as backup:
        config = {**route(primary, "big"), "max_retries": 3, "fallback_models": [route(backup, "small")]}
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=config) as h:
            primary.push(openai_error(401, "Incorrect API key provided", code="invalid_api_key"))
            backup.default = openai_text("must not be asked")
            r = await h.send("hello", conversation_id="auth")
            assert r.run.status == "failed"
            assert r.run.error_code == "provider_auth", r.run.error_code
            assert "auth" in r.run.error_message and "Incorrect API key" in r.run.error_message
            assert len(primary.model_requests) == 1  # not retried either
            assert backup.requests == []  # the fallback server was never contacted
            assert of_kind(r.events, "retry") == []


async def test_exhausted_chain_fails_naming_every_model(tmp_path: Path) -> None:
    async with FakeProviderServer() as a, FakeProviderServer() as b, FakeProviderServer() as c:
        config = {
            **route(a, "first"),
            "max_retries": 1,
            # The middle one cannot even be set up: its key variable is unset. It is skipped, and named.
            "fallback_models": [
                {"model": "openai/second", "api_key_env": "NO_SUCH_KEY_VARIABLE_FOR_TEST"},
                route(b, "third"),
                route(c, "fourth"),
            ],
        }
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=config) as h:
            a.push(overloaded(), overloaded())
            b.push(server_error(), server_error())
            c.push(openai_error(429, "slow down", code="rate_limit_exceeded", headers=NOW), server_error())
            r = await h.send("hello", conversation_id="all")
            assert r.run.status == "failed"
            message = r.run.error_message
            assert message.startswith("every configured model failed"), message
            for label in ("vllm/first", "openai/second", "vllm/third", "vllm/fourth"):
                assert label in message, (label, message)
            assert "NO_SUCH_KEY_VARIABLE_FOR_TEST" in message and "HTTP 529" in message and "HTTP 503" in message
            assert message.index("vllm/first") < message.index("vllm/third") < message.index("vllm/fourth")
            assert r.run.error_code == "provider_unavailable"  # the last model's failure
            assert [len(s.model_requests) for s in (a, b, c)] == [2, 2, 2]
            assert sum("continuing on fallback model" in x.reason for x in of_kind(r.events, "retry")) == 2


async def test_compaction_summary_uses_its_own_model_and_falls_back(tmp_path: Path) -> None:
    async with (
        FakeProviderServer() as main,
        FakeProviderServer() as summarizer,
        FakeProviderServer() as summarizer_backup,
    ):
        config = {
            **route(main, "main"),
            "compaction": {
                "model": route(summarizer, "cheap"),
                "fallback_models": [route(summarizer_backup, "cheap2")],
            },
        }
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=config) as h:
            main.push(openai_text("The code word is PELICAN-7. " + "padding " * 200))
            assert (await h.send("tell me the code word", conversation_id="cs")).run.status == "completed"
            summarizer.push(server_error())
            summarizer_backup.push(openai_text("SUMMARY-FROM-BACKUP: the code word is PELICAN-7", usage=None))
            main.push(openai_tool_calls([("k1", "compact", {})]), openai_text("Compacted and ready."))
            r = await h.send("compact your context now", conversation_id="cs")
            assert r.run.status == "completed", r.run.error_message
            [compaction] = of_kind(r.events, "compaction")
            assert compaction.summary.startswith("SUMMARY-FROM-BACKUP")
            notes = [p.message for p in of_kind(r.events, "progress")]
            assert any("summary model vllm/cheap failed" in n and "HTTP 503" in n for n in notes), notes
            assert any("summary written by fallback model vllm/cheap2" in n for n in notes), notes
            # The summary request went to the summary models only, never to the run's own model.
            for server in (summarizer, summarizer_backup):
                assert SUMMARIZER_SYSTEM[:40] in server.model_requests[0].json()["messages"][0]["content"]
            assert all(SUMMARIZER_SYSTEM[:40] not in str(req.json()["messages"][0]) for req in main.model_requests)
            last = main.model_requests[-1].json()["messages"]
            assert "SUMMARY-FROM-BACKUP" in last[1]["content"]


def test_config_shape_and_bind_time_checks(tmp_path: Path) -> None:
    parsed = LocalAgentConfig.parse(
        {
            "fallback_models": ["openai/gpt-4.1-mini", {"model": "anthropic/claude-x", "api_key_env": "ANTH_B"}],
            "compaction": {"model": "ollama/qwen3", "fallback_models": ["vllm/m"]},
        }
    )
    assert [r.model for r in parsed.fallback_routes()] == ["openai/gpt-4.1-mini", "anthropic/claude-x"]
    assert parsed.fallback_routes()[1].api_key_env == "ANTH_B"
    assert [r.model for r in parsed.compaction.routes()] == ["ollama/qwen3", "vllm/m"]
    runner = LocalAgentRunner(tmp_path, env={})
    problems = runner.validate_config({"fallback_models": ["vllm/ok", {"model": "bad"}]})
    assert any("fallback_models.1" in p and "provider/model" in p for p in problems), problems
    problems = runner.validate_config({"fallback_models": ["vllm/ok", "nope/model"]})
    assert len(problems) == 1 and "fallback_models" in problems[0] and "'nope'" in problems[0], problems
    problems = runner.validate_config({"compaction": {"model": "nope/x"}})
    assert problems and "compaction" in problems[0]
