"""Opaque, tamper-evident cursors bound to the conversation they were issued for.

A cursor is a position plus a short MAC over (kind, bot, conversation, position) with a per-data-dir secret, so
a cursor from another conversation, another bot or another list is refused instead of silently paging data the
caller may not see. Its text is `<position>.<tag>`; clients must treat it as opaque.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable

from agenthost.protos.errors import InvalidArgument


class CursorCodec:
    def __init__(self, secret: bytes) -> None:
        self._secret = secret[:64]  # BLAKE2b's key limit

    def encoder(self, kind: str, scope: str) -> Callable[[int], str]:
        """A cursor minter for one list of one conversation. Keyed BLAKE2b is a MAC on its own; the keyed state
        over the (kind, scope) prefix is built once and copied per position, because a page mints a cursor for
        every item it returns."""
        prefix = hashlib.blake2b(key=self._secret, digest_size=8)
        prefix.update(f"{kind}|{scope}|".encode())

        def encode(position: int) -> str:
            h = prefix.copy()
            h.update(str(position).encode())
            return f"{position}.{h.hexdigest()}"

        return encode

    def encode(self, kind: str, scope: str, position: int) -> str:
        return self.encoder(kind, scope)(position)

    def decode(self, kind: str, scope: str, cursor: str) -> int:
        """The position a cursor names; raises InvalidArgument if it is malformed or was issued elsewhere."""
        position_text, _, tag = cursor.partition(".")
        if len(cursor) > 64 or not position_text.isdigit() or len(tag) != 16:
            raise InvalidArgument("cursor is malformed")
        position = int(position_text)
        if not hmac.compare_digest(cursor, self.encode(kind, scope, position)):
            raise InvalidArgument("cursor was not issued for this conversation")
        return position
