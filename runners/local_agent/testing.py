"""Test doubles for the local agent, shipped with it so tests and the benchmark share them:

* `FakeRunAPI` — an in-memory stand-in for `agenthost.runners.sdk.api.RunAPI` (history, artifacts, state) that can also
  project run events into its transcript the way the host does.
* `FakeProviderServer` — a scripted HTTP/1.1 server on loopback that replays recorded SSE streams (OpenAI-compatible
  or Anthropic), errors, and broken connections, recording every request it gets.
* Builders for those streams and for a `RunContext`.

Nothing here reaches the network: the server binds 127.0.0.1 and clients are pointed at it explicitly.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors as host_errors
from agenthost.protos import run_api_pb2 as api_pb
from agenthost.protos import runner_pb2
from agenthost.runners.sdk.events import scope_value
from agenthost.runners.sdk.runner import RunContext

# ---------------------------------------------------------------- fake host API


class FakeRunAPI:
    """Implements the RunAPI methods the local agent calls, for one conversation, in memory."""

    def __init__(self, conversation_id: str = "c1", *, denied: Iterable[str] = ()) -> None:
        self.conversation_id = conversation_id
        self.items: list[pb.TranscriptItem] = []
        self.artifacts: dict[str, tuple[bytes, pb.ArtifactRef]] = {}
        self.state: dict[tuple[str, str], tuple[str, int]] = {}
        self.denied = set(denied)  # method names that raise PermissionDenied
        self.calls: list[str] = []
        self.run_id = "run-0"
        self._pending_text: list[str] = []

    def _check(self, name: str) -> None:
        self.calls.append(name)
        if name in self.denied:
            raise host_errors.PermissionDenied(f"{name} is not granted to this run")

    # ---- transcript ----

    def add_item(self, **fields: Any) -> pb.TranscriptItem:
        seq = len(self.items) + 1
        item = pb.TranscriptItem(
            item_id=f"it{seq}",
            conversation_id=self.conversation_id,
            seq=seq,
            cursor=str(seq),
            created_at=time.time(),
            **fields,
        )
        self.items.append(item)
        return item

    def add_user(self, text: str, event_id: str = "") -> pb.TranscriptItem:
        return self.add_item(
            role="user", item_type="message", text=text, event_id=event_id or f"ev{len(self.items) + 1}"
        )

    def project(self, run_events: Iterable[pb.RunEvent], run_id: str = "") -> None:
        """What the host does when a run's events arrive: tool turns and assistant text become transcript items."""
        for ev in run_events:
            kind = ev.WhichOneof("kind")
            if kind == "text_delta":
                self._pending_text.append(ev.text_delta.text)
            elif kind == "message":
                self._pending_text = []
                self.add_item(role="assistant", item_type="message", text=ev.message.text, run_id=run_id)
            elif kind == "tool_started":
                self._flush_text(run_id)
                t = ev.tool_started
                self.add_item(
                    role="assistant",
                    item_type="tool_call",
                    tool_call_id=t.tool_call_id,
                    tool_name=t.tool_name,
                    data_json=t.arguments_json or "{}",
                    run_id=run_id,
                )
            elif kind == "tool_finished":
                t = ev.tool_finished
                data = json.dumps({"artifact_id": t.artifact_id}) if t.artifact_id else "{}"
                self.add_item(
                    role="tool",
                    item_type="tool_result",
                    tool_call_id=t.tool_call_id,
                    tool_name=t.tool_name,
                    text=t.result,
                    data_json=data,
                    is_error=t.is_error,
                    run_id=run_id,
                )
            elif kind == "compaction":
                self.add_item(role="system", item_type="compaction", text=ev.compaction.summary, run_id=run_id)
            elif kind in ("completed", "failed"):
                self._flush_text(run_id)

    def _flush_text(self, run_id: str) -> None:
        if self._pending_text:
            self.add_item(role="assistant", item_type="message", text="".join(self._pending_text), run_id=run_id)
            self._pending_text = []

    async def history_page(
        self, *, conversation_id: str = "", cursor: str = "", direction: str = "backward", limit: int = 50
    ) -> api_pb.HistoryPageResponse:
        self._check("history_page")
        if conversation_id and conversation_id != self.conversation_id:
            raise host_errors.PermissionDenied("other conversation")
        limit = max(1, min(limit, 200))
        if direction == "backward":
            end = int(cursor) - 1 if cursor else len(self.items)
            start = max(0, end - limit)
            page = list(reversed(self.items[start:end]))
            has_more = start > 0
            nxt = str(start + 1) if has_more else ""
        else:
            start = int(cursor) if cursor else 0
            page = self.items[start : start + limit]
            has_more = start + limit < len(self.items)
            nxt = str(start + limit) if has_more else ""
        return api_pb.HistoryPageResponse(items=page, next_cursor=nxt, has_more=has_more)

    async def history_search(
        self,
        query: str,
        *,
        conversation_id: str = "",
        roles: Iterable[str] = (),
        item_types: Iterable[str] = (),
        top_k: int = 10,
    ) -> list[pb.TranscriptItem]:
        self._check("history_search")
        q = query.lower()
        hits = [it for it in self.items if q in it.text.lower() or q in it.data_json.lower()]
        return hits[:top_k]

    # ---- artifacts ----

    async def artifact_create(
        self,
        data: bytes,
        *,
        name: str,
        mime_type: str = "application/octet-stream",
        metadata: dict[str, Any] | None = None,
    ) -> pb.ArtifactRef:
        self._check("artifact_create")
        aid = f"art_{uuid.uuid4().hex[:12]}"
        ref = pb.ArtifactRef(
            artifact_id=aid,
            name=name,
            mime_type=mime_type,
            size_bytes=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            conversation_id=self.conversation_id,
            metadata_json=json.dumps(metadata or {}),
        )
        self.artifacts[aid] = (bytes(data), ref)
        return ref

    async def artifact_metadata(self, artifact_id: str) -> pb.ArtifactRef:
        self._check("artifact_metadata")
        if artifact_id not in self.artifacts:
            raise host_errors.NotFound(f"artifact {artifact_id} not found")
        return self.artifacts[artifact_id][1]

    async def artifact_read_range(self, artifact_id: str, offset: int = 0, length: int = 65536) -> api_pb.ArtifactChunk:
        self._check("artifact_read_range")
        if artifact_id not in self.artifacts:
            raise host_errors.NotFound(f"artifact {artifact_id} not found")
        data = self.artifacts[artifact_id][0]
        if offset > len(data):
            raise host_errors.OutOfRange("offset past end")
        return api_pb.ArtifactChunk(data=data[offset : offset + length])

    # ---- state ----

    async def state_get_versioned(self, scope: str, key: str) -> api_pb.StateValue:
        self._check("state_get")
        if (scope, key) not in self.state:
            return api_pb.StateValue(found=False)
        value, version = self.state[(scope, key)]
        return api_pb.StateValue(found=True, value_json=value, version=version)

    async def state_get(self, scope: str, key: str, default: Any = None) -> Any:
        v = await self.state_get_versioned(scope, key)
        return json.loads(v.value_json) if v.found else default

    async def state_set(self, scope: str, key: str, value: Any, *, if_version: int | None = None) -> int:
        self._check("state_set")
        current = self.state.get((scope, key), ("", 0))[1]
        if if_version is not None and if_version != current:
            raise host_errors.Aborted(f"version is {current}, not {if_version}")
        self.state[(scope, key)] = (json.dumps(value), current + 1)
        return current + 1

    async def state_delete(self, scope: str, key: str) -> bool:
        self._check("state_set")
        return self.state.pop((scope, key), None) is not None


