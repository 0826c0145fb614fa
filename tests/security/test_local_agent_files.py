"""The local agent's file tools against a workspace an attacker shapes (through the shell tool, which writes the
same directory): symlinks and hard links leading out, `..` and absolute paths, and a directory swapped for a
symlink while the tools run. Every test runs twice: with openat2 (RESOLVE_BENEATH) and with the user-space walk
used on kernels without it."""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agenthost.runners.local_agent.config import LocalAgentConfig
from agenthost.runners.local_agent.messages import ToolCall, ToolResult
from agenthost.runners.local_agent.testing import FakeRunAPI
from agenthost.runners.local_agent.tools import build_registry
from agenthost.runners.local_agent.tools import files as files_mod
from agenthost.runners.local_agent.tools.base import ToolContext

SECRET = "OUTSIDE-SECRET-7f3a"


@pytest.fixture(params=["openat2", "walk"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "openat2":
        if not files_mod.openat2_available():
            pytest.skip("this kernel has no openat2")
        monkeypatch.setattr(files_mod, "_openat2_ok", True)
    else:
        monkeypatch.setattr(files_mod, "_openat2_ok", False)
    return str(request.param)


@pytest.fixture
def ctx(tmp_path: Path, resolver: str) -> ToolContext:
    ws = tmp_path / "ws"
    ws.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET + "\n")
    (tmp_path / "secret.txt").write_text(SECRET + "\n")
    return ToolContext(workspace=ws, api=FakeRunAPI(), conversation_id="c1", run_id="r1", config=LocalAgentConfig())


async def call(ctx: ToolContext, name: str, **args: object) -> ToolResult:
    return await build_registry(ctx.config).run(ToolCall("id1", name, json.dumps(args)), ctx)


def outside_untouched(tmp_path: Path) -> None:
    assert sorted(p.name for p in (tmp_path / "outside").iterdir()) == ["secret.txt"]
    assert (tmp_path / "outside" / "secret.txt").read_text() == SECRET + "\n"
    assert (tmp_path / "secret.txt").read_text() == SECRET + "\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outside", "secret.txt", "ws"]


@pytest.mark.parametrize(
    "link_to",
    ["{tmp}/outside/secret.txt", "../outside/secret.txt", "../secret.txt", "chain"],
    ids=["absolute", "relative", "relative-parent", "chained"],
)
async def test_symlinked_file_leading_out_is_refused(ctx: ToolContext, tmp_path: Path, link_to: str) -> None:
    ws = ctx.workspace
    if link_to == "chain":
        os.symlink("../outside/secret.txt", ws / "hop")
        os.symlink("hop", ws / "link.txt")  # the first link stays inside; the second leads out
    else:
        os.symlink(link_to.format(tmp=tmp_path), ws / "link.txt")
    for tool, extra in (
        ("read_file", {}),
        ("write_file", {"content": "pwned"}),
        ("edit_file", {"old_string": "OUTSIDE", "new_string": "pwned"}),
    ):
        r = await call(ctx, tool, path="link.txt", **extra)
        assert r.is_error and "outside the workspace" in r.content, (tool, r.content)
    assert SECRET not in (await call(ctx, "grep", pattern="SECRET")).content
    assert (await call(ctx, "glob", pattern="*.txt")).content == "no matches"
    assert (await call(ctx, "grep", pattern="SECRET", path="link.txt")).is_error
    outside_untouched(tmp_path)


