"""The manifest model: what a runner declares about itself, validated wherever it crosses a process boundary.

A runner class carries a `RunnerManifest`; its plugin process sends it as JSON in `Runner.Describe`; the host
validates it here at install time and again at every start, so a malformed manifest is an install error with a
reason, never a surprise mid-run.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

# Every run-scoped API a grant can name, with the AgentRunAPIProxy methods it opens.
API_METHODS: dict[str, tuple[str, ...]] = {
    "history.page": ("HistoryPage",),
    "history.search": ("HistorySearch",),
    "events.get": ("EventGet",),
    "events.page": ("EventPage",),
    "artifacts.read": ("ArtifactMetadata", "ArtifactReadRange", "ArtifactRead"),
    "artifacts.create": ("ArtifactCreate",),
    "state.read": ("StateGet", "StateList"),
    "state.write": ("StateSet", "StateDelete"),
    # The run's bot's knowledge base (agenthost.host.knowledge), searched by keywords and by meaning.
    "kb": ("KbSearch",),
    # Recording the run's subagents as child runs of it (AgentRunAPIProxy.ChildRun).
    "subagents": ("ChildRun",),
}
ALL_APIS: tuple[str, ...] = tuple(API_METHODS)
# Run API methods every run may call whatever its grant: asking a person to approve a tool call reads nothing and
# grants the runner nothing (agenthost.host.runs.approvals bounds how much it may ask).
ALWAYS_GRANTED_METHODS: frozenset[str] = frozenset({"RequestApproval"})
StateScopeName = Literal["run", "conversation", "actor", "binding", "runner"]
BootstrapMode = Literal["none", "current_event", "recent_tail", "summary_tail"]

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")

MAX_INLINE_EVENTS = 200
# Runners (or channel adapters) one plugin may offer (parse_many); a worker's hello takes as many per plugin.
MAX_RUNNERS_PER_PLUGIN = 64
MAX_INLINE_BYTES = 256 * 1024


class ManifestError(ValueError):
    """A manifest that does not validate; the message says which field and why."""


def _schema_problem(schema: dict[str, Any]) -> str | None:
    import jsonschema

    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return exc.message
    return None


# The host checks every manifest at each start of its plugin process (and each test host at its own start): the
# same few schemas again and again, ~0.1 s of jsonschema each for a built-in runner's. The verdict depends only on
# the schema's content, so it is kept by that content; bounded, since a plugin may send any schema it likes.
@functools.lru_cache(maxsize=64)
def _known_schema_problem(schema_json: str) -> str | None:
    return _schema_problem(json.loads(schema_json))


# Whether building a manifest checks config_schema against the JSON Schema meta-schema. The host always does: every
# manifest it accepts arrives as JSON through `parse_json`. A runner process turns it off (`skip_schema_check`):
# its manifests reach the host only that way, and the check would cost it jsonschema for the process's life.
_check_schema = True


def skip_schema_check() -> None:
    """For a runner process: manifests built here leave config_schema to the host's check."""
    global _check_schema
    _check_schema = False


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunnerCapabilities(_Strict):
    streaming: bool = True
    tool_calls: bool = False
    attachments: bool = False
    cancellation: bool = True


class RunnerPermissions(_Strict):
    """The most a binding can grant this runner; a binding's resource policy can only narrow it."""

    apis: tuple[str, ...] = ALL_APIS
    state_scopes: tuple[StateScopeName, ...] = ("run", "conversation", "actor", "binding", "runner")
    cross_conversation: bool = False
    # The runner process needs the network (a model API, a web service). Its sandbox gets it only if the user
    # accepted at install (`plugins install --allow-network`); built-in runners have it.
    network: bool = False

    @field_validator("apis")
    @classmethod
    def _known_apis(cls, apis: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(apis) - set(ALL_APIS))
        if unknown:
            raise ValueError(f"unknown APIs {unknown}; known: {list(ALL_APIS)}")
        return apis


class ContextNeeds(_Strict):
    """What the runner wants inlined into its AgentRunContext. Nothing by default: runners pull history."""

    bootstrap: BootstrapMode = "none"
    max_inline_events: int = Field(20, ge=0, le=MAX_INLINE_EVENTS)
    max_inline_bytes: int = Field(64 * 1024, ge=0, le=MAX_INLINE_BYTES)