def make_run(
    api: Any,
    text: str,
    *,
    conversation_id: str = "c1",
    config: dict[str, Any] | None = None,
    event_id: str = "",
    state: dict[str, Any] | None = None,
    run_id: str = "",
    data_dir: Path | None = None,
    deadline_at: float = 0.0,
    streaming: bool = True,
    apis: Iterable[str] = (),
    state_scopes: Iterable[str] = (),
    bot_id: str = "bot1",
) -> RunContext:
    ctx = runner_pb2.AgentRunContext(
        run_id=run_id or f"run_{uuid.uuid4().hex[:8]}",
        event=pb.EventRecord(event_id=event_id, conversation_id=conversation_id, text=text),
        conversation=runner_pb2.Conversation(conversation_id=conversation_id, bot_id=bot_id),
        input=runner_pb2.RunInput(text=text),
        config_json=json.dumps(config or {}),
        state_json=json.dumps(state or {}),
        runtime=runner_pb2.Runtime(deadline_at=deadline_at),
        delivery=runner_pb2.Delivery(surface="test", supports_streaming=streaming),
        resources=runner_pb2.Resources(apis=list(apis)),
    )
    ctx.resources.state_scopes.extend(scope_value(s) for s in state_scopes)
    rc = RunContext(context=ctx, api=api)
    if data_dir is not None:
        rc.data_dir = data_dir
    return rc


