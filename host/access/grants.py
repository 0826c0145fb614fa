"""Run tokens and frozen grants: who may call the run API, for which run, and what that run may see.

The registry lives in memory on the host (the hot path pays one sha256 and two dict lookups per call); only
hashes are ever stored, in the runs table, so a database copy yields no usable token.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from agenthost.plugins.manifest import ALWAYS_GRANTED_METHODS, API_METHODS, RunnerManifest
from agenthost.protos import host_pb2 as hpb
from agenthost.protos.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied, Unauthenticated
from agenthost.protos.wire import STATE_SCOPES

SCOPE_VALUES = STATE_SCOPES
SCOPE_NAMES = {v: k for k, v in STATE_SCOPES.items()}


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_token(prefix: str) -> str:
    return f"{prefix}_{secrets.token_urlsafe(32)}"


@dataclass(frozen=True)
class Grant:
    """manifest permissions ∩ binding resource policy, frozen when the run is created."""

    apis: frozenset[str]
    methods: frozenset[str]
    state_scopes: frozenset[str]
    cross_conversation_patterns: tuple[str, ...]

    @classmethod
    def freeze(cls, manifest: RunnerManifest, policy: hpb.ResourcePolicy) -> Grant:
        apis = set(manifest.permissions.apis)
        if policy.apis:
            apis &= set(policy.apis)
        scopes = set(manifest.permissions.state_scopes)
        if policy.state_scopes:
            scopes &= {SCOPE_NAMES[s] for s in policy.state_scopes if s in SCOPE_NAMES}
        cross = tuple(policy.cross_conversation_patterns) if manifest.permissions.cross_conversation else ()
        methods = frozenset(m for api in apis for m in API_METHODS[api]) | ALWAYS_GRANTED_METHODS
        return cls(frozenset(apis), methods, frozenset(scopes), cross)

    def to_json(self) -> dict[str, object]:
        return {
            "apis": sorted(self.apis),
            "state_scopes": sorted(self.state_scopes),
            "cross_conversation_patterns": list(self.cross_conversation_patterns),
        }


@dataclass
class ActiveRun:
    run_id: str
    bot_id: str
    conversation_id: str
    actor_id: str
    binding_id: str
    runner_id: str
    plugin_id: str
    grant: Grant
    deadline_at: float
    token_hash: str
    # The run's tool token (RunRequest.tool_token): same run and grant, no plugin secret needed. Empty = none.
    tool_token_hash: str = ""
    finished: bool = False
    scope_keys: dict[str, str] = field(default_factory=dict)
    # Who sent the message this run answers: the admin-API caller's credential name ("admin", "channel.tg", …).
    # A send credential not granted all conversations decides approvals of its own runs only
    # (agenthost.host.api.access).
    origin: str = ""
    # The runner worker the run was placed on (its certificate's name); "" = a plugin process of this host. A call
    # for the run is accepted only from there: a run token replayed by another worker, or by a local plugin, is not.
    worker: str = ""
    # The seq of the event this run answers. Its own conversation is read as of that event: what belongs to events
    # recorded after it (messages queued behind this run) is its future and is not shown. 0: no such bound.
    event_seq: int = 0

    def __post_init__(self) -> None:
        # Conversation and actor state belong to the runner serving them: another runner bound to the same bot
        # cannot read them, and rebinding the same runner keeps them (unlike a key derived from the binding).
        self.scope_keys = {
            "run": f"run\x1f{self.run_id}",
            "conversation": f"conversation\x1f{self.bot_id}\x1f{self.conversation_id}\x1f{self.runner_id}",
            "actor": f"actor\x1f{self.bot_id}\x1f{self.actor_id}\x1f{self.runner_id}",
            "binding": f"binding\x1f{self.binding_id}",
            "runner": f"runner\x1f{self.runner_id}",
        }

    def scope_key(self, scope: int) -> str:
        """The storage key of a granted scope; raises for unknown or ungranted scopes."""
        name = SCOPE_NAMES.get(scope)
        if name is None:
            raise InvalidArgument(f"unknown state scope {scope}; expected one of {sorted(SCOPE_VALUES)}")
        if name not in self.grant.state_scopes:
            raise PermissionDenied(f"state scope {name!r} is not granted to this run")
        return self.scope_keys[name]

    def horizon(self, conversation_id: str) -> int | None:
        """The newest event seq of `conversation_id` this run may see (its own conversation only); None: all."""
        if self.event_seq and conversation_id == self.conversation_id:
            return self.event_seq
        return None

    def conversation(self, requested: str) -> str:
        """The conversation a read may touch: the run's own, or one the binding grants across conversations."""
        if not requested or requested == self.conversation_id:
            return self.conversation_id
        if len(requested) > 512:
            raise InvalidArgument("conversation_id is longer than 512 characters")
        if any(fnmatch.fnmatchcase(requested, p) for p in self.grant.cross_conversation_patterns):
            return requested
        raise PermissionDenied(f"conversation {requested!r} is not accessible by this run")

    def may_read(self, bot_id: str, conversation_id: str) -> bool:
        if bot_id != self.bot_id:
            return False
        try:
            self.conversation(conversation_id)
        except (PermissionDenied, InvalidArgument):
            return False
        return True


