"""Approval requests as inline-keyboard buttons, and the presses that decide them.

A button's callback_data is `ap:<token>`, a random token this process made and maps in its own table to (approval,
option, the chat and message the button is in). Telegram limits callback_data to 64 bytes and hands it back
verbatim from whoever presses, so nothing in it is trusted: a token this process did not make, or one pressed from
another chat or message, decides nothing. Who may press (`approvers` in the config): the listed Telegram user ids;
without a list, in a private chat its user if the operator listed them in `allowed_users`, else nobody: in a group
(its members are not all the bot's operators) and in a bot open to every Telegram user (a stranger would approve
the tool calls of their own run, which the approval is there to keep from them). Nobody here: an operator decides
it (`agenthost approvals`, the console), or it times out denied.
The host decides once (FAILED_PRECONDITION after that), which also makes a redelivered press harmless.

The table is kept in the adapter's state file (written when a request's message is sent): a run outlives a restart
of its channel's process, and so does its pending approval, so its buttons must keep working. A button restored
that way has no live stream to show the outcome, so the press that decides it edits the message itself.
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any

from telegram import InlineKeyboardButton, InlineKeyboardMarkup, User

from agenthost.channels.sdk.state import AdapterState
from agenthost.channels.sdk.text import one_line
from agenthost.protos import common_pb2 as pb
from agenthost.protos.text import call_arguments

log = logging.getLogger(__name__)

CALLBACK_PREFIX = "ap:"
MAX_KEPT = 256  # approvals remembered (pressed late, an old one is answered "already decided" by the host)
STATE_KEY = "approval_buttons"
LABEL_CHARS = 40
ARGUMENTS_CHARS = 2000  # with the summary (600), the reason (300) and the notes, well under Telegram's 4096

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
    restored: bool = False  # read back from the state file: no stream of its run is being followed
    settled: bool = False  # its outcome is known here: no longer kept in the state file

    def saved(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k not in ("restored", "settled")}

    @classmethod
    def load(cls, saved: Any) -> Shown | None:
        """One entry of the state file, or None if it is not one this board wrote (a file edited by hand)."""
        try:
            shown = cls(**saved, restored=True)
        except TypeError:
            return None
        typed = (
            isinstance(shown.approval_id, str)
            and isinstance(shown.chat_id, int)
            and isinstance(shown.message_id, int)
            and isinstance(shown.text, str)
            and isinstance(shown.options, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in shown.options.items())
            and sorted(shown.tokens) == sorted(shown.options)  # the state file sorts keys
        )
        return shown if typed else None


@dataclass(frozen=True)
class Pressed:
    """What an accepted press decides."""

    approval_id: str
    option: str
    shown: Shown


class ApprovalBoard:
    def __init__(
        self, approvers: list[int] | None, state: AdapterState | None = None, *, vetted_users: bool = False
    ) -> None:
        self.approvers = set(approvers) if approvers else None
        # The operator lists who may use the bot (`allowed_users`): only then is a private chat's user theirs.
        self.vetted_users = vetted_users
        self._by_token: dict[str, Shown] = {}
        self._by_approval: OrderedDict[str, Shown] = OrderedDict()
        self._state = state
        saved = state.get(STATE_KEY, []) if state is not None else []
        for entry in saved if isinstance(saved, list) else ():
            shown = Shown.load(entry) if isinstance(entry, dict) else None
            if shown is None:
                log.warning("an approval button entry in the state file is malformed; skipped")
                continue
            self._keep(shown)

    def show(self, request: pb.ApprovalRequested, chat_id: int, group: bool) -> tuple[Shown, InlineKeyboardMarkup]:
        """Makes the request's message text and keyboard, with fresh tokens recorded for its buttons."""
        shown = Shown(request.approval_id, chat_id, group, render_request(request, self.nobody_here(group)), {})
        rows = []
        for option in request.options:
            token = secrets.token_urlsafe(12)  # 16 characters: callback_data stays far below Telegram's 64 bytes
            shown.options[token] = option.id
            shown.tokens.append(token)
            label = one_line(option.label or option.id, LABEL_CHARS) or "?"
            rows.append(InlineKeyboardButton(label, callback_data=CALLBACK_PREFIX + token))
        self._keep(shown)
        return shown, InlineKeyboardMarkup([rows])

    def sent(self, shown: Shown, message_id: int) -> None:
        """The request's message is in the chat: its buttons can be pressed from now on, after a restart too."""
        shown.message_id = message_id
        self._save()

    def restored_open(self) -> list[Shown]:
        return [s for s in self._by_approval.values() if s.restored and not s.settled]

    def settle(self, shown: Shown) -> None:
        """Its outcome is shown or known: a late press is still answered (by the host), but the state file, which
        the adapter rewrites with every update it takes, keeps only the open ones."""
        if not shown.settled:
            shown.settled = True
            self._save()

    def _save(self) -> None:
        if self._state is not None:
            kept = [s.saved() for s in self._by_approval.values() if s.message_id is not None and not s.settled]
            self._state.save(**{STATE_KEY: kept})

    def _keep(self, shown: Shown) -> None:
        for token in shown.tokens:
            self._by_token[token] = shown
        self._by_approval[shown.approval_id] = shown
        while len(self._by_approval) > MAX_KEPT:
            _, old = self._by_approval.popitem(last=False)
            for token in old.tokens:
                self._by_token.pop(token, None)

    def find(self, approval_id: str) -> Shown | None:
        return self._by_approval.get(approval_id)

    def may_decide(self, user: User, chat_id: int, group: bool) -> bool:
        if self.approvers is not None:
            return user.id in self.approvers
        return not self.nobody_here(group) and user.id == chat_id

    def nobody_here(self, group: bool) -> str:
        """Why no one in such a chat may press the buttons (the line its request message carries); "" if someone
        may."""
        if self.approvers is not None:
            return ""
        if group:
            return "No one in this group may approve: the channel lists no approvers."
        if not self.vetted_users:
            return (
                "No one in this chat may approve: the bot is open to every Telegram user and the channel lists no"
                " approvers."
            )
        return ""

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


def render_request(request: pb.ApprovalRequested, nobody_here: str = "") -> str:
    """Plain text (the runner wrote tool, summary and reason: data, never markup), a few lines, well under 4096."""
    tool = one_line(request.tool_name, 100) or "a tool"
    summary = one_line(request.summary, 600)
    lines = [f"🔐 Approval needed: {tool}" + (f" — {summary}" if summary else "")]
    if request.from_sandbox:  # set by the host only: the request came with the run's tool token
        lines.append(
            "⚠️ Asked from inside the run's sandbox (the agent's harness, or a command the model ran): nobody has "
            "checked this text."
        )
    if request.arguments_json:  # the summary is cut: what matters may lie past its end
        lines.append(
            f"Arguments: {call_arguments(request.arguments_json, request.arguments_truncated, ARGUMENTS_CHARS)}"
        )
    if request.reason:
        lines.append(f"Why: {one_line(request.reason, 300)}")
    if request.expires_at:
        at = dt.datetime.fromtimestamp(request.expires_at, dt.UTC)
        lines.append(f"No answer by {at:%H:%M:%S} UTC is a denial.")
    if nobody_here:
        lines.append(f"({nobody_here} The bot's operator may decide it.)")
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