@pytest.mark.parametrize("link_to", ["{tmp}/outside", "../outside"], ids=["absolute", "relative"])
async def test_symlinked_directory_leading_out_is_refused(ctx: ToolContext, tmp_path: Path, link_to: str) -> None:
    os.symlink(link_to.format(tmp=tmp_path), ctx.workspace / "dir")
    for tool, extra in (
        ("read_file", {"path": "dir/secret.txt"}),
        ("write_file", {"path": "dir/new.txt", "content": "x"}),
        ("write_file", {"path": "dir/deeper/new.txt", "content": "x"}),
        ("edit_file", {"path": "dir/secret.txt", "old_string": "OUTSIDE", "new_string": "pwned"}),
        ("list_files", {"path": "dir"}),
        ("grep", {"pattern": "SECRET", "path": "dir"}),
        ("glob", {"pattern": "*", "path": "dir"}),
    ):
        r = await call(ctx, tool, **extra)
        assert r.is_error and "outside the workspace" in r.content, (tool, r.content)
    assert SECRET not in (await call(ctx, "grep", pattern="SECRET")).content
    assert (await call(ctx, "glob", pattern="**/*")).content == "no matches"
    listing = (await call(ctx, "list_files")).content
    assert "secret" not in listing and "dir ->" in listing  # shown as a link, never followed
    outside_untouched(tmp_path)


async def test_symlinks_within_the_workspace_still_work(ctx: ToolContext, tmp_path: Path) -> None:
    ws = ctx.workspace
    (ws / "src").mkdir()
    (ws / "src" / "real.txt").write_text("alpha\n")
    os.symlink("src/real.txt", ws / "alias.txt")
    os.symlink("src", ws / "code")
    os.symlink("../src/real.txt", ws / "src" / "up.txt")  # climbs out of src, not out of the workspace
    assert "alpha" in (await call(ctx, "read_file", path="alias.txt")).content
    assert "alpha" in (await call(ctx, "read_file", path="code/up.txt")).content
    r = await call(ctx, "edit_file", path="alias.txt", old_string="alpha", new_string="beta")
    assert not r.is_error, r.content
    assert (ws / "alias.txt").is_symlink() and (ws / "src" / "real.txt").read_text() == "beta\n"
    assert not (await call(ctx, "write_file", path="code/new.txt", content="n")).is_error
    assert (ws / "src" / "new.txt").read_text() == "n"
    assert "alias.txt" in (await call(ctx, "glob", pattern="*.txt")).content
    outside_untouched(tmp_path)


async def test_hard_link_to_an_outside_file_is_refused(ctx: ToolContext, tmp_path: Path) -> None:
    os.link(tmp_path / "outside" / "secret.txt", ctx.workspace / "hl.txt")
    for tool, extra in (
        ("read_file", {}),
        ("write_file", {"content": "pwned"}),
        ("edit_file", {"old_string": "OUTSIDE", "new_string": "pwned"}),
    ):
        r = await call(ctx, tool, path="hl.txt", **extra)
        assert r.is_error and "hard links" in r.content, (tool, r.content)
    assert SECRET not in (await call(ctx, "grep", pattern="SECRET")).content
    assert SECRET not in (await call(ctx, "grep", pattern="SECRET", path="hl.txt")).content
    assert (tmp_path / "outside" / "secret.txt").read_text() == SECRET + "\n"


@pytest.mark.parametrize(
    "path",
    [
        "../secret.txt",
        "./../secret.txt",
        "a/../../secret.txt",
        "src/../../secret.txt",
        "../outside/secret.txt",
        "/etc/passwd",
        "{ws}/../secret.txt",
        "{tmp}/outside/secret.txt",
        "~/.bashrc",
        "..",
    ],
)
async def test_dotdot_and_absolute_paths_are_refused(ctx: ToolContext, tmp_path: Path, path: str) -> None:
    (ctx.workspace / "src").mkdir()
    path = path.format(ws=ctx.workspace, tmp=tmp_path)
    for tool, extra in (
        ("read_file", {"path": path}),
        ("write_file", {"path": path + "/new", "content": "x"}),
        ("edit_file", {"path": path, "old_string": "OUTSIDE", "new_string": "x"}),
        ("list_files", {"path": path}),
        ("grep", {"pattern": "SECRET", "path": path}),
        ("glob", {"pattern": "*", "path": path}),
    ):
        r = await call(ctx, tool, **extra)
        assert r.is_error and "outside the workspace" in r.content, (tool, r.content)
    outside_untouched(tmp_path)


