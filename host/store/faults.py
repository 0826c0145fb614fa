"""How a database fault reaches the host's callers, on either backend: one typed error for "the database cannot be
reached now" (a PostgreSQL server stopped, restarting or cut off), and which failures are worth a retry of the
whole write transaction (another session's conflicting locks or snapshot). No driver imported."""

from __future__ import annotations

from agenthost.protos.errors import Aborted, Unavailable

# SQLSTATEs that say "this transaction lost a race with another session; run it again": serialization_failure,
# deadlock_detected. Only PostgreSQL raises them (the host is SQLite's only writer).
RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})

# The run outcome (RunInfo.error_code) of a run whose events or end could not be written because the database was
# unreachable: nothing more of it was recorded; the message may be sent again once `status` says the database is back.
RUN_CODE = "database_unavailable"


class DatabaseDown(Unavailable):
    """A read or write refused because the database cannot be reached now; the host keeps running and reconnects
    by itself when it is back. Travels as UNAVAILABLE (agenthost.protos.errors)."""


class WriteConflict(Aborted):
    """A write transaction refused as conflicting with another session past limits.WRITE_CONFLICT_RETRIES runs."""


def retryable(exc: BaseException) -> bool:
    """True for a driver error whose transaction should simply be run again (see RETRYABLE_SQLSTATES)."""
    return getattr(exc, "sqlstate", None) in RETRYABLE_SQLSTATES


def down_message(reason: str) -> str:
    return (
        f"the database is unreachable ({reason}); nothing was recorded. The host reconnects by itself:"
        " try again once `agenthost status` no longer says so"
    )


def reason(exc: BaseException) -> str:
    """What a driver's error says went wrong, on one line: the server's own message, else libpq's (whose lines go on
    from one another: "server closed the connection unexpectedly / This probably means …")."""
    primary = getattr(getattr(exc, "diag", None), "message_primary", None)
    if primary:
        return str(primary)
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return text[:300] if text else type(exc).__name__
