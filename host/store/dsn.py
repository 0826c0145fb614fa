"""Telling a PostgreSQL DSN from a SQLite path, and showing one without its password; no driver imported."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit


def is_dsn(target: object) -> bool:
    return isinstance(target, str) and target.startswith(("postgresql://", "postgres://"))


_PASSWORD_PARAMETER = re.compile(r"(^|&)(password=)[^&]*", re.IGNORECASE)


def redacted(dsn: str) -> str:
    """The DSN without its password (in its user part or a `password` parameter), for messages and `status`."""
    parts = urlsplit(dsn)
    if parts.password is not None:
        parts = parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1))
    return parts._replace(query=_PASSWORD_PARAMETER.sub(r"\1\2***", parts.query)).geturl()


def has_password(dsn: str) -> bool:
    """True if the DSN carries a password (in its user part or as a `password` parameter)."""
    parts = urlsplit(dsn)
    return parts.password is not None or "password" in parse_qs(parts.query)