async def test_absolute_path_inside_the_workspace_is_fine(ctx: ToolContext) -> None:
    r = await call(ctx, "write_file", path=f"{ctx.workspace}/a/b.txt", content="hi")
    assert not r.is_error and r.content == "wrote 2 bytes to a/b.txt"
    assert "hi" in (await call(ctx, "read_file", path=f"{ctx.workspace}/a/../a/b.txt")).content


async def test_write_lands_in_the_directory_that_was_checked(
    ctx: ToolContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deterministic swap: after the tool has found the target directory and written its temp file, the
    directory is moved away and a symlink to the outside put in its place (the fsync before the rename is the
    hook). The rename still happens in the directory the tool holds open."""
    ws = ctx.workspace
    (ws / "d").mkdir()
    real_fsync = os.fsync
    swapped: list[bool] = []

    def fsync_then_swap(fd: int) -> None:
        real_fsync(fd)
        if not swapped:
            os.rename(ws / "d", ws / "d.moved")
            os.symlink(tmp_path / "outside", ws / "d")
            swapped.append(True)

    monkeypatch.setattr(os, "fsync", fsync_then_swap)
    r = await call(ctx, "write_file", path="d/new.txt", content="payload")
    assert swapped and not r.is_error, r.content
    assert (ws / "d.moved" / "new.txt").read_text() == "payload"
    assert sorted(os.listdir(ws / "d.moved")) == ["new.txt"]  # no temp file left behind either
    outside_untouched(tmp_path)


def _exchanger() -> object:
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "renameat2"):
        pytest.skip("no renameat2 in this libc")
    return libc.renameat2


@pytest.mark.slow
async def test_directory_swapped_for_a_symlink_during_calls(ctx: ToolContext, tmp_path: Path) -> None:
    """A thread keeps atomically exchanging a real directory with a symlink to the outside (renameat2
    RENAME_EXCHANGE, so `d` always exists as one or the other) while the tools read, list, grep and write
    through `d` hundreds of times. A check-then-open implementation leaks within a few dozen calls."""
    ws = ctx.workspace
    (ws / "d").mkdir()
    (ws / "d" / "secret.txt").write_text("innocent\n")
    os.symlink(tmp_path / "outside", ws / "d.link")
    renameat2 = _exchanger()
    AT_FDCWD, RENAME_EXCHANGE = -100, 2
    stop = threading.Event()
    flips = 0

    def flip() -> None:
        nonlocal flips
        a, b = os.fsencode(ws / "d"), os.fsencode(ws / "d.link")
        while not stop.is_set():
            if renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) != 0:  # type: ignore[operator]
                raise OSError(ctypes.get_errno(), "renameat2")
            flips += 1

    thread = threading.Thread(target=flip, daemon=True)
    thread.start()
    seen_inside = 0
    try:
        for i in range(300):
            for tool, extra in (
                ("read_file", {"path": "d/secret.txt"}),
                ("list_files", {"path": "d"}),
                ("grep", {"pattern": "SECRET|innocent", "path": "d"}),
                ("write_file", {"path": f"d/w{i}.txt", "content": "w"}),
            ):
                r = await call(ctx, tool, **extra)
                assert SECRET not in r.content, (tool, r.content)
                seen_inside += "innocent" in r.content
            await asyncio.sleep(0)
    finally:
        stop.set()
        thread.join(5)
    assert flips > 100 and seen_inside > 0, (flips, seen_inside)  # the race really ran, and reads got through
    outside_untouched(tmp_path)


@pytest.fixture
def no_openat2(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(files_mod, "_openat2_ok", None)
    monkeypatch.setattr(files_mod, "_SYS_OPENAT2", None)
    yield


def test_without_openat2_the_walk_is_chosen(no_openat2: None) -> None:
    assert files_mod.openat2_available() is False
