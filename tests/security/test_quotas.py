"""Quotas a hostile runner (a plugin holding a valid run token) runs into, against a real host in process.

Each test lowers a cap in agenthost.host.limits so the flood takes seconds, drives it through the real SDK and
run API, and checks: the typed status or run outcome naming the cap, that nothing half-written is visible, and
that the host still serves a legitimate run afterwards.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from agenthost.host import limits
from agenthost.host.store.db import Database
from agenthost.host.store.runs import row_events
from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, RunnerPermissions, events
from agenthost.runners.sdk.testing import HostHarness

pytestmark = pytest.mark.timeout(120)
FIVE_MIB = 5 * 1024 * 1024


class Flood(Runner):
    """Does what the message says; reports what happened as its final message (JSON)."""

    manifest = RunnerManifest(name="flood", permissions=RunnerPermissions(state_scopes=["conversation", "run"]))

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        command, _, arg = run.context.input.text.partition(" ")
        report: dict[str, object] = {}
        if command == "hello":
            await run.api.state_set("run", "note", "ok")
            ref = await run.api.artifact_create(b"fine", name="ok.txt")
            report["artifact"] = ref.artifact_id
            yield events.message("hello back")
        elif command == "state-keys":
            report.update(await _until_refused(lambda i: run.api.state_set("conversation", f"k{i}", i)))
            # A full scope can still be changed in place and cleaned up, and room made is usable again.
            await run.api.state_set("conversation", "k0", 0)
            await run.api.state_delete("conversation", "k1")
            await run.api.state_set("conversation", "fresh", 1)
        elif command == "state-bytes":
            value = "v" * int(arg)
            report.update(await _until_refused(lambda i: run.api.state_set("conversation", f"b{i}", value)))
        elif command == "artifacts":
            data = b"a" * int(arg)
            report.update(await _until_refused(lambda i: run.api.artifact_create(data + str(i).encode(), name="f")))
        elif command == "artifact-stream":
            size = int(arg)

            async def chunks() -> AsyncIterator[bytes]:
                sent = 0
                while sent < size:
                    sent += 64 * 1024
                    yield b"s" * (64 * 1024)

            report.update(await _until_refused(lambda i: run.api.artifact_create(chunks(), name="stream")))
        elif command == "deltas":
            for _ in range(int(arg)):
                yield events.text("x")
        elif command == "str-deltas":  # the same, through the SDK's and the host's fast path for plain text
            for _ in range(int(arg)):
                yield "x"
        elif command == "messages":
            for _ in range(int(arg)):
                yield events.message("m" * 10_000)
        elif command == "two-big-results":
            for n in (1, 2):
                yield events.tool_started(f"c{n}", "dump", {"n": n})
                yield events.tool_finished(f"c{n}", "dump", f"needle{n} " + "r" * (FIVE_MIB - 8))
            yield events.message("done")
        elif command == "oversize":
            yield events.tool_finished("c", "dump", "r" * (9 * 1024 * 1024))
        elif command == "chatty":
            for _ in range(int(arg)):
                yield events.text("d" * 100_000)
        yield events.message(json.dumps(report))


async def _until_refused(action, limit: int = 10_000) -> dict[str, object]:
    for i in range(limit):
        try:
            await action(i)
        except errors.AgentHostError as exc:
            return {"ok": i, "error": type(exc).__name__, "message": exc.message}
    return {"ok": limit, "error": ""}


def _report(result) -> dict[str, object]:
    return json.loads(result.run.text.rsplit("\n\n", 1)[-1])


def _rows(h: HostHarness, sql: str, params: tuple = ()) -> list[sqlite3.Row]:
    return h.host.db.query(sql, params)


def _stored_events(h: HostHarness, run_id: str) -> list[pb.RunEvent]:
    """Every event the run's rows hold, in order (a row holds one event, or a run of consecutive deltas)."""
    rows = _rows(h, "SELECT kind, payload FROM run_events WHERE run_id = ? ORDER BY seq", (run_id,))
    return [e for r in rows for e in row_events(r["kind"], r["payload"])]


async def _still_serving(h: HostHarness) -> None:
    result = await asyncio.wait_for(h.send("hello", conversation_id="after"), 30)
    assert result.run.status == "completed", result.run.error_message
    assert "hello back" in result.text


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[HostHarness]:
    async with HostHarness(tmp_path, runners=[Flood]) as h:
        yield h


async def test_state_key_quota(host: HostHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "STATE_MAX_KEYS_PER_SCOPE", 20)
    result = await host.send("state-keys")
    assert result.run.status == "completed", result.run.error_message
    report = _report(result)
    assert report["ok"] == 20 and report["error"] == "ResourceExhausted"
    assert "STATE_MAX_KEYS_PER_SCOPE is 20" in report["message"]
    keys = [r[0] for r in _rows(host, "SELECT key FROM state WHERE scope_key LIKE 'conversation%'")]
    assert len(keys) == 20 and "fresh" in keys and "k1" not in keys and "k20" not in keys
    usage = _rows(host, "SELECT n_keys FROM state_usage WHERE scope_key LIKE 'conversation%'")
    assert usage[0][0] == 20  # the trigger-kept count agrees with the table
    await _still_serving(host)


