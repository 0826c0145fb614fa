"""The OpenAI wire shapes the gateway speaks: request parsing, response objects, stream chunks, and the text a run
produced.

The host owns each conversation's history, so only the request's last user message is sent to the bot; earlier
messages, `instructions`, system prompts and sampling parameters are accepted and not used (the bot's binding
decides its model and prompt). Ids are the run's own: `chatcmpl-<hex>` and `resp_<hex>` carry the hex of
`run_<hex>`, so a response id leads back to its run, and through the run to its bot and conversation.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Any

from agenthost.host.api.gateway.errors import bad_request
from agenthost.protos import common_pb2 as pb
from agenthost.protos import host_pb2 as hpb
from agenthost.protos.media import IMAGE_TYPES

MAX_USER_CHARS = 256  # the `user` field: it names an actor and, as a fallback, a conversation
FINISH_REASONS = frozenset({"stop", "length", "content_filter"})
_RUN_HEX = re.compile(r"run_([0-9a-f]{32})")
_RESPONSE_ID = re.compile(r"resp_([0-9a-f]{32})")
# `data:<media type>[;params];base64,<data>`: the only image URL the gateway takes (the host fetches nothing).
_DATA_URL = re.compile(r"data:([^;,]*)((?:;[^;,]*)*),(.*)", re.DOTALL)


# ---- ids ----


def _hex(run_id: str) -> str:
    m = _RUN_HEX.fullmatch(run_id)
    if m is None:  # the host's run ids always match; anything else is a bug worth seeing
        raise ValueError(f"unexpected run id {run_id!r}")
    return m.group(1)


def completion_id(run_id: str) -> str:
    return f"chatcmpl-{_hex(run_id)}"


def response_id(run_id: str) -> str:
    return f"resp_{_hex(run_id)}"


def message_id(run_id: str) -> str:
    return f"msg_{_hex(run_id)}"


def run_id_of_response(value: Any) -> str:
    """The run behind a `previous_response_id`; malformed ids are a 400, unknown ones are the caller's 404."""
    m = _RESPONSE_ID.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        raise bad_request("previous_response_id must be a response id (resp_...)", "previous_response_id")
    return f"run_{m.group(1)}"


# ---- requests ----


@dataclass(frozen=True)
class ChatRequest:
    model: str
    text: str
    stream: bool
    include_usage: bool
    user: str
    attachments: tuple[hpb.Attachment, ...] = ()


@dataclass(frozen=True)
class ResponsesRequest:
    model: str  # "" when previous_response_id names the bot
    text: str
    stream: bool
    user: str
    previous_response_id: str
    attachments: tuple[hpb.Attachment, ...] = ()


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request(f"{name} must be a boolean", name)
    return value


def _user(body: dict[str, Any]) -> str:
    user = body.get("user")
    if user is None:
        return ""
    if not isinstance(user, str) or not 0 < len(user) <= MAX_USER_CHARS or not user.isprintable():
        raise bad_request(f"user must be 1-{MAX_USER_CHARS} printable characters", "user")
    return user


def _model(body: dict[str, Any], *, required: bool = True) -> str:
    model = body.get("model")
    if model is None and not required:
        return ""
    if not isinstance(model, str) or not model:
        raise bad_request("model is required: the name of the bot to talk to", "model")
    return model


def _content(
    content: Any, param: str, part_types: tuple[str, ...], image_type: str
) -> tuple[str, tuple[hpb.Attachment, ...]]:
    """A message's text (a string, or its text parts joined) and its images (`image_type` parts holding `data:`
    URLs, which become message attachments). Other parts (files, audio) are refused rather than dropped: the bot
    would answer a question it never saw."""
    if isinstance(content, str):
        return content, ()
    if not isinstance(content, list):
        raise bad_request("message content must be a string or a list of content parts", param)
    texts = []
    images: list[hpb.Attachment] = []
    for i, part in enumerate(content):
        where = f"{param}.{i}"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == image_type:
            assert isinstance(part, dict)
            url = part.get("image_url")
            if isinstance(url, dict):  # chat completions: {"image_url": {"url": ..., "detail": ...}}
                url = url.get("url")
            images.append(_image(url, where, len(images)))
            continue
        if kind not in part_types or not isinstance(part.get("text"), str):  # type: ignore[union-attr]
            allowed = ", ".join((*part_types, image_type))
            raise bad_request(f"only text and image content parts ({allowed}) are supported", where)
        texts.append(part["text"])  # type: ignore[index]
    return "".join(texts), tuple(images)


