"""The HTTP gateway through the official `openai` client (and raw HTTP where a client would not send the bytes),
against a real host: chat completions, streamed and not; responses with previous_response_id; models; every
error status; a client that goes away mid-stream; a reader that stops reading; no run started twice."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from agenthost.host import limits
from agenthost.host.api.gateway import app as gateway_app
from agenthost.host.api.gateway import parse_address
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb

from .helpers import DELTAS, USAGE, Talker, World

pytestmark = pytest.mark.timeout(60)
REPLY = "".join(DELTAS)


def client(world: World, key: str | None = None, **kwargs: Any) -> AsyncOpenAI:
    kwargs.setdefault("max_retries", 0)
    return AsyncOpenAI(base_url=world.base_url, api_key=key or world.key, timeout=20, **kwargs)


def history(*turns: str) -> list[dict[str, str]]:
    """A chat client's request: a system prompt and alternating turns, the last one the user's."""
    msgs = [{"role": "system", "content": "ignored: the binding owns the prompt"}]
    for i, text in enumerate(turns):
        msgs.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return msgs


# ---- chat completions ----


async def test_chat_completion_sends_only_the_last_user_message_and_reports_usage(world: World) -> None:
    async with client(world) as c:
        raw = await c.chat.completions.with_raw_response.create(
            model="testbot", messages=history("first", "an old answer", "hello")
        )
    done = raw.parse()
    assert done.choices[0].message.content == REPLY
    assert done.choices[0].finish_reason == "stop"
    assert (done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.total_tokens) == (11, 3, 14)
    assert done.usage.prompt_tokens_details.cached_tokens == USAGE["cache_read_tokens"]
    assert done.model == "testbot"
    [run] = world.runs()
    assert done.id == "chatcmpl-" + run.run_id.removeprefix("run_")
    assert raw.headers["x-agenthost-run"] == run.run_id
    assert run.status == "completed" and run.text == REPLY
    assert [t for _, t, _ in Talker.seen] == ["hello"]  # earlier messages are not replayed: the host has them
    # The run records the gateway key's credential ("app") as its sender, like a gRPC SendMessage does.
    assert world.host.run_store.get(run.run_id, origin="app") is not None
    assert world.host.run_store.get(run.run_id, origin="") is None


async def test_chat_completion_streams_openai_chunks_with_usage_last(world: World) -> None:
    async with client(world) as c:
        stream = await c.chat.completions.create(
            model="testbot",
            messages=history("hello"),
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    content = [ch.choices[0].delta.content for ch in chunks if ch.choices and ch.choices[0].delta.content]
    assert content == list(DELTAS)  # one chunk per runner delta, in order
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == 14
    assert all(ch.usage is None for ch in chunks[:-1])
    assert len({ch.id for ch in chunks}) == 1
    [run] = world.runs()
    assert run.status == "completed" and run.usage.output_tokens == 3


async def test_stream_without_include_usage_has_no_usage_chunk(world: World) -> None:
    async with client(world) as c:
        stream = await c.chat.completions.create(model="testbot", messages=history("hello"), stream=True)
        chunks = [chunk async for chunk in stream]
    assert all(ch.choices for ch in chunks) and all(ch.usage is None for ch in chunks)


async def test_conversations_by_header_by_user_or_fresh(world: World) -> None:
    async with client(world) as c:
        for name in ("support 42", "support 42", "caf%C3%A9"):
            raw = await c.chat.completions.with_raw_response.create(
                model="testbot", messages=history("hi"), extra_headers={"X-Agenthost-Conversation": name}
            )
            assert raw.headers["x-agenthost-conversation"] == name  # echoed as sent: send it back to continue
        # A name that is not ASCII travels percent-encoded (UTF-8), both ways.
        raw = await c.chat.completions.with_raw_response.create(
            model="testbot", messages=history("hi"), extra_headers={"X-Agenthost-Conversation": "caf%c3%a9"}
        )
        assert raw.headers["x-agenthost-conversation"] == "caf%C3%A9"
        await c.chat.completions.create(model="testbot", messages=history("hi"), user="alice")
        fresh = [
            (await c.chat.completions.with_raw_response.create(model="testbot", messages=history("hi"))).headers[
                "x-agenthost-conversation"
            ]
            for _ in range(2)
        ]
    conversations = [conv for conv, _, _ in Talker.seen]
    assert conversations[:4] == ["support 42", "support 42", "café", "café"]
    # The host's history grows by the user's turn and the reply: the second turn sees the first.
    assert [n for _, _, n in Talker.seen[:4]] == [1, 3, 1, 3]
    assert conversations[4] == "user:app/alice"  # the end user's id, namespaced by the key
    assert fresh[0] != fresh[1] and conversations[5:] == fresh and fresh[0].startswith("conv_")


# ---- responses ----


async def test_responses_continue_by_previous_response_id(world: World) -> None:
    async with client(world) as c:
        first = await c.responses.create(model="testbot", input="hello")
        second = await c.responses.create(
            model="testbot",
            previous_response_id=first.id,
            input=[{"role": "user", "content": [{"type": "input_text", "text": "and again"}]}],
        )
        # The bot is known from the previous response; naming it again is optional.
        third = await c.responses.create(previous_response_id=second.id, input="once more")  # type: ignore[call-overload]
    assert first.output_text == REPLY and first.status == "completed"
    assert first.usage.input_tokens == 11 and first.usage.total_tokens == 14
    assert second.previous_response_id == first.id and third.previous_response_id == second.id
    runs = {r.run_id: r for r in world.runs()}
    conv = {runs["run_" + r.id.removeprefix("resp_")].conversation_id for r in (first, second, third)}
    assert len(conv) == 1
    assert [(t, n) for _, t, n in Talker.seen] == [("hello", 1), ("and again", 3), ("once more", 5)]


async def test_responses_stream_events(world: World) -> None:
    async with client(world) as c:
        stream = await c.responses.create(model="testbot", input="hello", stream=True)
        got = [event async for event in stream]
    kinds = [e.type for e in got]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.delta for e in got if e.type == "response.output_text.delta"] == list(DELTAS)
    assert [e.sequence_number for e in got] == list(range(len(got)))
    final = got[-1].response
    assert final.output_text == REPLY and final.usage.output_tokens == 3 and final.status == "completed"
    assert got[0].response.id == final.id


async def test_responses_previous_id_of_a_bot_the_key_may_not_use_does_not_exist(world: World) -> None:
    async with client(world, world.admin) as admin:
        other = await admin.responses.create(model="otherbot", input="hello")
    async with client(world) as c:
        with pytest.raises(openai.NotFoundError) as caught:
            await c.responses.create(model="testbot", previous_response_id=other.id, input="hi")
        assert caught.value.code == "previous_response_not_found"
        with pytest.raises(openai.NotFoundError):
            await c.responses.create(model="testbot", previous_response_id="resp_" + "0" * 32, input="hi")
        with pytest.raises(openai.BadRequestError):
            await c.responses.create(model="testbot", previous_response_id="run_x", input="hi")
    assert len(world.runs()) == 0


async def test_failed_run_as_response_is_a_failed_response(world: World) -> None:
    async with client(world) as c:
        resp = await c.responses.create(model="testbot", input="fail")
    assert resp.status == "failed" and resp.error.code == "boom" and "the runner broke" in resp.error.message
    assert len(world.runs()) == 1


# ---- models ----


async def test_models_list_the_bots_the_key_may_use(world: World) -> None:
    async with client(world) as c:
        assert [m.id async for m in c.models.list()] == ["testbot"]
        assert (await c.models.retrieve("testbot")).id == "testbot"
        with pytest.raises(openai.NotFoundError):
            await c.models.retrieve("otherbot")
    async with client(world, world.admin) as c:
        assert sorted([m.id async for m in c.models.list()]) == ["otherbot", "testbot"]


# ---- errors ----


async def test_missing_and_bad_keys_are_401(world: World) -> None:
    async with httpx.AsyncClient(base_url=world.base_url, timeout=10) as http:
        r = await http.get("/models")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = await http.post("/chat/completions", json={"model": "testbot", "messages": history("hi")})
        assert r.status_code == 401
        r = await http.get("/models", headers={"Authorization": "Basic dXNlcjpwYXNz"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    async with client(world, "cred_not-a-real-key") as c:
        with pytest.raises(openai.AuthenticationError):
            await c.chat.completions.create(model="testbot", messages=history("hi"))
    async with client(world) as c:
        assert [m.id async for m in c.models.list()] == ["testbot"]
        await world.harness.client.call("RevokeCredential", hpb.RevokeCredentialRequest(name="app"))
        with pytest.raises(openai.AuthenticationError):  # revoked: refused at the next request
            await c.chat.completions.create(model="testbot", messages=history("hi"))
    assert world.runs() == []


async def test_unknown_routes_and_methods_answer_in_openai_shape(world: World) -> None:
    async with httpx.AsyncClient(base_url=world.base_url, timeout=10) as http:
        r = await http.get("/embeddings")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        r = await http.get("/chat/completions", headers={"Authorization": f"Bearer {world.key}"})
        assert r.status_code == 405 and r.json()["error"]["message"]


async def test_other_and_unknown_bots_are_the_same_404(world: World) -> None:
    async with client(world) as c:
        for model in ("otherbot", "nosuchbot"):
            with pytest.raises(openai.NotFoundError) as caught:
                await c.chat.completions.create(model=model, messages=history("hi"))
            assert caught.value.code == "model_not_found" and "does not exist or you do not have access" in str(
                caught.value
            )
            with pytest.raises(openai.NotFoundError):
                await c.responses.create(model=model, input="hi")
    assert world.runs("otherbot") == [] and world.runs() == []


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode(), "model"),
        (json.dumps({"model": "testbot"}).encode(), "messages"),
        (json.dumps({"model": "testbot", "messages": [{"role": "assistant", "content": "hi"}]}).encode(), "messages.0"),
        (
            json.dumps({"model": "testbot", "messages": [{"role": "user", "content": "  "}]}).encode(),
            "messages.0.content",
        ),
        (
            json.dumps(
                {
                    "model": "testbot",
                    "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
                }
            ).encode(),
            "messages.0.content.0",
        ),
        (json.dumps({"model": "testbot", "messages": history("hi"), "stream": "yes"}).encode(), "stream"),
        (json.dumps({"model": "testbot", "messages": history("hi"), "n": 2}).encode(), "n"),
        # Dense enough for the gateway's parser process (GATEWAY_LOOP_PARSE_VALUES): it starts one.
        pytest.param(b"[" * 100_000, None, marks=pytest.mark.e2e),
    ],
)
async def test_malformed_requests_are_400(world: World, body: bytes, param: str | None) -> None:
    headers = {"Authorization": f"Bearer {world.key}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=world.base_url, timeout=10) as http:
        r = await http.post("/chat/completions", content=body, headers=headers)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]
    assert world.runs() == []


@pytest.mark.e2e
async def test_oversize_body_and_message_are_413(world: World) -> None:
    headers = {"Authorization": f"Bearer {world.key}"}
    big = {"model": "testbot", "messages": [{"role": "user", "content": "x" * (gateway_app.MAX_BODY_BYTES + 1)}]}
    async with httpx.AsyncClient(base_url=world.base_url, timeout=10) as http:
        r = await http.post("/chat/completions", json=big, headers=headers)
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    # Declared too large: refused from the header, before a byte of the body is read.
    host, port = parse_address(world.host.gateway.address)
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {world.key}\r\nContent-Length: {10**9}\r\n\r\n".encode()
    )
    status = await asyncio.wait_for(reader.readline(), 10)
    writer.close()
    assert status.split()[1] == b"413"
    async with client(world) as c:
        with pytest.raises(openai.APIStatusError) as caught:
            await c.chat.completions.create(model="testbot", messages=history("y" * (300 * 1024)))
        assert caught.value.status_code == 413 and caught.value.code == "message_too_large"
    assert world.runs() == []


async def test_a_request_repeated_with_its_idempotency_key_gets_the_first_requests_run(world: World) -> None:
    """A client that lost an answer (a failover, a dropped connection) sends the request again with the same
    Idempotency-Key: it gets the first request's run and answer, streamed or not, on either endpoint; the runner
    ran once. Keys are per bot and sender: another key holder's same key is its own message."""
    key = {"Idempotency-Key": "order-42"}
    async with client(world) as c:
        first = await c.chat.completions.with_raw_response.create(
            model="testbot", messages=history("hello"), extra_headers=key
        )
        again = await c.chat.completions.with_raw_response.create(
            model="testbot", messages=history("hello"), extra_headers=key
        )
        stream = await c.chat.completions.create(
            model="testbot", messages=history("hello"), stream=True, extra_headers=key
        )
        streamed = "".join([ch.choices[0].delta.content or "" async for ch in stream if ch.choices])
        response = await c.responses.with_raw_response.create(model="testbot", input="hello", extra_headers=key)
    run_id = first.headers["x-agenthost-run"]
    assert again.headers["x-agenthost-run"] == run_id and response.headers["x-agenthost-run"] == run_id
    assert again.parse().choices[0].message.content == REPLY and streamed == REPLY
    assert response.parse().output_text == REPLY
    assert [t for _, t, _ in Talker.seen] == ["hello"]
    created = await world.harness.client.call(
        "CreateCredential", hpb.CreateCredentialRequest(name="app2", scope="send", bots=["testbot"])
    )
    async with client(world, created.token) as c:
        theirs = await c.chat.completions.with_raw_response.create(
            model="testbot", messages=history("hello"), extra_headers=key
        )
    assert theirs.headers["x-agenthost-run"] != run_id and len(world.runs()) == 2