async def test_state_byte_quota(host: HostHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "STATE_MAX_BYTES_PER_SCOPE", 10_000)
    result = await host.send("state-bytes 3000")  # ~3 KB per key: the fourth crosses 10 KB
    report = _report(result)
    assert report["ok"] == 3 and report["error"] == "ResourceExhausted"
    assert "STATE_MAX_BYTES_PER_SCOPE is 10000 bytes" in report["message"]
    stored = _rows(host, "SELECT SUM(length(key) + length(value_json)) FROM state WHERE scope_key LIKE 'conv%'")
    assert stored[0][0] <= 10_000
    await _still_serving(host)


async def test_artifact_quotas_per_run_and_conversation(host: HostHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "ARTIFACT_MAX_BYTES_PER_RUN", 300_000)
    monkeypatch.setattr(limits, "ARTIFACT_MAX_BYTES_PER_CONVERSATION", 350_000)
    first = _report(await host.send("artifacts 100000", conversation_id="c"))
    assert first["ok"] == 2 and first["error"] == "ResourceExhausted"  # 3 × 100,00x bytes > 300,000
    assert "ARTIFACT_MAX_BYTES_PER_RUN = 300000" in first["message"]
    second = _report(await host.send("artifacts 100000", conversation_id="c"))
    assert second["ok"] == 1 and "ARTIFACT_MAX_BYTES_PER_CONVERSATION = 350000" in second["message"]
    third = _report(await host.send("artifacts 100000", conversation_id="other"))
    assert third["ok"] == 2 and "PER_RUN" in third["message"]  # another conversation has its own budget
    sizes = _rows(host, "SELECT SUM(size_bytes), COUNT(*) FROM artifacts WHERE conversation_id = 'c'")
    assert sizes[0][1] == 3 and sizes[0][0] <= 350_000
    assert list((host.host.data_dir / "artifacts" / "tmp").iterdir()) == []  # no temp file left behind
    await _still_serving(host)


async def test_streamed_upload_refused_at_the_crossing_chunk(
    host: HostHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "ARTIFACT_MAX_BYTES_PER_RUN", 1_000_000)
    # No size in the header: the host learns it chunk by chunk and must stop at the one crossing 1 MB.
    report = _report(await host.send("artifact-stream 4000000", conversation_id="s"))
    assert report["ok"] == 0 and report["error"] == "ResourceExhausted"
    assert "ARTIFACT_MAX_BYTES_PER_RUN = 1000000" in report["message"]
    assert _rows(host, "SELECT COUNT(*) FROM artifacts WHERE conversation_id = 's'")[0][0] == 0
    assert list((host.host.data_dir / "artifacts" / "tmp").iterdir()) == []
    assert host.host.artifacts._inflight_run == {} and host.host.artifacts._inflight_conversation == {}
    await _still_serving(host)


async def _check_quota_failure(host: HostHarness, result, cap: str) -> None:
    assert result.run.status == "failed" and result.run.error_code == "quota_exceeded", result.run
    assert cap in result.run.error_message
    await host.host.db.flush()
    persisted = _stored_events(host, result.run.run_id)
    assert [e.seq for e in persisted] == list(range(1, len(persisted) + 1))  # what was persisted is a clean prefix
    assert persisted[-1].failed.code == "quota_exceeded"  # the stream ends with the reason, like any failed run
    stored = host.host.run_store.get(result.run.run_id)
    assert stored.status == "failed" and stored.error_code == "quota_exceeded"
    await _still_serving(host)


@pytest.mark.parametrize("command", ["deltas", "str-deltas"])
async def test_delta_flood_ends_the_run(host: HostHarness, monkeypatch: pytest.MonkeyPatch, command: str) -> None:
    monkeypatch.setattr(limits, "RUN_MAX_EVENTS", 2_000)
    result = await asyncio.wait_for(host.send(f"{command} 50000"), 60)
    await _check_quota_failure(host, result, "RUN_MAX_EVENTS = 2000")
    assert len(_stored_events(host, result.run.run_id)) <= 2_001  # counted per event, however rows hold them


async def test_event_bytes_quota_ends_the_run(host: HostHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "RUN_MAX_EVENT_BYTES", 200_000)
    result = await asyncio.wait_for(host.send("messages 100"), 60)  # 100 × 10 KB
    await _check_quota_failure(host, result, "RUN_MAX_EVENT_BYTES = 200000")
    total = _rows(host, "SELECT SUM(length(payload)) FROM run_events WHERE run_id = ?", (result.run.run_id,))[0][0]
    assert total <= 200_000 + 1_000