def _image(url: Any, param: str, index: int) -> hpb.Attachment:
    """An image part's `data:` URL as an attachment; the host checks its type against its bytes."""
    if not isinstance(url, str):
        raise bad_request("an image part needs an image URL", param)
    if url.startswith(("http://", "https://")):
        raise bad_request(
            "image URLs are not fetched: send the image inline as a data: URL (data:image/png;base64,...)", param
        )
    m = _DATA_URL.fullmatch(url)
    if m is None or "base64" not in [p.strip().lower() for p in m.group(2).split(";")]:
        raise bad_request("an image must be a base64 data: URL (data:image/png;base64,...)", param)
    try:
        data = base64.b64decode(m.group(3), validate=True)
    except (binascii.Error, ValueError):
        raise bad_request("the image's data: URL is not valid base64", param) from None
    mime = m.group(1).strip().lower()
    if mime not in IMAGE_TYPES:
        # An image part the model cannot see as one (an SVG, an HTML page) would reach the bot as a file of that
        # type while the client believes it sent an image.
        raise bad_request(f"an image part takes PNG, JPEG, GIF or WebP, not {mime[:80]!r}", param)
    ext = {"image/png": ".png", "image/jpeg": ".jpg", "image/gif": ".gif", "image/webp": ".webp"}.get(mime, "")
    return hpb.Attachment(name=f"image-{index + 1}{ext}", mime_type=mime, data=data)


def _nonempty(text: str, param: str, attachments: tuple[hpb.Attachment, ...] = ()) -> str:
    if not text.strip() and not attachments:
        raise bad_request("the last user message is empty", param)
    return text


