"""Who may use the admin surface (`AgentHost` on admin.sock), and for what.

Two kinds of credential, both presented as `authorization: Bearer <token>`:
* the full-admin token, in `<data>/admin.token` (0600). The CLI reads it; no sandbox can see the data dir, so no
  plugin, model or harness can.
* scoped credentials made with CreateCredential ("send": talk to some bots and read their runs), for channel
  adapters and gateway keys. Only their sha256 is kept, in `<data>/credentials.json` (0600).

`AuthInterceptor` authenticates every call before any servicer code runs and makes the caller's `Principal`
available to the servicer. What a principal may reach (bots, conversations, runs, the actor its messages are
recorded under) is decided by the Principal alone, and every surface (the admin servicer over gRPC, the web console
through it, the HTTP gateway) asks it through agenthost.host.api.access.
"""

from __future__ import annotations

import contextlib
import contextvars
import hmac
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from agenthost.host.access.grants import hash_secret, new_token
from agenthost.host.access.private_files import ADMIN_TOKEN_FILE, read_json, write_json
from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb

CREDENTIALS_FILE = "credentials.json"
SCOPES = ("admin", "send")
# What a "send" credential may call; everything else needs "admin". Each of these names a bot or a run, and the
# servicer checks it against the credential (agenthost.host.api.access): a send credential reaches only the runs and
# conversations it started, unless granted all of its bots' (`all_conversations`; never a channel's).
SEND_METHODS = frozenset(
    {
        "SendMessage",
        "GetRun",
        "ListRuns",
        "ListRunEvents",
        "CancelRun",
        "ListApprovals",
        "DecideApproval",
        "ReadRunArtifact",
    }
)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# Credentials the host makes for its channel adapters (agenthost.host.processes.channels) are named
# `channel.<name>`; a user cannot create one of that name, so no adapter's credential can be pre-empted or shadowed.
CHANNEL_PREFIX = "channel."
# Names a credential may not take: "admin" is the admin token's, recorded as the sender of the CLI's messages (a send
# key of that name would own the CLI's conversations and runs), "local" the actor of messages that name none (a send
# key of that name, with no end user named, would be that actor: Principal.actor).
RESERVED_NAMES = frozenset({"admin", "local"})
# The conversation the gateway gives a key's end user who names none (`user:<key>/<user>`: Principal.user_conversation).
USER_CONVERSATION = "user:"
# How a channel adapter names a chat's conversation: `<platform>:<id>` (tg:42, tg:42:7 for a forum topic); a name of
# this form is started only by a channel (Principal.start_refusal).
CHAT_CONVERSATION = re.compile(r"[a-z][a-z0-9_-]{0,31}:")


