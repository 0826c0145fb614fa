"""What both harness drivers share: the plan for one turn and the state accumulated while its events stream.

A driver is two pure halves: `command(plan)` builds argv + environment, and `map_event(raw, turn)` turns one
line of the harness's JSON stream into run events while updating `TurnState`. Keeping them pure (no I/O) is
what lets the unit tests replay recorded streams without a process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from agenthost.protos import common_pb2 as pb
from agenthost.runners.external_harness.config import HarnessConfig
from agenthost.runners.external_harness.errors import HarnessReportedError
from agenthost.runners.external_harness.projection import HttpBridgeLaunch, Launch
from agenthost.runners.external_harness.user_mcp import UserMcp
from agenthost.runners.external_harness.workspace import Workspace
from agenthost.runners.sdk import events


@dataclass(frozen=True)
class TurnPlan:
    """Everything a driver needs to build the command line of one turn."""

    binary: str
    config: HarnessConfig
    workspace: Workspace
    resume_session_id: str | None  # continue this session ...
    new_session_id: str | None  # ... or start one with this id (Claude Code only; Codex picks its own)
    bridge: Launch | None  # None: no host MCP bridge this turn
    bridge_env: dict[str, str]  # the run's credentials for the bridge (secret; environment only)
    inherited_env: dict[str, str]  # the runner process's environment, filtered by the driver
    binary_env: dict[str, str] = field(default_factory=dict)  # what the harness's own launcher would set
    stored_keys: frozenset[str] = frozenset()  # names in inherited_env that came from the host's key store
    user_mcp: UserMcp | None = None  # the binding's own MCP servers, beside the bridge (None: none)
    stream_input: bool = False  # the prompt goes in as a JSON line and stdin stays open for later turns (warm.py)


@dataclass(frozen=True)
class Install:
    """How to start a harness binary: the file to exec, the environment its launcher would have set, and the
    paths a sandbox must show read-only for it to run."""

    exe: str
    env: dict[str, str]
    ro_paths: list[str]


@dataclass(frozen=True)
class Command:
    argv: list[str]
    env: dict[str, str]
    secrets: tuple[str, ...]  # values to scrub from anything shown to the user


@dataclass
class TurnState:
    """What one turn has produced so far.

    Text is kept in segments, the way the host projects it: streamed text becomes one assistant message when a
    tool call starts, and the final `message` event replaces the deltas of the last segment only. So the
    runner's closing `message` carries the text after the last tool call, never the whole turn again.
    """

    session_id: str | None = None
    model: str = ""
    segment: list[str] = field(default_factory=list)  # completed text blocks since the last tool call
    emitted_text: bool = False  # a text delta went out in this segment (for separators)
    any_text: bool = False  # any text at all this turn
    streamed_messages: set[str] = field(default_factory=set)  # message ids whose text went out as deltas
    streaming_message_id: str = ""  # the message token deltas currently belong to
    block_open: bool = False  # a streamed text block has started (the next delta continues it)
    tool_names: dict[str, str] = field(default_factory=dict)  # tool call id -> name
    finished: bool = False  # the harness reported the end of the turn (result / turn.completed)
    error: HarnessReportedError | None = None
    usage: pb.RunEvent | None = None
    # Codex reports token totals for the whole thread, not the turn; the runner subtracts the previous totals.
    cumulative_usage: dict[str, int] | None = None
    last_error_message: str = ""  # non-terminal errors, used if the process dies without a verdict
    # A kept Claude Code process reports its running cost over all its turns; this turn's share starts here.
    cost_offset_usd: float = 0.0
    cost_total_usd: float = 0.0
    session_lost: bool = False  # the harness said it does not know the session we asked to resume

    @property
    def final_text(self) -> str:
        """The text of the last segment: what the closing `message` event carries."""
        return "\n\n".join(t for t in self.segment if t)

    def text_block(self, text: str, *, message_id: str = "") -> list[pb.RunEvent]:
        """Records a completed text block; emits it unless its message already streamed token by token."""
        if not text:
            return []
        self.segment.append(text)
        self.any_text = True
        if message_id and message_id in self.streamed_messages:
            return []
        return self.delta(text, new_block=True)

    def delta(self, text: str, *, new_block: bool) -> list[pb.RunEvent]:
        out = []
        if new_block and self.emitted_text:
            out.append(events.text("\n\n"))  # the same separator final_text uses, so deltas == message
        out.append(events.text(text))
        self.emitted_text = self.any_text = True
        return out

    def tool_call(self, event: pb.RunEvent) -> list[pb.RunEvent]:
        """A tool call ends the current text segment (the host flushes it into its own message)."""
        self.segment = []
        self.emitted_text = False
        self.block_open = False
        return [event]


class Driver(Protocol):
    # Read-only members, so a driver may narrow config_model to its own config class.
    @property
    def name(self) -> str: ...

    @property
    def config_model(self) -> type[HarnessConfig]: ...

    @property
    def binary_env(self) -> str: ...  # env var naming the binary, e.g. AGENTHOST_CLAUDE_BIN

    @property
    def binary_name(self) -> str: ...

    def install(self, binary: str, path_env: str) -> Install: ...

    def command(self, plan: TurnPlan) -> Command: ...

    def map_event(self, raw: dict[str, Any], turn: TurnState) -> list[pb.RunEvent]: ...

    @property
    def default_key_env(self) -> str: ...  # the API key variable a binding uses unless it names another

    def session_lost(self, stderr: str, turn: TurnState) -> bool: ...

    def auth_problem(self, message: str) -> str | None: ...  # "missing" / "rejected" key, from the harness's words


def forwarded_secrets(plan: TurnPlan, default_key_env: str) -> dict[str, str]:
    """The runner-process variables a binding forwards: its API key variable and `pass_env` names.

    A binding that names a key variable explicitly gets a clear error when it is unset, rather than a harness
    that fails later with an authentication message that does not say which variable was missing.
    """
    from agenthost.runners.external_harness.errors import HarnessConfigError
    from agenthost.runners.sdk.keys import how_to_give_key

    out: dict[str, str] = {}
    key_env = plan.config.api_key_env or default_key_env
    if key_env in plan.inherited_env:
        out[key_env] = plan.inherited_env[key_env]
    elif plan.config.api_key_env:
        raise HarnessConfigError(
            f"api_key_env names {key_env}, which this binding does not provide. {how_to_give_key(key_env)}."
        )
    for name in plan.config.pass_env:
        if name in plan.inherited_env:
            out[name] = plan.inherited_env[name]
    return out


def secret_values(plan: TurnPlan, forwarded: dict[str, str]) -> tuple[str, ...]:
    """Values to scrub from stderr before a user sees it: forwarded keys and the run's credentials (not the
    run id or the socket path, which are useful in an error message)."""
    tokens = (plan.bridge_env.get("AGENTHOST_RUN_TOKEN", ""), plan.bridge_env.get("AGENTHOST_MCP_TOKEN", ""))
    user = plan.user_mcp.secrets if plan.user_mcp is not None else ()
    return tuple(v for v in (*forwarded.values(), *tokens, *user) if v)


def add_user_mcp_env(env: dict[str, str], user_env: dict[str, str]) -> None:
    """Adds the user servers' resolved secrets to the harness's environment; a name the harness already sets to
    something else (its API key variable) is a config error, not a silent override either way."""
    from agenthost.runners.external_harness.errors import HarnessConfigError

    for name, value in user_env.items():
        if name in env and env[name] != value:
            raise HarnessConfigError(
                f"mcp_servers: env {name} would replace the harness's own {name}; give the server's variable "
                "another name"
            )
        env[name] = value


_PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy")


def loopback_bypass(plan: TurnPlan, env: dict[str, str]) -> None:
    """With the bridge on loopback HTTP, keeps a configured proxy out of the way: the harness would otherwise
    send the endpoint's bearer token to the proxy (and the proxy could not reach our loopback anyway)."""
    if not isinstance(plan.bridge, HttpBridgeLaunch) or not any(env.get(v) for v in _PROXY_VARS):
        return
    for name in ("NO_PROXY", "no_proxy"):
        entries = [e for e in env.get(name, "").split(",") if e.strip()]
        for host in ("127.0.0.1", "localhost"):
            if host not in entries:
                entries.append(host)
        env[name] = ",".join(entries)


def base_url(url: str, *, v1: bool) -> str:
    """`url` with or without a trailing /v1 path segment. Claude Code appends /v1/messages itself and Codex
    appends only /responses, so each gets the form it needs whichever one the binding wrote (the wrong one is a
    404 the harness reports as a bad model name)."""
    parts = urlsplit(url.strip())
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    if v1:
        path += "/v1"
    return urlunsplit(parts._replace(path=path))


def isolation_env(plan: TurnPlan) -> dict[str, str]:
    ws = plan.workspace
    return {"HOME": str(ws.home), "TMPDIR": str(ws.tmp), "PWD": str(ws.working_dir)}


def auth_problem(message: str, *, missing: tuple[str, ...], rejected: tuple[str, ...]) -> str | None:
    """ "missing" or "rejected" when a harness's own words say its API key was absent or refused (drivers pass
    the markers their CLI prints), else None."""
    if any(m in message for m in missing):
        return "missing"
    if any(m in message for m in rejected):
        return "rejected"
    return None
