"""What a caller may reach, whichever surface it came through.

The rules are the caller's credential's (credentials.Principal: its bots, `own_only`, `actor`); this module is where
every surface applies them to the host's records: the admin servicer (gRPC, and the web console in-process through
it) and the HTTP gateway send messages, find runs and answer approvals only through here, so a rule added to a
credential holds on all of them at once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from agenthost.host.access.credentials import Principal, require_bot
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb

if TYPE_CHECKING:
    from agenthost.host.runs.approvals import Approvals
    from agenthost.host.runs.manager import RunManager
    from agenthost.host.store.runs import RunStore


def send(
    runs: RunManager, principal: Principal, request: hpb.SendMessageRequest, *, encoded: bool = False
) -> AsyncIterator[hpb.SendMessageReply | bytes]:
    """RunManager.send as `principal`: one of its bots; recorded as its message, under the actor it may name; into
    a conversation it started, unless it may use every conversation of its bots; never starting another key's end
    user's or a chat's (Principal.start_refusal). Refusals raise when the returned
    stream is first read (PermissionDenied), but for the bot's, which raises here."""
    require_bot(runs.registry.bot(request.bot).bot_id, principal)
    actor = principal.actor(request.actor if request.HasField("actor") else None)
    if actor is not None:
        request.actor.CopyFrom(actor)
    return runs.send(
        request,
        origin=principal.name,
        trusted=principal.is_admin,
        own_conversation=principal.own_only is not None,
        start_refusal=principal.start_refusal(request.conversation_id),
        encoded=encoded,
    )


def run(run_store: RunStore, principal: Principal, run_id: str) -> hpb.RunInfo:
    """A run `principal` may see; the others (other bots', and to an own-only caller those it did not start) do
    not exist to it: NotFound, as for an unknown id."""
    info = run_store.get(run_id, origin=principal.own_only)
    if info is None or not principal.may_use(info.bot_id):
        raise errors.NotFound(f"no run {run_id!r}")
    return info


def approvals(store: Approvals, principal: Principal, *, bot_id: str = "", run_id: str = "") -> list[hpb.ApprovalInfo]:
    """Pending approvals `principal` may answer: of its bots (or `bot_id`, which must be one), and to an own-only
    caller of the runs it started (the people waiting on a run started elsewhere are not its to answer)."""
    bot_ids: set[str] | None = None if principal.is_admin else set(principal.bots)
    if bot_id:
        require_bot(bot_id, principal)
        bot_ids = {bot_id}
    return store.list(bot_ids=bot_ids, run_id=run_id, origin=principal.own_only)


def approval(store: Approvals, principal: Principal, approval_id: str) -> hpb.ApprovalInfo:
    """An approval `principal` may decide; any other is NotFound, as an unknown id."""
    found = store.find(approval_id)
    own = principal.own_only
    if found is None or not principal.may_use(found.bot_id) or (own is not None and store.origin(approval_id) != own):
        raise errors.NotFound(f"no approval {approval_id[:64]!r}")
    return found
