"""Keeping a runner process small: `ssl` out of it until a runner is loaded, libraries' unused parts never in, and freed
heap returned.

grpc imports asyncio, and asyncio imports `ssl` if it can — Python's `_ssl` and the system's libssl and libcrypto,
~4 MiB of a process that serves gRPC over a unix socket and needs no TLS until it loads a runner (a model client
does). `defer_ssl` makes `import ssl` fail until `restore_ssl`; asyncio takes that as "no ssl here" and carries on.
`restore_ssl` imports it for real and gives asyncio back what it gave up: the module global each of its modules
checks (`ssl is None` means "not available") and `sslproto`, whose TLS machinery is defined only when ssl was there.

Only modules imported while ssl was deferred can have cached its absence; `modules_without_ssl` lists those
whose source mentions ssl, so a test can tell when a new import joins asyncio there.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

_deferred_at: set[str] | None = None


def defer_ssl() -> bool:
    """Makes `import ssl` fail from now on; False (and nothing changed) if ssl is already imported."""
    global _deferred_at
    if "ssl" in sys.modules:
        return False
    _deferred_at = set(sys.modules)
    sys.modules["ssl"] = None  # type: ignore[assignment]  # the import system's "not importable" marker
    return True


def deferred() -> bool:
    return "ssl" in sys.modules and sys.modules["ssl"] is None and _deferred_at is not None


def restore_ssl() -> None:
    """Imports ssl and repairs asyncio; a no-op unless `defer_ssl` took effect."""
    global _deferred_at
    if not deferred():
        return
    del sys.modules["ssl"]
    import ssl

    for name, module in list(sys.modules.items()):
        if (name == "asyncio" or name.startswith("asyncio.")) and getattr(module, "ssl", ...) is None:
            module.ssl = ssl  # type: ignore[attr-defined]
    if "asyncio.sslproto" in sys.modules:
        # Re-run in place: its module object is what base_events and selector_events hold.
        importlib.reload(sys.modules["asyncio.sslproto"])
    _deferred_at = None


# Modules a library imports at its own import for a feature no runner uses. httpx's __init__ tries its command-line
# client, `httpx._main`, which imports click and pygments before it needs rich: ~2.5 MiB and ~35 ms of CPU in every
# process that imports httpx (the local agent's model clients), kept even where the CLI then fails for want of rich.
# Marked "not importable", the library takes its own fallback (httpx.main says to install httpx[cli]).
UNUSED_AT_IMPORT = ("httpx._main",)


# pydantic looks for plugins of its own (the `pydantic` entry-point group: logfire's, for one) when it builds its first
# model, reading every installed distribution's entry points: ~1.2 MiB and ~30 ms of CPU in a runner process, whose
# manifest is a pydantic model (measured with importlib.metadata already imported, as discovery imports it). A runner
# process loads none, by pydantic's own switch; a process started with the variable set keeps its value (the host's
# supervisor does not pass it on).
PYDANTIC_PLUGINS_ENV = "PYDANTIC_DISABLE_PLUGINS"


def skip_unused_imports() -> None:
    """For a runner process, before the libraries above are imported: their unused parts stay out of it."""
    for name in UNUSED_AT_IMPORT:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]  # the import system's "not importable" marker
    os.environ.setdefault(PYDANTIC_PLUGINS_ENV, "__all__")


def modules_without_ssl() -> list[str]:
    """Modules imported since `defer_ssl` whose source mentions `ssl` (they may have cached its absence)."""
    if _deferred_at is None:
        return []
    found = []
    for name in sorted(set(sys.modules) - _deferred_at):
        spec = getattr(sys.modules[name], "__spec__", None)
        origin = getattr(spec, "origin", None) or ""
        if not origin.endswith(".py"):
            continue
        try:
            with open(origin, encoding="utf-8", errors="replace") as f:
                source = f.read()
        except OSError:
            continue
        if "import ssl" in source or "from ssl" in source:
            found.append(name)
    return found


# glibc's malloc, reached through ctypes (~0.3 MiB, imported only by a runner process that asked for it):
# `malloc_trim` hands freed heap pages back to the kernel; without it, the garbage a runner's load and a run leave
# behind (a parsed manifest, a model reply) stays resident for the process's life.
_M_ARENA_MAX = -8  # mallopt's parameter number (malloc.h)
_libc: Any = None


def _glibc() -> Any:
    """libc when it is glibc (it has malloc_trim), else None (musl: nothing to do)."""
    import ctypes

    libc = ctypes.CDLL(None)
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


def tune_malloc(arenas: int = 2) -> bool:
    """For a long-lived runner process, before it starts a thread: at most `arenas` malloc arenas (each of gRPC's
    threads would otherwise get its own, whose touched pages stay resident), and `trim_heap` from now on. False
    (and nothing changed) where libc is not glibc."""
    global _libc
    _libc = _glibc()
    if _libc is None:
        return False
    _libc.mallopt(_M_ARENA_MAX, arenas)
    return True


def trim_heap() -> None:
    """Returns the heap's free pages to the kernel; for the moments the process goes idle (its runners loaded, its
    last run ended). A no-op unless `tune_malloc` took effect (an in-process test host's heap is not ours)."""
    if _libc is not None:
        _libc.malloc_trim(0)
