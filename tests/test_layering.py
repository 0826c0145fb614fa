"""The house's layering, checked on the source: no import circle anywhere in agenthost, the host's rooms import
only rooms below them, and the plugin-side packages (runners, channels, plugins, protos) stay off the host.

Every import counts, those under `if TYPE_CHECKING:` and inside functions included: a circle that only type
checking or a deferred import hides is still two modules that cannot be understood one without the other. A part
that needs something of a room above it says so with a Protocol of its own (agenthost.host.api.services,
agenthost.host.processes.channels.ChannelsHost, agenthost.host.runs.child_runs.RunPath).

The checker runs on the real tree, and on the real tree with a planted upward import and a planted circle, so it
is shown to catch what it is for.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("channels", "host", "plugins", "protos", "runners")

# The host's rooms, top to bottom: a room may import the rooms below it, never one above; rooms on one line are
# peers and import neither each other.
HOST_LAYERS: tuple[tuple[str, ...], ...] = (
    ("cli",),  # the operator's side: the command, terminal rendering, the demo
    ("server",),  # the composition root: builds every part and hands each what it needs
    ("api",),  # the surfaces: admin API, run API, HTTP gateway and console
    ("runs", "knowledge"),  # the run path; the knowledge base
    ("workers",),  # runner workers: the host's listener and sessions, the worker process's side
    ("processes",),  # plugin and channel processes, their walls and config checks
    ("ops",),  # logs, metrics, traces
    ("access", "store"),  # credentials, grants, keys; the stores
    ("limits",),  # every cap, one constant each
)
# The only host modules the plugin side may import. The channel SDK talks to the host as an admin client; the runner
# SDK's pytest plugin runs a real host for a runner's tests (imported only where a test suite asks for it).
PLUGIN_SIDE_MAY_IMPORT: Mapping[str, tuple[str, ...]] = {
    "agenthost.channels.sdk": ("agenthost.host.api.client",),
    "agenthost.runners.sdk.testing": ("agenthost.host",),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["agenthost", *parts])


def sources() -> dict[str, str]:
    """Every agenthost module's source, by its installed name (the example plugin and generated stubs left out)."""
    found = {}
    for part in PARTS:
        for path in (ROOT / part).rglob("*.py"):
            if "examples" in path.parts or path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            found[_module_name(path)] = path.read_text()
    return found


def import_graph(modules: Mapping[str, str]) -> dict[str, set[str]]:
    """module -> the agenthost modules it imports (`from pkg import name` counts as pkg.name when that is a module)."""

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, source in modules.items():
        graph[module] = {target for name in _imported(source) if (target := known(name)) and target != module}
    return graph


@functools.cache
def _imported(source: str) -> tuple[str, ...]:
    """The agenthost names a module's source imports. Cached by the source: the tests here build the graph of the
    same ~180 modules five times (the planted ones differ by a few), and parsing them is what that costs."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        names: Iterable[str] = ()
        if isinstance(node, ast.Import):
            names = (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = (f"{node.module}.{alias.name}" for alias in node.names)
        found += (name for name in names if name.startswith("agenthost."))
    return tuple(found)


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The import circles: strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            advanced = False
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if parts[:2] == ["agenthost", "host"] and len(parts) > 2 else None


def layer_violations(graph: Mapping[str, set[str]]) -> list[str]:
    """Imports that go up or sideways between the host's rooms, or from the plugin side into the host."""
    rank = {room: depth for depth, rooms in enumerate(HOST_LAYERS) for room in rooms}
    found = []
    for module, targets in graph.items():
        for target in targets:
            room, target_room = _room(module), _room(target)
            if room is not None and target_room is not None and room != target_room:
                if rank[target_room] <= rank[room]:
                    found.append(f"{module} -> {target} ({room} may not import {target_room})")
            elif room is None and target.startswith("agenthost.host") and not module.startswith("agenthost.host"):
                allowed = next((v for k, v in PLUGIN_SIDE_MAY_IMPORT.items() if module.startswith(k)), ())
                if not any(target == a or target.startswith(a + ".") for a in allowed):
                    found.append(f"{module} -> {target} (the plugin side stays off the host)")
    return sorted(found)


def test_every_host_room_is_in_the_layering() -> None:
    rooms = {p.stem for p in (ROOT / "host").iterdir() if p.name != "__init__.py" and (p.suffix == ".py" or p.is_dir())}
    rooms.discard("__pycache__")
    assert rooms == {room for layer in HOST_LAYERS for room in layer}


def test_no_import_circle_anywhere() -> None:
    assert cycles(import_graph(sources())) == []


def test_the_host_rooms_import_only_downwards_and_the_plugin_side_stays_off_the_host() -> None:
    assert layer_violations(import_graph(sources())) == []


def test_the_checker_catches_a_planted_upward_import_and_a_planted_circle() -> None:
    real = sources()
    planted = dict(real)
    planted["agenthost.host.store.planted"] = "from agenthost.host.server import Host\n"
    planted["agenthost.runners.planted"] = "from agenthost.host.store.db import Database\n"
    planted["agenthost.host.runs.manager"] += "\nfrom agenthost.host.runs import child_runs_planted\n"
    planted["agenthost.host.runs.child_runs_planted"] = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from agenthost.host.runs.manager import RunManager\n"
    )
    graph = import_graph(planted)
    assert sorted(set(layer_violations(graph)) - set(layer_violations(import_graph(real)))) == [
        "agenthost.host.store.planted -> agenthost.host.server (store may not import server)",
        "agenthost.runners.planted -> agenthost.host.store.db (the plugin side stays off the host)",
    ]
    assert ["agenthost.host.runs.child_runs_planted", "agenthost.host.runs.manager"] in cycles(graph)
