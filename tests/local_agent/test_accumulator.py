"""Property: however a server slices and labels streamed tool-call deltas, the calls come back whole."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agenthost.runners.local_agent.providers.openai import ToolCallAccumulator

args_strategy = st.dictionaries(
    st.text("abcdefgh_", min_size=1, max_size=6),
    st.one_of(st.integers(-1000, 1000), st.text(max_size=12), st.booleans(), st.lists(st.integers(0, 9), max_size=3)),
    max_size=4,
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    calls=st.lists(st.tuples(st.sampled_from(["read_file", "grep", "shell"]), args_strategy), min_size=1, max_size=3),
    style=st.sampled_from(["openai", "ollama_index_zero", "no_index", "name_every_chunk"]),
    data=st.data(),
)
def test_any_slicing_reassembles_the_calls(calls: list[tuple[str, dict]], style: str, data: st.DataObject) -> None:
    acc = ToolCallAccumulator()
    for n, (name, args) in enumerate(calls):
        raw = json.dumps(args)
        cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=5)))
        pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
        pieces = [p for p in pieces if p] or [""]
        for k, piece in enumerate(pieces):
            delta: dict = {"function": {"arguments": piece}}
            if style in ("openai", "name_every_chunk"):
                delta["index"] = n
            elif style == "ollama_index_zero":
                delta["index"] = 0  # every parallel call on index 0; only the new id tells them apart
            if k == 0:
                delta["id"] = f"id{n}"  # no_index: a new id alone must open a new call
                delta["type"] = "function"
                delta["function"]["name"] = name
            elif style == "name_every_chunk":
                delta["function"]["name"] = name
            acc.add(delta)
    got = acc.calls()
    assert [(c.id, c.name, json.loads(c.arguments)) for c in got] == [
        (f"id{n}", name, args) for n, (name, args) in enumerate(calls)
    ]


@settings(max_examples=100, deadline=None)
@given(cuts=st.lists(st.integers(1, 2000), max_size=12), crlf=st.booleans())
def test_sse_framing_survives_any_byte_boundaries(cuts: list[int], crlf: bool) -> None:
    import asyncio

    import httpx

    from agenthost.runners.local_agent.messages import UserMessage
    from agenthost.runners.local_agent.providers.base import ModelRequest
    from agenthost.runners.local_agent.providers.openai import OpenAICompatProvider

    from .test_openai_provider import LLAMACPP_RAW

    raw = LLAMACPP_RAW if crlf else LLAMACPP_RAW.replace(b"\r\n", b"\n")
    bounds = sorted({c % len(raw) for c in cuts} | {0, len(raw)})

    async def body():  # type: ignore[no-untyped-def]
        for a, b in zip(bounds, bounds[1:], strict=False):
            yield raw[a:b]

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body())

    async def go() -> None:
        p = OpenAICompatProvider(
            "llamacpp",
            "m",
            base_url="http://fake/v1",
            api_key=None,
            timeout=5,
            flavor="llamacpp",
            transport=httpx.MockTransport(handler),
        )
        final = await p.complete(ModelRequest("s", [UserMessage("x")]))
        await p.aclose()
        (c,) = final.message.tool_calls
        assert json.loads(c.arguments) == {"path": "x.md"} and final.message.reasoning == "Need the file."

    asyncio.run(go())
