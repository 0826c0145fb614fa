"""A run reads its conversation as of the message it answers, through a real host.

The host records a message when it arrives, so while run R (answering m1) executes, m2 and m3 queued behind it
are already in the transcript. They are R's future: HistoryPage, HistorySearch, EventPage, EventGet, the inline
bootstrap, latest_cursor and transcript_count must all leave them out, while R's own message and every earlier
message and reply stay, each once, in turn order: each earlier message followed by its run's replies, R's own
message last (the host recorded them m1 m2 A1 A2; a runner projecting history must read m1 A1 m2). People's view
(GetHistory, `agenthost history`) reads the same order. Arrival orders are drawn by hypothesis; every wait is on
an event (a run starting, a reply being recorded, a run finishing), never a sleep.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agenthost.host.api.client import HostClient
from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb
from agenthost.protos.wire import accepted_run
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, events
from agenthost.runners.sdk.testing import HostHarness

pytestmark = [pytest.mark.timeout(300)]
CONVERSATION = "horizon"
WORD = "zebra"  # in every message and reply, so a search for it finds the whole visible transcript


@dataclass
class View:
    """What one run was shown of its conversation when it started."""

    text: str
    event_seq: int
    pages: list[tuple[int, str, str, str]]  # (seq, role, text, event_id), oldest first, paging back from ""
    forward: list[tuple[int, str, str, str]]  # paging forward from ""
    from_latest: list[tuple[int, str, str, str]]  # paging back from ContextAccess.latest_cursor
    latest_cursor: str
    count: int
    search: set[tuple[int, str, str]]
    bootstrap: list[tuple[int, str, str]]
    events: list[str]
    allowed: list[str]  # messages EventGet handed it by id
    refused: list[str]  # messages EventGet answered NotFound for (recorded after its own)


class Recorder(Runner):
    """Records its view, then answers in two recorded replies, holding between them until released."""

    manifest = RunnerManifest(
        name="recorder",
        context={"bootstrap": "recent_tail", "max_inline_events": 100, "max_inline_bytes": 256 * 1024},
    )
    views: ClassVar[dict[str, View]] = {}
    started: ClassVar[dict[str, asyncio.Event]] = {}
    release: ClassVar[dict[str, asyncio.Event]] = {}
    event_ids: ClassVar[dict[str, str]] = {}  # message text -> its event id, filled as the test sends

    @classmethod
    def reset(cls) -> None:
        cls.views, cls.started, cls.release, cls.event_ids = {}, {}, {}, {}

    @classmethod
    def event(cls, table: dict[str, asyncio.Event], text: str) -> asyncio.Event:
        return table.setdefault(text, asyncio.Event())

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        api = run.api
        pages = await _walk(api, "")
        forward = await _walk(api, "", "forward")
        ctx = run.context.context
        from_latest = await _walk(api, ctx.latest_cursor) if ctx.latest_cursor else []
        found = await api.history_search(WORD, top_k=50)
        evs = await api.event_page(limit=100)
        mine = run.context.event.seq
        allowed, refused = [], []
        for text, event_id in list(Recorder.event_ids.items()):
            try:
                got = await api.event_get(event_id)
            except errors.NotFound:
                refused.append(text)
                continue
            assert got.seq <= mine, f"{run.text} was handed event {got.text!r} recorded after its own"
            allowed.append(text)
        Recorder.views[run.text] = View(
            text=run.text,
            event_seq=mine,
            pages=pages,
            forward=forward,
            from_latest=from_latest,
            latest_cursor=ctx.latest_cursor,
            count=ctx.transcript_count,
            search={(i.seq, i.role, i.text) for i in found},
            bootstrap=[(i.seq, i.role, i.text) for i in run.context.bootstrap],
            events=[e.text for e in reversed(evs.events)],
            allowed=allowed,
            refused=refused,
        )
        first = f"{WORD} first reply to {run.text}"
        yield events.message(first)
        # "Between its replies" begins once the host has recorded the first: a message sent on `started` must land
        # after it, however long the reply takes to reach the store on a loaded machine. The host's store has no
        # event a runner could wait on, so the runner reads its history until the reply is there.
        while first not in [i.text for i in (await api.history_page(limit=5)).items]:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        Recorder.event(Recorder.started, run.text).set()
        await Recorder.event(Recorder.release, run.text).wait()
        yield events.message(f"{WORD} second reply to {run.text}")


async def _walk(api, cursor: str, direction: str = "backward") -> list[tuple[int, str, str, str]]:
    """Every item from `cursor` on, oldest first."""
    items = []
    while True:
        # small pages: the filter must hold across cursors
        page = await api.history_page(cursor=cursor, limit=2, direction=direction)
        items += [(i.seq, i.role, i.text, i.event_id) for i in page.items]
        if not page.has_more:
            return items if direction == "forward" else list(reversed(items))
        cursor = page.next_cursor


def replies(text: str) -> list[str]:
    return [f"{WORD} first reply to {text}", f"{WORD} second reply to {text}"]


def turns(messages: list[str]) -> list[tuple[str, str]]:
    """The conversation as it went: each message, then its run's replies."""
    return [item for m in messages for item in [("user", m), *(("assistant", r) for r in replies(m))]]


