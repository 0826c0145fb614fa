"""Constructors for the events a runner yields. Each returns a `RunEvent` protobuf ready for the wire.

Runners yield these from `Runner.run`; the SDK coalesces consecutive events into batches and the host assigns
sequence numbers. Exactly one terminal event (`completed` or `failed`) ends a run; if a runner returns without
one, the SDK sends `completed()` for it, and if it raises, `failed("runner_error", ...)`.
"""

from __future__ import annotations

import json
from typing import Any

from agenthost.protos import common_pb2 as pb
from agenthost.protos.wire import STATE_SCOPES

RunEvent = pb.RunEvent

_SCOPE_NAMES: dict[int, str] = {v: k for k, v in STATE_SCOPES.items()}


def text(delta: str) -> pb.RunEvent:
    """A piece of streamed assistant text."""
    # The hot path of streaming: setting the field in place is a third of the cost of building a TextDelta and
    # copying it in through the constructor.
    event = pb.RunEvent()
    event.text_delta.text = delta
    return event


def message(text: str, *, role: str = "assistant") -> pb.RunEvent:
    """A completed message. After streaming deltas, this replaces them in the transcript (it is the final text)."""
    return pb.RunEvent(message=pb.Message(role=role, text=text))


def tool_started(tool_call_id: str, tool_name: str, arguments: Any = None) -> pb.RunEvent:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments if arguments is not None else {})
    return pb.RunEvent(tool_started=pb.ToolStarted(tool_call_id=tool_call_id, tool_name=tool_name, arguments_json=args))


def tool_finished(
    tool_call_id: str, tool_name: str, result: str, *, is_error: bool = False, artifact_id: str = ""
) -> pb.RunEvent:
    return pb.RunEvent(
        tool_finished=pb.ToolFinished(
            tool_call_id=tool_call_id, tool_name=tool_name, result=result, is_error=is_error, artifact_id=artifact_id
        )
    )


def compaction(tokens_before: int, tokens_after: int, summary: str = "", artifact_id: str = "") -> pb.RunEvent:
    return pb.RunEvent(
        compaction=pb.Compaction(
            tokens_before=tokens_before, tokens_after=tokens_after, summary=summary, artifact_id=artifact_id
        )
    )


def retry(attempt: int, delay_seconds: float, reason: str) -> pb.RunEvent:
    return pb.RunEvent(retry=pb.Retry(attempt=attempt, delay_seconds=delay_seconds, reason=reason))


def state_updated(scope: str, key: str) -> pb.RunEvent:
    return pb.RunEvent(state_updated=pb.StateUpdated(scope=STATE_SCOPES[scope], key=key))


def artifact_created(artifact: pb.ArtifactRef) -> pb.RunEvent:
    return pb.RunEvent(artifact_created=pb.ArtifactCreated(artifact=artifact))


def usage(
    input_tokens: int = 0,
    output_tokens: int = 0,
    *,
    cache_read_tokens: int = 0,
    cache_write_tokens: int = 0,
    cost_usd: float = 0.0,
    model: str = "",
) -> pb.RunEvent:
    return pb.RunEvent(
        usage=pb.Usage(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cache_read_tokens=cache_read_tokens,
            cache_write_tokens=cache_write_tokens,
            cost_usd=cost_usd,
            model=model,
        )
    )


def progress(message: str, fraction: float = -1.0) -> pb.RunEvent:
    return pb.RunEvent(progress=pb.Progress(message=message, fraction=fraction))


def completed(finish_reason: str = "stop") -> pb.RunEvent:
    return pb.RunEvent(completed=pb.Completed(finish_reason=finish_reason))


def failed(code: str, message: str, *, retryable: bool = False) -> pb.RunEvent:
    return pb.RunEvent(failed=pb.Failed(code=code, message=message, retryable=retryable))


TERMINAL_KINDS = frozenset({"completed", "failed"})


def is_terminal(event: pb.RunEvent) -> bool:
    return event.WhichOneof("kind") in TERMINAL_KINDS


def scope_value(scope: str) -> pb.StateScope:
    """Maps a scope name ("conversation", ...) to its wire enum; raises ValueError for unknown names."""
    try:
        return STATE_SCOPES[scope]
    except KeyError:
        raise ValueError(f"unknown state scope {scope!r}; expected one of {sorted(STATE_SCOPES)}") from None


def scope_name(value: int) -> str:
    try:
        return _SCOPE_NAMES[value]
    except KeyError:
        raise ValueError(f"unknown state scope value {value}") from None