@pytest.mark.parametrize("value", [b"has space", b"x" * 129, "caf\u00e9".encode(), b"tab\tin", b""])
async def test_a_malformed_idempotency_key_is_400_and_nothing_is_recorded(world: World, value: bytes) -> None:
    headers = {"Authorization": f"Bearer {world.key}".encode(), b"Idempotency-Key": value}
    async with httpx.AsyncClient(base_url=world.base_url, timeout=10) as http:
        r = await http.post("/chat/completions", json={"model": "testbot", "messages": history("hi")}, headers=headers)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_idempotency_key", r.text
    assert "1-128 printable ASCII" in r.json()["error"]["message"]
    assert world.runs() == []


async def test_resource_exhausted_refusal_is_429_and_retried_by_the_client(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    refusals = 0
    real_send = world.host.runs.send

    async def refusing(request: hpb.SendMessageRequest, **options: Any) -> Any:
        nonlocal refusals
        if refusals == 0:
            refusals += 1
            # As the host's admission queue refuses past its bound: with a hint of when to come back.
            raise errors.ResourceExhausted(
                "RUNS_MAX_QUEUED = 8192 runs are queued; retry in 2500 ms", retry_after_ms=2500
            )
        async for reply in real_send(request, **options):
            yield reply

    monkeypatch.setattr(world.host.runs, "send", refusing)
    async with client(world) as c:
        with pytest.raises(openai.RateLimitError) as caught:
            await c.chat.completions.create(model="testbot", messages=history("hi"))
        assert caught.value.response.headers["retry-after"] == "3"  # 2500 ms, in whole seconds up
    assert world.runs() == []
    # Nothing was started, so the client's own retry is safe: it gets the one run.
    async with client(world, max_retries=2) as c:
        await c.chat.completions.create(model="testbot", messages=history("hi"))
    assert refusals == 1 and len(world.runs()) == 1


async def test_a_bot_with_no_binding_is_503_without_retry(world: World) -> None:
    await world.harness.client.call("CreateBot", hpb.CreateBotRequest(name="unbound"))
    async with client(world, world.admin, max_retries=2) as c:
        with pytest.raises(openai.InternalServerError) as caught:
            await c.chat.completions.create(model="unbound", messages=history("hi"))
    assert caught.value.status_code == 503 and caught.value.response.headers["x-should-retry"] == "false"


async def test_a_failed_run_is_502_and_never_started_twice(world: World) -> None:
    # The client would retry a plain 5xx; the gateway says not to, because the message was accepted and recorded.
    async with client(world, max_retries=3) as c:
        with pytest.raises(openai.InternalServerError) as caught:
            await c.chat.completions.create(model="testbot", messages=history("fail"))
        assert caught.value.status_code == 502 and caught.value.code == "boom"
        parts: list[str | None] = []
        with pytest.raises(openai.APIError) as streamed:
            stream = await c.chat.completions.create(model="testbot", messages=history("fail"), stream=True)
            async for chunk in stream:
                parts.append(chunk.choices[0].delta.content)
        assert parts == ["", "partial"]  # what streamed before the failure, then the error event
        assert streamed.value.body["code"] == "boom"
    runs = world.runs()
    assert len(runs) == 2 and {r.status for r in runs} == {"failed"}
    assert len(Talker.seen) == 2


# ---- the run outlives its client ----


async def test_disconnect_mid_stream_does_not_cancel_the_run(world: World) -> None:
    headers = {"Authorization": f"Bearer {world.key}"}
    body = {"model": "testbot", "messages": history("hold"), "stream": True}
    async with httpx.AsyncClient(base_url=world.base_url, timeout=10) as http:
        async with http.stream("POST", "/chat/completions", json=body, headers=headers) as r:
            assert r.status_code == 200
            run_id = r.headers["x-agenthost-run"]
            async for line in r.aiter_lines():
                if DELTAS[0] in line:
                    break  # the first delta arrived; the runner is now parked
    # The connection is closed; the run is still going.
    await asyncio.wait_for(Talker.holding.wait(), 10)
    assert world.host.run_store.get(run_id).status == "running"
    Talker.release.set()
    info = await world.wait_finished(run_id)
    assert info.status == "completed" and info.text == REPLY and info.usage.input_tokens == USAGE["input_tokens"]
    assert len(world.runs()) == 1


async def test_host_stop_ends_open_streams_with_the_runs_outcome(world: World) -> None:
    async with client(world) as c:
        stream = await c.chat.completions.create(model="testbot", messages=history("hold"), stream=True)
        await asyncio.wait_for(Talker.holding.wait(), 10)
        stopping = asyncio.create_task(world.host.stop())
        with pytest.raises(openai.APIError) as caught:
            async for _ in stream:
                pass
        await asyncio.wait_for(stopping, 30)
    # The stream ended with the run's recorded outcome, written before the database closed.
    assert caught.value.body["code"] == "host_shutdown"
    assert f"run {stream.response.headers['x-agenthost-run']} interrupted" in caught.value.body["message"]


async def test_a_reader_that_stops_reading_does_not_hold_the_run(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "INBOX_MAX_BYTES", 256 * 1024)
    host, port = parse_address(world.host.gateway.address)
    reader, writer = await asyncio.open_connection(host, port)
    body = json.dumps({"model": "testbot", "messages": history("flood 4000"), "stream": True}).encode()
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {world.key}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")  # then never read again: 16 MiB of deltas pile up
    run_id = next(
        line.split(b":", 1)[1].strip().decode()
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"x-agenthost-run:")
    )
    info = await world.wait_finished(run_id, timeout=30)
    assert info.status == "completed"
    deltas, after = 0, 0
    while True:  # every delta is recorded, whoever read them
        page, more = world.host.run_store.events(run_id, after, 5000)
        deltas += sum(e.WhichOneof("kind") == "text_delta" for e in page)
        after = page[-1].seq
        if not more:
            break
    assert deltas == 4000
    # Reading again: what was buffered (bounded), then the error that says this client was dropped, then the end.
    received = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    assert b"client_too_slow" in received and b"[DONE]" not in received
    assert len(received) < 4000 * 4096 // 2


