"""Claude Code processes kept between the messages of a conversation (warm.py), against the scripted stand-in
harness: when a process is reused, when it must not be, and that nothing of it outlives its welcome."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from agenthost.runners.external_harness.runner import ClaudeCodeRunner
from agenthost.runners.external_harness.warm import KeptHarnesses
from agenthost.runners.sdk.events import scope_value

from .helpers import pids_with_env
from .test_runner import _collect, _config, _kinds, _log, _tag

pytestmark = [pytest.mark.timeout(60)]


def _starts(tmp_path: Path) -> list[dict]:
    return [entry for entry in _log(tmp_path) if "argv" in entry]


async def _until(condition, what: str, timeout: float = 20.0) -> None:
    """Waits for a condition the runner reaches on its own (a timer, a process exiting), however loaded the
    machine is; fails with `what` if it never does."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not condition():
        if loop.time() > end:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0.02)


@pytest.mark.e2e
async def test_the_next_message_goes_to_the_kept_process_with_its_own_cost(tmp_path, fake_host, clean_env) -> None:
    runner = ClaudeCodeRunner(tmp_path / "data")
    turns = []
    for text in ("one", "two", "three"):
        turns.append(await _collect(runner, fake_host.run_context(text, config=_config(tmp_path))))
    assert [t[-2].message.text for t in turns] == ["echo[1]: one", "echo[2]: two", "echo[3]: three"]
    starts = _starts(tmp_path)
    assert len({s["process"] for s in starts}) == 1 and [s["prompt"] for s in starts] == ["one", "two", "three"]
    assert starts[0]["argv"][starts[0]["argv"].index("--input-format") + 1] == "stream-json"
    # The CLI reports the process's running cost (0.01, 0.02, 0.03); each message is charged its own share.
    costs = [next(e.usage.cost_usd for e in t if e.WhichOneof("kind") == "usage") for t in turns]
    assert costs == pytest.approx([0.01, 0.01, 0.01])
    assert len(runner.kept) == 1