def check_view(view: View, earlier: list[str]) -> None:
    """`earlier`: the messages answered before this one, in arrival order."""
    got = [(role, text) for _, role, text, _ in view.pages]
    # Pages of 2, both ways: exactly the earlier turns in order, then its own message, last.
    assert got == [*turns(earlier), ("user", view.text)], f"{view.text} saw {got}"
    assert view.forward == view.pages, "forward and backward pages differ"
    seqs = [seq for seq, *_ in view.pages]
    assert len(seqs) == len(set(seqs)), "items repeated"
    assert view.count == len(view.pages)
    assert view.from_latest == view.pages[:-1]  # latest_cursor names the newest visible item
    assert view.search == {(seq, role, text) for seq, role, text, _ in view.pages}
    assert view.bootstrap == [(seq, role, text) for seq, role, text, _ in view.pages]
    assert view.events == [*earlier, view.text]
    assert set(view.allowed) <= {*earlier, view.text} and not set(view.refused) & {*earlier, view.text}


async def _send(h: HostHarness, text: str) -> tuple[hpb.RunInfo, asyncio.Task[hpb.RunInfo]]:
    """Sends `text`; returns once the host has recorded it (its first reply), with a task that ends with the run."""
    stream = h.client.stream(hpb.SendMessageRequest(bot=h.bot, text=text, conversation_id=CONVERSATION), timeout=120)
    first = await asyncio.wait_for(anext(stream), 30)
    run = accepted_run(first)
    Recorder.event_ids[text] = run.event_id

    async def rest() -> hpb.RunInfo:
        async for reply in stream:
            if reply.WhichOneof("kind") == "run_finished":
                return reply.run_finished
        raise AssertionError(f"the run of {text} never finished")

    return run, asyncio.create_task(rest())


# When each next message arrives: at once (it queues behind every held run), while the oldest held run is between
# its two replies (it is then let go: the message's seq falls between that run's replies), or once every held run
# has been let go and has finished.
GAPS = ("now", "midrun", "finished")


async def play(root: Path, gaps: list[str], *, cli: bool = False) -> None:
    Recorder.reset()
    texts = [f"{WORD} message {i}" for i in range(len(gaps) + 1)]
    async with HostHarness(root, runners=[Recorder]) as h:
        tasks = []
        _, task = await _send(h, texts[0])
        tasks.append(task)
        held = 0  # the oldest run not yet let go
        for k, gap in enumerate(gaps, start=1):
            if gap == "midrun":
                await asyncio.wait_for(Recorder.event(Recorder.started, texts[held]).wait(), 30)
            elif gap == "finished":
                for j in range(held, k):
                    Recorder.event(Recorder.release, texts[j]).set()
                    await asyncio.wait_for(tasks[j], 30)
                held = k
            _, task = await _send(h, texts[k])
            tasks.append(task)
            if gap == "midrun":
                Recorder.event(Recorder.release, texts[held]).set()
                held += 1
        for text in texts:
            Recorder.event(Recorder.release, text).set()
        infos = await asyncio.wait_for(asyncio.gather(*tasks), 60)
        assert [i.status for i in infos] == ["completed"] * len(texts), [i.error_message for i in infos]
        for i, text in enumerate(texts):
            check_view(Recorder.views[text], texts[:i])
        # People's view (GetHistory) is the whole transcript, whatever the runs saw, in the same turn order.
        assert await _history(h) == turns(texts)
        if cli:
            assert await _cli_history(h) == turns(texts)


