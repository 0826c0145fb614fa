"""Telling a PostgreSQL DSN from a SQLite path, and showing one without its password; no driver imported."""

from __future__ import annotations

from urllib.parse import urlsplit


def is_dsn(target: object) -> bool:
    return isinstance(target, str) and target.startswith(("postgresql://", "postgres://"))


def redacted(dsn: str) -> str:
    """The DSN without its password, for messages and `status`."""
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    return parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)).geturl()