@dataclass(frozen=True)
class Principal:
    """An authenticated caller, and the rules of its credential: the one place they are written."""

    name: str
    scope: str
    bots: frozenset[str] = field(default_factory=frozenset)
    all_conversations: bool = False
    # Which issue of the credential this is (the sha256 of its token): a credential revoked and made again under the
    # same name is another principal, so nothing opened with the old one (a console session) carries over.
    issue: str = field(default="", repr=False)
    # A channel adapter's chats: the head (`tg:`) of every conversation name it may start, set by the host from the
    # channel's record (agenthost.host.processes.channels.chat_prefix), never from what the adapter says.
    chats: str = ""

    @property
    def is_admin(self) -> bool:
        return self.scope == "admin"

    def require_method(self, method: str) -> None:
        """Refuses an admin method this credential may not call: a scoped one may call SEND_METHODS alone. Asked by
        AuthInterceptor for gRPC callers and by the console's in-process calls (AdminCalls)."""
        if not self.is_admin and method not in SEND_METHODS:
            raise errors.PermissionDenied(f"credential {self.name!r} ({self.scope}) may not call {method}")

    @property
    def is_channel(self) -> bool:
        """A credential the host made for one of its channel adapters (no user can make one of that name)."""
        return self.name.startswith(CHANNEL_PREFIX)

    def may_use(self, bot_id: str) -> bool:
        return self.is_admin or bot_id in self.bots

    @property
    def own_only(self) -> str | None:
        """The sender (credential name, as recorded on events and runs) whose conversations and runs alone this
        caller may use, when that is narrower than its bots; None: all of them. A send key serves one application
        (a channel adapter is a plugin serving whoever writes on its platform): the conversations another sender
        started (the CLI's, a Telegram chat, another application's) are not its to write into or read back through
        the bot's replies, nor their runs its to read or act on, unless the operator granted it all (never a
        channel's)."""
        if self.is_admin or (self.all_conversations and not self.is_channel):
            return None
        return self.name

    def user_conversation(self, user: str) -> str:
        """The one conversation of this key's end user `user` with a bot, in the key's namespace as its actor is."""
        return f"{USER_CONVERSATION}{self.name}/{user}"

    def start_refusal(self, conversation_id: str) -> str | None:
        """Why this caller may not be the one to start `conversation_id`; None: it may. The first sender of a
        conversation owns it (own-only callers are refused in it after), so a name another sender will need is not
        everyone's to take first:
        - a key's end user's conversation (`user:<key>/<user>`) is that key's: started by another sender, the end
          user, who has no other, would be refused in it for good;
        - a chat's (`<platform>:<id>`, as tg:42) is its channel adapter's: a key that started it first would lock
          the chat out of its own conversation;
        - a channel adapter, an untrusted plugin, starts only names of that form, never a key's or the CLI's, and
          only under the head the host gave its channel (`chats`), never another channel's chats.
        The admin may start any."""
        if self.is_admin:
            return None
        shown = repr(conversation_id[:64])
        if conversation_id.startswith(USER_CONVERSATION):
            if conversation_id.startswith(self.user_conversation("")):
                return None
            return (
                f"conversation {shown} is another key's end user's conversation; {self.name!r} may not start it:"
                " name another"
            )
        chat_named = CHAT_CONVERSATION.match(conversation_id) is not None
        if self.is_channel and not chat_named:
            return (
                f"a channel names its chats' conversations <platform>:<id> (tg:42), not {shown}: that is a name a"
                " key or the CLI uses"
            )
        if self.is_channel and not (self.chats and conversation_id.startswith(self.chats)):
            # Another platform's chats (a "slack" adapter taking tg:42 first), or another channel's of this bot.
            return (
                f"channel {self.name.removeprefix(CHANNEL_PREFIX)!r} names its chats' conversations "
                f"{self.chats or '<none given>'}<id>, not {shown}: those are another channel's"
            )
        if not self.is_channel and chat_named:
            return (
                f"conversation {shown} is named as a chat's (<platform>:<id>, as tg:42), which only a channel adapter"
                f" starts; {self.name!r} may not start it: name one without a '<platform>:' head"
            )
        return None

    def actor(self, requested: pb.Actor | None) -> pb.Actor | None:
        """The actor a message from this caller is recorded under, and so whose `actor` state (personal memory) its
        run reads. A send key names its end users within its own namespace, `<credential>/<id>` (the credential
        itself with no id), as it names their conversations: two applications' "alice", or a key claiming a
        Telegram user's `tg:<id>`, never reach one another's memory. The admin (trusted) names actors outright; None:
        the host's default (`local`). A channel adapter names its platform's users (`tg:<id>`) but is an untrusted
        plugin: never an actor a credential's name could be or head (`local`, `app`, `app/alice`: the CLI user's or a
        key's memory); naming none, it is itself."""
        if self.is_admin:
            return requested
        actor = pb.Actor(actor_type="user")
        if requested is not None:
            actor.CopyFrom(requested)
        actor.actor_type = actor.actor_type or "user"
        if not self.is_channel:
            actor.actor_id = f"{self.name}/{actor.actor_id}" if actor.actor_id else self.name
        elif not actor.actor_id:
            actor.actor_id = self.name
        elif _NAME.fullmatch(actor.actor_id.partition("/")[0]):
            raise errors.InvalidArgument(
                f"a channel names its platform's users as <platform>:<id> (tg:42), not {actor.actor_id[:64]!r}: that"
                " is a host credential's own actor"
            )
        return actor


