"""The tool interface: a name, a description, a JSON Schema for arguments, and an async `execute`.

A tool reports a problem by raising `ToolError`; the registry turns that, bad arguments, and even a crashing tool
into an error result for the model. A failing tool is information for the model, never a failed run.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from agenthost.runners.local_agent import approvals
from agenthost.runners.local_agent.config import LocalAgentConfig
from agenthost.runners.local_agent.images import ToolOutput
from agenthost.runners.local_agent.messages import ImagePart, ToolCall, ToolResult
from agenthost.runners.local_agent.providers.base import ToolSpec

if TYPE_CHECKING:
    # Imported at a run's first tool call, not with the runner's class or its tool registry: a runner process
    # that only validates configs, runs the harness runners beside it or answers without tools does not hold
    # jsonschema (~2 MiB).
    import jsonschema


class ToolError(Exception):
    """A failure the model should read and can act on (bad path, no match, timeout, ...)."""


class HostAPI(Protocol):
    """The part of `agenthost.runners.sdk.api.RunAPI` the local agent uses; tests pass an in-memory fake."""

    async def history_page(
        self, *, conversation_id: str = ..., cursor: str = ..., direction: Any = ..., limit: int = ...
    ) -> Any: ...
    async def history_search(
        self, query: str, *, conversation_id: str = ..., roles: Any = ..., item_types: Any = ..., top_k: int = ...
    ) -> list[Any]: ...
    async def artifact_metadata(self, artifact_id: str) -> Any: ...
    async def artifact_read_range(self, artifact_id: str, offset: int = ..., length: int = ...) -> Any: ...
    async def artifact_create(
        self, data: bytes, *, name: str, mime_type: str = ..., metadata: dict[str, Any] | None = ...
    ) -> Any: ...
    async def state_get(self, scope: Any, key: str, default: Any = ...) -> Any: ...
    async def state_get_versioned(self, scope: Any, key: str) -> Any: ...
    async def state_set(self, scope: Any, key: str, value: Any, *, if_version: int | None = ...) -> int: ...
    async def state_delete(self, scope: Any, key: str) -> bool: ...
    async def request_approval(
        self,
        tool_name: str,
        *,
        summary: str = ...,
        arguments: Any = ...,
        reason: str = ...,
        timeout_seconds: float = ...,
        tool_call_id: str = ...,
    ) -> Any: ...


@dataclass
class ToolContext:
    workspace: Path
    api: HostAPI
    conversation_id: str
    run_id: str
    config: LocalAgentConfig
    # Events a tool wants surfaced (state_updated, artifact_created); the loop drains them after each call.
    pending_events: list[Any] = field(default_factory=list)
    # Where the shell tool records unsandboxed commands' process groups (tools.shell.ProcessLedger); None = not
    # recorded. Sandboxed commands need no record: they die with the runner.
    ledger: Any = None
    # Set by the `compact` tool (to its focus text, possibly empty): the loop compacts once the step's calls all
    # have results, because compacting mid-step would cut the exchange the model is in the middle of.
    compact_request: str | None = None
    # Bytes of the images this run has loaded or tools returned, by ImagePart.key: what requests show. Only for
    # the run's length: the session keeps references (messages.ImagePart), never bytes.
    images: dict[str, bytes] = field(default_factory=dict)
    # The run's subagents (local_agent.subagents.Subagents), for the `task` tool; None = no subagents this run.
    subagents: Any = None


class Tool(ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    parameters: ClassVar[dict[str, Any]]
    # Read-only tools may run concurrently with each other; anything else runs alone, in declared order.
    read_only: ClassVar[bool] = False
    # Tools that need their call's id (to link what they record to it) implement `execute_call` instead.
    needs_call_id: ClassVar[bool] = False
    # True for tools whose schema is set per instance (an MCP server's tool): validators are then per schema.
    dynamic_schema: ClassVar[bool] = False

    def spec(self) -> ToolSpec:
        return ToolSpec(name=self.name, description=self.description, parameters=self.parameters)

    @abstractmethod
    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> str | ToolOutput:
        """Returns the result text (with images, a ToolOutput); raises ToolError for failures the model should
        see."""

    async def execute_call(self, args: dict[str, Any], ctx: ToolContext, call_id: str) -> str:
        return await self.execute(args, ctx)


# Validators per tool class: checking a schema costs milliseconds, and tool schemas never change at runtime.
_VALIDATORS: dict[type[Tool], jsonschema.Draft202012Validator] = {}
# Per-instance schemas (MCP servers' tools), by their JSON text; bounded, since servers can change them.
_SCHEMA_VALIDATORS: dict[str, jsonschema.Draft202012Validator] = {}
_MAX_SCHEMA_VALIDATORS = 1_024
_ANY_OBJECT = {"type": "object"}


def _validator(tool: Tool) -> jsonschema.Draft202012Validator:
    import jsonschema

    if tool.dynamic_schema:
        key = json.dumps(tool.parameters, sort_keys=True, default=str)
        v = _SCHEMA_VALIDATORS.get(key)
        if v is None:
            try:
                jsonschema.Draft202012Validator.check_schema(tool.parameters)
                # A $ref outside the schema would make validation fail (nothing is fetched), not the call.
                usable = not _external_ref(tool.parameters)
            except jsonschema.SchemaError:
                usable = False
            # A server's schema this validator cannot apply: the server checks its own arguments.
            v = jsonschema.Draft202012Validator(tool.parameters if usable else _ANY_OBJECT)
            if len(_SCHEMA_VALIDATORS) >= _MAX_SCHEMA_VALIDATORS:
                _SCHEMA_VALIDATORS.clear()
            _SCHEMA_VALIDATORS[key] = v
        return v
    cls = type(tool)
    v = _VALIDATORS.get(cls)
    if v is None:
        jsonschema.Draft202012Validator.check_schema(tool.parameters)
        v = _VALIDATORS[cls] = jsonschema.Draft202012Validator(tool.parameters)
    return v


def _external_ref(schema: Any) -> bool:
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and not ref.startswith("#"):
            return True
        return any(_external_ref(v) for v in schema.values())
    if isinstance(schema, list):
        return any(_external_ref(v) for v in schema)
    return False


class ToolRegistry:
    def __init__(self, tools: list[Tool]) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self._tools:
                raise ValueError(f"duplicate tool name {tool.name!r}")
            self._tools[tool.name] = tool
        # Built at each tool's first call, not here: a run that calls no tool (a plain chat turn) never imports
        # jsonschema (~2 MiB a runner process would hold for its life).
        self._validators: dict[str, jsonschema.Draft202012Validator] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._tools

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def specs(self) -> list[ToolSpec]:
        # Sorted by name: the schemas open every request's cached prefix, so their order must not depend on how
        # the tool set was assembled (config order, grants).
        return [self._tools[n].spec() for n in sorted(self._tools)]

    def with_tools(self, extra: list[Tool]) -> ToolRegistry:
        """This registry's tools followed by `extra` (a run's MCP tools), as a new registry."""
        return ToolRegistry([*self._tools.values(), *extra])

    def is_read_only(self, name: str) -> bool:
        tool = self._tools.get(name)
        return bool(tool and tool.read_only)

    async def run(self, call: ToolCall, ctx: ToolContext, *, truncated: bool = False) -> ToolResult:
        tool = self._tools.get(call.name)
        if tool is None:
            return _err(call, f"error: unknown tool {call.name!r}; available tools: {', '.join(self._tools)}")
        try:
            args = call.parsed_arguments()
        except ValueError as exc:
            hint = " Your output hit the token limit mid-call; use smaller arguments." if truncated else ""
            return _err(call, f"error: arguments are not a valid JSON object ({exc}): {call.arguments[:300]!r}.{hint}")
        validator = self._validators.get(call.name)
        if validator is None:
            validator = self._validators[call.name] = _validator(tool)
        problems = sorted(validator.iter_errors(args), key=str)
        if problems:
            where = "/".join(str(p) for p in problems[0].absolute_path) or "<arguments>"
            return _err(call, f"error: invalid arguments at {where}: {problems[0].message}")
        # Every tool call passes here, so this is where a person's approval is asked for (the binding's approvals).
        refused = await approvals.check(ctx.api, ctx.config.approvals, call, args)
        if refused is not None:
            return refused
        try:
            if tool.needs_call_id:
                content = await tool.execute_call(args, ctx, call.id)
            else:
                content = await tool.execute(args, ctx)
        except ToolError as exc:
            return _err(call, f"error: {exc}")
        except Exception as exc:  # noqa: BLE001 — a crashing tool must not end the run; the model gets the reason
            return _err(call, f"error: tool {call.name} crashed: {type(exc).__name__}: {exc}")
        if isinstance(content, ToolOutput):
            parts = []
            for image in content.images:
                part = ImagePart(mime_type=image.mime_type, name=image.name, size=len(image.data), sha256=image.sha256)
                ctx.images[part.key] = image.data  # the loop stores it on the host and re-keys it
                parts.append(part)
            return ToolResult(tool_call_id=call.id, name=call.name, content=content.text, images=parts)
        return ToolResult(tool_call_id=call.id, name=call.name, content=content)


def _err(call: ToolCall, message: str) -> ToolResult:
    return ToolResult(tool_call_id=call.id, name=call.name, content=message, is_error=True)


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=1)