def parse_chat(body: dict[str, Any]) -> ChatRequest:
    model = _model(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list", "messages")
    last = messages[-1]
    param = f"messages.{len(messages) - 1}"
    if not isinstance(last, dict) or last.get("role") != "user":
        raise bad_request(
            "the last message must have role 'user': it is what is sent to the bot (the host keeps the history)",
            param,
        )
    text, attachments = _content(last.get("content"), f"{param}.content", ("text",), "image_url")
    text = _nonempty(text, f"{param}.content", attachments)
    n = body.get("n")
    if n is not None and n != 1:
        raise bad_request("n must be 1: a bot gives one reply per message", "n")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad_request("stream_options must be an object", "stream_options")
    stream = _flag(body, "stream")
    include_usage = _flag(options or {}, "include_usage")
    if include_usage and not stream:
        raise bad_request("stream_options is only allowed when stream is true", "stream_options")
    return ChatRequest(
        model=model,
        text=text,
        stream=stream,
        include_usage=include_usage,
        user=_user(body),
        attachments=attachments,
    )


def parse_responses(body: dict[str, Any]) -> ResponsesRequest:
    previous = body.get("previous_response_id")
    model = _model(body, required=previous is None)
    raw = body.get("input")
    attachments: tuple[hpb.Attachment, ...] = ()
    if isinstance(raw, str):
        text = raw
    elif isinstance(raw, list) and raw:
        last = raw[-1]
        param = f"input.{len(raw) - 1}"
        if not isinstance(last, dict) or last.get("role") != "user" or last.get("type", "message") != "message":
            raise bad_request(
                "the last input item must be a user message: it is what is sent to the bot (the host keeps the "
                "history)",
                param,
            )
        text, attachments = _content(last.get("content"), f"{param}.content", ("input_text", "text"), "input_image")
    else:
        raise bad_request("input must be a string or a non-empty list of input items", "input")
    return ResponsesRequest(
        model=model,
        text=_nonempty(text, "input", attachments),
        stream=_flag(body, "stream"),
        user=_user(body),
        previous_response_id=run_id_of_response(previous) if previous is not None else "",
        attachments=attachments,
    )


# ---- the text a client sees ----


class TextAssembler:
    """Turns a run's events into the reply text, as deltas while it streams and whole at the end, the way the host
    records it (RunManager._flush_text): streamed deltas form a segment; a `message` is a segment's final text
    (completing or replacing its deltas); a tool call or the end closes a segment; segments join with a blank line.

    A `message` that differs from the deltas already streamed cannot be taken back from a stream: the stream keeps
    what it sent, and `text` (the non-streaming reply) has the message."""

    SEPARATOR = "\n\n"

    def __init__(self) -> None:
        self._segments: list[str] = []
        self._streamed = ""  # this segment's deltas so far

    def feed(self, event: pb.RunEvent) -> str:
        """The text to send for `event` ("" for none)."""
        kind = event.WhichOneof("kind")
        if kind == "text_delta":
            delta = event.text_delta.text
            if not delta:
                return ""
            lead = self.SEPARATOR if not self._streamed and self._segments else ""
            self._streamed += delta
            return lead + delta
        if kind == "message":
            final, streamed = event.message.text, self._streamed
            self._streamed = ""
            if not final:
                self._close(streamed)
                return ""
            lead = self.SEPARATOR if not streamed and self._segments else ""
            self._segments.append(final)
            if not streamed:
                return lead + final
            return final[len(streamed) :] if final.startswith(streamed) else ""
        if kind in ("tool_started", "completed", "failed"):
            self._close(self._streamed)
            self._streamed = ""
        return ""

    def _close(self, segment: str) -> None:
        if segment:
            self._segments.append(segment)

    @property
    def text(self) -> str:
        return self.SEPARATOR.join(self._segments + ([self._streamed] if self._streamed else []))


def finish_reason(event: pb.RunEvent | None) -> str:
    if event is not None and event.WhichOneof("kind") == "completed":
        reason = event.completed.finish_reason
        return reason if reason in FINISH_REASONS else "stop"
    return "stop"


# ---- chat completions ----


def chat_usage(usage: pb.Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cache_read_tokens},
    }


def chat_completion(run: hpb.RunInfo, model: str, text: str, reason: str) -> dict[str, Any]:
    return {
        "id": completion_id(run.run_id),
        "object": "chat.completion",
        "created": int(run.created_at),
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None,
                "finish_reason": reason,
            }
        ],
        "usage": chat_usage(run.usage),
    }


class ChatChunks:
    """`chat.completion.chunk` objects of one streamed completion. With include_usage, every chunk carries
    `usage: null` and one last chunk with no choices carries the totals (OpenAI's stream_options contract)."""

    def __init__(self, run: hpb.RunInfo, model: str, include_usage: bool) -> None:
        self._base = {
            "id": completion_id(run.run_id),
            "object": "chat.completion.chunk",
            "created": int(run.created_at),
            "model": model,
            "system_fingerprint": None,
        }
        self._include_usage = include_usage

    def _chunk(self, delta: dict[str, Any], reason: str | None) -> dict[str, Any]:
        chunk = {**self._base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]}
        if self._include_usage:
            chunk["usage"] = None
        return chunk

    def role(self) -> dict[str, Any]:
        return self._chunk({"role": "assistant", "content": ""}, None)

    def content(self, text: str) -> dict[str, Any]:
        return self._chunk({"content": text}, None)

    def finish(self, reason: str) -> dict[str, Any]:
        return self._chunk({}, reason)

    def usage(self, usage: pb.Usage) -> dict[str, Any] | None:
        if not self._include_usage:
            return None
        return {**self._base, "choices": [], "usage": chat_usage(usage)}


