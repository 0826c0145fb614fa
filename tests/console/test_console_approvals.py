"""Approvals through the console's JSON API against a real host: a runner's held-open RequestApproval is listed,
approved or denied from the console, and the decision reaches the runner; deciding twice, unknown ids, bad
decisions, missing CSRF and non-admin keys are refused."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from agenthost.protos import host_pb2 as hpb

from .conftest import CSRF, Console
from .helpers import Helper

pytestmark = pytest.mark.timeout(60)


class Chat:
    """A console chat whose server-sent events are read in the background; the test waits on what it sees."""

    def __init__(self, console: Console, client: aiohttp.ClientSession, csrf: str, text: str) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self._changed = asyncio.Condition()
        self.task = asyncio.create_task(self._read(console, client, csrf, text))

    async def _read(self, console: Console, client: aiohttp.ClientSession, csrf: str, text: str) -> None:
        async with client.post(f"{console.url}/api/bots/testbot/chat", json={"text": text}, headers={CSRF: csrf}) as r:
            assert r.status == 200, await r.text()
            kind = ""
            async for raw in r.content:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: "):
                    async with self._changed:
                        self.seen.append((kind, json.loads(line[6:])))
                        self._changed.notify_all()

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [e[kind] for k, e in self.seen if k == "run_event" and kind in e]

    async def wait_for(self, kind: str) -> dict[str, Any]:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: self.events(kind)), 20)
        return self.events(kind)[0]

    async def finished(self) -> dict[str, Any]:
        await asyncio.wait_for(self.task, 20)
        return next(e for k, e in self.seen if k == "run_finished")

    def text(self) -> str:
        return "".join(e["text"] for e in self.events("text_delta"))


@contextlib.asynccontextmanager
async def chatting(console: Console, client: aiohttp.ClientSession, csrf: str, text: str) -> AsyncIterator[Chat]:
    chat = Chat(console, client, csrf, text)
    try:
        yield chat
    finally:
        chat.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await chat.task


async def test_approve_from_the_console_reaches_the_runner_and_a_second_decision_is_409(console: Console) -> None:
    async with console.session() as c:
        csrf = await console.sign_in(c)
        async with chatting(console, c, csrf, "ask about orders") as chat:
            asked = await chat.wait_for("approval_requested")
            assert asked["tool_name"] == "lookup" and asked["reason"] == "lookups need a person's OK"
            assert [o["id"] for o in asked["options"]] == ["approve", "deny"]
            assert json.loads(asked["arguments_json"]) == {"query": "ask about orders", "depth": 2}
            approval_id = asked["approval_id"]
            run_id = chat.seen[0][1]["run_id"]

            async with c.get(f"{console.url}/api/approvals", headers={CSRF: csrf}) as r:
                assert r.status == 200
                (pending,) = (await r.json())["approvals"]
            assert pending["approval_id"] == approval_id and pending["status"] == "pending"
            assert pending["run_id"] == run_id and pending["bot_name"] == "testbot"
            assert pending["request"]["summary"] == "look up 'ask about orders'"
            async with c.get(f"{console.url}/api/approvals?bot=testbot&run={run_id}", headers={CSRF: csrf}) as r:
                assert [a["approval_id"] for a in (await r.json())["approvals"]] == [approval_id]
            async with c.get(f"{console.url}/api/approvals?run=run_other", headers={CSRF: csrf}) as r:
                assert (await r.json())["approvals"] == []
            async with c.get(f"{console.url}/api/approvals?bot=nobot", headers={CSRF: csrf}) as r:
                assert r.status == 404

            url = f"{console.url}/api/approvals/{approval_id}"
            # Refused before anything is decided: no CSRF header, another origin, a decision that is no option.
            async with c.post(url, json={"decision": "approve"}) as r:
                assert r.status == 403 and (await r.json())["error"]["code"] == "csrf"
            async with c.post(
                url, json={"decision": "approve"}, headers={CSRF: csrf, "Origin": "https://evil.example"}
            ) as r:
                assert r.status == 403 and (await r.json())["error"]["code"] == "cross_origin"
            for bad in ({"decision": "maybe"}, {"decision": ""}, {"decision": 1}, {"decision": "deny", "note": ["x"]}):
                async with c.post(url, json=bad, headers={CSRF: csrf}) as r:
                    assert r.status == 400, (bad, await r.text())
            async with c.post(url, json={"decision": "deny", "note": "x" * 1001}, headers={CSRF: csrf}) as r:
                assert r.status == 400
            assert Helper.decisions == []
            assert [a.approval_id for a in console.host.runs.approvals.list(bot_ids=None)] == [approval_id]

            async with c.post(url, json={"decision": "approve", "note": "once"}, headers={CSRF: csrf}) as r:
                assert r.status == 200, await r.text()
                info = await r.json()
            assert info["status"] == "approved" and info["resolved"]["decided_by"] == "admin"
            async with c.post(url, json={"decision": "deny"}, headers={CSRF: csrf}) as r:
                assert r.status == 409
                error = (await r.json())["error"]
            assert error["code"] == "failed_precondition" and "already approved" in error["message"]
            async with c.post(
                f"{console.url}/api/approvals/apr_nope", json={"decision": "approve"}, headers={CSRF: csrf}
            ) as r:
                assert r.status == 404

            finished = await chat.finished()
        assert finished["status"] == "completed"
        (decision,) = Helper.decisions
        assert decision.approved and decision.decided_by == "admin" and decision.note == "once"
        (resolved,) = chat.events("approval_resolved")
        assert resolved["outcome"] == "approved" and resolved["note"] == "once"
        assert chat.events("tool_finished") and chat.text().endswith("The answer is 42.")
        async with c.get(f"{console.url}/api/approvals", headers={CSRF: csrf}) as r:
            assert (await r.json())["approvals"] == []
        # The run page has both events, in order, for the card to be drawn decided.
        async with c.get(f"{console.url}/api/runs/{run_id}", headers={CSRF: csrf}) as r:
            kinds = [next(k for k in e if k not in ("seq", "created_at")) for e in (await r.json())["events"]]
        assert kinds.index("approval_requested") < kinds.index("approval_resolved") < kinds.index("tool_started")


async def test_deny_from_the_console_tells_the_runner_who_and_why(console: Console) -> None:
    ops = await console.harness.client.call("CreateCredential", hpb.CreateCredentialRequest(name="ops", scope="admin"))
    async with console.session() as c:
        csrf = await console.sign_in(c, ops.token)
        async with chatting(console, c, csrf, "ask for everything") as chat:
            asked = await chat.wait_for("approval_requested")
            async with c.post(
                f"{console.url}/api/approvals/{asked['approval_id']}",
                json={"decision": "deny", "note": "not on\nprod"},
                headers={CSRF: csrf},
            ) as r:
                assert r.status == 200 and (await r.json())["status"] == "denied"
            finished = await chat.finished()
    assert finished["status"] == "completed"
    (decision,) = Helper.decisions
    assert not decision.approved and decision.outcome == "denied" and decision.decided_by == "ops"
    assert decision.note == "not on prod"  # one line, as every approval text shown to a person
    assert chat.text().endswith("Not looked up: denied by ops (not on prod).")
    assert chat.events("tool_started") == []


async def test_a_send_key_cannot_reach_approvals_through_the_console(console: Console) -> None:
    client = console.harness.client
    send = await client.call(
        "CreateCredential", hpb.CreateCredentialRequest(name="app", scope="send", bots=["testbot"])
    )
    async with console.session() as admin, console.session() as c:
        csrf = await console.sign_in(admin)
        async with chatting(console, admin, csrf, "ask quietly") as chat:
            asked = await chat.wait_for("approval_requested")
            url = f"{console.url}/api/approvals/{asked['approval_id']}"
            bearer = {"Authorization": f"Bearer {send.token}"}
            async with c.post(f"{console.url}/api/session", json={"token": send.token}, headers={CSRF: "sign-in"}) as r:
                assert r.status == 403 and (await r.json())["error"]["code"] == "not_admin"
            async with c.get(f"{console.url}/api/approvals", headers=bearer) as r:
                assert r.status == 401
            for headers in (bearer, {**bearer, CSRF: "sign-in"}, {**bearer, CSRF: csrf}):
                async with c.post(url, json={"decision": "approve"}, headers=headers) as r:
                    assert r.status == 401, await r.text()
            # The admin's session cookie is not this client's: its CSRF token alone opens nothing.
            async with c.post(url, json={"decision": "approve"}, headers={CSRF: csrf}) as r:
                assert r.status == 401
            assert Helper.decisions == []
            assert [a.approval_id for a in console.host.runs.approvals.list(bot_ids=None)] == [asked["approval_id"]]
            async with admin.post(url, json={"decision": "deny", "note": "cleanup"}, headers={CSRF: csrf}) as r:
                assert r.status == 200
            await chat.finished()
    assert [d.outcome for d in Helper.decisions] == ["denied"]