# ---------------------------------------------------------------- scripted provider server


@dataclass
class Reply:
    """One scripted HTTP response. `chunks` are written one by one (chunked encoding), `delay` seconds apart;
    with `drop_after` set, the connection is cut after that many chunks (a dropped stream)."""

    status: int = 200
    chunks: list[bytes] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "text/event-stream"
    delay: float = 0.0
    drop_after: int | None = None
    hang: bool = False  # never answer (for timeouts and cancellation)


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


class FakeProviderServer:
    def __init__(self) -> None:
        self.script: list[Reply] = []
        self.routes: dict[str, Reply] = {}  # fixed replies by "METHOD /path" (probes)
        self.requests: list[Recorded] = []
        self.default: Reply | None = None
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[Any]] = set()
        self.connections = 0  # TCP connections accepted: keep-alive reuse shows up as fewer of these
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def push(self, *replies: Reply) -> None:
        self.script.extend(replies)

    async def __aenter__(self) -> FakeProviderServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for w in list(self._conns):
            w.close()
        for t in list(self._handlers):
            t.cancel()  # a `hang` reply would otherwise keep its handler alive past the test
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2)

    @property
    def model_requests(self) -> list[Recorded]:
        return [r for r in self.requests if r.method == "POST" and r.path.endswith(("/chat/completions", "/messages"))]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns.add(writer)
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
                self.requests.append(Recorded(method, path, headers, body))
                reply = self.routes.get(f"{method} {path}")
                if reply is None:
                    reply = self.script.pop(0) if self.script else self.default
                if reply is None:
                    reply = Reply(
                        status=500,
                        chunks=[b'{"error":{"message":"fake server: script exhausted"}}'],
                        content_type="application/json",
                    )
                if not await self._respond(writer, reply):
                    return
        except (asyncio.CancelledError, ConnectionError):
            # Cancelled by __aexit__ (the top of this handler task, so nothing above needs the cancellation),
            # or the client went away mid-reply.
            return
        finally:
            self._conns.discard(writer)
            self._handlers.discard(task)
            writer.close()

    async def _respond(self, writer: asyncio.StreamWriter, reply: Reply) -> bool:
        if reply.hang:
            await asyncio.sleep(3600)
        head = [f"HTTP/1.1 {reply.status} X", f"content-type: {reply.content_type}", "transfer-encoding: chunked"]
        head += [f"{k}: {v}" for k, v in reply.headers.items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
        for n, chunk in enumerate(reply.chunks):
            if reply.drop_after is not None and n >= reply.drop_after:
                await writer.drain()
                writer.transport.abort()
                return False
            if reply.delay:
                await asyncio.sleep(reply.delay)
            if chunk:
                writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


# ---------------------------------------------------------------- stream builders


def sse(data: Any, event: str | None = None) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data)
    return (f"event: {event}\n" if event else "").encode() + f"data: {payload}\n\n".encode()


def openai_stream(chunks: list[dict[str, Any]], *, done: bool = True) -> Reply:
    return Reply(chunks=[sse(c) for c in chunks] + ([sse("[DONE]")] if done else []))


