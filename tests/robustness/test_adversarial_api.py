"""Every way into AgentRunAPIProxy a hostile or buggy caller might try, with raw stubs against a real host.

Each attempt must get its documented status, leave an audit row, and change no data (the data tables' digest is
the same before and after); the host keeps serving afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from agenthost.protos import common_pb2 as pb
from agenthost.protos import run_api_pb2 as api
from agenthost.protos import run_api_pb2_grpc

from .conftest import SC, World, db_digest, status_of

pytestmark = pytest.mark.timeout(120)

TRAVERSAL = [
    "../x",
    "../../../../etc/passwd",
    "/etc/passwd",
    "..\\..\\x",
    "a/../../x",
    "./.",
    "..",
    "\x00",
    "a\x00b",
    "%2e%2e%2f",
    "~/.ssh/id_rsa",
    "file:///etc/passwd",
    "C:\\Windows\\system32",
    "\u202e",
    "a" * 5000,
    " ",
]


def requests(w: World, run_id: str) -> dict[str, Callable[[tuple], Any]]:
    """One valid call per method for `run_id`, as callables taking metadata."""
    s = w.stub

    def upload(md: tuple) -> Any:
        def parts() -> Iterator[api.ArtifactUpload]:
            yield api.ArtifactUpload(header=api.ArtifactHeader(run_id=run_id, name="n.txt"))
            yield api.ArtifactUpload(data=b"payload")

        return s.ArtifactCreate(parts(), metadata=md, timeout=10)

    art = w.art1.artifact_id
    return {
        "HistoryPage": lambda md: s.HistoryPage(api.HistoryPageRequest(run_id=run_id), metadata=md, timeout=10),
        "HistorySearch": lambda md: s.HistorySearch(
            api.HistorySearchRequest(run_id=run_id, query="hello"), metadata=md, timeout=10
        ),
        "EventGet": lambda md: s.EventGet(
            api.EventGetRequest(run_id=run_id, event_id=w.r1.context.event.event_id), metadata=md, timeout=10
        ),
        "EventPage": lambda md: s.EventPage(api.EventPageRequest(run_id=run_id), metadata=md, timeout=10),
        "ArtifactMetadata": lambda md: s.ArtifactMetadata(
            api.ArtifactMetadataRequest(run_id=run_id, artifact_id=art), metadata=md, timeout=10
        ),
        "ArtifactReadRange": lambda md: s.ArtifactReadRange(
            api.ArtifactReadRangeRequest(run_id=run_id, artifact_id=art), metadata=md, timeout=10
        ),
        "ArtifactRead": lambda md: s.ArtifactRead(
            api.ArtifactReadRequest(run_id=run_id, artifact_id=art), metadata=md, timeout=10
        ),
        "ArtifactCreate": upload,
        "StateGet": lambda md: s.StateGet(
            api.StateGetRequest(run_id=run_id, scope=pb.CONVERSATION, key="k"), metadata=md, timeout=10
        ),
        "StateSet": lambda md: s.StateSet(
            api.StateSetRequest(run_id=run_id, scope=pb.CONVERSATION, key="k", value_json='"changed"'),
            metadata=md,
            timeout=10,
        ),
        "StateDelete": lambda md: s.StateDelete(
            api.StateDeleteRequest(run_id=run_id, scope=pb.CONVERSATION, key="k"), metadata=md, timeout=10
        ),
        "StateList": lambda md: s.StateList(
            api.StateListRequest(run_id=run_id, scope=pb.CONVERSATION), metadata=md, timeout=10
        ),
    }


def refused(
    w: World,
    attempts: list[tuple[str, Callable[[], Any], SC]],
    *,
    serving: bool = True,
    unaudited: tuple[str, ...] = (),
) -> None:
    """Runs each attempt, checks its status, then that the audit log has one matching row per attempt (except
    those gRPC refuses before any handler runs, such as an oversize message) and no data table changed."""
    before = db_digest(w.db_path)
    audit_before = len(w.flush_audit())
    wrong = []
    for label, call, expected in attempts:
        got = status_of(call)
        if got != expected:
            wrong.append(f"{label}: expected {expected.name}, got {got.name}")
    assert not wrong, "\n".join(wrong)
    rows = w.flush_audit()[audit_before:]
    assert sorted(r["outcome"] for r in rows) == sorted(e.name for label, _, e in attempts if label not in unaudited)
    assert db_digest(w.db_path) == before, "a refused call changed data"
    if serving:
        assert w.host_serving()


METHODS = [
    "HistoryPage",
    "HistorySearch",
    "EventGet",
    "EventPage",
    "ArtifactMetadata",
    "ArtifactReadRange",
    "ArtifactRead",
    "ArtifactCreate",
    "StateGet",
    "StateSet",
    "StateDelete",
    "StateList",
]


def test_credentials_on_every_method(world: World) -> None:
    w = world
    r0, r1, r2 = w.r0, w.r1, w.r2
    attempts = []
    for method in METHODS:
        mine = requests(w, r1.run_id)[method]
        on_r2 = requests(w, r2.run_id)[method]
        attempts += [
            (f"{method} no token", lambda c=mine: c(w.md(r1, token="")), SC.UNAUTHENTICATED),
            (f"{method} no credentials", lambda c=mine: c(()), SC.UNAUTHENTICATED),
            (f"{method} forged", lambda c=mine: c(w.md(r1, token="rt_" + "A" * 43)), SC.UNAUTHENTICATED),
            (
                f"{method} not bearer",
                lambda c=mine: c((("authorization", r1.api.run_token), ("x-agenthost-plugin", r1.api.plugin_secret))),
                SC.UNAUTHENTICATED,
            ),
            (f"{method} secret as token", lambda c=mine: c(w.md(r1, token=r1.api.plugin_secret)), SC.UNAUTHENTICATED),
            (
                f"{method} replayed token of ended run",
                lambda m=method: requests(w, r0.run_id)[m](w.md(r0)),
                SC.UNAUTHENTICATED,
            ),
            (f"{method} r0 token on r1", lambda c=mine: c(w.md(r1, token=r0.api.run_token)), SC.UNAUTHENTICATED),
            (f"{method} other run's token", lambda c=on_r2: c(w.md(r1)), SC.PERMISSION_DENIED),
            (f"{method} unknown run", lambda m=method: requests(w, "run_" + "0" * 32)[m](w.md(r1)), SC.NOT_FOUND),
            (f"{method} empty run id", lambda m=method: requests(w, "")[m](w.md(r1)), SC.INVALID_ARGUMENT),
            (f"{method} no plugin secret", lambda c=mine: c(w.md(r1, secret="")), SC.PERMISSION_DENIED),
            (f"{method} other runner's secret", lambda c=mine: c(w.md(r1, secret="ps_other")), SC.PERMISSION_DENIED),
        ]
    refused(w, attempts)


def test_expired_and_finished_runs(world: World) -> None:
    w = world
    active = w.h.host.grants.get(w.r1.run_id)
    calls = requests(w, w.r1.run_id)
    try:
        active.deadline_at = time.time() - 1
        refused(
            w,
            [(f"{m} expired", lambda c=calls[m]: c(w.md(w.r1)), SC.FAILED_PRECONDITION) for m in METHODS],
            serving=False,
        )
        active.deadline_at = time.time() + 600
        active.finished = True  # terminal event seen, token not yet revoked
        refused(
            w,
            [(f"{m} finished", lambda c=calls[m]: c(w.md(w.r1)), SC.FAILED_PRECONDITION) for m in METHODS],
            serving=False,
        )
    finally:
        active.finished = False
        active.deadline_at = time.time() + 600


def test_other_conversations_ids_cursors_and_artifacts(world: World) -> None:
    w = world
    s, m1, rid = w.stub, w.md(w.r1), w.r1.run_id
    other_hist = s.HistoryPage(api.HistoryPageRequest(run_id=w.r2.run_id, limit=1), metadata=w.md(w.r2)).items[0].cursor
    other_ev = s.EventPage(api.EventPageRequest(run_id=w.r2.run_id, limit=1), metadata=w.md(w.r2)).events[0].cursor
    my_ev = s.EventPage(api.EventPageRequest(run_id=rid, limit=1), metadata=m1).events[0].cursor
    art2 = w.art2.artifact_id
    refused(
        w,
        [
            (
                "history of c2",
                lambda: s.HistoryPage(api.HistoryPageRequest(run_id=rid, conversation_id="c2"), metadata=m1),
                SC.PERMISSION_DENIED,
            ),
            (
                "search c2",
                lambda: s.HistorySearch(
                    api.HistorySearchRequest(run_id=rid, conversation_id="c2", query="hello"), metadata=m1
                ),
                SC.PERMISSION_DENIED,
            ),
            (
                "events of c2",
                lambda: s.EventPage(api.EventPageRequest(run_id=rid, conversation_id="c2"), metadata=m1),
                SC.PERMISSION_DENIED,
            ),
            (
                "event of c2",
                lambda: s.EventGet(api.EventGetRequest(run_id=rid, event_id=w.r2.context.event.event_id), metadata=m1),
                SC.PERMISSION_DENIED,
            ),
            (
                "c2 history cursor",
                lambda: s.HistoryPage(api.HistoryPageRequest(run_id=rid, cursor=other_hist), metadata=m1),
                SC.INVALID_ARGUMENT,
            ),
            (
                "c2 event cursor",
                lambda: s.EventPage(api.EventPageRequest(run_id=rid, cursor=other_ev), metadata=m1),
                SC.INVALID_ARGUMENT,
            ),
            (
                "event cursor as history cursor",
                lambda: s.HistoryPage(api.HistoryPageRequest(run_id=rid, cursor=my_ev), metadata=m1),
                SC.INVALID_ARGUMENT,
            ),
            (
                "tampered cursor",
                lambda: s.HistoryPage(api.HistoryPageRequest(run_id=rid, cursor=my_ev[:-2] + "AA"), metadata=m1),
                SC.INVALID_ARGUMENT,
            ),
            (
                "c2 artifact metadata",
                lambda: s.ArtifactMetadata(api.ArtifactMetadataRequest(run_id=rid, artifact_id=art2), metadata=m1),
                SC.PERMISSION_DENIED,
            ),
            (
                "c2 artifact range",
                lambda: s.ArtifactReadRange(api.ArtifactReadRangeRequest(run_id=rid, artifact_id=art2), metadata=m1),
                SC.PERMISSION_DENIED,
            ),
            (
                "c2 artifact stream",
                lambda: s.ArtifactRead(api.ArtifactReadRequest(run_id=rid, artifact_id=art2), metadata=m1),
                SC.PERMISSION_DENIED,
            ),
            (
                "unknown artifact",
                lambda: s.ArtifactMetadata(
                    api.ArtifactMetadataRequest(run_id=rid, artifact_id="art_" + "f" * 32), metadata=m1
                ),
                SC.NOT_FOUND,
            ),
            (
                "unknown event",
                lambda: s.EventGet(api.EventGetRequest(run_id=rid, event_id="ev_nope"), metadata=m1),
                SC.NOT_FOUND,
            ),
        ],
    )
    # and the same reads of c1 through r2 are refused the same way (symmetry)
    assert (
        status_of(
            lambda: s.ArtifactMetadata(
                api.ArtifactMetadataRequest(run_id=w.r2.run_id, artifact_id=w.art1.artifact_id), metadata=w.md(w.r2)
            )
        )
        == SC.PERMISSION_DENIED
    )


def test_path_traversal_in_every_string_field(world: World) -> None:
    w = world
    s, m1, rid = w.stub, w.md(w.r1), w.r1.run_id
    attempts = []
    for bad in TRAVERSAL:
        long = len(bad) > 512
        attempts += [
            (
                f"conversation {bad!r}",
                lambda b=bad: s.HistoryPage(api.HistoryPageRequest(run_id=rid, conversation_id=b), metadata=m1),
                SC.INVALID_ARGUMENT if long else SC.PERMISSION_DENIED,
            ),
            (
                f"cursor {bad!r}",
                lambda b=bad: s.HistoryPage(api.HistoryPageRequest(run_id=rid, cursor=b), metadata=m1),
                SC.INVALID_ARGUMENT,
            ),
            (
                f"event cursor {bad!r}",
                lambda b=bad: s.EventPage(api.EventPageRequest(run_id=rid, cursor=b), metadata=m1),
                SC.INVALID_ARGUMENT,
            ),
            (
                f"event id {bad!r}",
                lambda b=bad: s.EventGet(api.EventGetRequest(run_id=rid, event_id=b), metadata=m1),
                SC.INVALID_ARGUMENT if len(bad) > 128 else SC.NOT_FOUND,
            ),
            (
                f"artifact id {bad!r}",
                lambda b=bad: s.ArtifactReadRange(api.ArtifactReadRangeRequest(run_id=rid, artifact_id=b), metadata=m1),
                SC.INVALID_ARGUMENT if len(bad) > 128 else SC.NOT_FOUND,
            ),
            (
                f"artifact stream id {bad!r}",
                lambda b=bad: s.ArtifactRead(api.ArtifactReadRequest(run_id=rid, artifact_id=b), metadata=m1),
                SC.INVALID_ARGUMENT if len(bad) > 128 else SC.NOT_FOUND,
            ),
            (
                f"run id {bad!r}",
                lambda b=bad: s.StateGet(api.StateGetRequest(run_id=b, scope=pb.CONVERSATION, key="k"), metadata=m1),
                SC.INVALID_ARGUMENT if not bad else SC.NOT_FOUND,
            ),
        ]
        if bad.strip() != bad or "\x00" in bad or "\\" in bad or "%" in bad or "~" in bad or "\u202e" in bad or long:
            attempts.append(
                (
                    f"state key {bad!r}",
                    lambda b=bad: s.StateSet(
                        api.StateSetRequest(run_id=rid, scope=pb.CONVERSATION, key=b, value_json="1"), metadata=m1
                    ),
                    SC.INVALID_ARGUMENT,
                )
            )
    refused(w, attempts)


def test_traversal_names_are_only_metadata(world: World) -> None:
    """Artifact names and state keys that look like paths never become paths: the store writes only
    objects/<sha[:2]>/<sha> under its root, whatever the name."""
    w = world
    root = w.h.host.data_dir / "artifacts"
    before = {p for p in w.h.host.data_dir.parent.rglob("*")}
    for bad in TRAVERSAL[:8]:
        name = bad.replace("\x00", "")

        def parts(n: str = name) -> Iterator[api.ArtifactUpload]:
            yield api.ArtifactUpload(header=api.ArtifactHeader(run_id=w.r1.run_id, name=n, mime_type="text/plain"))
            yield api.ArtifactUpload(data=f"content {n}".encode())

        ref = w.stub.ArtifactCreate(parts(), metadata=w.md(w.r1), timeout=10)
        assert ref.name == name and ref.artifact_id.startswith("art_")
    nul = status_of(
        lambda: w.stub.ArtifactCreate(
            iter([api.ArtifactUpload(header=api.ArtifactHeader(run_id=w.r1.run_id, name="a\x00b"))]),
            metadata=w.md(w.r1),
        )
    )
    assert nul == SC.INVALID_ARGUMENT
    created = {p for p in w.h.host.data_dir.parent.rglob("*")} - before
    for path in created:
        rel = path.relative_to(root)  # raises if anything was written outside the artifact root
        assert rel.parts[0] == "objects" and (len(rel.parts) < 3 or len(rel.parts[2]) == 64), rel
    assert not list((root / "tmp").iterdir())


def test_sizes_enums_and_state_abuse(world: World) -> None:
    w = world
    s, m1, rid = w.stub, w.md(w.r1), w.r1.run_id
    art = w.art1.artifact_id
    big = 2**31 - 1
    i64 = 2**63 - 1
    cases = [
        (
            "page limit 2^31",
            lambda: s.HistoryPage(api.HistoryPageRequest(run_id=rid, limit=big), metadata=m1),
            SC.OUT_OF_RANGE,
        ),
        (
            "page limit -1",
            lambda: s.HistoryPage(api.HistoryPageRequest(run_id=rid, limit=-1), metadata=m1),
            SC.OUT_OF_RANGE,
        ),
        (
            "event limit 101",
            lambda: s.EventPage(api.EventPageRequest(run_id=rid, limit=101), metadata=m1),
            SC.OUT_OF_RANGE,
        ),
        (
            "top_k huge",
            lambda: s.HistorySearch(api.HistorySearchRequest(run_id=rid, query="x", top_k=big), metadata=m1),
            SC.OUT_OF_RANGE,
        ),
        (
            "state list limit",
            lambda: s.StateList(api.StateListRequest(run_id=rid, scope=pb.CONVERSATION, limit=big), metadata=m1),
            SC.OUT_OF_RANGE,
        ),
        (
            "range length int64",
            lambda: s.ArtifactReadRange(
                api.ArtifactReadRangeRequest(run_id=rid, artifact_id=art, length=i64), metadata=m1
            ),
            SC.OUT_OF_RANGE,
        ),
        (
            "range offset int64",
            lambda: s.ArtifactReadRange(
                api.ArtifactReadRangeRequest(run_id=rid, artifact_id=art, offset=i64), metadata=m1
            ),
            SC.OUT_OF_RANGE,
        ),
        (
            "range offset negative",
            lambda: s.ArtifactReadRange(
                api.ArtifactReadRangeRequest(run_id=rid, artifact_id=art, offset=-1), metadata=m1
            ),
            SC.OUT_OF_RANGE,
        ),
        (
            "stream offset negative",
            lambda: s.ArtifactRead(api.ArtifactReadRequest(run_id=rid, artifact_id=art, offset=-(2**63)), metadata=m1),
            SC.OUT_OF_RANGE,
        ),
        (
            "direction 7",
            lambda: s.HistoryPage(api.HistoryPageRequest(run_id=rid, direction=7), metadata=m1),
            SC.INVALID_ARGUMENT,
        ),
        (
            "direction -1",
            lambda: s.EventPage(api.EventPageRequest(run_id=rid, direction=-1), metadata=m1),
            SC.INVALID_ARGUMENT,
        ),
        (
            "scope 99",
            lambda: s.StateGet(api.StateGetRequest(run_id=rid, scope=99, key="k"), metadata=m1),
            SC.INVALID_ARGUMENT,
        ),
        (
            "scope unspecified",
            lambda: s.StateSet(api.StateSetRequest(run_id=rid, scope=0, key="k", value_json="1"), metadata=m1),
            SC.INVALID_ARGUMENT,
        ),
        (
            "scope negative",
            lambda: s.StateList(api.StateListRequest(run_id=rid, scope=-5), metadata=m1),
            SC.INVALID_ARGUMENT,
        ),
        (
            "query 1001 chars",
            lambda: s.HistorySearch(api.HistorySearchRequest(run_id=rid, query="x" * 1001), metadata=m1),
            SC.INVALID_ARGUMENT,
        ),
        (
            "17 role filters",
            lambda: s.HistorySearch(api.HistorySearchRequest(run_id=rid, query="x", roles=["user"] * 17), metadata=m1),
            SC.INVALID_ARGUMENT,
        ),
        (
            "17 event types",
            lambda: s.EventPage(api.EventPageRequest(run_id=rid, event_types=["a"] * 17), metadata=m1),
            SC.INVALID_ARGUMENT,
        ),
        (
            "list prefix 257",
            lambda: s.StateList(api.StateListRequest(run_id=rid, scope=pb.CONVERSATION, prefix="p" * 257), metadata=m1),
            SC.INVALID_ARGUMENT,
        ),
        (
            "oversize message",
            lambda: s.HistorySearch(api.HistorySearchRequest(run_id=rid, query="x" * (9 * 1024 * 1024)), metadata=m1),
            SC.RESOURCE_EXHAUSTED,
        ),
    ]
    for key in ("", " k", "k ", "a\nb", "k" * 257, "ключ", "a;DROP TABLE state", "\u0000", "k\t"):
        cases.append(
            (
                f"key {key[:20]!r}",
                lambda k=key: s.StateSet(
                    api.StateSetRequest(run_id=rid, scope=pb.CONVERSATION, key=k, value_json="1"), metadata=m1
                ),
                SC.INVALID_ARGUMENT,
            )
        )
        cases.append(
            (
                f"delete key {key[:20]!r}",
                lambda k=key: s.StateDelete(
                    api.StateDeleteRequest(run_id=rid, scope=pb.CONVERSATION, key=k), metadata=m1
                ),
                SC.INVALID_ARGUMENT,
            )
        )
    for value, code in (
        ("", SC.INVALID_ARGUMENT),
        ("{nope", SC.INVALID_ARGUMENT),
        ("NaN", SC.INVALID_ARGUMENT),
        ("[Infinity]", SC.INVALID_ARGUMENT),
        ("[" * 100_000 + "]" * 100_000, SC.INVALID_ARGUMENT),
        ('"' + "x" * (256 * 1024) + '"', SC.RESOURCE_EXHAUSTED),
        ("1 2", SC.INVALID_ARGUMENT),
    ):
        cases.append(
            (
                f"value {value[:12]!r}",
                lambda v=value: s.StateSet(
                    api.StateSetRequest(run_id=rid, scope=pb.CONVERSATION, key="k", value_json=v), metadata=m1
                ),
                code,
            )
        )
    cases += [
        (
            "stale if_version",
            lambda: s.StateSet(
                api.StateSetRequest(run_id=rid, scope=pb.CONVERSATION, key="k", value_json="2", if_version=99),
                metadata=m1,
            ),
            SC.ABORTED,
        ),
        (
            "negative if_version",
            lambda: s.StateSet(
                api.StateSetRequest(run_id=rid, scope=pb.CONVERSATION, key="k", value_json="2", if_version=-1),
                metadata=m1,
            ),
            SC.ABORTED,
        ),
        (
            "if_version 0 on existing",
            lambda: s.StateSet(
                api.StateSetRequest(run_id=rid, scope=pb.CONVERSATION, key="k", value_json="2", if_version=0),
                metadata=m1,
            ),
            SC.ABORTED,
        ),
    ]
    refused(w, cases, unaudited=("oversize message",))


def test_malformed_messages_and_uploads(world: World) -> None:
    w = world
    m1, rid = w.md(w.r1), w.r1.run_id
    raw = {
        name: w.channel.unary_unary(f"/agenthost.v1.AgentRunAPIProxy/{name}")
        for name in ("StateGet", "StateSet", "HistoryPage")
    }
    garbage = [
        b"\xff\xff\xff\xff",
        b"\x0a\x03\xff\xfe\xfd",
        b"\x0a\x7f" + b"a" * 10,
        b"\x08" + b"\x80" * 11,
        b"\x12\x02\xc3\x28",
    ]
    attempts = [
        (f"{n} {g!r}", lambda c=c, g=g: c(g, metadata=m1, timeout=10), SC.INVALID_ARGUMENT)
        for n, c in raw.items()
        for g in garbage
    ]

    def header_then(*parts: api.ArtifactUpload) -> Iterator[api.ArtifactUpload]:
        yield api.ArtifactUpload(header=api.ArtifactHeader(run_id=rid, name="x"))
        yield from parts

    up = lambda it: w.stub.ArtifactCreate(it, metadata=m1, timeout=10)  # noqa: E731
    raw_up = w.channel.stream_unary("/agenthost.v1.AgentRunAPIProxy/ArtifactCreate")
    big_channel = grpc.insecure_channel(w.h.host.api_address, options=[("grpc.max_send_message_length", 32 << 20)])
    big_up = run_api_pb2_grpc.AgentRunAPIProxyStub(big_channel).ArtifactCreate
    attempts += [
        ("upload without header", lambda: up(iter([api.ArtifactUpload(data=b"x")])), SC.INVALID_ARGUMENT),
        ("empty upload", lambda: up(iter([])), SC.INVALID_ARGUMENT),
        (
            "two headers",
            lambda: up(header_then(api.ArtifactUpload(header=api.ArtifactHeader(run_id=rid)))),
            SC.INVALID_ARGUMENT,
        ),
        (
            "short of expected size",
            lambda: up(
                iter(
                    [
                        api.ArtifactUpload(header=api.ArtifactHeader(run_id=rid, expected_size=10)),
                        api.ArtifactUpload(data=b"abc"),
                    ]
                )
            ),
            SC.INVALID_ARGUMENT,
        ),
        (
            "declared too big",
            lambda: up(iter([api.ArtifactUpload(header=api.ArtifactHeader(run_id=rid, expected_size=2**40))])),
            SC.RESOURCE_EXHAUSTED,
        ),
        (
            "bad metadata json",
            lambda: up(iter([api.ArtifactUpload(header=api.ArtifactHeader(run_id=rid, metadata_json="{x"))])),
            SC.INVALID_ARGUMENT,
        ),
        (
            "mime type too long",
            lambda: up(iter([api.ArtifactUpload(header=api.ArtifactHeader(run_id=rid, mime_type="t" * 300))])),
            SC.INVALID_ARGUMENT,
        ),
        ("garbage upload message", lambda: raw_up(iter([b"\xff\xff"]), metadata=m1, timeout=10), SC.INVALID_ARGUMENT),
        (
            "garbage after header",
            lambda: raw_up(
                iter([api.ArtifactUpload(header=api.ArtifactHeader(run_id=rid)).SerializeToString(), b"\x0a\x05\xff"]),
                metadata=m1,
                timeout=10,
            ),
            SC.INVALID_ARGUMENT,
        ),
        # sent through a channel whose own send cap is larger, so the host's 8 MiB receive cap is what refuses it
        (
            "oversize chunk",
            lambda: big_up(header_then(api.ArtifactUpload(data=b"x" * (9 * 1024 * 1024))), metadata=m1, timeout=10),
            SC.RESOURCE_EXHAUSTED,
        ),
    ]
    before = db_digest(w.db_path)
    audit_before = len(w.flush_audit())
    for label, call, expected in attempts:
        assert status_of(call) == expected, label
        assert db_digest(w.db_path) == before, label
    rows = w.flush_audit()[audit_before:]
    # gRPC's own cap refuses the oversize chunk; the handler then finds its call dead and records CANCELLED.
    audited = {"oversize chunk": "CANCELLED"}
    assert sorted(r["outcome"] for r in rows) == sorted(audited.get(label, e.name) for label, _, e in attempts)
    assert db_digest(w.db_path) == before
    assert not list((w.h.host.data_dir / "artifacts" / "tmp").iterdir())
    assert w.host_serving()
    big_channel.close()