@pytest.mark.parametrize("change", ["config", "claude_md", "key", "session_reset", "bridge_grant"])
@pytest.mark.e2e
async def test_a_changed_start_up_input_gets_a_new_process_that_resumes(
    change: str, tmp_path, fake_host, clean_env, monkeypatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-first-key")
    runner = ClaudeCodeRunner(tmp_path / "data")
    first = await _collect(runner, fake_host.run_context("one", config=_config(tmp_path)))
    one_kept = len(pids_with_env(_tag(tmp_path)))  # bwrap, its init and the harness, or fewer without a sandbox
    assert one_kept
    session = fake_host.data.get_state("conversation", "external.session_id")
    workdir = Path(fake_host.data.get_state("conversation", "external.working_directory"))
    config = _config(tmp_path)
    if change == "config":
        config["append_system_prompt"] = "Answer in French."
    elif change == "claude_md":
        with (workdir / "CLAUDE.md").open("a") as fh:
            fh.write("\nA rule the user added after the process started.\n")
    elif change == "key":
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-rotated-key")
    elif change == "session_reset":
        fake_host.data.state.pop((scope_value("conversation"), "external.session_id"))
    rc = fake_host.run_context("two", config=config)
    if change == "bridge_grant":  # the endpoint's tool list was fixed when the CLI listed it
        del rc.context.resources.apis[:]
        rc.context.resources.apis.append("history.page")
    second = await _collect(runner, rc)
    assert _kinds(first)[-1] == _kinds(second)[-1] == "completed"
    starts = _starts(tmp_path)
    assert starts[0]["process"] != starts[1]["process"]
    argv = starts[1]["argv"]
    if change == "session_reset":
        assert "--resume" not in argv and second[-2].message.text == "echo[1]: two"
    else:
        assert argv[argv.index("--resume") + 1] == session and second[-2].message.text == "echo[2]: two"
    # The old process is gone, the new one kept in its place.
    assert len(runner.kept) == 1
    await _until(lambda: len(pids_with_env(_tag(tmp_path))) == one_kept, "the replaced process stopped")


@pytest.mark.parametrize("why", ["failed", "keep_warm_0", "budget", "stdio_bridge", "left_a_process", "no_sandbox"])
@pytest.mark.e2e
async def test_processes_that_must_not_be_kept_are_not(why: str, tmp_path, fake_host, clean_env) -> None:
    mode = "is_error" if why == "failed" else "ok"
    extra = {
        "keep_warm_0": {"keep_warm_seconds": 0},
        "budget": {"max_budget_usd": 1.0},  # the CLI counts it over its whole life, not per message
        "stdio_bridge": {"mcp_transport": "stdio"},  # its bridge process holds one run's token
        "no_sandbox": {"process_sandbox": False},  # no pid namespace to see what a turn left running
    }.get(why, {})
    prompt = "[spawn] one" if why == "left_a_process" else "one"  # nothing a model starts outlives its run
    runner = ClaudeCodeRunner(tmp_path / "data")
    events = await _collect(runner, fake_host.run_context(prompt, config=_config(tmp_path, mode, **extra)))
    assert _kinds(events)[-1] == ("failed" if why == "failed" else "completed")
    assert len(runner.kept) == 0
    await _until(lambda: not pids_with_env(_tag(tmp_path)), "the turn's process exited")
    if why == "stdio_bridge":
        # One message per process, as before the kept processes: the prompt on stdin, no stream-json input (which
        # the default bridge, on the CLI's own pipes, needs even when nothing is kept).
        assert "--input-format" not in _starts(tmp_path)[0]["argv"]


@pytest.mark.e2e
async def test_idle_processes_expire(tmp_path, fake_host, clean_env) -> None:
    runner = ClaudeCodeRunner(tmp_path / "data")
    await _collect(runner, fake_host.run_context("one", config=_config(tmp_path, keep_warm_seconds=0.3)))
    await _until(lambda: len(runner.kept) == 0, "the idle process expired")
    await _until(lambda: not pids_with_env(_tag(tmp_path)), "the expired process exited")
    second = await _collect(runner, fake_host.run_context("two", config=_config(tmp_path, keep_warm_seconds=0.3)))
    assert second[-2].message.text == "echo[2]: two"
    assert len({s["process"] for s in _starts(tmp_path)}) == 2


@pytest.mark.e2e
async def test_a_process_that_prints_while_idle_is_retired(tmp_path, fake_host, clean_env) -> None:
    runner = ClaudeCodeRunner(tmp_path / "data")
    await _collect(runner, fake_host.run_context("[noise] one", config=_config(tmp_path)))
    await _until(lambda: len(runner.kept) == 0, "the noisy process was retired")
    await _until(lambda: not pids_with_env(_tag(tmp_path)), "the retired process exited")
    # Its stray line is not taken for the next message's reply: that comes from a new process.
    second = await _collect(runner, fake_host.run_context("two", config=_config(tmp_path)))
    assert second[-2].message.text == "echo[2]: two" and _kinds(second)[-1] == "completed"
    assert len({s["process"] for s in _starts(tmp_path)}) == 2


@pytest.mark.e2e
async def test_cancelling_a_message_in_a_kept_process_stops_it(tmp_path, fake_host, clean_env) -> None:
    runner = ClaudeCodeRunner(tmp_path / "data")
    await _collect(runner, fake_host.run_context("one", config=_config(tmp_path)))
    task = asyncio.create_task(_collect(runner, fake_host.run_context("[hang] two", config=_config(tmp_path))))
    await _until(lambda: len(_starts(tmp_path)) == 2, "the kept process took the second message")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(runner.kept) == 0
    await _until(lambda: not pids_with_env(_tag(tmp_path)), "the cancelled process exited")
    third = await _collect(runner, fake_host.run_context("three", config=_config(tmp_path)))
    assert _kinds(third)[-1] == "completed" and third[-2].message.text.startswith("echo[")
    starts = _starts(tmp_path)
    assert starts[2]["process"] != starts[0]["process"] and "--resume" in starts[2]["argv"]


@pytest.mark.e2e
async def test_a_deadline_in_a_kept_process_stops_it(tmp_path, fake_host, clean_env) -> None:
    runner = ClaudeCodeRunner(tmp_path / "data")
    await _collect(runner, fake_host.run_context("one", config=_config(tmp_path, timeout_seconds=5)))
    events = await _collect(runner, fake_host.run_context("[hang] two", config=_config(tmp_path, timeout_seconds=1)))
    assert _kinds(events)[-1] == "failed" and events[-1].failed.code == "deadline_exceeded"
    assert len(runner.kept) == 0
    await _until(lambda: not pids_with_env(_tag(tmp_path)), "the timed-out process exited")


@pytest.mark.e2e
async def test_kept_processes_are_bounded_and_stop_with_the_runner(tmp_path, fake_host, clean_env) -> None:
    runner = ClaudeCodeRunner(tmp_path / "data")
    runner.kept = KeptHarnesses(capacity=2)
    for n in range(3):
        fake_host.data.conversation_id = f"conv-{n}"
        events = await _collect(runner, fake_host.run_context(f"hi {n}", config=_config(tmp_path)))
        assert _kinds(events)[-1] == "completed"
        if n == 0:
            one_kept = len(pids_with_env(_tag(tmp_path)))
    assert len(runner.kept) == 2  # the least recently used one was stopped
    await _until(lambda: len(pids_with_env(_tag(tmp_path))) == 2 * one_kept, "the evicted process exited")
    await runner.close()
    assert len(runner.kept) == 0
    await _until(lambda: not pids_with_env(_tag(tmp_path)), "every kept process stopped with the runner")


def _new_conversation(fake_host, conversation_id: str) -> None:
    """The next run_context is the first message of another conversation of the same bot (the fake host keeps
    one conversation's state)."""
    fake_host.data.conversation_id = conversation_id
    fake_host.data.state.clear()


def _spared(tmp_path: Path, **extra):
    return _config(tmp_path, spare_process=True, **extra)


async def _spare_boot(runner, tmp_path: Path) -> dict:
    """The log entry of the spare started after the first message, once it is up."""
    await _until(lambda: len(runner.spares) == 1, "a spare started after the message")
    first = _starts(tmp_path)[0]["process"]
    await _until(lambda: any(b["boot"] != first for b in _log(tmp_path, boots=True)), "the spare logged its start")
    (boot,) = [b for b in _log(tmp_path, boots=True) if b["boot"] != first]
    return boot


@pytest.mark.e2e
async def test_a_new_conversation_gets_the_spare_started_after_another_ones_message(
    tmp_path, fake_host, clean_env
) -> None:
    runner = ClaudeCodeRunner(tmp_path / "data")
    await _collect(runner, fake_host.run_context("one", config=_spared(tmp_path)))
    spare_boot = await _spare_boot(runner, tmp_path)
    slot = Path(spare_boot["cwd"])
    assert slot.parent.name == ".spares"
    # Started with nothing of the first conversation: no message details, and a managed block without its id.
    assert not (slot / ".agenthost" / "context.json").exists()
    assert "conv-1" not in (slot / "CLAUDE.md").read_text()

    _new_conversation(fake_host, "conv-2")
    second = await _collect(runner, fake_host.run_context("two", config=_spared(tmp_path)))
    assert second[-2].message.text == "echo[1]: two" and _kinds(second)[-1] == "completed"
    answered = _starts(tmp_path)[-1]
    assert answered["process"] == spare_boot["boot"] and answered["cwd"] == str(slot)
    # The slot is the conversation's directory for good: recorded, linked from its own path, and its context.json
    # is this message's.
    assert fake_host.data.get_state("conversation", "external.working_directory") == str(slot)
    linked = runner.workspaces.workspace("bot-1", "conv-2", workspace_root=None)
    assert linked.working_dir == slot
    assert '"conv-2"' in (slot / ".agenthost" / "context.json").read_text()
    # Its next message goes to the same process, now kept; and the claimed spare was replaced by a new one.
    third = await _collect(runner, fake_host.run_context("three", config=_spared(tmp_path)))
    assert third[-2].message.text == "echo[2]: three" and _starts(tmp_path)[-1]["process"] == spare_boot["boot"]
    await _until(lambda: len(runner.spares) == 1, "a new spare replaced the claimed one")
    await runner.close()
    assert slot.is_dir()  # claimed: the conversation's, not removed with the runner's spares
    # The unclaimed spare's slot went with it (the runner process's lock file stays until the process ends).
    assert [p.name for p in slot.parent.iterdir() if p.suffix != ".lock"] == [slot.name]
    await _until(lambda: not pids_with_env(_tag(tmp_path)), "every process stopped with the runner")


@pytest.mark.e2e
async def test_spares_and_kept_processes_have_no_way_to_the_hosts_loopback(tmp_path, fake_host, clean_env) -> None:
    """A process started ahead (a spare) and one kept between messages are sandboxes like any turn's: their
    network is a namespace of their own, so a port on the host's loopback stays closed to what runs in them."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    config = _spared(tmp_path)
    config["env"] = {**config["env"], "FAKE_HARNESS_NET_PORT": str(port)}
    runner = ClaudeCodeRunner(tmp_path / "data")
    try:
        await _collect(runner, fake_host.run_context("one", config=config))
        spare_boot = await _spare_boot(runner, tmp_path)
        _new_conversation(fake_host, "conv-2")
        in_spare = await _collect(runner, fake_host.run_context("[net] two", config=config))
        assert _starts(tmp_path)[-1]["process"] == spare_boot["boot"]
        kept = await _collect(runner, fake_host.run_context("[net] three", config=config))
        assert _starts(tmp_path)[-1]["process"] == spare_boot["boot"]
        socket.create_connection(("127.0.0.1", port), timeout=5).close()  # control: open from out here
    finally:
        listener.close()
    assert in_spare[-2].message.text == "echo[1]: [net] two net=closed", in_spare[-2]
    assert kept[-2].message.text == "echo[2]: [net] three net=closed", kept[-2]


@pytest.mark.parametrize("change", ["key", "claude_md_outside_the_block"])
@pytest.mark.e2e
async def test_a_spare_that_would_not_start_the_same_way_is_replaced(
    change: str, tmp_path, fake_host, clean_env, monkeypatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-first-key")
    runner = ClaudeCodeRunner(tmp_path / "data")
    await _collect(runner, fake_host.run_context("one", config=_spared(tmp_path)))
    spare_boot = await _spare_boot(runner, tmp_path)
    if change == "key":
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-rotated-key")
    else:  # the spare read the file when it started; an edit since then is not in it
        with (Path(spare_boot["cwd"]) / "CLAUDE.md").open("a") as fh:
            fh.write("\nA rule written after the spare started.\n")
    _new_conversation(fake_host, "conv-2")
    second = await _collect(runner, fake_host.run_context("two", config=_spared(tmp_path)))
    assert second[-2].message.text == "echo[1]: two" and _kinds(second)[-1] == "completed"
    answered = _starts(tmp_path)[-1]
    # A new process answered, in the slot the conversation claimed, with the key of now.
    assert answered["process"] != spare_boot["boot"] and answered["cwd"] == spare_boot["cwd"]
    assert spare_boot["boot"] not in {b["boot"] for b in _log(tmp_path, boots=True)[2:]}


@pytest.mark.e2e
async def test_spares_are_per_binding_expire_and_leave_no_slot(tmp_path, fake_host, clean_env) -> None:
    runner = ClaudeCodeRunner(tmp_path / "data")
    await _collect(runner, fake_host.run_context("one", config=_spared(tmp_path, keep_warm_seconds=2)))
    await _spare_boot(runner, tmp_path)
    spares_dir = next((tmp_path / "data" / "workspaces").glob("*/.spares"))
    # Another binding's conversation (another instruction) does not take it: it would not start the same way.
    _new_conversation(fake_host, "conv-2")
    await _collect(
        runner, fake_host.run_context("two", config=_spared(tmp_path, keep_warm_seconds=2, instructions="!"))
    )
    assert runner.workspaces.workspace("bot-1", "conv-2").working_dir.parent.name != ".spares"
    # Unclaimed spares (the first binding's, and the one the second binding's message left) stop after the binding's
    # keep_warm_seconds, their slots with them.
    await _until(
        lambda: len(runner.spares) == 0 and not [p for p in spares_dir.iterdir() if p.is_dir()],
        "the spares expired and their slots were removed",
        timeout=30,
    )
    await _until(lambda: not pids_with_env(_tag(tmp_path)), "every process stopped")
    # Their harness homes too: what is left are the two conversations' own.
    homes = list((tmp_path / "data" / "harness").glob("*/conversations/*"))
    assert sorted(h.name.split("-")[0] for h in homes) == ["conv", "conv"], homes


@pytest.mark.e2e
async def test_concurrent_first_messages_share_no_spare(tmp_path, fake_host, clean_env) -> None:
    runner = ClaudeCodeRunner(tmp_path / "data")
    await _collect(runner, fake_host.run_context("zero", config=_spared(tmp_path)))
    await _until(lambda: len(runner.spares) == 1, "a spare started")
    contexts = []
    for n in (1, 2, 3):
        _new_conversation(fake_host, f"conv-new-{n}")
        contexts.append(fake_host.run_context(f"first of {n}", config=_spared(tmp_path)))
    results = await asyncio.gather(*(_collect(runner, rc) for rc in contexts))
    assert sorted(r[-2].message.text for r in results) == [f"echo[1]: first of {n}" for n in (1, 2, 3)]
    dirs = {runner.workspaces.workspace("bot-1", f"conv-new-{n}").working_dir for n in (1, 2, 3)}
    assert len(dirs) == 3  # each conversation in its own directory, one of them the spare's
    assert sum(d.parent.name == ".spares" for d in dirs) == 1
    processes = [s["process"] for s in _starts(tmp_path)]
    assert len(set(processes)) == len(processes) == 4


def test_slots_of_a_dead_runner_are_swept_and_claimed_ones_kept(tmp_path) -> None:
    import fcntl
    import os

    from agenthost.runners.external_harness.workspace import _OWNER, WorkspaceManager, _owner_gone, path_key

    root = tmp_path / "data" / "workspaces" / path_key("bot-1") / ".spares"
    dead_unclaimed, dead_claimed, alive = root / "dead-aaaa", root / "dead-bbbb", root / "alive-cccc"
    homes = {}
    for slot in (dead_unclaimed, dead_claimed, alive):
        (slot / ".agenthost").mkdir(parents=True)
        homes[slot] = WorkspaceManager(tmp_path / "data")._harness_dir(path_key("bot-1"), slot.resolve())
        (homes[slot] / "claude").mkdir(parents=True)
    (root / "dead.lock").touch()  # its runner died: nothing holds the lock
    (root.parent / path_key("conv-old")).symlink_to(Path(".spares") / dead_claimed.name)
    # Another runner process, alive (in a pid namespace of its own, say): it holds its lock.
    held = os.open(root / "alive.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        manager = WorkspaceManager(tmp_path / "data")
        live = manager.new_slot("bot-1")
        other = WorkspaceManager(tmp_path / "data").new_slot("bot-1")  # this runner's own are not swept either
    finally:
        os.close(held)
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [dead_claimed.name, alive.name, "alive.lock", f"{_OWNER}.lock", live.path.name, other.path.name]
    )
    # The swept slot's harness home went with it; the others' stay.
    assert [slot for slot, home in homes.items() if not home.exists()] == [dead_unclaimed]
    # That runner is gone now (its lock released with its fd); this one is not.
    assert _owner_gone(root, "alive") and not _owner_gone(root, _OWNER)
    # A conversation that has a directory keeps it; a new one claims.
    assert not manager.claim("bot-1", "conv-old", live) and not live.claimed
    assert manager.claim("bot-1", "conv-new", live) and live.claimed
    assert manager.workspace("bot-1", "conv-new").working_dir == live.path
    live.discard()
    assert live.path.is_dir()
    other.discard()
    assert not other.path.exists()


@pytest.mark.e2e
async def test_spares_do_not_evict_one_another(tmp_path, fake_host, clean_env) -> None:
    """More bindings than room: the first ones keep their spares, and a later binding's turn starts none (a spare
    that evicts another, for a turn of a third binding to evict, would be a process start per message)."""
    runner = ClaudeCodeRunner(tmp_path / "data")
    for n in range(4):
        _new_conversation(fake_host, f"conv-{n}")
        await _collect(runner, fake_host.run_context("hi", config=_spared(tmp_path, instructions=f"binding {n}")))
        if n < 2:
            await _until(lambda n=n: len(runner.spares) == n + 1, f"binding {n}'s spare started")
            first_two = set(runner.spares._kept)
    # Spares start when the turn ends (_turn's finally): one for binding 2 or 3 would be starting now.
    assert set(runner.spares._kept) == first_two and not runner._spares_starting


@pytest.mark.parametrize("taken", ["kept", "spare"])
@pytest.mark.e2e
async def test_a_turn_that_fails_before_its_harness_runs_stops_the_process_it_took(
    taken: str, tmp_path, fake_host, clean_env, monkeypatch
) -> None:
    """Taken out for a turn (the conversation's kept process, or a spare for a first message), a process belongs to
    that turn: a failure before the harness runs (here the sandbox refused) stops it, never strands it unwatched."""
    from agenthost.runners.external_harness import runner as runner_mod
    from agenthost.runners.external_harness.errors import HarnessSandboxError

    runner = ClaudeCodeRunner(tmp_path / "data")
    await _collect(runner, fake_host.run_context("one", config=_spared(tmp_path, keep_warm_seconds=60)))
    await _spare_boot(runner, tmp_path)
    if taken == "spare":
        _new_conversation(fake_host, "conv-2")

    def refuse(**_: object) -> None:
        raise HarnessSandboxError("the sandbox is refused for this test")

    monkeypatch.setattr(runner_mod, "harness_sandbox", refuse)
    events = await _collect(runner, fake_host.run_context("two", config=_spared(tmp_path, keep_warm_seconds=60)))
    assert _kinds(events)[-1] == "failed" and "refused for this test" in events[-1].failed.message
    waiting = runner.spares if taken == "spare" else runner.kept
    assert len(waiting) == 0
    # One process is left: the one not taken (the spare, or the first conversation's kept process).
    await _until(lambda: len({b["boot"] for b in _log(tmp_path, boots=True)}) == 2, "both processes logged")
    await runner.close()
    await _until(lambda: not pids_with_env(_tag(tmp_path)), "no process outlives the runner")


@pytest.mark.parametrize("planted", ["fifo_claude_local_md", "fifo_claude_md", "symlink_claude_md", "fifo_skills_json"])
@pytest.mark.e2e
async def test_what_a_model_plants_in_its_working_directory_neither_hangs_the_runner_nor_reads_outside(
    planted: str, tmp_path, fake_host, clean_env
) -> None:
    """The working directory is the harness's: a model's command can leave a FIFO or a symlink where the runner
    reads (a start-up file it fingerprints, CLAUDE.md it rewrites, skills.json). The runner must not block on one
    (its event loop serves every conversation) nor follow one out of the workspace and copy what it finds in."""
    import os

    runner = ClaudeCodeRunner(tmp_path / "data")
    await _collect(runner, fake_host.run_context("one", config=_config(tmp_path)))
    workdir = Path(fake_host.data.get_state("conversation", "external.working_directory"))
    secret = tmp_path / "data" / "runner-only-secret.txt"
    secret.write_text("MARKER-RUNNER-SECRET")
    target = {
        "fifo_claude_local_md": workdir / "CLAUDE.local.md",
        "fifo_claude_md": workdir / "CLAUDE.md",
        "symlink_claude_md": workdir / "CLAUDE.md",
        "fifo_skills_json": workdir / ".agenthost" / "skills.json",
    }[planted]
    target.unlink(missing_ok=True)
    if planted.startswith("fifo"):
        os.mkfifo(target)
    else:
        target.symlink_to(secret)
    second = await asyncio.wait_for(_collect(runner, fake_host.run_context("two", config=_config(tmp_path))), 20)
    kinds = _kinds(second)
    if planted == "fifo_claude_local_md":  # not the runner's file: the CLI's business, the turn goes on
        assert kinds[-1] == "completed"
    else:
        assert kinds[-1] == "failed" and second[-1].failed.code == "projection_error", second[-1]
        assert "regular file" in second[-1].failed.message
    for path in workdir.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert "MARKER-RUNNER-SECRET" not in path.read_text(errors="replace"), path
    assert secret.read_text() == "MARKER-RUNNER-SECRET"
