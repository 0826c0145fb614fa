"""The plugin process's side of the host's spawn protocol, one for both plugin kinds (the runner SDK's and the
channel SDK's entry points): the configuration line on stdin, the lifeline (EOF on stdin = the host is gone), and
loading one distribution's entry points through pluggy. Imports nothing heavy until it is used: a lazy runner reads
its configuration long before it loads any plugin code."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import asyncio

    import pluggy


T = TypeVar("T")


class DiscoveryError(RuntimeError):
    """A plugin's entry points cannot give what the host asked for; the message names the entry point or rule."""


def read_config_line(required: Iterable[str]) -> dict[str, Any]:
    """The configuration line, read from the raw descriptor: nothing may sit in a buffer, because what follows on
    stdin is only the lifeline's EOF, watched by the event loop. Every `required` key must be a string."""
    data = b""
    while b"\n" not in data:
        chunk = os.read(0, 65536)
        if not chunk:
            break
        data += chunk
    config = json.loads(data.split(b"\n", 1)[0])
    if not isinstance(config, dict):
        raise ValueError("not a JSON object")
    for key in required:
        if not isinstance(config.get(key), str):
            raise KeyError(key)
    return config


def watch_lifeline(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    """Only the host holds the stdin pipe's write end, so EOF means the host died or let go of us, whichever way
    it ended (kill -9 included): `stop` is set. Watched by the loop, not a thread: a thread costs an idle process
    its stack and a malloc arena."""

    def readable() -> None:
        try:
            more = os.read(0, 4096)
        except BlockingIOError:
            return
        except OSError:
            more = b""
        if not more:
            loop.remove_reader(0)
            stop.set()

    os.set_blocking(0, False)
    loop.add_reader(0, readable)


def load_entry_points(distribution: str, group: str, only: Collection[str] | None = None) -> pluggy.PluginManager:
    """A plugin manager holding the entry points of `group` that `distribution` declares, and no one else's
    (discovery is execution: a plugin process must not import its neighbours' code); of those, only the ones named
    in `only` when given. An entry point that fails to import is a DiscoveryError naming it, never a skip."""
    from importlib import metadata

    import pluggy

    from agenthost.plugins import hookspecs

    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        raise DiscoveryError(f"distribution {distribution!r} is not installed in this environment") from None
    eps = [ep for ep in dist.entry_points if ep.group == group]
    if not eps:
        raise DiscoveryError(f"{distribution} declares no [{group}] entry points")
    if only is not None:
        missing = set(only) - {ep.name for ep in eps}
        if missing:
            raise DiscoveryError(f"{distribution} no longer declares the [{group}] entry points {sorted(missing)}")
        eps = [ep for ep in eps if ep.name in only]
    prefix = distribution.lower().replace("_", "-").replace(".", "-")
    for ep in eps:
        try:
            plugin = ep.load()
        except Exception as exc:
            raise DiscoveryError(f"entry point {ep.name} = {ep.value} failed to import: {exc!r}") from exc
        pm.register(plugin, name=f"{prefix}:{group}:{ep.name}")
    return pm


def registered_classes(
    distribution: str,
    group: str,
    hook: str,
    base: type[T],
    manifest_type: type[Any],
    kind: str,
    *,
    only: Collection[str] | None = None,
    origins: dict[str, str] | None = None,
) -> dict[str, type[T]]:
    """The classes `distribution` registers through `hook` of its `group` entry points, by manifest name: the one
    discovery of both SDKs (runners: agenthost_register_runners, channel adapters: agenthost_register_channels).
    Whatever is registered must subclass `base` and carry a `manifest` of `manifest_type` with a name of its own;
    a failure anywhere is a DiscoveryError that says what is wrong, never a skip or a bare traceback.

    `only` limits discovery to the named entry points. `origins`, when given, is filled with the entry point that
    registered each class (left empty when a hook wrapper makes that unknowable): a runner process that knows it
    imports only the entry point of the runner a call names."""
    found: dict[str, type[T]] = {}
    source: list[str] = [""]

    def register(cls: type[T]) -> None:
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise DiscoveryError(f"{cls!r} is not a subclass of {base.__module__.rsplit('.', 1)[0]}.{base.__name__}")
        manifest: Any = getattr(cls, "manifest", None)
        if not isinstance(manifest, manifest_type):
            raise DiscoveryError(f"{cls.__qualname__} has no `manifest = {manifest_type.__name__}(...)`")
        if manifest.name in found:
            raise DiscoveryError(f"two {kind} are named {manifest.name!r}")
        found[manifest.name] = cls
        if origins is not None and source[0]:
            origins[manifest.name] = source[0]

    try:
        caller = getattr(load_entry_points(distribution, group, only).hook, hook)
        impls = caller.get_hookimpls()
        if origins is None or any(impl.hookwrapper or impl.wrapper for impl in impls):
            caller(register=register)
        else:
            # pluggy's own call, one implementation at a time (last registered first), to know whose it is.
            prefix = f":{group}:"
            for impl in reversed(impls):
                source[0] = impl.plugin_name.split(prefix, 1)[-1]
                impl.function(**{arg: register for arg in impl.argnames})
    except DiscoveryError:
        raise
    except Exception as exc:
        raise DiscoveryError(f"registering the {kind} failed: {exc!r}") from exc
    if not found:
        raise DiscoveryError(f"the plugin registered no {kind}")
    return found


def main(argv: list[str], prog: str, serve: Callable[[], int], describe: Callable[[str], int]) -> int:
    """The command line of both SDK entry points: `serve` (what the host spawns) or `describe --distribution D`.
    `serve` is matched without argparse, which an idle plugin process would otherwise hold for nothing."""
    if argv == ["serve"]:
        return serve()
    import argparse

    parser = argparse.ArgumentParser(prog=prog)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve")
    d = sub.add_parser("describe")
    d.add_argument("--distribution", required=True)
    return describe(parser.parse_args(argv).distribution)