def openai_text(text: str, *, piece: int = 8, usage: tuple[int, int] | None = (100, 10)) -> Reply:
    chunks: list[dict[str, Any]] = [
        {"choices": [{"index": 0, "delta": {"content": text[i : i + piece]}, "finish_reason": None}]}
        for i in range(0, len(text), piece)
    ]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    if usage:
        chunks.append({"choices": [], "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1]}})
    return openai_stream(chunks)


def openai_tool_calls(
    calls: list[tuple[str, str, dict[str, Any]]], *, text: str = "", usage: tuple[int, int] | None = (100, 10)
) -> Reply:
    """calls: (id, name, arguments); arguments are streamed in two fragments like OpenAI does."""
    chunks: list[dict[str, Any]] = []
    if text:
        chunks.append({"choices": [{"index": 0, "delta": {"content": text}}]})
    for i, (cid, name, args) in enumerate(calls):
        raw = json.dumps(args)
        half = len(raw) // 2
        chunks.append(
            {
                "choices": [
                    {
                        "index": 0,
                        "delta": {
                            "tool_calls": [
                                {"index": i, "id": cid, "type": "function", "function": {"name": name, "arguments": ""}}
                            ]
                        },
                    }
                ]
            }
        )
        chunks.append(
            {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": i, "function": {"arguments": raw[:half]}}]}}]}
        )
        chunks.append(
            {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": i, "function": {"arguments": raw[half:]}}]}}]}
        )
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    if usage:
        chunks.append({"choices": [], "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1]}})
    return openai_stream(chunks)


def openai_error(status: int, message: str, *, code: str = "", headers: dict[str, str] | None = None) -> Reply:
    body = json.dumps({"error": {"message": message, "type": code or "error", "code": code or None}})
    return Reply(status=status, chunks=[body.encode()], content_type="application/json", headers=headers or {})


def anthropic_error(status: int, message: str, *, kind: str = "invalid_request_error") -> Reply:
    body = json.dumps({"type": "error", "error": {"type": kind, "message": message}})
    return Reply(status=status, chunks=[body.encode()], content_type="application/json")


def anthropic_stream(events: list[tuple[str, dict[str, Any]]]) -> Reply:
    return Reply(chunks=[sse({"type": name, **data}, event=name) for name, data in events])


def anthropic_text(
    text: str, *, input_tokens: int = 100, output_tokens: int = 10, thinking: tuple[str, str] | None = None
) -> Reply:
    evs: list[tuple[str, dict[str, Any]]] = [
        (
            "message_start",
            {
                "message": {
                    "id": "msg_1",
                    "role": "assistant",
                    "content": [],
                    "usage": {"input_tokens": input_tokens, "output_tokens": 1},
                }
            },
        ),
    ]
    idx = 0
    if thinking:
        evs += [
            ("content_block_start", {"index": idx, "content_block": {"type": "thinking", "thinking": ""}}),
            ("content_block_delta", {"index": idx, "delta": {"type": "thinking_delta", "thinking": thinking[0]}}),
            ("content_block_delta", {"index": idx, "delta": {"type": "signature_delta", "signature": thinking[1]}}),
            ("content_block_stop", {"index": idx}),
        ]
        idx += 1
    evs += [
        ("content_block_start", {"index": idx, "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"index": idx, "delta": {"type": "text_delta", "text": text}}),
        ("content_block_stop", {"index": idx}),
        ("message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": output_tokens}}),
        ("message_stop", {}),
    ]
    return anthropic_stream(evs)


def anthropic_tool_use(
    tool_id: str, name: str, args: dict[str, Any], *, text: str = "", thinking: tuple[str, str] | None = None
) -> Reply:
    evs: list[tuple[str, dict[str, Any]]] = [
        (
            "message_start",
            {
                "message": {
                    "id": "msg_2",
                    "role": "assistant",
                    "content": [],
                    "usage": {"input_tokens": 120, "output_tokens": 1},
                }
            },
        ),
    ]
    idx = 0
    if thinking:
        evs += [
            ("content_block_start", {"index": idx, "content_block": {"type": "thinking", "thinking": ""}}),
            ("content_block_delta", {"index": idx, "delta": {"type": "thinking_delta", "thinking": thinking[0]}}),
            ("content_block_delta", {"index": idx, "delta": {"type": "signature_delta", "signature": thinking[1]}}),
            ("content_block_stop", {"index": idx}),
        ]
        idx += 1
    if text:
        evs += [
            ("content_block_start", {"index": idx, "content_block": {"type": "text", "text": ""}}),
            ("content_block_delta", {"index": idx, "delta": {"type": "text_delta", "text": text}}),
            ("content_block_stop", {"index": idx}),
        ]
        idx += 1
    raw = json.dumps(args)
    evs += [
        (
            "content_block_start",
            {"index": idx, "content_block": {"type": "tool_use", "id": tool_id, "name": name, "input": {}}},
        ),
        ("content_block_delta", {"index": idx, "delta": {"type": "input_json_delta", "partial_json": raw[:3]}}),
        ("content_block_delta", {"index": idx, "delta": {"type": "input_json_delta", "partial_json": raw[3:]}}),
        ("content_block_stop", {"index": idx}),
        ("message_delta", {"delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 20}}),
        ("message_stop", {}),
    ]
    return anthropic_stream(evs)


# ---------------------------------------------------------------- in-process scripted provider


class ScriptedProvider:
    """A provider without HTTP: each model call pops the next assistant message and streams its text in pieces.
    Records every request so tests can assert what the model was shown."""

    provider_id = "scripted"
    model = "m"
    full_model = "scripted/m"
    context_window_hint = 100_000

    def __init__(self, turns: list[Any]) -> None:
        self.turns = list(turns)
        self.requests: list[Any] = []

    async def stream(self, request: Any) -> Any:
        from agenthost.runners.local_agent.providers.base import Final, TextChunk, Usage

        self.requests.append(request)
        message = self.turns.pop(0)
        for i in range(0, len(message.content), 5):
            yield TextChunk(message.content[i : i + 5])
        yield Final(
            message=message,
            finish_reason="tool_calls" if message.tool_calls else "stop",
            usage=Usage(input_tokens=100, output_tokens=10),
        )

    async def complete(self, request: Any) -> Any:
        final = None
        async for ev in self.stream(request):
            final = ev
        return final

    async def probe(self) -> Any:
        from agenthost.runners.local_agent.providers.base import ProbeResult

        return ProbeResult(ok=True, context_window=self.context_window_hint)

    async def aclose(self) -> None:
        return None


# ---------------------------------------------------------------- prompt-cache prefix measurement


def _strip_cache_control(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip_cache_control(v) for v in value]
    return value


def cacheable_prefix(body: dict[str, Any]) -> bytes:
    """The part of a chat request a provider's prompt cache keys on — tool schemas, system prompt, messages, in the
    order providers render them — as canonical JSON. Anthropic `cache_control` markers are left out: they mark
    where to cache, are not part of the cached content, and the last one moves forward every request by design.
    One line per tool, system block and message, so a request that only appends is an exact extension (a JSON
    array's closing bracket would otherwise count as a difference)."""
    system = body.get("system", [])
    items = [*body.get("tools", []), *(system if isinstance(system, list) else [system]), *body.get("messages", [])]
    lines = [
        json.dumps(_strip_cache_control(item), ensure_ascii=False, separators=(",", ":"), sort_keys=True)
        for item in items
    ]
    return "".join(line + "\n" for line in lines).encode("utf-8")


def common_prefix_len(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    lo, hi = 0, n
    while lo < hi:  # binary search on slice equality: C-speed comparisons instead of a Python loop per byte
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def prefix_shares(bodies: list[dict[str, Any]]) -> list[float]:
    """For each request after the first: the share of the previous request's cacheable bytes that the request
    repeats byte for byte at its start (1.0 = the previous request is entirely a prefix of this one)."""
    serialized = [cacheable_prefix(b) for b in bodies]
    return [common_prefix_len(prev, cur) / len(prev) for prev, cur in zip(serialized, serialized[1:], strict=False)]


def cache_script(provider: Literal["openai", "anthropic"], turns: int = 20) -> list[tuple[str, list[Reply]]]:
    """A scripted conversation of `turns` user messages and the model replies each one gets: plain answers, and
    every few turns tool calls that change the workspace, the todo list and the user's memory — the state a
    per-turn system prompt would have re-rendered. Tool-call ids are unique across the conversation."""
    tool_turns: dict[int, list[tuple[str, dict[str, Any]]]] = {
        1: [("write_file", {"path": "notes.txt", "content": "alpha\nbeta\n"})],
        3: [("todo_write", {"items": [{"content": "draft the plan", "status": "in_progress"}]})],
        5: [("read_file", {"path": "notes.txt"}), ("list_files", {})],
        8: [("memory", {"action": "add", "target": "notes", "content": "Prefers short answers"})],
        11: [("edit_file", {"path": "notes.txt", "old_string": "beta", "new_string": "gamma"})],
        14: [("todo_write", {"items": [{"content": "draft the plan", "status": "completed"}]})],
        17: [("grep", {"pattern": "gamma"})],
    }
    script: list[tuple[str, list[Reply]]] = []
    for turn in range(turns):
        replies: list[Reply] = []
        for step, (name, args) in enumerate(tool_turns.get(turn, [])):
            cid = f"call_{turn}_{step}"
            if provider == "openai":
                replies.append(openai_tool_calls([(cid, name, args)], text=f"Step {step} of turn {turn}."))
            else:
                replies.append(anthropic_tool_use(cid, name, args, text=f"Step {step} of turn {turn}."))
        answer = f"Answer {turn}: " + "done. " * (5 + turn % 4)
        replies.append(openai_text(answer) if provider == "openai" else anthropic_text(answer))
        script.append((f"Message {turn}: please continue with part {turn} of the task.", replies))
    return script
