"""Approval requests as inline-keyboard buttons, and the presses that decide them.

A button's callback_data is `ap:<token>`, a random token this process made and maps in its own table to (approval,
option, the chat and message the button is in). Telegram limits callback_data to 64 bytes and hands it back
verbatim from whoever presses, so nothing in it is trusted: a token this process did not make, or one pressed from
another chat or message, decides nothing. Who may press (`approvers` in the config): the listed Telegram user ids;
without a list, in a private chat its user, in a group nobody (a group's members are not all the bot's operators).
The host decides once (FAILED_PRECONDITION after that), which also makes a redelivered press harmless.

The table lives in memory: like the host's pending approvals, which end with their run, it does not survive a
restart (a press on an older button is answered "no longer valid").
"""

from __future__ import annotations

import datetime as dt
import secrets
from collections import OrderedDict
from dataclasses import dataclass, field

from telegram import InlineKeyboardButton, InlineKeyboardMarkup, User

from agenthost.channels.sdk.text import one_line
from agenthost.protos import common_pb2 as pb

CALLBACK_PREFIX = "ap:"
MAX_KEPT = 1024  # approvals remembered (pressed late, an old one is answered "already decided" by the host)
LABEL_CHARS = 40

OUTCOME_LINES = {
    "approved": "✅ Approved",
    "denied": "❌ Denied",
    "timeout": "⌛ Timed out: not approved",
    "cancelled": "🚫 Cancelled",
}


@dataclass
class Shown:
    """One approval request as shown in a chat."""

    approval_id: str
    chat_id: int
    group: bool
    text: str
    options: dict[str, str]  # token -> option id
    message_id: int | None = None  # set once the message is sent
    tokens: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Pressed:
    """What an accepted press decides."""

    approval_id: str
    option: str
    shown: Shown


class ApprovalBoard:
    def __init__(self, approvers: list[int] | None) -> None:
        self.approvers = set(approvers) if approvers else None
        self._by_token: dict[str, Shown] = {}
        self._by_approval: OrderedDict[str, Shown] = OrderedDict()

    def show(self, request: pb.ApprovalRequested, chat_id: int, group: bool) -> tuple[Shown, InlineKeyboardMarkup]:
        """Makes the request's message text and keyboard, with fresh tokens recorded for its buttons."""
        shown = Shown(request.approval_id, chat_id, group, render_request(request, group, self.approvers), {})
        rows = []
        for option in request.options:
            token = secrets.token_urlsafe(12)  # 16 characters: callback_data stays far below Telegram's 64 bytes
            shown.options[token] = option.id
            shown.tokens.append(token)
            self._by_token[token] = shown
            label = one_line(option.label or option.id, LABEL_CHARS) or "?"
            rows.append(InlineKeyboardButton(label, callback_data=CALLBACK_PREFIX + token))
        self._by_approval[request.approval_id] = shown
        while len(self._by_approval) > MAX_KEPT:
            _, old = self._by_approval.popitem(last=False)
            for token in old.tokens:
                self._by_token.pop(token, None)
        return shown, InlineKeyboardMarkup([rows])

    def find(self, approval_id: str) -> Shown | None:
        return self._by_approval.get(approval_id)

    def may_decide(self, user: User, chat_id: int, group: bool) -> bool:
        if self.approvers is not None:
            return user.id in self.approvers
        return not group and user.id == chat_id

    def resolve_press(self, data: str | None, chat_id: int | None, message_id: int | None) -> Pressed | None:
        """The approval and option a press stands for, or None: not a token this process made, or pressed
        anywhere but on the message the token was sent with."""
        if not isinstance(data, str) or not data.startswith(CALLBACK_PREFIX):
            return None
        shown = self._by_token.get(data.removeprefix(CALLBACK_PREFIX))
        if shown is None or shown.message_id is None:
            return None
        if chat_id != shown.chat_id or message_id != shown.message_id:
            return None
        return Pressed(shown.approval_id, shown.options[data.removeprefix(CALLBACK_PREFIX)], shown)


def render_request(request: pb.ApprovalRequested, group: bool, approvers: set[int] | None) -> str:
    """Plain text (the runner wrote tool, summary and reason: data, never markup), a few lines, well under 4096."""
    tool = one_line(request.tool_name, 100) or "a tool"
    summary = one_line(request.summary, 600)
    lines = [f"🔐 Approval needed: {tool}" + (f" — {summary}" if summary else "")]
    if request.from_sandbox:  # set by the host only: the request came with the run's tool token
        lines.append(
            "⚠️ Asked from inside the run's sandbox (the agent's harness, or a command the model ran): nobody has "
            "checked this text."
        )
    if request.reason:
        lines.append(f"Why: {one_line(request.reason, 300)}")
    if request.expires_at:
        at = dt.datetime.fromtimestamp(request.expires_at, dt.UTC)
        lines.append(f"No answer by {at:%H:%M:%S} UTC is a denial.")
    if group and approvers is None:
        lines.append("(No one in this group may approve: the channel lists no approvers.)")
    return "\n".join(lines)


def render_outcome(shown_text: str, resolved: pb.ApprovalResolved) -> str:
    line = OUTCOME_LINES.get(resolved.outcome, f"Ended: {one_line(resolved.outcome, 40)}")
    if resolved.outcome in ("approved", "denied"):
        note = one_line(resolved.note, 200)
        if note.startswith("via Telegram by "):  # this adapter's own note names the person
            line += f" {note}"
        elif resolved.decided_by:
            line += f" by {one_line(resolved.decided_by, 64)}" + (f": {note}" if note else "")
    return f"{shown_text}\n\n{line}"


def who(user: User) -> str:
    """A presser as the host's record names them: name, @username, id (the id is what `approvers` lists)."""
    name = one_line(user.full_name, 64)
    handle = f" @{user.username}" if user.username else ""
    return f"{name}{handle} (tg:{user.id})"
