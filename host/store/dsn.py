"""Telling a PostgreSQL DSN from a SQLite path, and showing one without its password; no driver imported."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit


def is_dsn(target: object) -> bool:
    return isinstance(target, str) and target.startswith(("postgresql://", "postgres://"))


def redacted(dsn: str) -> str:
    """The DSN without its password, for messages and `status`."""
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    return parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)).geturl()


def has_password(dsn: str) -> bool:
    """True if the DSN carries a password (in its user part or as a `password` parameter)."""
    parts = urlsplit(dsn)
    return parts.password is not None or "password" in parse_qs(parts.query)
