"""The console's JSON API against a real host: sign-in, sessions and CSRF under attack, static files, and every
page's data (bots, bindings with schema and runner validation, streamed chat, runs, plugins and logs)."""

from __future__ import annotations

import json
import time

import pytest

from agenthost.host.api.gateway import console_auth
from agenthost.host.ops import logs
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.sdk.testing import TEST_PLUGIN

from .conftest import CSRF, Console
from .helpers import Helper

pytestmark = pytest.mark.timeout(60)


async def sse_events(response) -> list[tuple[str, dict]]:  # type: ignore[no-untyped-def]
    out = []
    kind = "message"
    async for raw in response.content:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            out.append((kind, json.loads(line[6:])))
    return out


async def test_sign_in_sets_a_locked_down_cookie_and_headers(console: Console) -> None:
    async with console.session() as c:
        async with c.post(
            f"{console.url}/api/session", json={"token": console.host.admin_token}, headers={CSRF: "sign-in"}
        ) as r:
            assert r.status == 200
            cookie = r.headers["Set-Cookie"]
            body = await r.json()
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/console" in cookie
        assert "Secure" not in cookie  # plain loopback HTTP: a Secure cookie would never come back
        assert console.host.admin_token not in cookie and console.host.admin_token not in json.dumps(body)
        async with c.get(f"{console.url}/api/bots", headers={CSRF: body["csrf"]}) as r:
            assert r.status == 200
            assert [b["name"] for b in (await r.json())["bots"]] == ["testbot"]
            assert r.headers["Cache-Control"] == "no-store"
            assert "default-src 'self'" in r.headers["Content-Security-Policy"]
            assert r.headers["X-Frame-Options"] == "DENY"
            assert "Access-Control-Allow-Origin" not in r.headers
        async with c.get(f"{console.url}/") as r:
            assert r.status == 200 and r.content_type == "text/html"
            page = await r.text()
            assert '<script type="module" src="/console/static/app.js">' in page
            assert "script-src 'self'" in r.headers["Content-Security-Policy"]
        async with c.delete(f"{console.url}/api/session", headers={CSRF: body["csrf"]}) as r:
            assert r.status == 200
        async with c.get(f"{console.url}/api/bots") as r:
            assert r.status == 401


async def test_behind_a_tls_proxy_the_session_cookie_is_secure(console: Console) -> None:
    """Behind the TLS-terminating proxy the docs ask for, this server sees plain HTTP but the page is https (its
    Origin says so): the cookie must be Secure, or the browser would also send the session to an http:// URL of the
    same host, in the clear."""
    netloc = console.url.split("/")[2]
    async with console.session() as c:
        for origin, secure in ((f"https://{netloc}", True), (f"http://{netloc}", False)):
            async with c.post(
                f"{console.url}/api/session",
                json={"token": console.host.admin_token},
                headers={CSRF: "sign-in", "Origin": origin},
            ) as r:
                assert r.status == 200, await r.text()
                assert ("Secure" in r.headers["Set-Cookie"]) is secure, (origin, r.headers["Set-Cookie"])


async def test_requests_without_a_live_session_are_refused(console: Console) -> None:
    async with console.session() as c:
        async with c.get(f"{console.url}/api/bots") as r:
            assert r.status == 401 and (await r.json())["error"]["code"] == "signed_out"
        # A forged cookie, and the admin token itself presented as a cookie, are not sessions.
        for forged in ("x" * 43, console.host.admin_token):
            async with c.get(f"{console.url}/api/bots", cookies={console_auth.COOKIE: forged}) as r:
                assert r.status == 401
        # Bearer keys open the OpenAI endpoints, not the console.
        async with c.get(
            f"{console.url}/api/bots", headers={"Authorization": f"Bearer {console.host.admin_token}"}
        ) as r:
            assert r.status == 401
        csrf = await console.sign_in(c)
        async with c.get(f"{console.url}/api/bots", headers={CSRF: csrf}) as r:
            assert r.status == 200
        sessions = console.host.gateway.console.sessions
        start = time.monotonic()
        sessions.clock = lambda: start + console_auth.IDLE_SECONDS + 1
        async with c.get(f"{console.url}/api/bots", headers={CSRF: csrf}) as r:
            assert r.status == 401
        sessions.clock = time.monotonic
        async with c.get(
            f"{console.url}/api/bots", headers={CSRF: csrf}
        ) as r:  # gone for good, not just while the clock was ahead
            assert r.status == 401