class RunRegistry:
    """Live runs by token hash, and plugin processes by secret hash. Owned by the host's RunManager."""

    def __init__(self) -> None:
        self._by_token: dict[str, ActiveRun] = {}
        self._by_run: dict[str, ActiveRun] = {}
        self._plugins_by_secret: dict[str, str] = {}

    # plugin processes
    def add_plugin_secret(self, plugin_id: str, secret: str) -> None:
        self._plugins_by_secret = {h: p for h, p in self._plugins_by_secret.items() if p != plugin_id}
        self._plugins_by_secret[hash_secret(secret)] = plugin_id

    def plugin_of_secret(self, secret: str) -> str | None:
        """The plugin whose process holds `secret` (a runner worker checks its own processes' calls so)."""
        return self._plugins_by_secret.get(hash_secret(secret))

    def remove_plugin(self, plugin_id: str) -> None:
        self._plugins_by_secret = {h: p for h, p in self._plugins_by_secret.items() if p != plugin_id}

    # runs
    def activate(self, run: ActiveRun) -> None:
        self._by_token[run.token_hash] = run
        if run.tool_token_hash:
            self._by_token[run.tool_token_hash] = run
        self._by_run[run.run_id] = run

    def revoke(self, run_id: str) -> None:
        run = self._by_run.pop(run_id, None)
        if run is not None:
            self._by_token.pop(run.token_hash, None)
            self._by_token.pop(run.tool_token_hash, None)

    def get(self, run_id: str) -> ActiveRun | None:
        return self._by_run.get(run_id)

    def active(self) -> list[ActiveRun]:
        return list(self._by_run.values())

    def token_run(self, metadata: Sequence[tuple[str, str | bytes]]) -> tuple[ActiveRun, str, str | bytes | None]:
        """The first step of `authorize`, alone for the run API's gate (which refuses a call before its request
        is read): the run whose token the call presents, the token's hash and the plugin secret presented, if any.
        Raises Unauthenticated for a missing, unknown or revoked token."""
        token = plugin_secret = None
        for key, value in metadata:
            if key == "authorization":
                token = value
            elif key == "x-agenthost-plugin":
                plugin_secret = value
        if not isinstance(token, str) or not token.startswith("Bearer "):
            raise Unauthenticated("missing run token (authorization: Bearer <token>)")
        presented = hash_secret(token[7:])
        run = self._by_token.get(presented)
        if run is None:
            raise Unauthenticated("run token is not valid (unknown, forged, or revoked when its run ended)")
        return run, presented, plugin_secret

    def authorize(
        self,
        metadata: Sequence[tuple[str, str | bytes]],
        run_id: str,
        method: str,
        run_exists: callable,
        worker: str = "",
        gated: tuple[str, str | bytes | None] | None = None,
    ) -> tuple[ActiveRun, bool]:
        """The one check every AgentRunAPIProxy call passes through, in this order:

        token missing/unknown/revoked → UNAUTHENTICATED; run_id empty → INVALID_ARGUMENT; run unknown →
        NOT_FOUND; token of another run, or a run token presented by another plugin process → PERMISSION_DENIED;
        run finished or past its deadline → FAILED_PRECONDITION; method outside the frozen grant →
        PERMISSION_DENIED.

        Returns the run and whether the call presented its tool token (a process inside the run's sandbox) rather
        than its run token (the runner process, with the plugin's secret).

        `gated`: (token hash, plugin secret) that `token_run` already read from this same call's metadata (the run
        API's gate does, before the request is read); `metadata` is then not read again. The token is still looked
        up here, so a run revoked since the gate is refused the same way.
        """
        if gated is None:
            run, presented, plugin_secret = self.token_run(metadata)
        else:
            presented, plugin_secret = gated
            found = self._by_token.get(presented)
            if found is None:
                raise Unauthenticated("run token is not valid (unknown, forged, or revoked when its run ended)")
            run = found
        if not run_id:
            raise InvalidArgument("run_id is required")
        if run_id != run.run_id:
            if not run_exists(run_id):
                raise NotFound(f"no run {run_id[:64]!r}")
            raise PermissionDenied("this token belongs to another run")
        if not hmac.compare_digest(run.worker, worker):
            raise PermissionDenied("this run belongs to another worker" if run.worker else "this run is not a worker's")
        # The run token is bound to its plugin process; the tool token stands alone (it lives only inside the
        # run's own sandboxed processes, which must never hold the plugin's secret). A worker checked its own
        # plugin process's secret before forwarding the call; the host checks the worker (above).
        by_tool_token = presented == run.tool_token_hash
        if not by_tool_token and not worker:
            caller = self._plugins_by_secret.get(hash_secret(plugin_secret)) if isinstance(plugin_secret, str) else None
            if caller is None or not hmac.compare_digest(caller, run.plugin_id):
                raise PermissionDenied("this run belongs to another runner process")
        if run.finished:
            raise FailedPrecondition(f"run {run_id} has finished")
        if run.deadline_at and time.time() > run.deadline_at:
            raise FailedPrecondition(f"run {run_id} is past its deadline")
        if method not in run.grant.methods:
            raise PermissionDenied(f"{method} is not granted to this run")
        return run, by_tool_token