async def _cli_history(h: HostHarness) -> list[tuple[str, str]]:
    """`agenthost history` as a person runs it (a real process), in text and JSON; the two must agree."""
    shown = {}
    for fmt in ((), ("--json",)):
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "agenthost.host.cli", "--data-dir", str(h.host.data_dir)),
            *("history", h.bot, "--conversation", CONVERSATION, *fmt),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), 60)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
        assert proc.returncode == 0, err.decode()
        if fmt:
            shown[fmt] = [(i["role"], i["text"]) for i in json.loads(out)["items"]]
        else:
            lines = out.decode().splitlines()
            shown[fmt] = [(line[1:].split("] ", 1)[0], line.split("] ", 1)[1]) for line in lines]
    assert shown[()] == shown[("--json",)]
    return shown[()]


async def _history(h: HostHarness) -> list[tuple[str, str]]:
    """GetHistory in pages of 2, both ways; the two must agree."""
    walked: dict[int, list[tuple[str, str]]] = {}
    for direction in (pb.FORWARD, pb.BACKWARD):
        items, cursor = [], ""
        while True:
            resp = await h.client.call(
                "GetHistory",
                hpb.GetHistoryRequest(
                    bot=h.bot, conversation_id=CONVERSATION, limit=2, direction=direction, cursor=cursor
                ),
            )
            items += [(i.role, i.text) for i in resp.items]
            if not resp.has_more:
                break
            cursor = resp.next_cursor
        walked[direction] = items if direction == pb.FORWARD else list(reversed(items))
    assert walked[pb.FORWARD] == walked[pb.BACKWARD]
    return walked[pb.FORWARD]


@pytest.mark.slow
@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(gaps=st.lists(st.sampled_from(GAPS), min_size=2, max_size=5))
def test_each_run_sees_its_conversation_up_to_its_message(gaps: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="horizon-") as tmp:
        asyncio.run(asyncio.wait_for(play(Path(tmp), gaps), 120))


@pytest.mark.e2e
async def test_burst_of_three_queued_behind_a_running_run(tmp_path: Path) -> None:
    """m0 holds; m1 and m2 queue behind it: m1's run sees m0's turn and m1, never m2, not even by event id.
    `agenthost history` shows the burst in turn order: m0, its replies, m1, its replies, m2, its replies."""
    await play(tmp_path, ["now", "now"], cli=True)
    assert Recorder.views["zebra message 1"].refused == ["zebra message 2"]
    # m0's run records its view while m1 and m2 arrive: it is refused whichever of them had arrived by then.
    refused = Recorder.views["zebra message 0"].refused
    assert refused == ["zebra message 1", "zebra message 2"][: len(refused)], refused


async def test_message_queued_between_the_replies_of_the_run_ahead(tmp_path: Path) -> None:
    """m1 arrives while m0's run is between its replies, so m1's seq lies between them in the transcript; in
    turn order both replies still come before m1."""
    await play(tmp_path, ["midrun", "now", "finished"])
    view = Recorder.views["zebra message 1"]
    seq = {text: s for s, _, text, _ in view.pages}
    assert seq[replies("zebra message 0")[0]] < seq["zebra message 1"] < seq[replies("zebra message 0")[1]]
    order = [text for _, _, text, _ in view.pages]
    assert order == ["zebra message 0", *replies("zebra message 0"), "zebra message 1"]


class Reopened(HostHarness):
    """The same data dir after a stop: the bot and its binding are already recorded. The in-process runner is
    attached again, so its plugin row (which the host cannot start on its own) is dropped first."""

    async def __aenter__(self) -> HostHarness:
        db = sqlite3.connect(self.host.data_dir / "agenthost.db")
        try:
            with db:
                db.execute("DELETE FROM plugins WHERE plugin_id = 'test'")
        finally:
            db.close()
        await self.host.start()
        self.client = HostClient(self.host.admin_address, token=self.host.admin_token)
        await self._attach()
        return self


