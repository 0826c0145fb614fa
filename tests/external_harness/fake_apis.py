"""Fake Anthropic Messages and OpenAI Responses APIs on loopback, scripted per test.

A script is a function of the request that returns the reply as a list of blocks:
`{"type": "text", "text": ...}` or `{"type": "tool", "name": ..., "input": {...}}` (a tool call; Codex MCP
tools are named `<server>.<tool>`). The script is stateless: it looks at the request (the newest prompt and how
many model steps followed it), which is what makes it work across processes and across `--resume`.

Guards keep a confused client from spinning: a request cap, a wall-clock cap per server, and the rule that a
tool call the request does not offer becomes a text reply naming the problem.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Block = dict[str, Any]
MAX_REQUESTS = 200


@dataclass
class Request:
    """One model request as the script sees it."""

    body: dict[str, Any]
    prompt: str  # the newest user prompt
    steps: int  # model replies since that prompt (0 = first call of the turn)
    last_tool_result: str
    tools: list[str]

    @property
    def raw(self) -> str:
        """The whole request as text, for marker assertions."""
        return json.dumps(self.body, ensure_ascii=False)


Script = Callable[[Request], list[Block]]


def _text_of(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    out = []
    for part in content or []:
        if isinstance(part, dict):
            if isinstance(part.get("text"), str):
                out.append(part["text"])
            elif "content" in part:
                out += _text_of(part["content"])
            elif isinstance(part.get("output"), str):
                out.append(part["output"])
    return out


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class FakeAPI:
    """Base: a loopback HTTP server in a thread; subclasses parse requests and render replies."""

    def __init__(self, script: Script, *, max_seconds: float = 300.0, max_requests: int = MAX_REQUESTS) -> None:
        self.script = script
        self.requests: list[Request] = []
        self.max_seconds = max_seconds
        self.max_requests = max_requests
        self.hang_event = threading.Event()  # set to release requests a script asked to hang
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:  # noqa: N802
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:  # noqa: N802
                self._json(200, {"data": [], "object": "list"})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    self._json(400, {"error": {"type": "invalid_request_error", "message": "bad json"}})
                    return
                status, content_type, payload = fake.handle(self.path, body)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _json(self, status: int, doc: Any) -> None:
                payload = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._started = 0.0

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def __enter__(self) -> FakeAPI:
        self._started = time.monotonic()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.hang_event.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def handle(self, path: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
        raise NotImplementedError

    def _blocks(self, request: Request) -> list[Block]:
        with self._lock:
            self.requests.append(request)
            over = len(self.requests) > self.max_requests or time.monotonic() - self._started > self.max_seconds
        if over:
            return [{"type": "text", "text": "FAKE-ERROR: request cap reached"}]
        blocks = self.script(request)
        if any(b.get("type") == "http_error" for b in blocks):
            return blocks
        if any(b.get("type") == "hang" for b in blocks):
            # Holds the request open (bounded) so a test can cancel the harness mid-call.
            self.hang_event.wait(timeout=min(60.0, self.max_seconds))
            return [{"type": "text", "text": "released"}]
        checked = []
        for block in blocks:
            if block["type"] == "tool" and block["name"] not in request.tools:
                checked.append(
                    {"type": "text", "text": f"FAKE-ERROR: tool {block['name']} not offered: {request.tools}"}
                )
            else:
                checked.append(block)
        return checked


def _sse(events: list[tuple[str, dict[str, Any]]]) -> bytes:
    return "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events).encode()


class FakeAnthropic(FakeAPI):
    """POST /v1/messages (streaming SSE or JSON)."""

    def handle(self, path: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
        if not path.startswith("/v1/messages") or path.startswith("/v1/messages/count_tokens"):
            if path.startswith("/v1/messages/count_tokens"):
                return 200, "application/json", b'{"input_tokens": 10}'
            return 200, "application/json", b"{}"
        request = self._parse(body)
        if not request.tools and request.steps == 0 and "stream" in body and not request.prompt:
            blocks = [{"type": "text", "text": "aux"}]
        else:
            blocks = self._blocks(request)
        for block in blocks:
            if block["type"] == "http_error":
                error = {
                    "type": "error",
                    "error": {
                        "type": block.get("error_type", "authentication_error"),
                        "message": block.get("message", "invalid x-api-key"),
                    },
                }
                return block.get("status", 401), "application/json", json.dumps(error).encode()
        return self._render(body, blocks)

    @staticmethod
    def _parse(body: dict[str, Any]) -> Request:
        messages = body.get("messages") or []
        prompt_index, prompt = -1, ""
        for i in range(len(messages) - 1, -1, -1):
            msg = messages[i]
            content = msg.get("content")
            parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
            if msg.get("role") != "user" or any(p.get("type") == "tool_result" for p in parts if isinstance(p, dict)):
                continue
            texts = [
                p.get("text", "")
                for p in parts
                if isinstance(p, dict)
                and p.get("type") == "text"
                and not p.get("text", "").startswith("<system-reminder>")
            ]
            if texts:
                prompt_index, prompt = i, texts[-1]
                break
        steps = sum(1 for m in messages[prompt_index + 1 :] if m.get("role") == "assistant")
        last_result = ""
        for msg in reversed(messages):
            content = msg.get("content")
            if isinstance(content, list):
                results = [p for p in content if isinstance(p, dict) and p.get("type") == "tool_result"]
                if results:
                    last_result = "\n".join(_text_of(results[-1].get("content")))
                    break
        tools = [t.get("name", "") for t in body.get("tools") or []]
        return Request(body=body, prompt=prompt, steps=steps, last_tool_result=last_result, tools=tools)

    def _render(self, body: dict[str, Any], blocks: list[Block]) -> tuple[int, str, bytes]:
        msg_id = f"msg_fake_{uuid.uuid4().hex[:20]}"
        model = body.get("model") or "claude-fake"
        content = []
        for block in blocks:
            if block["type"] == "tool":
                content.append(
                    {
                        "type": "tool_use",
                        "id": f"toolu_fake_{uuid.uuid4().hex[:20]}",
                        "name": block["name"],
                        "input": block.get("input") or {},
                    }
                )
            else:
                content.append({"type": "text", "text": block["text"]})
        stop = "tool_use" if any(c["type"] == "tool_use" for c in content) else "end_turn"
        usage = {
            "input_tokens": 100,
            "output_tokens": 10,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
        }
        if not body.get("stream"):
            doc = {
                "id": msg_id,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": content,
                "stop_reason": stop,
                "stop_sequence": None,
                "usage": usage,
            }
            return 200, "application/json", json.dumps(doc).encode()
        events: list[tuple[str, dict[str, Any]]] = [
            (
                "message_start",
                {
                    "type": "message_start",
                    "message": {
                        "id": msg_id,
                        "type": "message",
                        "role": "assistant",
                        "model": model,
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": {**usage, "output_tokens": 1},
                    },
                },
            ),
        ]
        for i, c in enumerate(content):
            if c["type"] == "text":
                events.append(
                    (
                        "content_block_start",
                        {"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}},
                    )
                )
                text = c["text"]
                # Several deltas per block so token streaming is observable.
                for piece in [text[j : j + 8] for j in range(0, len(text), 8)] or [""]:
                    events.append(
                        (
                            "content_block_delta",
                            {"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": piece}},
                        )
                    )
            else:
                events.append(
                    (
                        "content_block_start",
                        {
                            "type": "content_block_start",
                            "index": i,
                            "content_block": {"type": "tool_use", "id": c["id"], "name": c["name"], "input": {}},
                        },
                    )
                )
                events.append(
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": i,
                            "delta": {"type": "input_json_delta", "partial_json": json.dumps(c["input"])},
                        },
                    )
                )
            events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
        events.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": 10},
                },
            )
        )
        events.append(("message_stop", {"type": "message_stop"}))
        return 200, "text/event-stream", _sse(events)


class FakeOpenAI(FakeAPI):
    """POST /v1/responses (streaming SSE or JSON), as Codex calls it."""

    def handle(self, path: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
        if not path.startswith("/v1/responses"):
            return 404, "application/json", b'{"error": {"message": "not found"}}'
        request = self._parse(body)
        blocks = self._blocks(request)
        for block in blocks:
            if block["type"] == "http_error":
                error = {
                    "error": {
                        "type": "invalid_request_error",
                        "code": block.get("code", "invalid_api_key"),
                        "message": block.get("message", "Incorrect API key provided"),
                    }
                }
                return block.get("status", 401), "application/json", json.dumps(error).encode()
        return self._render(body, blocks)

    @staticmethod
    def _tool_names(body: dict[str, Any]) -> list[str]:
        names = []
        for tool in body.get("tools") or []:
            if tool.get("type") == "namespace":
                names += [f"{tool.get('name')}.{t.get('name')}" for t in tool.get("tools") or []]
            elif tool.get("name"):
                names.append(tool["name"])
        return names

    @classmethod
    def _parse(cls, body: dict[str, Any]) -> Request:
        items = body.get("input") or []
        if isinstance(items, str):
            items = [{"type": "message", "role": "user", "content": items}]
        prompt_index, prompt = -1, ""
        for i in range(len(items) - 1, -1, -1):
            item = items[i]
            if item.get("type", "message") == "message" and item.get("role") == "user":
                texts = [t for t in _text_of(item.get("content")) if not t.lstrip().startswith(("<", "# AGENTS.md"))]
                if texts:
                    prompt_index, prompt = i, texts[-1]
                    break
        after = items[prompt_index + 1 :]
        steps = sum(1 for it in after if it.get("type") == "function_call" or it.get("role") == "assistant")
        last_result = ""
        for item in reversed(items):
            if item.get("type") in ("function_call_output", "custom_tool_call_output"):
                output = item.get("output")
                last_result = output if isinstance(output, str) else json.dumps(output)
                break
        return Request(body=body, prompt=prompt, steps=steps, last_tool_result=last_result, tools=cls._tool_names(body))

    def _render(self, body: dict[str, Any], blocks: list[Block]) -> tuple[int, str, bytes]:
        resp_id = f"resp_fake_{uuid.uuid4().hex[:16]}"
        model = body.get("model") or "gpt-fake"
        output = []
        for block in blocks:
            if block["type"] == "tool":
                namespace, _, name = block["name"].rpartition(".")
                item = {
                    "type": "function_call",
                    "id": f"fc_{uuid.uuid4().hex[:16]}",
                    "call_id": f"call_{uuid.uuid4().hex[:16]}",
                    "name": name,
                    "arguments": json.dumps(block.get("input") or {}),
                    "status": "completed",
                }
                if namespace:
                    item["namespace"] = namespace
                output.append(item)
            else:
                output.append(
                    {
                        "type": "message",
                        "id": f"msg_{uuid.uuid4().hex[:16]}",
                        "role": "assistant",
                        "status": "completed",
                        "content": [{"type": "output_text", "text": block["text"], "annotations": []}],
                    }
                )
        usage = {
            "input_tokens": 100,
            "input_tokens_details": {"cached_tokens": 20},
            "output_tokens": 10,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 110,
        }
        response = {
            "id": resp_id,
            "object": "response",
            "created_at": int(time.time()),
            "model": model,
            "status": "completed",
            "output": output,
            "usage": usage,
        }
        if not body.get("stream"):
            return 200, "application/json", json.dumps(response).encode()
        events: list[tuple[str, dict[str, Any]]] = [
            (
                "response.created",
                {"type": "response.created", "response": {**response, "status": "in_progress", "output": []}},
            ),
        ]
        for i, item in enumerate(output):
            events.append(
                (
                    "response.output_item.added",
                    {
                        "type": "response.output_item.added",
                        "output_index": i,
                        "item": {**item, "status": "in_progress"},
                    },
                )
            )
            if item["type"] == "message":
                text = item["content"][0]["text"]
                events.append(
                    (
                        "response.output_text.delta",
                        {
                            "type": "response.output_text.delta",
                            "item_id": item["id"],
                            "output_index": i,
                            "content_index": 0,
                            "delta": text,
                        },
                    )
                )
            events.append(
                ("response.output_item.done", {"type": "response.output_item.done", "output_index": i, "item": item})
            )
        events.append(("response.completed", {"type": "response.completed", "response": response}))
        return 200, "text/event-stream", _sse(events)
