"""The Telegram adapter: long-polls the Bot API for updates and turns each message into an inbound event for the
channel's bot; streams the run's reply back by editing a message.

Exactly once, per update: `offset` in the adapter's state is the first update_id not yet handed to the host, so an
update Telegram delivers again (it does, until an offset confirms it) never starts a second run. A message is
recorded as in flight (durably) before it is sent to the host and the offset moves past it once the host has
created its run. If the process dies in between, the next start asks the host whether a run for that
conversation was created after the in-flight record: if so the update is done (and its reply is delivered from
the run), if not Telegram still has it and delivers it again. Each reply being delivered is recorded as owed
(`pending`) until it is delivered or Telegram refuses it. Each Bot API call is tried again on a transient failure
(TelegramSink); a reply still owed after that is delivered from the run's record by a background loop every
`redeliver_interval` seconds while the process runs, and by the next start. Delivery is at least once: a reply
confirmed delivered is never sent again, but one whose sending failed part way (or whose 5xx hid a message that
did arrive) is sent again whole. Updates that are malformed,
not for the bot, from a blocked user, commands or too long are settled at once (offset advanced) so none blocks
the ones behind it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import warnings
from collections.abc import AsyncIterator
from typing import Any

from telegram import LinkPreviewOptions, User
from telegram.error import NetworkError, RetryAfter, TelegramError, TimedOut
from telegram.ext import Defaults, ExtBot
from telegram.request import HTTPXRequest

from agenthost.channels.sdk import ChannelAdapter, ChannelContext, ChannelManifest, Limits, Pacer, deliver
from agenthost.channels.telegram.approvals import OUTCOME_LINES, ApprovalBoard, Shown, render_outcome, who
from agenthost.channels.telegram.sink import TelegramSink, _seconds, transient
from agenthost.channels.telegram.updates import Command, Ignore, Inbound, Press, Where, classify
from agenthost.channels.telegram.webhook import Webhook
from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors, media
from agenthost.protos import host_pb2 as hpb
from agenthost.protos.limited_log import RefusalLimiter, log_limited

log = logging.getLogger(__name__)
# getUpdates goes through do_api_request on purpose: the raw list lets one malformed update be skipped instead of
# failing the whole batch in the library's parser.
warnings.filterwarnings("ignore", message=r".*instead of 'Bot\.do_api_request\(\"getUpdates\"")

CONFIG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        # No default: only the operator names the key a channel is handed (`--set token_key=TELEGRAM_BOT_TOKEN`).
        "token_key": {
            "type": "string",
            "description": "name of the bot token in the host's key store (agenthost keys set NAME)",
        },
        "api_url": {"type": "string", "default": "https://api.telegram.org", "pattern": "^https?://"},
        "allowed_users": {"type": "array", "items": {"type": "integer"}, "description": "only these user ids"},
        "blocked_users": {"type": "array", "items": {"type": "integer"}},
        "approvers": {
            "type": "array",
            "items": {"type": "integer"},
            "description": (
                "user ids who may press approval buttons (default: a private chat's user if allowed_users lists"
                " them; in groups, and in a bot open to everyone, nobody)"
            ),
        },
        "max_input_chars": {"type": "integer", "minimum": 1, "maximum": 200000, "default": 16000},
        "poll_timeout": {"type": "integer", "minimum": 0, "maximum": 50, "default": 25},
        "edit_interval": {"type": "number", "minimum": 0.05, "maximum": 10, "default": 1.0},
        "streaming": {"type": "boolean", "default": True},
        "retry_delay": {
            "type": "number",
            "minimum": 0.01,
            "maximum": 30,
            "default": 0.5,
            "description": "seconds before a Bot API call is tried again after a 5xx or timeout (doubled each time)",
        },
        "redeliver_interval": {
            "type": "number",
            "minimum": 0.1,
            "maximum": 3600,
            "default": 30,
            "description": "seconds between attempts to deliver replies still owed after their retries failed",
        },
        "mode": {"enum": ["polling", "webhook"], "default": "polling"},
        "webhook_url": {"type": "string", "pattern": "^https?://", "description": "the public URL Telegram posts to"},
        "webhook_listen": {"type": "string", "default": "127.0.0.1:8443", "pattern": "^[^:]*:[0-9]{1,5}$"},
        "webhook_trusted_proxies": {
            "type": "array",
            "items": {"type": "string", "maxLength": 64},
            "maxItems": 64,
            "default": [],
            "description": "addresses or networks of the reverse proxies in front of webhook_listen, whose "
            "X-Forwarded-For names the client for the listener's per-address caps (none: every peer is the client)",
        },
    },
    "required": ["token_key"],
    "if": {"properties": {"mode": {"const": "webhook"}}, "required": ["mode"]},
    "then": {"required": ["webhook_url"]},
}

UPDATE_KINDS = ["message", "callback_query"]
# Every message and edit this bot sends: no link previews. Telegram previews a message's first link by fetching it
# from its own servers, with nobody clicking, so a model steered into writing a link with the conversation in its
# query would carry it off past every egress wall of the run's sandbox. Set once on the bot, so no call can miss it.
PLAIN_TEXT = Defaults(link_preview_options=LinkPreviewOptions(is_disabled=True))
MAX_UPLOAD_BYTES = 50 * 1024 * 1024  # the Bot API's limit for a file a bot sends
GREETING = "Hi! Send me a message and I will answer. /new starts a fresh conversation."


class TelegramAdapter(ChannelAdapter):
    manifest = ChannelManifest(
        name="telegram",
        description="Telegram bots over the Bot API (long polling or a webhook): private chats, groups, topics",
        config_schema=CONFIG_SCHEMA,
        secret_settings=("token_key",),
    )

    async def run(self, ctx: ChannelContext) -> None:
        cfg = {k: v.get("default") for k, v in CONFIG_SCHEMA["properties"].items()} | ctx.config
        self.ctx = ctx
        self.cfg = cfg
        self.allowed = set(cfg.get("allowed_users") or ())
        self.blocked = set(cfg.get("blocked_users") or ())
        self.board = ApprovalBoard(cfg.get("approvers"), ctx.state, vetted_users=bool(self.allowed))
        # What any Telegram user can make this process log again and again (an ignored message, a stranger's, a
        # forged or refused button press): limited per kind, so a stranger cannot roll its log's history away.
        self.refusals = RefusalLimiter()
        api = str(cfg["api_url"]).rstrip("/")
        poll = int(cfg["poll_timeout"])
        self.bot = ExtBot(
            ctx.secret("token_key"),
            defaults=PLAIN_TEXT,
            base_url=f"{api}/bot",
            base_file_url=f"{api}/file/bot",
            request=HTTPXRequest(connection_pool_size=32, read_timeout=20.0),
            get_updates_request=HTTPXRequest(connection_pool_size=1, read_timeout=poll + 15.0),
        )
        self.pacer = Pacer(Limits(per_chat_interval=float(cfg["edit_interval"])))
        self.deliveries: set[asyncio.Task[None]] = set()
        self.delivering: set[str] = set()  # runs whose reply a task is delivering now
        async with self.bot:
            self.me: User = self.bot.bot
            webhook = None
            if cfg["mode"] == "webhook":
                webhook = Webhook(
                    self._handle, str(cfg["webhook_listen"]), [str(p) for p in cfg.get("webhook_trusted_proxies", [])]
                )
                await webhook.start()
                await self.bot.set_webhook(
                    str(cfg["webhook_url"]),
                    secret_token=webhook.secret,
                    max_connections=1,
                    allowed_updates=UPDATE_KINDS,
                )
            else:
                await self.bot.delete_webhook()  # getUpdates is refused while a webhook is set
            log.info("telegram adapter for @%s (bot %s): %s", self.me.username, ctx.bot, cfg["mode"])
            await self._recover()
            owed = asyncio.create_task(self._owed_loop(float(cfg["redeliver_interval"])), name="owed")
            try:
                if webhook is None:
                    await self._poll(poll)
                else:
                    await ctx.stop.wait()
            finally:
                owed.cancel()
                if webhook is not None:
                    await webhook.stop()
                if self.deliveries:
                    await asyncio.wait(self.deliveries, timeout=2.0)
                    for task in self.deliveries:
                        task.cancel()

    # ---- the loop ----

    async def _poll(self, poll: int) -> None:
        stop = asyncio.ensure_future(self.ctx.stop.wait())
        try:
            while not self.ctx.stop.is_set():
                fetch = asyncio.ensure_future(
                    self.bot.do_api_request(
                        "getUpdates",
                        api_kwargs={"offset": self.offset, "timeout": poll, "allowed_updates": UPDATE_KINDS},
                    )
                )
                await asyncio.wait({fetch, stop}, return_when=asyncio.FIRST_COMPLETED)
                if not fetch.done():
                    fetch.cancel()
                    break
                try:
                    updates = fetch.result()
                except RetryAfter as exc:
                    await self._pause(_seconds(exc.retry_after))
                    continue
                except (TimedOut, NetworkError) as exc:
                    log.warning("getUpdates failed, retrying: %r", exc)
                    await self._pause(1.0)
                    continue
                if not isinstance(updates, list):
                    log.warning("getUpdates answered a %s, not a list; skipped", type(updates).__name__)
                    await self._pause(1.0)
                    continue
                for raw in updates:
                    await self._handle(raw)
        finally:
            stop.cancel()

    async def _owed_loop(self, interval: float) -> None:
        """Replies still owed after their delivery failed (Telegram down longer than a call's retries) are tried
        again while the process runs, not only at the next start."""
        while not self.ctx.stop.is_set():
            await self._pause(interval)
            if not self.ctx.stop.is_set():
                self._deliver_owed()

    def _sink(self, where: Where, **options: Any) -> TelegramSink:
        return TelegramSink(self.bot, self.pacer, where, retry_delay=float(self.cfg["retry_delay"]), **options)

    async def _pause(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self.ctx.stop.wait(), seconds)
        except TimeoutError:
            pass

    @property
    def offset(self) -> int:
        return int(self.ctx.state.get("offset", 0))

    def _settle(self, update_id: int) -> None:
        """Update `update_id` is done with: never handle it again."""
        if update_id >= self.offset:
            self.ctx.state.save(offset=update_id + 1, inflight=None)

    async def _handle(self, raw: Any) -> str:
        """Handles one update; returns what became of it (the webhook answers Telegram by it)."""
        update_id = raw.get("update_id") if isinstance(raw, dict) else None
        if not isinstance(update_id, int) or isinstance(update_id, bool):
            log.warning("skipped an update without an update_id")
            return "malformed"
        if update_id < self.offset:
            log.info("update %d was already handled (redelivered); skipped", update_id)
            return "duplicate"
        try:
            what = classify(raw, self.bot, self.me)
        except Exception as exc:  # noqa: BLE001 — whatever the parser raises, the update is malformed
            log.warning("update %d is malformed (%s: %s); skipped", update_id, type(exc).__name__, exc)
            self._settle(update_id)
            return "malformed"
        if isinstance(what, Ignore):
            log_limited(self.refusals, log, "ignored", logging.INFO, "update %d ignored: %s", update_id, what.reason)
            self._settle(update_id)
            return "ignored"
        if isinstance(what, Press):
            # Settled after the decision: a crash in between redelivers the press, which the host then refuses
            # as already decided (it decides an approval once), so a press is never lost nor counted twice.
            await self._press(what)
            self._settle(update_id)
            return "pressed"
        user_id = what.user.id
        if user_id in self.blocked or (self.allowed and user_id not in self.allowed):
            log_limited(
                self.refusals,
                log,
                "not-allowed",
                logging.INFO,
                "update %d ignored: user %d is not allowed to use this bot",
                update_id,
                user_id,
            )
            self._settle(update_id)
            return "ignored"
        if isinstance(what, Command):
            self._settle(update_id)
            await self._command(what)
            return "command"
        return await self._message(update_id, what)

    async def _command(self, command: Command) -> None:
        sink = self._sink(command.where, reply_to=command.message_id)
        try:
            if command.name == "new":
                generations = dict(self.ctx.state.get("generations", {}))
                base = command.where.base_conversation
                generations[base] = int(generations.get(base, 0)) + 1
                self.ctx.state.save(generations=generations)
                await sink.notice("🆕 Started a new conversation.")
            else:
                await sink.notice(GREETING)
        except TelegramError as exc:
            log.warning("could not answer /%s: %r", command.name, exc)

    def _conversation(self, where: Where) -> str:
        base = where.base_conversation
        generation = int(self.ctx.state.get("generations", {}).get(base, 0))
        return f"{base}#{generation}" if generation else base

    async def _message(self, update_id: int, inbound: Inbound) -> str:
        sink = self._sink(
            inbound.where, reply_to=inbound.message_id, fetch_artifact=self._fetch_artifact, approvals=self.board
        )
        limit = int(self.cfg["max_input_chars"])
        if len(inbound.text) > limit:
            self._settle(update_id)
            await self._notice(
                sink, f"⚠️ That message is too long ({len(inbound.text)} characters; the limit is {limit})."
            )
            return "refused"
        conversation = self._conversation(inbound.where)
        user = inbound.user
        request = self.ctx.request(
            conversation,
            inbound.text,
            actor=pb.Actor(actor_type="user", actor_id=f"tg:{user.id}", display_name=user.full_name),
            data={
                "telegram": {
                    "update_id": update_id,
                    "chat_id": inbound.where.chat_id,
                    "message_id": inbound.message_id,
                    "thread_id": inbound.where.thread_id,
                    "username": user.username,
                }
            },
            **await self._attachments(inbound, sink),
        )
        where = _where_json(inbound.where, inbound.message_id)
        # Durable before the host sees it: a crash from here on is resolved by _recover.
        self.ctx.state.save(
            offset=update_id,
            inflight={"update_id": update_id, "conversation": conversation, "at": time.time(), "where": where},
        )
        accepted = asyncio.get_running_loop().create_future()
        run_id = ""

        async def started(run: hpb.RunInfo) -> None:
            nonlocal run_id
            run_id = run.run_id
            self.delivering.add(run_id)
            # One write: the update is settled and its reply owed, so a crash mid-reply is finished after restart.
            pending = {**self.ctx.state.get("pending", {}), run.run_id: where}
            self.ctx.state.save(offset=max(self.offset, update_id + 1), inflight=None, pending=pending)
            if not accepted.done():
                accepted.set_result(run.run_id)

        async def reply() -> None:
            try:
                await sink.typing()
                await deliver(self.ctx.send(request), sink, streaming=bool(self.cfg["streaming"]), on_started=started)
            except Exception as exc:
                if _transient(exc):
                    # Telegram unreachable past the sink's retries: the reply stays owed; _owed_loop (or a restart)
                    # delivers it from the run's record.
                    log.warning("delivering the reply to update %d failed: %r", update_id, exc)
                else:
                    # Telegram refused (the user blocked the bot, the chat is gone, …): trying again cannot help.
                    log.exception("delivering the reply to update %d failed", update_id)
                    self._delivered(run_id)
            else:
                self._delivered(run_id)
            finally:
                self.delivering.discard(run_id)
                if not accepted.done():
                    # Refused by the host (the user was told) or failed before a run existed: nothing to redo.
                    self._settle(update_id)
                    accepted.set_result(None)

        task = asyncio.create_task(reply(), name=f"reply:{update_id}")
        self.deliveries.add(task)
        task.add_done_callback(self.deliveries.discard)
        # One update at a time until the host has it (cheap): the offset only ever moves forward in order, and runs
        # of one chat reach the host in the order they were written. Replies stream concurrently.
        return "sent" if await accepted else "refused"

    # ---- approval buttons ----

    async def _press(self, press: Press) -> None:
        answer = await self._decide(press)
        try:
            await self.bot.answer_callback_query(press.query_id, text=answer)
        except TelegramError as exc:
            log.warning("could not answer a button press: %r", exc)

    async def _decide(self, press: Press) -> str:
        """Decides the approval a press stands for, when the presser may; returns what they are told."""
        pressed = self.board.resolve_press(press.data, press.chat_id, press.message_id)
        if pressed is None:
            log_limited(
                self.refusals,
                log,
                "unknown-press",
                logging.WARNING,
                "a button press from user %d with data this adapter did not make; refused",
                press.user.id,
            )
            return "This button is no longer valid."
        user = press.user
        if (
            user.id in self.blocked
            or (self.allowed and user.id not in self.allowed)
            or not self.board.may_decide(user, pressed.shown.chat_id, pressed.shown.group)
        ):
            log_limited(
                self.refusals,
                log,
                "may-not-decide",
                logging.INFO,
                "user %d may not decide approval %s; refused",
                user.id,
                pressed.approval_id,
            )
            return "You cannot approve this."
        request = hpb.DecideApprovalRequest(
            approval_id=pressed.approval_id, decision=pressed.option, note=f"via Telegram by {who(user)}"
        )
        try:
            info = await self.ctx.host.call("DecideApproval", request, timeout=15.0)
        except (errors.FailedPrecondition, errors.NotFound):
            self.board.settle(pressed.shown)
            await self._drop_keyboard(pressed.shown)
            return "This was already decided."
        except errors.AgentHostError as exc:
            log.warning("could not decide approval %s: %r", pressed.approval_id, exc)
            return "Could not reach the bot; please try again."
        if pressed.shown.restored:
            # No stream of this run is followed since a restart: show the outcome here, as the sink would.
            resolved = pb.ApprovalResolved(approval_id=pressed.approval_id, outcome=info.status, note=request.note)
            self.board.settle(pressed.shown)
            await self._show_outcome(pressed.shown, resolved)
        return OUTCOME_LINES.get(info.status, info.status)

    async def _show_outcome(self, shown: Shown, resolved: pb.ApprovalResolved) -> None:
        try:
            # Edited without reply_markup: Telegram removes the keyboard with the old text.
            await self.bot.edit_message_text(
                render_outcome(shown.text, resolved), chat_id=shown.chat_id, message_id=shown.message_id
            )
        except TelegramError as exc:
            log.debug("could not show the outcome of approval %s: %r", shown.approval_id, exc)

    async def _drop_keyboard(self, shown: Shown) -> None:
        """The buttons of an approval decided elsewhere (or whose run ended while this process was away)."""
        try:
            # Without reply_markup: Telegram removes the keyboard.
            await self.bot.edit_message_reply_markup(chat_id=shown.chat_id, message_id=shown.message_id)
        except TelegramError as exc:
            log.debug("could not remove the buttons of approval %s: %r", shown.approval_id, exc)

    async def _notice(self, sink: TelegramSink, line: str) -> None:
        try:
            await sink.notice(line)
        except TelegramError as exc:
            log.warning("could not send a notice: %r", exc)

    async def _attachments(self, inbound: Inbound, sink: TelegramSink) -> dict[str, Any]:
        """Photos and documents become the message's attachments (the host stores them as artifacts). A file over
        the host's limit, or one Telegram cannot hand over, is left out and the user told in one line."""
        if not (inbound.photos or inbound.documents):
            return {}
        # Images are typed by the host from their bytes (Telegram's label could disagree with them).
        files = [(fid, size, "photo.jpg", "") for fid, size in inbound.photos]
        files += [
            (fid, size, name, "" if mime.startswith("image/") else mime) for fid, size, name, mime in inbound.documents
        ]
        out: list[hpb.Attachment] = []
        total = 0
        for file_id, size, name, mime in files[: media.ATTACHMENTS_MAX_PER_MESSAGE]:
            if size > media.ATTACHMENT_MAX_BYTES or total + size > media.ATTACHMENTS_MAX_BYTES_PER_MESSAGE:
                await self._notice(sink, f"⚠️ {name} is too large ({size} bytes); it was not sent to the bot.")
                continue
            try:
                tg_file = await self.bot.get_file(file_id)
                data = bytes(await tg_file.download_as_bytearray())
            except TelegramError as exc:
                log.warning("could not fetch file %s: %r", file_id, exc)
                await self._notice(sink, f"⚠️ Could not fetch {name} from Telegram; it was not sent to the bot.")
                continue
            if len(data) > media.ATTACHMENT_MAX_BYTES:
                await self._notice(sink, f"⚠️ {name} is too large ({len(data)} bytes); it was not sent to the bot.")
                continue
            total += len(data)
            out.append(hpb.Attachment(name=name, mime_type=mime, data=data))
        if len(files) > media.ATTACHMENTS_MAX_PER_MESSAGE:
            await self._notice(sink, f"⚠️ Only the first {media.ATTACHMENTS_MAX_PER_MESSAGE} files were sent.")
        return {"attachments": out} if out else {}

    async def _fetch_artifact(self, ref: pb.ArtifactRef) -> bytes | None:
        return await self.ctx.read_artifact(ref.run_id, ref.artifact_id, MAX_UPLOAD_BYTES)

    # ---- recovery ----

    def _delivered(self, run_id: str) -> None:
        pending = dict(self.ctx.state.get("pending", {}))
        if pending.pop(run_id, None) is not None:
            self.ctx.state.save(pending=pending)

    async def _finish(self, run_id: str, where: dict[str, Any]) -> None:
        """Delivers the owed reply of a run whose delivery failed (here, or in a previous process): its final text,
        whole."""
        sink = self._sink(
            Where(int(where["chat_id"]), where.get("thread_id"), bool(where.get("group"))),
            reply_to=where.get("reply_to"),
            fetch_artifact=self._fetch_artifact,
        )
        try:
            while True:
                run = await self.ctx.host.call("GetRun", hpb.RunRequestById(run_id=run_id))
                if run.status not in ("queued", "running"):
                    break
                await self._pause(1.0)  # no stream to rejoin for a run already under way: its status is polled
                if self.ctx.stop.is_set():
                    return
            replayed = _replies_of(run)
            await deliver(replayed, sink, streaming=False)
            log.info("delivered the owed reply of run %s", run_id)
        except errors.NotFound:
            log.warning("run %s is gone; its reply cannot be delivered", run_id)
        except (errors.AgentHostError, TelegramError) as exc:
            if _transient(exc):
                log.warning("could not deliver the owed reply of run %s (kept): %r", run_id, exc)
                return
            log.warning("could not deliver the owed reply of run %s: %r", run_id, exc)
        finally:
            self.delivering.discard(run_id)
        self._delivered(run_id)

    async def _recover(self) -> None:
        """Settles a message that was in flight when the previous process died (see the module docstring), and the
        approval buttons of requests that ended while it was away."""
        inflight = self.ctx.state.get("inflight")
        if isinstance(inflight, dict):
            await self._recover_inflight(inflight)
        if restored := self.board.restored_open():
            try:
                listed = await self.ctx.host.call("ListApprovals", hpb.ListApprovalsRequest())
            except errors.AgentHostError as exc:
                log.warning("could not list pending approvals (their buttons stay until pressed): %r", exc)
            else:
                still_open = {a.approval_id for a in listed.approvals}
                for shown in restored:
                    if shown.approval_id not in still_open:
                        self.board.settle(shown)
                        await self._drop_keyboard(shown)
        self._deliver_owed()

    def _deliver_owed(self) -> None:
        """Starts delivering each owed reply no task is delivering now (each at most once at a time)."""
        for run_id, where in dict(self.ctx.state.get("pending", {})).items():
            if run_id in self.delivering:
                continue
            if not isinstance(where, dict) or not isinstance(where.get("chat_id"), int):
                log.warning("run %s is owed a reply to an unknown chat; dropped", run_id)
                self._delivered(run_id)
                continue
            self.delivering.add(run_id)
            task = asyncio.create_task(self._finish(run_id, where), name=f"finish:{run_id}")
            self.deliveries.add(task)
            task.add_done_callback(self.deliveries.discard)

    async def _recover_inflight(self, inflight: dict[str, Any]) -> None:
        update_id = int(inflight["update_id"])
        try:
            runs = await self.ctx.runs(str(inflight["conversation"]), limit=20)
        except errors.AgentHostError as exc:
            raise RuntimeError(f"cannot tell whether update {update_id} reached the host: {exc}") from None
        # The host and this process share a clock; a second of slack covers the record being written first.
        taken = [r for r in runs if r.created_at >= float(inflight["at"]) - 1.0]
        if taken:
            run = taken[-1]  # newest first: the earliest run since the record
            log.info("update %d had reached the host before a restart (run %s); not sent again", update_id, run.run_id)
            pending = {**self.ctx.state.get("pending", {}), run.run_id: inflight.get("where")}
            self.ctx.state.save(offset=max(self.offset, update_id + 1), inflight=None, pending=pending)
        else:
            log.info("update %d had not reached the host before a restart; Telegram will deliver it again", update_id)
            self.ctx.state.save(inflight=None)


def _where_json(where: Where, reply_to: int) -> dict[str, Any]:
    return {"chat_id": where.chat_id, "thread_id": where.thread_id, "group": where.group, "reply_to": reply_to}


async def _replies_of(run: hpb.RunInfo) -> AsyncIterator[hpb.SendMessageReply]:
    """A finished run as the stream `deliver` reads (its final text and outcome; no deltas)."""
    yield hpb.SendMessageReply(run_started=run)
    yield hpb.SendMessageReply(run_finished=run)


def _transient(exc: BaseException) -> bool:
    """Telegram or the host unreachable for now (worth trying again later), as against a refusal."""
    return transient(exc) or isinstance(exc, errors.Unavailable)