async def test_queued_messages_across_a_host_restart(tmp_path: Path) -> None:
    """Stopping the host interrupts the running run, and the queued ones cannot start again (their runner is gone);
    their messages stay in the conversation
    (a person saw them sent), so the first run after the restart sees them, each once, in arrival order, with the
    reply the interrupted run had recorded — and nothing of its own future."""
    Recorder.reset()
    texts = [f"{WORD} message {i}" for i in range(5)]
    h = HostHarness(tmp_path, runners=[Recorder])
    await h.__aenter__()
    try:
        started, first = await _send(h, texts[0])
        await asyncio.wait_for(Recorder.event(Recorder.started, texts[0]).wait(), 30)
        queued = [await _send(h, t) for t in texts[1:3]]
    finally:
        await h.__aexit__(None, None, None)
    await asyncio.gather(first, *(t for _, t in queued), return_exceptions=True)  # their clients were cut
    run_ids = [started.run_id, *(info.run_id for info, _ in queued)]
    assert set(Recorder.views) == {texts[0]}  # the queued runs never reached the runner

    async with Reopened(tmp_path, runners=[Recorder]) as h2:
        # The running run ends interrupted; the queued ones would rejoin the queue (resume_queued), but this
        # harness's in-process runner is not registered yet when the host resumes them, so they end
        # runner_unavailable, never reaching a runner.
        ended = [h2.host.runs.runs.get(r) for r in run_ids]
        assert [(i.status, i.error_code) for i in ended] == [("interrupted", "host_shutdown")] + [
            ("failed", "runner_unavailable")
        ] * 2
        _, task = await _send(h2, texts[3])
        await asyncio.wait_for(Recorder.event(Recorder.started, texts[3]).wait(), 30)
        _, last = await _send(h2, texts[4])
        Recorder.event(Recorder.release, texts[3]).set()
        Recorder.event(Recorder.release, texts[4]).set()
        assert (await asyncio.wait_for(task, 30)).status == "completed"
        assert (await asyncio.wait_for(last, 30)).status == "completed"
    view = Recorder.views[texts[3]]
    got = [(role, text) for _, role, text, _ in view.pages]
    # m0 recorded its first reply before the stop (whether before or after m1 and m2 arrived, it is m0's turn);
    # the stop cut its second. m1 and m2 were never answered.
    assert got == [
        ("user", texts[0]),
        ("assistant", replies(texts[0])[0]),
        ("user", texts[1]),
        ("user", texts[2]),
        ("user", texts[3]),
    ], got
    assert view.count == len(got)
    assert view.events == texts[:4]
    later = [(role, text) for _, role, text, _ in Recorder.views[texts[4]].pages]
    # m4 arrived while m3's run was between its replies, so its seq lies between them; its turn comes after.
    assert later == [*got, *(("assistant", r) for r in replies(texts[3])), ("user", texts[4])], later


class Pager(Runner):
    """Reads the same page of its conversation before and after its reply is recorded (the host serves a page it
    has read before from memory while the conversation is unchanged: Conversations.page_history_message)."""

    manifest = RunnerManifest(name="pager")
    pages: ClassVar[dict[str, list[list[str]]]] = {}
    read: ClassVar[asyncio.Event]
    reread: ClassVar[asyncio.Event]

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        async def page() -> None:
            items = (await run.api.history_page()).items  # newest first
            Pager.pages.setdefault(run.text, []).append([i.text for i in reversed(items)])

        await page()
        if run.text == "first":
            await page()  # the same request again, nothing recorded meanwhile
            Pager.read.set()
            yield events.message("reply to first")
            await Pager.reread.wait()
            await page()


async def test_a_page_read_again_shows_what_was_added_and_only_up_to_the_run_horizon(tmp_path: Path) -> None:
    """Run A reads a page, its reply is recorded and a message queues behind it; A's next read of the same page
    shows its reply and not the queued message (A's future); B, answering that message with nothing recorded
    since A's last read, reads the same request and is shown the message. A page kept from one read is never
    served past a change of its conversation, nor to a run of another horizon."""
    Pager.pages, Pager.read, Pager.reread = {}, asyncio.Event(), asyncio.Event()
    async with HostHarness(tmp_path, runners=[Pager]) as h:
        first = h.client.stream(hpb.SendMessageRequest(bot=h.bot, text="first", conversation_id=CONVERSATION))
        await asyncio.wait_for(anext(first), 30)
        await asyncio.wait_for(Pager.read.wait(), 30)
        second = h.client.stream(hpb.SendMessageRequest(bot=h.bot, text="second", conversation_id=CONVERSATION))
        await asyncio.wait_for(anext(second), 30)  # recorded, queued behind A

        async def replied() -> None:
            while "reply to first" not in await _texts(h):  # noqa: ASYNC110 - the store has no event to wait on
                await asyncio.sleep(0.01)

        await asyncio.wait_for(replied(), 30)
        Pager.reread.set()
        for stream in (first, second):
            async with asyncio.timeout(60):
                async for _ in stream:
                    pass
    assert Pager.pages["first"] == [["first"], ["first"], ["first", "reply to first"]]
    assert Pager.pages["second"] == [["first", "reply to first", "second"]]


async def _texts(h: HostHarness) -> list[str]:
    resp = await h.client.call(
        "GetHistory", hpb.GetHistoryRequest(bot=h.bot, conversation_id=CONVERSATION, limit=50, direction=pb.BACKWARD)
    )
    return [i.text for i in resp.items]
