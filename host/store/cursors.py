"""Opaque, tamper-evident cursors bound to the conversation they were issued for.

A cursor is a position plus a short HMAC over (kind, bot, conversation, position) with a per-data-dir secret, so
a cursor from another conversation, another bot or another list is refused instead of silently paging data the
caller may not see.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from protos.errors import InvalidArgument


class CursorCodec:
    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def _tag(self, kind: str, scope: str, position: int) -> str:
        # Keyed BLAKE2b is a MAC on its own and one C call (a page of 50 items mints 50 cursors).
        msg = f"{kind}|{scope}|{position}".encode()
        return hashlib.blake2b(msg, key=self._secret[:64], digest_size=8).hexdigest()

    def encode(self, kind: str, scope: str, position: int) -> str:
        raw = f"{position}.{self._tag(kind, scope, position)}".encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    def decode(self, kind: str, scope: str, cursor: str) -> int:
        """The position a cursor names; raises InvalidArgument if it is malformed or was issued elsewhere."""
        if len(cursor) > 128:
            raise InvalidArgument("cursor is malformed")
        try:
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
            position_text, tag = raw.split(".", 1)
            position = int(position_text)
        except (ValueError, UnicodeDecodeError):
            raise InvalidArgument("cursor is malformed") from None
        if position < 0 or not hmac.compare_digest(tag, self._tag(kind, scope, position)):
            raise InvalidArgument("cursor was not issued for this conversation")
        return position