async def test_two_five_mib_tool_results_pass_end_to_end(host: HostHarness) -> None:
    result = await asyncio.wait_for(host.send("two-big-results"), 60)
    assert result.run.status == "completed", result.run.error_message
    results = [e.tool_finished.result for e in result.events if e.HasField("tool_finished")]
    assert [len(r) for r in results] == [FIVE_MIB, FIVE_MIB]
    stored = _rows(
        host, "SELECT length(text) FROM transcript WHERE item_type = 'tool_result' AND run_id = ?", (result.run.run_id,)
    )
    assert [r[0] for r in stored] == [FIVE_MIB, FIVE_MIB]  # stored whole; only the index sees a prefix
    indexed = _rows(host, "SELECT rowid FROM transcript_fts WHERE transcript_fts MATCH 'needle2'")
    assert len(indexed) == 1


async def test_event_larger_than_a_message_is_refused_at_the_sdk(host: HostHarness) -> None:
    result = await asyncio.wait_for(host.send("oversize"), 60)
    assert result.run.status == "failed" and result.run.error_code == "event_too_large"
    assert "MAX_EVENT_BYTES" in result.run.error_message
    await _still_serving(host)


async def test_runinfo_text_is_cut_in_list_and_get(host: HostHarness) -> None:
    result = await host.send("hello", conversation_id="big")
    # A row as an older host could have left it (158 MB in the field report; 20 MB here).
    huge = "t" * (20 * 1024 * 1024)
    await host.host.db.write(
        lambda c: c.execute(
            "UPDATE runs SET text = ?, error_message = ?, error_code = ? WHERE run_id = ?",
            (huge, huge, huge[:5000], result.run.run_id),
        )
    )
    listed = await host.client.call("ListRuns", hpb.ListRunsRequest(limit=1000))
    run = next(r for r in listed.runs if r.run_id == result.run.run_id)
    assert len(run.text) == limits.RUNINFO_LIST_TEXT_CHARS and run.text.endswith(limits.RUN_TEXT_MARKER)
    assert len(run.error_message) == limits.RUNINFO_LIST_TEXT_CHARS
    got = await host.client.call("GetRun", hpb.RunRequestById(run_id=result.run.run_id))
    assert len(got.text) == limits.RUNINFO_GET_TEXT_CHARS and got.text.endswith(limits.RUN_TEXT_MARKER)


async def test_runner_error_message_is_capped_when_recorded(host: HostHarness) -> None:
    st_text = "e" * (2 * limits.RUN_MAX_ERROR_CHARS)
    info = hpb.RunInfo(run_id="run_x", error_code="c" * 1000, error_message=st_text, text="x" * 10)
    from agenthost.host.store.runs import RunStore

    await host.host.db.write(lambda conn: RunStore.finish(conn, info))  # no such row: the cut is what we check
    assert len(info.error_message) == limits.RUN_MAX_ERROR_CHARS and len(info.error_code) == limits.RUN_MAX_CODE_CHARS


async def test_slow_client_is_dropped_not_the_run(host: HostHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "INBOX_MAX_BYTES", 1_000_000)
    request = hpb.SendMessageRequest(bot=host.bot, text="chatty 300", conversation_id="slow")  # 30 MB of deltas
    call = host.client.stub.SendMessage(request, timeout=60)
    started = await call.read()  # then read nothing while the run streams
    run_id = started.run_started.run_id
    for _ in range(600):
        info = host.host.run_store.get(run_id)
        if info.status != "running" and info.status != "queued":
            break
        await asyncio.sleep(0.1)
    assert info.status == "completed", info  # the run never waited for its subscriber
    with pytest.raises(grpc.RpcError) as caught:
        while (await call.read()) is not grpc.aio.EOF:
            pass
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "INBOX_MAX_BYTES" in caught.value.details()
    await _still_serving(host)


async def test_writer_queue_applies_backpressure(store_target: Path | str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "WRITE_QUEUE_MAX_JOBS", 10)
    db = Database(store_target)
    await db.open()
    gate = threading.Event()
    try:
        db.enqueue(lambda conn: gate.wait(30))  # holds the writer, as a slow disk would
        for i in range(20):
            db.enqueue(lambda conn, i=i: conn.execute("INSERT INTO meta(key, value) VALUES (?, 'v')", (f"q{i}",)))
        assert db.congested
        waiting = asyncio.ensure_future(db.write(lambda conn: conn.execute("INSERT INTO meta VALUES ('w', 'v')")))
        await asyncio.sleep(0.2)
        assert not waiting.done() and db.pending_jobs == 21  # it waits for room instead of queuing
        gate.set()
        await asyncio.wait_for(waiting, 10)
        assert not db.congested and db.pending_jobs == 0
        assert len(db.query("SELECT key FROM meta WHERE key LIKE 'q%' OR key = 'w'")) == 21
    finally:
        gate.set()
        await db.close()