async def test_state_changes_need_the_csrf_token_and_the_same_origin(console: Console) -> None:
    async with console.session() as c:
        csrf = await console.sign_in(c)
        create = {"name": "newbot"}
        async with c.post(f"{console.url}/api/bots", json=create) as r:
            assert r.status == 403 and (await r.json())["error"]["code"] == "csrf"
        async with c.post(f"{console.url}/api/bots", json=create, headers={CSRF: "sign-in"}) as r:
            assert r.status == 403
        async with c.post(
            f"{console.url}/api/bots", json=create, headers={CSRF: csrf, "Origin": "https://evil.example"}
        ) as r:
            assert r.status == 403 and (await r.json())["error"]["code"] == "cross_origin"
        # What a cross-site HTML form can send: no custom header, a form content type.
        async with c.post(f"{console.url}/api/bots", data="name=newbot") as r:
            assert r.status == 403
        async with c.post(f"{console.url}/api/bots", data="name=newbot", headers={CSRF: csrf}) as r:
            assert r.status == 415
        assert [b.name for b in console.host.registry.bots()] == ["testbot"]
        async with c.post(f"{console.url}/api/bots", json=create, headers={CSRF: csrf}) as r:
            assert r.status == 201, await r.text()
        assert "newbot" in [b.name for b in console.host.registry.bots()]
        async with c.post(f"{console.url}/api/bots", json=create, headers={CSRF: csrf}) as r:
            assert r.status == 409  # the admin servicer's own refusal, mapped once
        async with c.post(
            f"{console.url}/api/bots",
            data=b"{" + b" " * (300 * 1024) + b"}",
            headers={CSRF: csrf, "Content-Type": "application/json"},
        ) as r:
            assert r.status == 413

        async def trickle():  # type: ignore[no-untyped-def]  # chunked: no Content-Length to refuse up front
            yield b'{"name": "'
            for _ in range(40):
                yield b"x" * 8192
            yield b'"}'

        async with c.post(
            f"{console.url}/api/bots", data=trickle(), headers={CSRF: csrf, "Content-Type": "application/json"}
        ) as r:
            assert r.status == 413
        async with c.options(
            f"{console.url}/api/bots",
            headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
        ) as r:
            assert r.status >= 400 and "Access-Control-Allow-Origin" not in r.headers


async def test_only_admin_credentials_sign_in(console: Console) -> None:
    client = console.harness.client
    send = await client.call(
        "CreateCredential", hpb.CreateCredentialRequest(name="app", scope="send", bots=["testbot"])
    )
    admin = await client.call("CreateCredential", hpb.CreateCredentialRequest(name="ops", scope="admin"))
    async with console.session() as c:
        url = f"{console.url}/api/session"
        async with c.post(url, json={"token": send.token}, headers={CSRF: "sign-in"}) as r:
            assert r.status == 403 and (await r.json())["error"]["code"] == "not_admin"
            assert "Set-Cookie" not in r.headers
        async with c.post(url, json={"token": "adm_" + "x" * 43}, headers={CSRF: "sign-in"}) as r:
            assert r.status == 401
        async with c.post(url, json={"token": console.host.admin_token}) as r:  # no CSRF header: login CSRF
            assert r.status == 403
        async with c.get(f"{console.url}/api/bots") as r:
            assert r.status == 401
        csrf = await console.sign_in(c, admin.token)
        async with c.get(f"{console.url}/api/session", headers={CSRF: csrf}) as r:
            assert (await r.json())["name"] == "ops"
        await client.call("RevokeCredential", hpb.RevokeCredentialRequest(name="ops"))
        async with c.get(f"{console.url}/api/bots", headers={CSRF: csrf}) as r:
            assert r.status == 401  # the session died with its credential


