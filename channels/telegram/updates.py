"""What one Telegram update asks of the bot, decided without touching the network: a message to send to the
bot, a command, or nothing (and why). Pure functions over python-telegram-bot's parsed objects, so every branch is
tested without a server."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from telegram import Message, Update, User

GROUP_TYPES = ("group", "supergroup")


@dataclass(frozen=True)
class Where:
    """A place replies go: a chat, maybe a forum topic in it."""

    chat_id: int
    thread_id: int | None
    group: bool

    @property
    def base_conversation(self) -> str:
        """`tg:<chat>` or `tg:<chat>:<topic>`: one conversation per chat (per forum topic), until `/new`."""
        return f"tg:{self.chat_id}" + (f":{self.thread_id}" if self.thread_id else "")


@dataclass(frozen=True)
class Inbound:
    """A message for the bot."""

    where: Where
    message_id: int
    text: str
    user: User
    photos: tuple[tuple[str, int], ...] = ()  # (file id, size) of the largest size of the photo
    documents: tuple[tuple[str, int, str, str], ...] = ()  # (file id, size, file name, mime type)


@dataclass(frozen=True)
class Command:
    where: Where
    message_id: int
    name: str  # without the slash and the @bot suffix
    user: User


@dataclass(frozen=True)
class Press:
    """A press of an inline-keyboard button (callback_query): always answered (answerCallbackQuery)."""

    query_id: str
    user: User
    data: str | None
    chat_id: int | None  # the chat and message the button is in (None when Telegram no longer says)
    message_id: int | None
    group: bool


@dataclass(frozen=True)
class Ignore:
    reason: str
    user_id: int | None = None


def _where(message: Message) -> Where:
    thread = message.message_thread_id if message.is_topic_message else None
    return Where(message.chat.id, thread, message.chat.type in GROUP_TYPES)


def _addressed(message: Message, text: str, me: User) -> tuple[bool, str]:
    """In a group: is the bot mentioned (or replied to)? Returns the text with the mention taken out."""
    mentioned = False
    stripped = text
    for entity in message.entities or message.caption_entities or ():
        part = message.parse_entity(entity) if message.text else message.parse_caption_entity(entity)
        if entity.type == "mention" and me.username and part.lower() == f"@{me.username.lower()}":
            mentioned = True
            stripped = stripped.replace(part, "", 1)
        elif entity.type == "text_mention" and entity.user is not None and entity.user.id == me.id:
            mentioned = True
    replied = (
        message.reply_to_message is not None
        and message.reply_to_message.from_user is not None
        and message.reply_to_message.from_user.id == me.id
    )
    return mentioned or replied, " ".join(stripped.split()) if mentioned else stripped.strip()


def classify(raw: dict[str, Any], bot: Any, me: User) -> Inbound | Command | Press | Ignore:
    """Raises ValueError (or the parser's TypeError/KeyError) for an update that is not a well-formed Telegram
    update; the caller logs it and moves past it."""
    update = Update.de_json(raw, bot)
    if update is None:
        raise ValueError("empty update")
    query = update.callback_query
    if query is not None:
        if not isinstance(query.id, str) or query.from_user is None:
            raise ValueError("callback query without an id or a sender")
        where = query.message
        chat_id = where.chat.id if where is not None else None
        return Press(
            query.id,
            query.from_user,
            query.data,
            chat_id,
            where.message_id if where is not None else None,
            where is not None and where.chat.type in GROUP_TYPES,
        )
    message = update.message
    if message is None:
        kinds = sorted(k for k in raw if k != "update_id")
        return Ignore(f"not a new message ({', '.join(kinds) or 'nothing'})")
    if not isinstance(message.chat.id, int) or not isinstance(message.message_id, int):
        raise ValueError("message without a chat or an id")
    user = message.from_user
    if user is None or user.is_bot:
        return Ignore("not from a person")
    where = _where(message)
    text = message.text if message.text is not None else (message.caption or "")
    if text.startswith("/"):
        head, _, _rest = text.partition(" ")
        name, _, target = head[1:].partition("@")
        if target and (not me.username or target.lower() != me.username.lower()):
            return Ignore("a command for another bot", user.id)
        if name in ("new", "start", "help"):
            return Command(where, message.message_id, name, user)
    if where.group:
        addressed, text = _addressed(message, text, me)
        if not addressed:
            return Ignore("a group message not addressed to the bot", user.id)
    photos: tuple[tuple[str, int], ...] = ()
    if message.photo:
        largest = max(message.photo, key=lambda p: p.width * p.height)
        photos = ((largest.file_id, largest.file_size or 0),)
    documents: tuple[tuple[str, int, str, str], ...] = ()
    if message.document is not None:
        d = message.document
        documents = ((d.file_id, d.file_size or 0, d.file_name or "document", d.mime_type or ""),)
    if not text.strip() and not photos and not documents:
        return Ignore("nothing the bot can read (no text, photo or document)", user.id)
    return Inbound(where, message.message_id, text, user, photos, documents)
