"""A run's stream rendered for a terminal: what `agenthost send`, `agenthost chat` and `agenthost demo` print."""

from __future__ import annotations

import sys
from typing import Any

from agenthost.host.client import HostClient
from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb


class Printer:
    """Renders a run's stream for a terminal: text as it arrives, tools and notes on their own lines."""

    def __init__(self, out: Any = None) -> None:
        self.out = out or sys.stdout
        self.mid_line = False

    def _line(self, text: str) -> None:
        if self.mid_line:
            self.out.write("\n")
            self.mid_line = False
        self.out.write(text + "\n")

    def event(self, ev: pb.RunEvent) -> None:
        kind = ev.WhichOneof("kind")
        if kind == "text_delta":
            self.out.write(ev.text_delta.text)
            self.mid_line = not ev.text_delta.text.endswith("\n")
        elif kind == "tool_started":
            self._line(f"  ⚙ {ev.tool_started.tool_name}({ev.tool_started.arguments_json[:200]})")
        elif kind == "tool_finished":
            mark = "✗" if ev.tool_finished.is_error else "✓"
            self._line(f"  {mark} {ev.tool_finished.result[:300].replace(chr(10), ' ')}")
        elif kind == "retry":
            self._line(f"  … retry {ev.retry.attempt} in {ev.retry.delay_seconds:.1f}s: {ev.retry.reason}")
        elif kind == "compaction":
            self._line(f"  … compacted context {ev.compaction.tokens_before} → {ev.compaction.tokens_after} tokens")
        elif kind == "progress":
            self._line(f"  … {ev.progress.message}")
        self.out.flush()

    def finished(self, run: hpb.RunInfo, streamed_text: bool) -> None:
        if not streamed_text and run.text:
            self._line(run.text)
        if self.mid_line:
            self.out.write("\n")
            self.mid_line = False
        if run.status != "completed":
            self._line(f"[run {run.run_id} {run.status}: {run.error_code} {run.error_message}]")


async def stream_reply(client: HostClient, request: hpb.SendMessageRequest) -> hpb.RunInfo:
    """Streams one message's run to the terminal and returns how it finished. Used by `send`, `chat` and the demo."""
    printer = Printer()
    streamed = False
    finished: hpb.RunInfo | None = None
    async for reply in client.stream(request):
        kind = reply.WhichOneof("kind")
        if kind == "events":
            for ev in reply.events.events:
                streamed |= ev.WhichOneof("kind") == "text_delta"
                printer.event(ev)
        elif kind == "run_finished":
            finished = reply.run_finished
    if finished is None:
        raise errors.Unavailable("the host ended the stream before the run finished")
    printer.finished(finished, streamed)
    return finished
