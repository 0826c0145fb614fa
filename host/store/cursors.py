"""Opaque, tamper-evident cursors bound to the conversation they were issued for.

A cursor is a position plus a short MAC over (kind, bot, conversation, position) with a per-data-dir secret, so
a cursor from another conversation, another bot or another list is refused instead of silently paging data the
caller may not see. Its text is `<position>.<tag>`; clients must treat it as opaque. A position is one number
(an event's seq) or, for the transcript, two joined by `-` (the item's turn, then its seq: see
Conversations.page_history); the MAC covers the position's text, so neither form can be passed off as the other.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable

from agenthost.protos.errors import InvalidArgument

MAX_PARTS = 2


class CursorCodec:
    def __init__(self, secret: bytes) -> None:
        self._secret = secret[:64]  # BLAKE2b's key limit

    def encoder(self, kind: str, scope: str) -> Callable[..., str]:
        """A cursor minter for one list of one conversation: `encode(seq)` or `encode(event_seq, seq)`. Keyed
        BLAKE2b is a MAC on its own; the keyed state over the (kind, scope) prefix is built once and copied per
        position, because a page mints a cursor for every item it returns."""
        prefix = hashlib.blake2b(key=self._secret, digest_size=8)
        prefix.update(f"{kind}|{scope}|".encode())

        def encode(*position: int) -> str:
            text = "-".join(str(p) for p in position)
            h = prefix.copy()
            h.update(text.encode())
            return f"{text}.{h.hexdigest()}"

        return encode

    def encode(self, kind: str, scope: str, *position: int) -> str:
        return self.encoder(kind, scope)(*position)

    def decode_parts(self, kind: str, scope: str, cursor: str) -> tuple[int, ...]:
        """The position a cursor names, as its one or two numbers; raises InvalidArgument if it is malformed or
        was issued elsewhere."""
        if len(cursor) > 64:
            raise InvalidArgument("cursor is malformed")
        position_text, _, tag = cursor.partition(".")
        parts = position_text.split("-")
        # isascii: str.isdigit also takes digits such as "²", which int() refuses
        if len(parts) > MAX_PARTS or not all(p.isascii() and p.isdigit() for p in parts) or len(tag) != 16:
            raise InvalidArgument("cursor is malformed")
        position = tuple(int(p) for p in parts)
        if not hmac.compare_digest(cursor, self.encode(kind, scope, *position)):
            raise InvalidArgument("cursor was not issued for this conversation")
        return position

    def decode(self, kind: str, scope: str, cursor: str) -> int:
        """The one-number position a cursor names (lists ordered by seq alone, such as events)."""
        position = self.decode_parts(kind, scope, cursor)
        if len(position) != 1:
            raise InvalidArgument("cursor is malformed")
        return position[0]