class RunnerManifest(_Strict):
    name: str
    description: str = ""
    version: str = "0.0.0"
    capabilities: RunnerCapabilities = RunnerCapabilities()
    permissions: RunnerPermissions = RunnerPermissions()
    context: ContextNeeds = ContextNeeds()
    # JSON Schema of the binding config; checked when a binding is created.
    config_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})

    @field_validator("name")
    @classmethod
    def _slug(cls, name: str) -> str:
        if not _NAME.match(name):
            raise ValueError("must be 1-64 chars of a-z 0-9 . _ - starting with a letter or digit")
        return name

    @field_validator("config_schema")
    @classmethod
    def _valid_schema(cls, schema: dict[str, Any]) -> dict[str, Any]:
        if not _check_schema:
            return schema
        try:
            key = json.dumps(schema, sort_keys=True)
        except (TypeError, ValueError):  # not JSON (a manifest built in Python): checked as it is, uncached
            problem = _schema_problem(schema)
        else:
            problem = _known_schema_problem(key)
        if problem is not None:
            raise ValueError(f"config_schema is not a valid JSON Schema: {problem}")
        return schema

    @classmethod
    def parse_json(cls, raw: str | bytes) -> RunnerManifest:
        """Validates a manifest from the wire; raises ManifestError naming the bad fields."""
        return _parse(cls, raw, "runner")

    def validate_config(self, config: dict[str, Any]) -> None:
        """Raises ManifestError when a binding config does not satisfy config_schema."""
        import jsonschema

        errors = sorted(jsonschema.Draft202012Validator(self.config_schema).iter_errors(config), key=str)
        if errors:
            first = errors[0]
            where = "/".join(str(p) for p in first.absolute_path) or "<root>"
            raise ManifestError(f"config for runner {self.name!r} is invalid at {where}: {first.message}")


class ChannelPermissions(_Strict):
    # A channel adapter talks to its platform (Telegram's Bot API, a chat server), so it asks for the network;
    # an installed adapter gets it only if the user accepted at install (`plugins install --allow-network`).
    network: bool = True


class ChannelManifest(_Strict):
    """What a channel adapter declares: its name, its settings (JSON Schema of the non-secret config given to
    `agenthost channels add`) and the named secrets (from the host's key store) it needs, e.g. a bot token."""

    name: str
    description: str = ""
    version: str = "0.0.0"
    permissions: ChannelPermissions = ChannelPermissions()
    config_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    # Setting names whose values are key-store names (e.g. "token_key"); each must name a stored key.
    secret_settings: tuple[str, ...] = ()

    @field_validator("name")
    @classmethod
    def _slug(cls, name: str) -> str:
        if not _NAME.match(name):
            raise ValueError("must be 1-64 chars of a-z 0-9 . _ - starting with a letter or digit")
        return name

    @field_validator("config_schema")
    @classmethod
    def _valid_schema(cls, schema: dict[str, Any]) -> dict[str, Any]:
        return RunnerManifest._valid_schema(schema)

    @classmethod
    def parse_json(cls, raw: str | bytes) -> ChannelManifest:
        """Validates a manifest from the wire; raises ManifestError naming the bad fields."""
        return _parse(cls, raw, "channel")


M = TypeVar("M", RunnerManifest, ChannelManifest)


def parse_many(cls: type[M], raws: Sequence[str | bytes]) -> list[M]:
    """A plugin's runners (or channel adapters) as its process describes them, at install and every start. At most
    MAX_RUNNERS_PER_PLUGIN: each config schema is checked (milliseconds of jsonschema, and the verdict cache does not
    help against schemas made to differ), so a plugin offering thousands cost the host seconds of CPU at every
    start. CPU-bound: the host calls it off its event loop."""
    if len(raws) > MAX_RUNNERS_PER_PLUGIN:
        kind = "runners" if cls is RunnerManifest else "channel adapters"
        raise ManifestError(
            f"the plugin offers {len(raws)} {kind}; at most MAX_RUNNERS_PER_PLUGIN = {MAX_RUNNERS_PER_PLUGIN}"
        )
    return [cls.parse_json(raw) for raw in raws]


def _parse(cls: type[M], raw: str | bytes, kind: str) -> M:
    try:
        return cls.model_validate_json(raw)
    except ValidationError as exc:
        raise ManifestError(f"invalid {kind} manifest: {validation_problems(exc)}") from None


def validation_problems(exc: ValidationError, root: str = "<root>") -> str:
    """A pydantic error as one line naming each bad field ("a.b: message; c: message"; `root` names the model
    itself): how manifests, the built-in runners' binding configs and knowledge settings report what is wrong."""
    return "; ".join(f"{'.'.join(str(p) for p in err['loc']) or root}: {err['msg']}" for err in exc.errors())
