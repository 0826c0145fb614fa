"""What a runner author writes: a `Runner` subclass with a manifest and an async-generator `run`.

    class Echo(Runner):
        manifest = RunnerManifest(name="echo", description="Repeats the message")

        async def run(self, run: RunContext) -> AsyncIterator[RunEvent]:
            yield events.text(run.text)

The SDK's server calls `setup()` once per process, then `run()` once per host `Run` RPC, each in its own task:
cancelling the RPC cancels that task, so `run` sees `asyncio.CancelledError` at its next await.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from agenthost.protos import common_pb2 as pb
from agenthost.protos import runner_pb2
from agenthost.runners.sdk.api import RunAPI
from agenthost.runners.sdk.child import ChildRun

if TYPE_CHECKING:
    # Only for the annotation: the serving process imports this module long before (and often without ever)
    # loading a runner class, and the manifest model costs it pydantic.
    from agenthost.plugins.manifest import RunnerManifest
    from agenthost.protos.run_api_pb2 import ApprovalDecision


@dataclass
class RunContext:
    """One run as the runner sees it: the host's AgentRunContext plus a client for the run's API."""

    context: runner_pb2.AgentRunContext
    api: RunAPI
    data_dir: Path = field(default_factory=lambda: Path(os.environ.get("AGENTHOST_RUNNER_DATA_DIR", ".")))
    # The credential to hand to processes started for this run (a harness, its MCP bridge): valid for this run's
    # grant only, dead when the run ends, and usable without the plugin's secret, which must stay in this process.
    tool_token: str = ""
    # Provider keys the binding names, resolved by the host from its key store (`agenthost keys set`).
    secrets: dict[str, str] = field(default_factory=dict)

    @property
    def run_id(self) -> str:
        return self.context.run_id

    @property
    def text(self) -> str:
        """The inbound message text."""
        return self.context.input.text

    @property
    def attachments(self) -> list[pb.ArtifactRef]:
        """Files sent with the inbound message, stored by the host as artifacts of the conversation: read their
        bytes with `api.artifact_read_all(ref.artifact_id)` (the binding must grant `artifacts.read`). An image's
        mime_type (png, jpeg, gif, webp) was checked against its bytes by the host."""
        return list(self.context.event.attachments)

    @property
    def conversation_id(self) -> str:
        return self.context.conversation.conversation_id

    @property
    def bot_id(self) -> str:
        return self.context.conversation.bot_id

    @property
    def deadline_at(self) -> float:
        return self.context.runtime.deadline_at

    @cached_property
    def config(self) -> dict[str, Any]:
        """The binding's runner config (already validated by the host against the manifest's config_schema)."""
        return json.loads(self.context.config_json or "{}")

    @cached_property
    def state(self) -> dict[str, dict[str, Any]]:
        """The state snapshot taken when the run started, per granted scope."""
        return json.loads(self.context.state_json or "{}")

    def child_run(
        self, description: str, *, subagent_type: str = "", tool_call_id: str = "", timeout: float = 0.0
    ) -> AbstractAsyncContextManager[ChildRun]:
        """Records a subagent as a child run of this run: `async with run.child_run("...") as child:
        await child.emit(ev)`. See `agenthost.runners.sdk.child`."""
        return self.api.child_run(description, subagent_type=subagent_type, tool_call_id=tool_call_id, timeout=timeout)

    @property
    def bootstrap(self) -> list[pb.TranscriptItem]:
        """History inlined by the host; empty unless the manifest asked for a bootstrap."""
        return list(self.context.bootstrap)

    async def request_approval(
        self,
        tool_name: str,
        *,
        summary: str = "",
        arguments: Any = None,
        reason: str = "",
        timeout_seconds: float = 0.0,
        tool_call_id: str = "",
    ) -> ApprovalDecision:
        """Asks whoever is talking to the bot whether a tool call may run; returns the host's ApprovalDecision
        (`approved`, `outcome`, `decided_by`, `note`). See RunAPI.request_approval."""
        return await self.api.request_approval(
            tool_name,
            summary=summary,
            arguments=arguments,
            reason=reason,
            timeout_seconds=timeout_seconds,
            tool_call_id=tool_call_id,
        )


class Runner:
    """Base class of every runner. Subclasses set `manifest` and implement `run`."""

    manifest: ClassVar[RunnerManifest]

    def __init__(self, data_dir: Path) -> None:
        # A directory private to this runner, under the plugin's data dir; persists across restarts.
        self.data_dir = data_dir

    async def setup(self) -> None:
        """Called once per process before the first run. Override for expensive initialisation."""

    async def close(self) -> None:
        """Called once when the process shuts down gracefully."""

    def validate_config(self, config: dict[str, Any]) -> list[str]:
        """Rules of a binding config that its JSON Schema cannot express. Called by the host when a binding is
        created or changed (after the schema check passed); each returned sentence is a reason to refuse it, and
        should name the setting. The default has no extra rules."""
        return []

    async def list_models(self, config: dict[str, Any], secrets: dict[str, str]) -> list[dict[str, str]]:
        """The models a binding with this config could use, for `agenthost models`: one dict per model with
        `provider`, `model` and `base_url`; a provider that could not be asked is a dict with `error` (and no
        `model`) rather than an exception, so the other providers still show. `secrets` are the provider keys the
        binding names, as a run would receive them. The default lists nothing."""
        return []

    def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent | str]:
        """Yields the run's events. Must be an async generator. A plain `str` is a text delta, the same as
        `events.text(s)` on the wire at about a third of the runner's CPU per delta: the form for streaming text."""
        raise NotImplementedError
