"""The conformance suite's runner on the Python SDK. Its twin on the TypeScript SDK is
sdk/typescript/examples/conformance-runner/src/main.ts; both obey the same script, carried in the run's input text
as JSON {"steps": [...]}, and end with one `message` whose text is the JSON list of what each step observed. The
steps (each a dict with "op"):

    deltas {n, text}                    yield `text` n times as text deltas
    tool {id, name}                     a tool_started and its tool_finished
    state_set {scope, key, value, if_version?} -> {version} | {error}
    state_get {scope, key}              -> {found, value, version}
    state_delete {scope, key}           -> {deleted}
    state_list {scope, prefix}          -> {keys}
    history {limit, direction}          -> {items: [[role, text]...], has_more}
    history_search {query}              -> {texts}
    event_get_trigger                   -> {type, text} of the event that started the run
    event_page {limit}                  -> {types}
    artifact {name, data, mime}         create, announce (artifact_created), read back -> {name, mime, size, sha256,
                                        read, range}
    approval {tool, summary, timeout}   -> {outcome, approved, note}
    child {description, text}           a child run that streams `text` -> {status}
    child_timeout {timeout}             a child run the host times out while it works; it then emits -> {error}
    park                                progress "parked", then wait until the host ends the run
    kb_search {query}                   -> {hits, keyword_only}
    reject {case}                       a call the host must refuse -> {error: the typed error's class name}
    fail {message}                      raise: the run fails with runner_error

A binding config {"refuse": "why"} is refused by the runner's own check (ValidateConfig), and every binding lists
one model, {"provider": "conformance", "model": <config's "model", default "m1">} (ListModels).

Errors are observed by class name, which is the same in both SDKs (agenthost.protos.errors, runner-sdk errors).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors
from agenthost.runners.sdk import RunAPI, RunContext, Runner, RunnerManifest, events


async def _rejected(run: RunContext, case: str) -> dict[str, Any]:
    api = run.api

    def other(run_id: str = api.run_id, token: str = api.run_token) -> RunAPI:
        return RunAPI(
            api._stub,
            run_id=run_id,
            run_token=token,
            plugin_secret=api.plugin_secret,
            deadline_at=run.deadline_at,
        )

    calls = {
        "bad_token": lambda: other(token="rt_not_a_token").state_get("run", "k"),
        "other_run": lambda: other(run_id="run_000000000000").state_get("run", "k"),
        "foreign_conversation": lambda: api.history_page(conversation_id="someone-elses"),
        "limit_out_of_range": lambda: api.history_page(limit=1000),
        "stale_version": lambda: api.state_set("conversation", "cas", 1, if_version=987654),
        "missing_artifact": lambda: api.artifact_metadata("art_doesnotexist"),
        "empty_tool_name": lambda: api.request_approval(""),
        "state_write_not_granted": lambda: api.state_set("conversation", "k", 1),
    }
    try:
        await calls[case]()
    except errors.AgentHostError as exc:
        return {"error": type(exc).__name__}
    return {"error": None}


class Conformance(Runner):
    manifest = RunnerManifest(name="conformance", description="Obeys the conformance suite's scripts")

    def validate_config(self, config: dict[str, Any]) -> list[str]:
        return [f"refuse: {config['refuse']}"] if "refuse" in config else []

    async def list_models(self, config: dict[str, Any], secrets: dict[str, str]) -> list[dict[str, str]]:
        return [{"provider": "conformance", "model": str(config.get("model", "m1"))}]

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent | str]:
        observed: list[Any] = []
        api = run.api
        for step in json.loads(run.text)["steps"]:
            op = step["op"]
            if op == "deltas":
                for _ in range(step["n"]):
                    yield step["text"]
                observed.append(step["n"])
            elif op == "tool":
                yield events.tool_started(step["id"], step["name"], {"x": 1})
                yield events.tool_finished(step["id"], step["name"], "ok")
                observed.append("tool")
            elif op == "state_set":
                try:
                    version = await api.state_set(
                        step["scope"], step["key"], step["value"], if_version=step.get("if_version")
                    )
                    observed.append({"version": version})
                except errors.AgentHostError as exc:
                    observed.append({"error": type(exc).__name__})
            elif op == "state_get":
                value = await api.state_get_versioned(step["scope"], step["key"])
                observed.append(
                    {
                        "found": value.found,
                        "value": json.loads(value.value_json) if value.found else None,
                        "version": value.version,
                    }
                )
            elif op == "state_delete":
                observed.append({"deleted": await api.state_delete(step["scope"], step["key"])})
            elif op == "state_list":
                listed = await api.state_list(step["scope"], prefix=step.get("prefix", ""))
                observed.append({"keys": list(listed.keys)})
            elif op == "history":
                page = await api.history_page(limit=step.get("limit", 50), direction=step.get("direction", "backward"))
                observed.append({"items": [[i.role, i.text] for i in page.items], "has_more": page.has_more})
            elif op == "history_search":
                found = await api.history_search(step["query"])
                observed.append({"texts": [i.text for i in found]})
            elif op == "event_get_trigger":
                event = await api.event_get(run.context.event.event_id)
                observed.append({"type": event.event_type, "text": event.text})
            elif op == "event_page":
                page = await api.event_page(limit=step.get("limit", 50))
                observed.append({"types": [e.event_type for e in page.events]})
            elif op == "artifact":
                data = step["data"].encode()
                ref = await api.artifact_create(data, name=step["name"], mime_type=step["mime"])
                yield events.artifact_created(ref)
                meta = await api.artifact_metadata(ref.artifact_id)
                read = await api.artifact_read_all(ref.artifact_id)
                chunk = await api.artifact_read_range(ref.artifact_id, 1, 3)
                observed.append(
                    {
                        "name": meta.name,
                        "mime": meta.mime_type,
                        "size": meta.size_bytes,
                        "sha256": meta.sha256 == hashlib.sha256(data).hexdigest(),
                        "read": read.decode(),
                        "range": chunk.data.decode(),
                    }
                )
            elif op == "approval":
                decision = await run.request_approval(
                    step["tool"], summary=step.get("summary", ""), timeout_seconds=step.get("timeout", 0)
                )
                observed.append({"outcome": decision.outcome, "approved": decision.approved, "note": decision.note})
            elif op == "child":
                async with run.child_run(step["description"], subagent_type="conformance") as child:
                    await child.emit(events.text(step["text"]), events.message(step["text"]))
                assert child.result is not None
                observed.append({"status": child.result.status})
            elif op == "child_timeout":
                try:
                    async with run.child_run("slow", timeout=step["timeout"]) as child:
                        await asyncio.sleep(step["timeout"] + 1.5)
                        await child.emit(events.text("too late"))
                    observed.append({"error": None})
                except errors.AgentHostError as exc:
                    observed.append({"error": type(exc).__name__})
            elif op == "park":
                yield events.progress("parked")
                await asyncio.sleep(3600)
            elif op == "kb_search":
                found = await api.kb_search(step["query"])
                observed.append({"hits": len(found.hits), "keyword_only": found.keyword_only})
            elif op == "reject":
                observed.append(await _rejected(run, step["case"]))
            elif op == "fail":
                raise RuntimeError(step["message"])
            else:
                raise ValueError(f"unknown op {op!r}")
        yield events.message(json.dumps(observed))