async def test_a_session_dies_with_the_very_credential_it_signed_in_with(console: Console) -> None:
    """Revoking `ops` and making a new `ops` (a rotation, or the name taken by someone else) ends the sessions the
    old key opened: a session is tied to the credential's issue, not its name and scope."""
    client = console.harness.client
    old = await client.call("CreateCredential", hpb.CreateCredentialRequest(name="ops", scope="admin"))
    async with console.session() as stale, console.session() as fresh:
        stale_csrf = await console.sign_in(stale, old.token)
        async with stale.get(f"{console.url}/api/bots", headers={CSRF: stale_csrf}) as r:
            assert r.status == 200
        await client.call("RevokeCredential", hpb.RevokeCredentialRequest(name="ops"))
        new = await client.call("CreateCredential", hpb.CreateCredentialRequest(name="ops", scope="admin"))
        async with stale.get(f"{console.url}/api/bots", headers={CSRF: stale_csrf}) as r:
            assert r.status == 401 and (await r.json())["error"]["code"] == "signed_out"
        async with stale.post(f"{console.url}/api/session", json={"token": old.token}, headers={CSRF: "sign-in"}) as r:
            assert r.status == 401  # the old key itself is dead too
        fresh_csrf = await console.sign_in(fresh, new.token)
        async with fresh.get(f"{console.url}/api/session", headers={CSRF: fresh_csrf}) as r:
            assert r.status == 200 and (await r.json())["name"] == "ops"
        # And the new issue's sessions die with it, at their very next request.
        await client.call("RevokeCredential", hpb.RevokeCredentialRequest(name="ops"))
        async with fresh.get(f"{console.url}/api/session", headers={CSRF: fresh_csrf}) as r:
            assert r.status == 401


@pytest.mark.parametrize(
    "path",
    [
        "/static/../../admin.token",
        "/static/..%2f..%2fadmin.token",
        "/static/%2e%2e%2f%2e%2e%2fadmin.token",
        "/static/..%5c..%5cadmin.token",
        "/static/console_api.py",
        "/static/__init__.py",
        "/static/",
        "/static/app.js%00.png",
        "/../host.json",
    ],
)
async def test_static_files_are_a_fixed_table(console: Console, path: str) -> None:
    async with console.session() as c:
        async with c.get(console.url + path, allow_redirects=False) as r:
            body = await r.read()
            assert r.status in (404, 400), (path, r.status)
            assert console.host.admin_token.encode() not in body and b"import" not in body


async def test_static_files_are_served_with_their_types(console: Console) -> None:
    async with console.session() as c:
        for name, kind in [("app.js", "text/javascript"), ("style.css", "text/css"), ("index.html", "text/html")]:
            async with c.get(f"{console.url}/static/{name}") as r:
                assert r.status == 200 and r.content_type == kind
                assert r.headers["X-Content-Type-Options"] == "nosniff"
        async with c.get(console.url, allow_redirects=False) as r:
            assert r.status == 302 and r.headers["Location"] == "/console/"


async def test_bindings_are_checked_by_schema_and_runner_and_shown_redacted(console: Console) -> None:
    async with console.session() as c:
        csrf = await console.sign_in(c)
        h = {CSRF: csrf}
        async with c.get(f"{console.url}/api/runners", headers={CSRF: csrf}) as r:
            (runner,) = (await r.json())["runners"]
        assert runner["runner_id"] == f"{TEST_PLUGIN}/helper" and runner["config_schema"]["properties"]["max_tools"]
        validate = f"{console.url}/api/validate-config"
        async with c.post(
            validate, json={"runner_id": runner["runner_id"], "config": {"max_tools": 9}}, headers=h
        ) as r:
            assert (await r.json())["problems"] == ["max_tools: 9 is greater than the maximum of 3"]
        bad = {"runner_id": runner["runner_id"], "config": {"greeting": "forbidden words"}}
        async with c.post(validate, json=bad, headers=h) as r:
            assert (await r.json())["problems"] == ["greeting: may not say 'forbidden'"]
        async with c.post(f"{console.url}/api/bots/testbot/bindings", json=bad, headers=h) as r:
            assert r.status == 400 and "forbidden" in (await r.json())["error"]["message"]
        good = {
            "runner_id": runner["runner_id"],
            "config": {"greeting": "Hi!", "api_key": "s3cret-value"},
            "priority": 5,
        }
        async with c.post(f"{console.url}/api/bots/testbot/bindings", json=good, headers=h) as r:
            assert r.status == 201, await r.text()
            created = await r.json()
        assert created["config"] == {"greeting": "Hi!", "api_key": "[redacted]"}
        async with c.get(f"{console.url}/api/bots/testbot", headers={CSRF: h[CSRF]}) as r:
            page = await r.json()
        assert "s3cret-value" not in json.dumps(page)
        assert {b["binding_id"] for b in page["bindings"]} >= {created["binding_id"]}
        patch = {"binding_id": created["binding_id"], "config_patch": {"max_tools": 7}}
        async with c.post(validate, json=patch, headers=h) as r:
            assert (await r.json())["problems"] == ["max_tools: 7 is greater than the maximum of 3"]
        url = f"{console.url}/api/bindings/{created['binding_id']}"
        async with c.patch(url, json={"config_patch": {"max_tools": 2}}, headers=h) as r:
            assert r.status == 200, await r.text()
            assert (await r.json())["config"] == {"greeting": "Hi!", "api_key": "[redacted]", "max_tools": 2}
        stored = json.loads(console.host.registry.binding(created["binding_id"]).config_json)
        assert stored["api_key"] == "s3cret-value"  # the secret the browser never saw is kept
        async with c.patch(url, json={"priority": 2**40}, headers=h) as r:
            assert r.status == 400
        async with c.delete(url, headers=h) as r:
            assert r.status == 200