# ---- wiring ----


@pytest.mark.e2e
def test_the_gateway_is_not_imported_unless_enabled() -> None:
    code = "import sys, agenthost.host.server, agenthost.host.cli.main; sys.exit('aiohttp' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_addresses_default_to_loopback() -> None:
    assert parse_address(":8080") == ("127.0.0.1", 8080)
    assert parse_address("8080") == ("127.0.0.1", 8080)
    assert parse_address("[::1]:0") == ("::1", 0)
    assert parse_address("0.0.0.0:80") == ("0.0.0.0", 80)
    with pytest.raises(ValueError):
        parse_address("localhost:http")


def test_serve_flag() -> None:
    from agenthost.host.cli.main import build_parser

    assert build_parser().parse_args(["serve", "--gateway", "127.0.0.1:8080"]).gateway == "127.0.0.1:8080"
    assert build_parser().parse_args(["serve"]).gateway is None


async def test_a_queued_run_is_an_sse_comment_the_openai_client_skips(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26: a request that must wait for a slot hears so at once, on the stream it opened: `queued` (its place)
    and then `run_started` as SSE comment lines, which the OpenAI wire format has no field for and which the
    `openai` client library skips: its chunks and events are exactly those of a run that never waited."""
    monkeypatch.setattr(limits, "RUNS_MAX_ACTIVE", 1)
    headers = {"Authorization": f"Bearer {world.key}"}
    hold = {"model": "testbot", "messages": history("hold"), "stream": True, "user": "holder"}
    body = {"model": "testbot", "messages": history("hello"), "stream": True, "user": "waiter"}
    async with httpx.AsyncClient(base_url=world.base_url, timeout=20) as http, client(world) as c:
        async with http.stream("POST", "/chat/completions", json=hold, headers=headers) as held:
            await asyncio.wait_for(Talker.holding.wait(), 10)  # the only slot is taken
            async with http.stream("POST", "/chat/completions", json=body, headers=headers) as r:
                lines = r.aiter_lines()
                async for line in lines:  # before any slot frees: the run is still held
                    if line.startswith(":"):
                        break
                run_id = r.headers["x-agenthost-run"]
                # Its place in the host's line would count other senders' runs: not a key's to learn.
                assert line == f": agenthost queued run={run_id} waiting_on=host"
                # The official client, queued behind both: chat completions and the Responses API.
                chat = await c.chat.completions.create(
                    model="testbot", messages=history("hi"), stream=True, user="third"
                )
                responses = await c.responses.create(model="testbot", input="hey", stream=True, user="fourth")
                Talker.release.set()
                rest = [line async for line in lines]
            assert f": agenthost run_started run={run_id}" in rest
            assert rest[-2:] == ["data: [DONE]", ""]
            await held.aread()
        chunks = [chunk async for chunk in chat]
        events = [event async for event in responses]
    content = [ch.choices[0].delta.content for ch in chunks if ch.choices and ch.choices[0].delta.content]
    assert content == list(DELTAS) and chunks[0].choices[0].delta.role == "assistant"
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["stop"]
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == REPLY
    assert sorted(r.status for r in world.runs()) == ["completed"] * 4