# ---- responses ----


def responses_usage(usage: pb.Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": usage.cache_read_tokens},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


_RESPONSE_STATUS = {"completed": "completed", "cancelled": "cancelled", "queued": "queued", "running": "in_progress"}


def output_message(run_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "id": message_id(run_id),
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if text else [],
    }


def response_object(
    run: hpb.RunInfo, model: str, previous_response_id: str, text: str | None = None, user: str = ""
) -> dict[str, Any]:
    """The Response resource for a run; `text` None while it is in progress (no output yet)."""
    status = _RESPONSE_STATUS.get(run.status, "failed")
    error = None
    if status == "failed":
        error = {
            "code": run.error_code or "server_error",
            "message": f"run {run.run_id} {run.status}: {run.error_message}".rstrip(": "),
        }
    done = run.status not in ("queued", "running")
    return {
        "id": response_id(run.run_id),
        "object": "response",
        "created_at": run.created_at,
        "completed_at": run.finished_at if done else None,
        "status": status,
        "error": error,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "model": model,
        "output": [output_message(run.run_id, text, "completed")] if text else [],
        "parallel_tool_calls": False,
        "previous_response_id": previous_response_id or None,
        "temperature": None,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": None,
        "usage": responses_usage(run.usage) if done else None,
        "user": user or None,
    }


class ResponseEvents:
    """The Responses streaming events of one run, numbered: created and in_progress; the output message and its
    text part opened at the first text; deltas; the part, item and text closed; then completed or failed."""

    def __init__(self, run: hpb.RunInfo, model: str, previous_response_id: str, user: str) -> None:
        self._run = run
        self._model = model
        self._previous = previous_response_id
        self._user = user
        self._seq = 0
        self._item_id = message_id(run.run_id)
        self._open = False

    def _event(self, kind: str, **fields: Any) -> tuple[str, dict[str, Any]]:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return kind, event

    def start(self) -> list[tuple[str, dict[str, Any]]]:
        running = hpb.RunInfo()
        running.CopyFrom(self._run)
        running.status = "running"
        response = response_object(running, self._model, self._previous, user=self._user)
        return [
            self._event("response.created", response=response),
            self._event("response.in_progress", response=response),
        ]

    def delta(self, text: str) -> list[tuple[str, dict[str, Any]]]:
        out = []
        if not self._open:
            self._open = True
            out.append(
                self._event(
                    "response.output_item.added",
                    output_index=0,
                    item=output_message(self._run.run_id, "", "in_progress"),
                )
            )
            out.append(
                self._event(
                    "response.content_part.added",
                    item_id=self._item_id,
                    output_index=0,
                    content_index=0,
                    part={"type": "output_text", "text": "", "annotations": [], "logprobs": []},
                )
            )
        out.append(
            self._event(
                "response.output_text.delta",
                item_id=self._item_id,
                output_index=0,
                content_index=0,
                delta=text,
                logprobs=[],
            )
        )
        return out

    def finish(self, run: hpb.RunInfo, streamed: str) -> list[tuple[str, dict[str, Any]]]:
        """`streamed`: the text the deltas carried (what a client assembled), closed out as the output's text."""
        out = []
        if self._open:
            part = {"type": "output_text", "text": streamed, "annotations": [], "logprobs": []}
            ids = {"item_id": self._item_id, "output_index": 0, "content_index": 0}
            out.append(self._event("response.output_text.done", **ids, text=streamed, logprobs=[]))
            out.append(self._event("response.content_part.done", **ids, part=part))
            out.append(
                self._event(
                    "response.output_item.done", output_index=0, item=output_message(run.run_id, streamed, "completed")
                )
            )
        response = response_object(run, self._model, self._previous, streamed, self._user)
        kind = "response.completed" if response["status"] == "completed" else "response.failed"
        out.append(self._event(kind, response=response))
        return out

    def error(self, code: str, message: str) -> tuple[str, dict[str, Any]]:
        return self._event("error", code=code, message=message, param=None)