ADMIN = Principal("admin", "admin")
# No default: servicer code that runs without an authenticated caller fails closed instead of acting as admin.
_current: contextvars.ContextVar[Principal] = contextvars.ContextVar("agenthost_principal")


def current() -> Principal:
    """The caller of the admin call being served (set by AuthInterceptor for the call's whole life)."""
    try:
        return _current.get()
    except LookupError:
        raise errors.Internal("an admin call reached the servicer without an authenticated caller") from None


@contextlib.contextmanager
def acting_as(principal: Principal) -> Iterator[None]:
    """Serves admin calls made in-process (the gateway's console) as `principal`, as AuthInterceptor does for calls
    that arrive over gRPC."""
    token = _current.set(principal)
    try:
        yield
    finally:
        _current.reset(token)


def require_bot(bot_id: str, principal: Principal | None = None) -> None:
    """Refuses a scoped caller (the current one by default) touching a bot outside its credential."""
    principal = principal or current()
    if not principal.may_use(bot_id):
        raise errors.PermissionDenied(f"credential {principal.name!r} may not use bot {bot_id!r}")


class Credentials:
    """Owned by the Host. The admin token is created once and kept across restarts (the CLI of a user who started
    the host earlier keeps working); scoped credentials live until revoked."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.admin_token = self._load_or_create_admin_token()
        self._admin_hash = hash_secret(self.admin_token)
        self._path = data_dir / CREDENTIALS_FILE
        self._scoped: dict[str, dict[str, Any]] = (read_json(self._path) or {}).get("credentials", {})

    def _load_or_create_admin_token(self) -> str:
        path = self.data_dir / ADMIN_TOKEN_FILE
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            st = os.lstat(path)
            if st.st_uid != os.getuid() or not os.path.isfile(path) or os.path.islink(path):
                raise PermissionError(f"{path} is not a file owned by this user; refusing to trust it") from None
            os.chmod(path, 0o600)
            token = path.read_text().strip()
            if token:
                return token
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
        token = new_token("adm")
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        return token

    def authenticate(self, metadata: tuple[tuple[str, str | bytes], ...] | None) -> Principal:
        token = next((v for k, v in metadata or () if k == "authorization"), None)
        if not isinstance(token, str) or not token.startswith("Bearer "):
            raise errors.Unauthenticated(
                "missing credential (authorization: Bearer <token>); the CLI reads <data dir>/admin.token"
            )
        digest = hash_secret(token[7:])
        if hmac.compare_digest(digest, self._admin_hash):
            return ADMIN
        for name, cred in self._scoped.items():
            if hmac.compare_digest(digest, cred["token_hash"]):
                return self._principal(name, cred)
        raise errors.Unauthenticated("credential is not valid (unknown, or revoked)")

    @staticmethod
    def _principal(name: str, cred: dict[str, Any]) -> Principal:
        # Credentials written before the grant existed lack it: their conversations are their own.
        return Principal(
            name,
            cred["scope"],
            frozenset(cred["bots"]),
            all_conversations=bool(cred.get("all_conversations", False)),
            issue=cred["token_hash"],
            chats=str(cred.get("chats", "")),
        )

    def is_live(self, principal: Principal) -> bool:
        """Whether `principal` is still what its credential says: not revoked, not revoked and made again."""
        if principal == ADMIN:
            return True
        cred = self._scoped.get(principal.name)
        return cred is not None and self._principal(principal.name, cred) == principal

    # ---- scoped credentials (admin calls) ----

    def create(
        self,
        name: str,
        scope: str,
        bot_ids: list[str],
        *,
        replace: bool = False,
        all_conversations: bool = False,
        chats: str = "",
    ) -> tuple[hpb.CredentialInfo, str]:
        """`replace` is the host's own rotation of a channel's credential: the old token stops working. `chats`: a
        channel's conversation head (Principal.chats), given only by the host."""
        if not replace and name.startswith(CHANNEL_PREFIX):
            raise errors.InvalidArgument(f"credential names starting with {CHANNEL_PREFIX!r} are the host's own")
        if all_conversations and (scope != "send" or name.startswith(CHANNEL_PREFIX)):
            raise errors.InvalidArgument(
                "only a send credential is granted all conversations (an admin credential has them already)"
            )
        if not _NAME.fullmatch(name):
            raise errors.InvalidArgument("credential name: 1-64 of letters, digits, '.', '_', '-'")
        if name in RESERVED_NAMES:
            raise errors.InvalidArgument(f"credential name {name!r} is the host's own; choose another")
        if scope not in SCOPES:
            raise errors.InvalidArgument(f"scope must be one of {list(SCOPES)}, not {scope!r}")
        if scope == "send" and not bot_ids:
            raise errors.InvalidArgument("a send credential names at least one bot")
        if name in self._scoped and not replace:
            raise errors.AlreadyExists(f"credential {name!r} exists; revoke it first")
        token = new_token("cred")
        cred = {
            "scope": scope,
            "bots": sorted(set(bot_ids)),
            "token_hash": hash_secret(token),
            "created_at": time.time(),
            "all_conversations": all_conversations,
        }
        if chats:
            cred["chats"] = chats
        self._save({**self._scoped, name: cred})
        return self._info(name, cred), token

    def list(self) -> list[hpb.CredentialInfo]:
        return [self._info(name, cred) for name, cred in sorted(self._scoped.items())]

    def revoke(self, name: str) -> None:
        if name not in self._scoped:
            raise errors.NotFound(f"no credential {name!r}")
        self._save({k: v for k, v in self._scoped.items() if k != name})

    def _save(self, scoped: dict[str, dict[str, Any]]) -> None:
        write_json(self._path, {"credentials": scoped})
        self._scoped = scoped

    @staticmethod
    def _info(name: str, cred: dict[str, Any]) -> hpb.CredentialInfo:
        return hpb.CredentialInfo(
            name=name,
            scope=cred["scope"],
            bots=cred["bots"],
            created_at=cred["created_at"],
            all_conversations=bool(cred.get("all_conversations", False)),
        )


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Authenticates every AgentHost call from its metadata alone, before the request is read, and runs the
    handler with the caller's Principal set. Health checks on the same server stay open (readiness probes)."""

    def __init__(self, credentials: Credentials, on_refused: Callable[[str, str], None] | None = None) -> None:
        """`on_refused(method, code)` is told of every refusal (the host's observer logs and counts them)."""
        self.credentials = credentials
        self.on_refused = on_refused

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        service, _, method = details.method.rpartition("/")
        if handler is None or not service.endswith("agenthost.v1.AgentHost"):
            return handler
        try:
            principal = self.credentials.authenticate(details.invocation_metadata)
            principal.require_method(method)
        except errors.AgentHostError as exc:
            if self.on_refused is not None:
                self.on_refused(method, exc.code.name)
            return _refusal(handler, exc)
        return _with_principal(handler, principal)


def _refusal(handler: grpc.RpcMethodHandler, error: errors.AgentHostError) -> grpc.RpcMethodHandler:
    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await errors.abort_with(context, error)

    async def streaming(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await errors.abort_with(context, error)
        yield  # pragma: no cover — abort raises

    return _replace(handler, unary, streaming)


def _with_principal(handler: grpc.RpcMethodHandler, principal: Principal) -> grpc.RpcMethodHandler:
    inner_unary = handler.unary_unary
    inner_stream = handler.unary_stream

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        token = _current.set(principal)
        try:
            return await inner_unary(request, context)
        finally:
            _current.reset(token)

    async def streaming(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        token = _current.set(principal)
        try:
            async for reply in inner_stream(request, context):
                yield reply
        finally:
            # A stream left suspended at its `yield` when the host stops is closed later by the event loop, in a
            # task and context of its own, where the token means nothing (and the call's context is gone).
            with contextlib.suppress(ValueError):
                _current.reset(token)

    return _replace(handler, unary, streaming)


def _replace(handler: grpc.RpcMethodHandler, unary: Any, streaming: Any) -> grpc.RpcMethodHandler:
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(
            unary, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(
            streaming,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    raise TypeError("AgentHost has only unary-unary and unary-stream methods")