async def test_chat_streams_the_run_as_it_happens_and_the_run_page_has_it_all(console: Console) -> None:
    async with console.session() as c:
        csrf = await console.sign_in(c)
        async with c.post(
            f"{console.url}/api/bots/testbot/chat", json={"text": "hold", "conversation_id": "c1"}, headers={CSRF: csrf}
        ) as r:
            assert r.status == 200 and r.content_type == "text/event-stream"
            seen: list[tuple[str, dict]] = []
            kind = ""
            # Before the runner is released, the page already has the run, the first text and the tool call.
            while not any(k == "run_event" and "tool_started" in e for k, e in seen):
                line = (await r.content.readline()).decode().rstrip("\n")
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: "):
                    seen.append((kind, json.loads(line[6:])))
            assert Helper.holding.is_set() and not Helper.release.is_set()
            assert seen[0][0] == "run_started"
            Helper.release.set()
            seen += await sse_events(r)
        run_id = seen[0][1]["run_id"]
        finished = [e for k, e in seen if k == "run_finished"]
        assert finished and finished[0]["status"] == "completed" and finished[0]["usage"]["input_tokens"] == 12
        text = "".join(e["text_delta"]["text"] for k, e in seen if k == "run_event" and "text_delta" in e)
        assert text == "Let me look. The answer is 42."
        async with c.get(f"{console.url}/api/runs?bot=testbot", headers={CSRF: csrf}) as r:
            assert [x["run_id"] for x in (await r.json())["runs"]] == [run_id]
        async with c.get(f"{console.url}/api/runs/{run_id}", headers={CSRF: csrf}) as r:
            detail = await r.json()
        assert detail["run"]["conversation_id"] == "c1" and detail["run"]["usage"]["model"] == "fake-model"
        kinds = [next(k for k in e if k not in ("seq", "created_at")) for e in detail["events"]]
        assert "tool_started" in kinds and "tool_finished" in kinds and kinds[-1] == "completed"
        async with c.post(f"{console.url}/api/bots/nobot/chat", json={"text": "hi"}, headers={CSRF: csrf}) as r:
            assert r.status == 404 and "nobot" in (await r.json())["error"]["message"]
        async with c.get(f"{console.url}/api/runs/run_nope", headers={CSRF: csrf}) as r:
            assert r.status == 404
        validate = f"{console.url}/api/validate-config"
        for body in ({"runner_id": "nope/none"}, {"runner_id": ""}, {"binding_id": "bind_nope"}):
            async with c.post(validate, json=body, headers={CSRF: csrf}) as r:
                assert r.status in (400, 404), (body, r.status, await r.text())


async def test_plugins_list_toggle_and_logs_with_secrets_masked(console: Console) -> None:
    path = logs.plugin_log_path(console.host.data_dir, TEST_PLUGIN)
    path.parent.mkdir(parents=True, exist_ok=True)
    leaked = "adm_" + "A" * 43
    path.write_text("".join(f"line {i}\n" for i in range(30)) + f"oops {leaked}\n")
    async with console.session() as c:
        csrf = await console.sign_in(c)
        async with c.get(f"{console.url}/api/plugins", headers={CSRF: csrf}) as r:
            (plugin,) = (await r.json())["plugins"]
        assert plugin["plugin_id"] == TEST_PLUGIN and plugin["state"] == "ready" and plugin["restarts"] == 0
        async with c.get(f"{console.url}/api/plugins/{TEST_PLUGIN}/logs?lines=3", headers={CSRF: csrf}) as r:
            lines = (await r.json())["lines"]
        assert lines == ["line 28", "line 29", "oops [redacted]"]
        for bad in ("lines=0", "lines=5000", "lines=x"):
            async with c.get(f"{console.url}/api/plugins/{TEST_PLUGIN}/logs?{bad}", headers={CSRF: csrf}) as r:
                assert r.status == 400
        async with c.get(f"{console.url}/api/plugins/no-such/logs", headers={CSRF: csrf}) as r:
            assert r.status == 404
        async with c.post(
            f"{console.url}/api/plugins/no-such/enabled", json={"enabled": False}, headers={CSRF: csrf}
        ) as r:
            assert r.status == 404
        async with c.post(
            f"{console.url}/api/plugins/{TEST_PLUGIN}/enabled", json={"enabled": "no"}, headers={CSRF: csrf}
        ) as r:
            assert r.status == 400


