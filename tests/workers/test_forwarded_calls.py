"""A worker's unary run API calls multiplexed on its one `WorkerHub.Calls` stream (host/workers/mux.py): every
check of a call holds per frame against a real host (the run token, the run placed on this worker, the worker's
certificate), and the stream's own failure modes give callers a typed error, never a hang: a reply for a call not
in flight, a stream cut mid-call, a slow call among fast ones, a deadline, a cancelled call."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from agenthost.host.server import Host
from agenthost.host.workers.mux import CALLS_METHOD, CallFailed, Multiplexer, serve_calls
from agenthost.protos import run_api_pb2 as api
from agenthost.protos import worker_pb2 as wpb
from tests.cli_process import acli
from tests.workers.helpers import ScriptedWorker, batch, completed, enrolled

HISTORY = "/agenthost.v1.AgentRunAPIProxy/HistoryPage"


@pytest.mark.e2e
async def test_each_frame_is_checked_as_the_call_would_be(host: Host, tmp_path: Path) -> None:
    """Served with the run's token on its own worker's stream; the same token on another worker's stream, a bad
    token, a streaming method, and any frame after its worker is revoked: refused, each with its status."""
    one = await enrolled(host, tmp_path / "one", "one")
    two = await enrolled(host, tmp_path / "two", "two")
    async with ScriptedWorker(one) as w1, ScriptedWorker(two, offers=[]) as w2:
        assert w1.channel is not None and w2.channel is not None
        for args in (("bots", "create", "b"), ("bots", "bind", "b", "--runner", "fake/echo")):
            rc, out, err = await acli(host.data_dir, *args)
            assert rc == 0, out + err
        send = asyncio.create_task(acli(host.data_dir, "send", "b", "hi", "--conversation", "c"))
        run_id = await asyncio.wait_for(w1.assigned.get(), 60)
        call, ups = w1.open_run(run_id)
        request = (await call.read()).request
        token = f"Bearer {request.run_token}"
        page = api.HistoryPageRequest(run_id=run_id).SerializeToString()
        mine, theirs = Multiplexer(w1.channel), Multiplexer(w2.channel)
        reply = api.HistoryPageResponse.FromString(await mine.call(HISTORY, token, page, 30))
        assert [i.text for i in reply.items] == ["hi"]
        with pytest.raises(CallFailed) as caught:
            await theirs.call(HISTORY, token, page, 30)
        assert caught.value.code == grpc.StatusCode.PERMISSION_DENIED and "another worker" in caught.value.details
        with pytest.raises(CallFailed) as caught:
            await mine.call(HISTORY, "Bearer nope", page, 30)
        assert caught.value.code == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(CallFailed) as caught:
            await mine.call("/agenthost.v1.AgentRunAPIProxy/Events", token, b"", 30)
        assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
        ups.put_nowait(batch(completed()))
        ups.put_nowait(None)
        rc, out, err = await asyncio.wait_for(send, 60)
        assert rc == 0, out + err
        # Revoked with its stream open: its next frame is refused on the certificate, not served.
        rc, out, err = await acli(host.data_dir, "workers", "revoke", "two")
        assert rc == 0, err
        with pytest.raises(CallFailed) as caught:
            await theirs.call(HISTORY, token, page, 30)
        assert caught.value.code == grpc.StatusCode.UNAUTHENTICATED
        assert "worker 'two' was revoked" in caught.value.details, caught.value.details
        await mine.close()
        await theirs.close()
    host.audit.flush()
    await host.db.flush()
    outcomes = [(r["method"], r["outcome"]) for r in host.audit.rows(run_id)]
    assert ("HistoryPage", "OK") in outcomes and ("HistoryPage", "PERMISSION_DENIED") in outcomes, outcomes


Behaviour = Callable[[AsyncIterator[bytes], grpc.aio.ServicerContext], AsyncIterator[bytes]]


async def _served(behaviour: Behaviour) -> tuple[grpc.aio.Server, grpc.aio.Channel]:
    """A stand-in host serving `Calls` with `behaviour` on loopback, and a channel to it."""
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("agenthost.v1.WorkerHub", {"Calls": _stream(behaviour)}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, grpc.aio.insecure_channel(f"127.0.0.1:{port}")


def _stream(behaviour: Behaviour) -> grpc.RpcMethodHandler:
    assert CALLS_METHOD.endswith("/Calls")
    return grpc.stream_stream_rpc_method_handler(behaviour)


async def test_a_reply_for_a_call_not_in_flight_is_dropped_and_the_call_still_answered() -> None:
    async def behaviour(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for data in requests:
            frame = wpb.ForwardedCall.FromString(data)
            yield wpb.ForwardedReply(id=frame.id + 1000, reply=b"stray").SerializeToString()
            yield wpb.ForwardedReply(id=frame.id, reply=b"mine").SerializeToString()

    server, channel = await _served(behaviour)
    mux = Multiplexer(channel)
    try:
        assert await asyncio.wait_for(mux.call(HISTORY, "", b"", 30), 30) == b"mine"
        assert await asyncio.wait_for(mux.call(HISTORY, "", b"", 30), 30) == b"mine"
        assert mux.unknown_replies == 2
    finally:
        await mux.close()
        await channel.close()
        await server.stop(0)


async def test_a_stream_cut_mid_call_fails_every_call_in_flight_and_the_next_call_opens_a_new_one() -> None:
    got = asyncio.Event()
    streams = 0

    async def behaviour(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        nonlocal streams
        streams += 1
        if streams == 1:
            await anext(requests)
            await anext(requests)
            got.set()
            await context.abort(grpc.StatusCode.UNAVAILABLE, "cut")
        async for data in requests:
            yield wpb.ForwardedReply(id=wpb.ForwardedCall.FromString(data).id, reply=b"ok").SerializeToString()

    server, channel = await _served(behaviour)
    mux = Multiplexer(channel)
    try:
        calls = [asyncio.create_task(mux.call(HISTORY, "", b"", None)) for _ in range(2)]
        await asyncio.wait_for(got.wait(), 30)
        for task in calls:
            with pytest.raises(CallFailed) as caught:
                await asyncio.wait_for(task, 30)
            assert caught.value.code == grpc.StatusCode.UNAVAILABLE
        assert await asyncio.wait_for(mux.call(HISTORY, "", b"", 30), 30) == b"ok"
        assert streams == 2
    finally:
        await mux.close()
        await channel.close()
        await server.stop(0)


async def test_a_slow_call_holds_up_no_other_and_deadlines_and_cancels_reach_the_host() -> None:
    """The host's side (serve_calls) with a slow and a fast unary handler behind a real stream."""
    release = asyncio.Event()
    slow_cancelled = asyncio.Event()
    open_calls = 0
    all_left = asyncio.Event()

    async def slow(request: bytes, context: Any) -> bytes:
        try:
            await release.wait()
        except asyncio.CancelledError:
            slow_cancelled.set()
            raise
        return b"slow"

    async def fast(request: bytes, context: Any) -> bytes:
        return b"fast:" + request

    handlers = {
        "/t/Slow": grpc.unary_unary_rpc_method_handler(slow),
        "/t/Fast": grpc.unary_unary_rpc_method_handler(fast),
    }

    def admit() -> Callable[[], None]:
        nonlocal open_calls
        open_calls += 1

        def leave() -> None:
            nonlocal open_calls
            open_calls -= 1
            if open_calls == 0:
                all_left.set()

        return leave

    async def behaviour(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for reply in serve_calls(requests, context, handlers=handlers, admit=admit):
            yield reply

    server, channel = await _served(behaviour)
    mux = Multiplexer(channel)
    try:
        held = asyncio.create_task(mux.call("/t/Slow", "", b"", None))
        assert await asyncio.wait_for(mux.call("/t/Fast", "", b"1", 30), 30) == b"fast:1"
        assert not held.done()
        # A deadline is carried: the host ends the call DEADLINE_EXCEEDED.
        with pytest.raises(CallFailed) as caught:
            await asyncio.wait_for(mux.call("/t/Slow", "", b"", 0.5), 30)
        assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        # The caller giving up cancels the call on the host, and frees its open-call slot.
        held.cancel()
        await asyncio.wait_for(slow_cancelled.wait(), 30)
        await asyncio.wait_for(all_left.wait(), 30)
        assert open_calls == 0
        assert await asyncio.wait_for(mux.call("/t/Fast", "", b"2", 30), 30) == b"fast:2"
    finally:
        await mux.close()
        await channel.close()
        await server.stop(0)


async def test_a_worker_that_reads_no_replies_cannot_grow_the_hosts_memory() -> None:
    """A worker writes frames the host refuses (no such method) and never reads the refusals: the host stops
    reading its frames once REPLY_QUEUE_FRAMES replies wait (and the stream's windows are full), rather than
    queueing a refusal for each of them."""
    frames_read = 0

    async def counted(requests: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        nonlocal frames_read
        async for data in requests:
            frames_read += 1
            yield data

    def admit() -> Callable[[], None]:
        return lambda: None

    async def behaviour(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for reply in serve_calls(counted(requests), context, handlers={}, admit=admit):
            yield reply

    server, channel = await _served(behaviour)
    call = channel.stream_stream(CALLS_METHOD)()
    sent = 20_000
    written = 0
    method = "/nope/" + "x" * 4096  # each refusal names it: 4 KiB a reply, past grpc's windows within a few MiB

    async def write() -> None:
        nonlocal written
        for i in range(sent):
            await call.write(wpb.ForwardedCall(id=i + 1, method=method).SerializeToString())
            written += 1

    writer = asyncio.create_task(write())
    try:
        # Until the writer is held by flow control (no progress for a while) or has sent everything.
        last = -1
        while not writer.done() and written != last:
            last = written
            await asyncio.wait({writer}, timeout=2)
        assert frames_read < sent, f"the host read all {sent} frames of a worker that reads no replies"
        assert frames_read < sent // 2, frames_read
    finally:
        writer.cancel()
        call.cancel()
        await asyncio.gather(writer, return_exceptions=True)
        await channel.close()
        await server.stop(0)
