"""Replies into one Telegram chat (or forum topic): plain text (no parse mode, so nothing a model writes can break
Telegram's markup or be read as it), paced per chat, with Telegram's 429 `retry_after` honoured and transient
failures (a 5xx, a timeout, a reset connection) tried again with bounded exponential backoff.

A sendMessage retried after a 5xx or a timeout may already have been sent (the Bot API cannot say): delivery is
at least once there, since a duplicate message is the lesser harm than a lost reply. A refusal (400, 403) is
never retried."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from telegram import Bot, InputFile, ReplyParameters
from telegram.error import BadRequest, Forbidden, NetworkError, RetryAfter, TimedOut

from agenthost.channels.sdk.throttle import Pacer
from agenthost.channels.telegram.approvals import ApprovalBoard, render_outcome
from agenthost.channels.telegram.updates import Where
from agenthost.protos import common_pb2 as pb

log = logging.getLogger(__name__)

MAX_CHARS = 4096  # Telegram's limit for one message's text
RETRIES = 5  # attempts per call
RETRY_DELAY = 0.5  # seconds before the second attempt after a transient failure, doubled each time after
RETRY_DELAY_MAX = 8.0
# Kinds that are the run's inner workings, not something to show a chat.
QUIET_KINDS = frozenset({"tool_started", "tool_finished", "progress"})
ArtifactFetcher = Callable[[pb.ArtifactRef], Awaitable[bytes | None]]


def _seconds(value: int | dt.timedelta) -> float:
    return value.total_seconds() if isinstance(value, dt.timedelta) else float(value)


def transient(exc: BaseException) -> bool:
    """The Bot API unreachable for now (a 5xx, a timeout, a reset connection: worth trying again), as against a
    refusal. python-telegram-bot raises NetworkError for a 5xx and files BadRequest under NetworkError too."""
    if isinstance(exc, BadRequest | Forbidden):
        return False
    return isinstance(exc, TimedOut | NetworkError)


class TelegramSink:
    max_chars = MAX_CHARS
    can_edit = True

    def __init__(
        self,
        bot: Bot,
        pacer: Pacer,
        where: Where,
        *,
        reply_to: int | None = None,
        fetch_artifact: ArtifactFetcher | None = None,
        approvals: ApprovalBoard | None = None,
        retry_delay: float = RETRY_DELAY,
    ) -> None:
        self.bot = bot
        self.pacer = pacer
        self.where = where
        self.reply_to = reply_to
        self.fetch_artifact = fetch_artifact
        self.approvals = approvals
        self.retry_delay = retry_delay

    async def _call(self, send: Callable[[], Awaitable[Any]]) -> Any:
        for attempt in range(RETRIES):
            await self.pacer.acquire(self.where.chat_id, self.where.group)
            try:
                return await send()
            except RetryAfter as exc:
                wait = _seconds(exc.retry_after)
                log.info("telegram asked to wait %.1fs before writing to chat %s", wait, self.where.chat_id)
                self.pacer.retry_after(self.where.chat_id, wait)
                if attempt == RETRIES - 1:
                    raise
            except (TimedOut, NetworkError) as exc:
                if not transient(exc) or attempt == RETRIES - 1:
                    raise
                delay = min(self.retry_delay * 2**attempt, RETRY_DELAY_MAX)
                log.warning("telegram failed (%r); trying again in %.2fs", exc, delay)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    def _reply_parameters(self) -> ReplyParameters | None:
        # Only the first message of a reply quotes the user's (in groups, so it is clear whom it answers).
        if self.reply_to is None or not self.where.group:
            return None
        target, self.reply_to = self.reply_to, None
        return ReplyParameters(message_id=target, allow_sending_without_reply=True)

    async def send_text(self, text: str) -> int:
        text = text.strip()  # Telegram trims messages; sending the trimmed text keeps later edits comparable
        reply = self._reply_parameters()
        message = await self._call(
            lambda: self.bot.send_message(
                self.where.chat_id, text, message_thread_id=self.where.thread_id, reply_parameters=reply
            )
        )
        return message.message_id

    async def edit_text(self, handle: int, text: str) -> None:
        text = text.strip()
        try:
            await self._call(lambda: self.bot.edit_message_text(text, chat_id=self.where.chat_id, message_id=handle))
        except BadRequest as exc:
            if "not modified" not in str(exc).lower():
                raise

    async def notice(self, line: str) -> None:
        await self.send_text(line)

    async def typing(self) -> None:
        try:
            await self.bot.send_chat_action(self.where.chat_id, "typing", message_thread_id=self.where.thread_id)
        except Exception as exc:  # noqa: BLE001 — a missing typing indicator is not worth failing a reply
            log.debug("sendChatAction failed: %r", exc)

    async def event(self, event: pb.RunEvent) -> None:
        kind = event.WhichOneof("kind")
        if kind in QUIET_KINDS:
            return
        if kind == "artifact_created":
            await self._send_artifact(event.artifact_created.artifact)
            return
        if kind == "approval_requested" and self.approvals is not None:
            await self._ask(event.approval_requested)
            return
        if kind == "approval_resolved" and self.approvals is not None:
            await self._resolved(event.approval_resolved)
            return
        # A kind this adapter does not render yet: say so in one line rather than drop it.
        await self.notice(f"ℹ️ The bot sent something this chat cannot show ({kind}).")

    async def _send_artifact(self, ref: pb.ArtifactRef) -> None:
        data = await self.fetch_artifact(ref) if self.fetch_artifact is not None else None
        if data is None:
            await self.notice(f"📎 The bot made a file, {ref.name or ref.artifact_id}, that this chat cannot fetch.")
            return
        upload = InputFile(data, filename=ref.name or "file")
        if ref.mime_type in ("image/png", "image/jpeg", "image/webp") and len(data) <= 10 * 1024 * 1024:
            await self._call(
                lambda: self.bot.send_photo(self.where.chat_id, upload, message_thread_id=self.where.thread_id)
            )
        else:
            await self._call(
                lambda: self.bot.send_document(self.where.chat_id, upload, message_thread_id=self.where.thread_id)
            )

    async def _ask(self, request: pb.ApprovalRequested) -> None:
        assert self.approvals is not None
        shown, keyboard = self.approvals.show(request, self.where.chat_id, self.where.group)
        message = await self._call(
            lambda: self.bot.send_message(
                self.where.chat_id, shown.text, message_thread_id=self.where.thread_id, reply_markup=keyboard
            )
        )
        self.approvals.sent(shown, message.message_id)

    async def _resolved(self, resolved: pb.ApprovalResolved) -> None:
        assert self.approvals is not None
        shown = self.approvals.find(resolved.approval_id)
        if shown is None or shown.message_id is None:
            return
        message_id = shown.message_id
        self.approvals.settle(shown)
        # Telegram removes the inline keyboard of a message whose text is edited without one: no more buttons.
        await self._call(
            lambda: self.bot.edit_message_text(
                render_outcome(shown.text, resolved), chat_id=shown.chat_id, message_id=message_id
            )
        )