async def test_the_cookie_alone_opens_nothing(console: Console) -> None:
    """A browser sends a cookie to every port of its host (and SameSite counts 127.0.0.1:9999 as the same site): a
    page another local user serves on the operator's machine receives the console's cookie. The cookie alone, sent
    back to the console as that user would, reads nothing: neither the session's token nor any page of the admin
    surface. The token, which the console page keeps in its origin's own storage, is needed for reads too."""
    async with console.session() as c:
        csrf = await console.sign_in(c)
        (cookie,) = [m.value for m in c.cookie_jar if m.key == console_auth.COOKIE]
    paths = ("session", "status", "bots", "bots/testbot", "runs?bot=testbot", "plugins", f"plugins/{TEST_PLUGIN}/logs")
    async with console.session() as thief:
        for path in paths:
            async with thief.get(f"{console.url}/api/{path}", cookies={console_auth.COOKIE: cookie}) as r:
                body = await r.text()
                assert r.status == 403 and json.loads(body)["error"]["code"] == "csrf", path
                assert csrf not in body
        async with thief.get(
            f"{console.url}/api/session", cookies={console_auth.COOKIE: cookie}, headers={CSRF: csrf}
        ) as r:
            assert r.status == 200  # with the token: the console page itself


async def test_chat_says_queued_at_once_behind_a_run_of_the_same_conversation(console: Console) -> None:
    """Issue 26: a message that waits for its turn gets a `queued` event (its place in line) before anything else,
    then `run_started` once the run ahead ends."""
    async with console.session() as c:
        csrf = await console.sign_in(c)
        url = f"{console.url}/api/bots/testbot/chat"
        async with c.post(url, json={"text": "hold", "conversation_id": "q"}, headers={CSRF: csrf}) as first:
            assert first.status == 200
            async with c.post(url, json={"text": "next", "conversation_id": "q"}, headers={CSRF: csrf}) as r:
                assert r.status == 200
                kind = ""
                while True:  # the first event arrives while the first run still holds
                    line = (await r.content.readline()).decode().rstrip("\n")
                    if line.startswith("event: "):
                        kind = line[7:]
                    elif line.startswith("data: "):
                        queued = json.loads(line[6:])
                        break
                assert not Helper.release.is_set()
                assert kind == "queued" and queued["waiting_on"] == "conversation" and queued["position"] == 1
                assert queued["run"]["status"] == "queued"
                Helper.release.set()
                rest = await sse_events(r)
            await sse_events(first)
        kinds = [k for k, _ in rest]
        assert kinds[0] == "run_started" and rest[0][1]["run_id"] == queued["run"]["run_id"]
        assert kinds[-1] == "run_finished" and rest[-1][1]["status"] == "completed"


async def test_a_sign_in_is_parsed_only_at_a_tokens_size(console: Console, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sign-in is read and parsed before anyone is known: at the console's 256 KiB body cap, anyone reaching the
    port made the host's event loop parse 256 KiB of JSON (a list of zeros: ~30 ms) per request, no key needed.
    Now a body past a token's size is refused 413 from its header (or as it arrives) and never parsed."""
    parsed: list[int] = []
    real_loads = json.loads

    def recording(data, *args, **kwargs):  # type: ignore[no-untyped-def]
        parsed.append(len(data))
        return real_loads(data, *args, **kwargs)

    monkeypatch.setattr(json, "loads", recording)
    zeros = b'{"token": "x", "pad": [' + b",".join([b"0"] * 100_000) + b"]}"
    async with console.session() as c:

        async def chunked():  # type: ignore[no-untyped-def]
            for i in range(0, len(zeros), 4096):
                yield zeros[i : i + 4096]

        for body in (zeros, chunked()):
            async with c.post(
                f"{console.url}/api/session",
                data=body,
                headers={CSRF: "sign-in", "Content-Type": "application/json"},
            ) as r:
                assert r.status == 413, await r.text()
        assert not [n for n in parsed if n > 4096], parsed
        # A real sign-in still fits.
        async with c.post(
            f"{console.url}/api/session", json={"token": console.host.admin_token}, headers={CSRF: "sign-in"}
        ) as r:
            assert r.status == 200
