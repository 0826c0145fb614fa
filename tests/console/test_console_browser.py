"""The console in a real headless Chromium (Debian's `chromium`), driven as a person would: sign in, create a bot,
bind a runner through the form its schema generates, chat and watch the reply and the tool call stream in, open the
run, look at the plugins. Screenshots go to $AGENTHOST_SCREENSHOTS (the committed set in docs/console/ is made with
`AGENTHOST_SCREENSHOTS=docs/console`), else to the test's temporary directory, so a run leaves the checkout clean."""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agenthost.host.ops import logs
from agenthost.runners.sdk.testing import TEST_PLUGIN

from .conftest import Console
from .helpers import Helper

CHROMIUM = "/usr/bin/chromium"
SHOTS = os.environ.get("AGENTHOST_SCREENSHOTS", "")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(180),
    pytest.mark.skipif(
        not os.access(CHROMIUM, os.X_OK), reason=f"no {CHROMIUM}: install Debian's chromium (apt-get install chromium)"
    ),
]


@pytest.fixture
async def page(tmp_path: Path) -> AsyncIterator:  # type: ignore[type-arg]
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        context = await p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=ARGS,
            viewport={"width": 1280, "height": 860},
        )
        try:
            page = context.pages[0] if context.pages else await context.new_page()
            page.set_default_timeout(20_000)
            problems: list[str] = []
            # A CSP violation or a script error on our own pages is a failure, not noise.
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.problems = problems  # type: ignore[attr-defined]
            page.shots_dir = tmp_path / "screenshots"  # type: ignore[attr-defined]
            yield page
        finally:
            await context.close()


async def shot(page, name: str) -> None:  # type: ignore[no-untyped-def]
    folder = Path(SHOTS or page.shots_dir)
    folder.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(folder / f"{name}.png"), full_page=True)


async def test_a_person_signs_in_binds_a_runner_chats_and_reads_the_run(console: Console, page) -> None:  # type: ignore[no-untyped-def]
    from playwright.async_api import expect

    await page.goto(console.url)
    await expect(page.locator("#sign-in h1")).to_have_text("Sign in")
    await page.fill("#token", "cred_not-a-real-key-at-all-000000000000000")
    await page.click("#sign-in button[type=submit]")
    await expect(page.locator("#sign-in .error")).to_contain_text("not valid")
    await shot(page, "sign-in")
    page.problems.clear()  # the browser logs the refused sign-in's 401 itself
    await page.fill("#token", console.host.admin_token)
    await page.click("#sign-in button[type=submit]")
    await expect(page.locator("#bots")).to_contain_text("testbot")

    # The key is not anywhere a script could read it.
    stored = await page.evaluate("() => JSON.stringify([document.cookie, {...localStorage}, {...sessionStorage}])")
    assert console.host.admin_token not in stored and "agenthost_console" not in stored

    await page.fill("#bot-name", "helpdesk")
    await page.fill("#bot-description", "answers questions about orders")
    await page.click("#create-bot button[type=submit]")
    await page.click("#bots >> text=helpdesk")
    await expect(page.locator("#bindings")).to_contain_text("Not bound to a runner yet.")

    # The form comes from the runner's JSON Schema; a value it refuses is shown under its field.
    await page.select_option("#runner", f"{TEST_PLUGIN}/helper")
    await expect(page.locator("#cfg-max_tools")).to_be_visible()
    assert await page.locator("#cfg-api_key").get_attribute("type") == "password"
    await page.fill("#cfg-greeting", "Hello from helpdesk.")
    await page.fill("#cfg-max_tools", "9")
    await page.select_option("#cfg-style", label="fancy")
    await page.click("#bind button[type=submit]")
    error = page.locator('[data-error-for="max_tools"]')
    await expect(error).to_have_text("max_tools: 9 is greater than the maximum of 3")
    await shot(page, "binding-invalid")
    # The runner's own rule (ValidateConfig), also inline.
    await page.fill("#cfg-max_tools", "2")
    await page.fill("#cfg-greeting", "forbidden greeting")
    await page.click("#bind button[type=submit]")
    await expect(page.locator('[data-error-for="greeting"]')).to_have_text("greeting: may not say 'forbidden'")
    await expect(error).to_be_hidden()
    await page.fill("#cfg-greeting", "Hello from helpdesk.")
    await page.click("#bind button[type=submit]")
    await expect(page.locator(".binding")).to_contain_text(f"{TEST_PLUGIN}/helper")
    await expect(page.locator(".binding .config")).to_contain_text('"max_tools": 2')
    (binding,) = console.host.registry.bindings(console.host.registry.bot("helpdesk").bot_id)
    assert '"style": "fancy"' in binding.config_json

    # Editing starts from the stored config; only what changed is sent.
    await page.click(".binding >> text=Edit config")
    await expect(page.locator(".edit-binding #cfg-greeting")).to_have_value("Hello from helpdesk.")
    await page.fill(".edit-binding #cfg-max_tools", "4")
    await page.click(".edit-binding button[type=submit]")
    await expect(page.locator('.edit-binding [data-error-for="max_tools"]')).to_contain_text("maximum of 3")
    await page.fill(".edit-binding #cfg-max_tools", "3")
    await page.click(".edit-binding button[type=submit]")
    await expect(page.locator(".binding .config")).to_contain_text('"max_tools": 3')
    (binding,) = console.host.registry.bindings(binding.bot_id)
    assert json.loads(binding.config_json) == {"greeting": "Hello from helpdesk.", "max_tools": 3, "style": "fancy"}

    # The reply streams in: the greeting and the running tool call show before the runner is let go.
    await page.fill("#chat-input", "hold")
    await page.click("#chat-send")
    await expect(page.locator(".bubble.bot .assistant-text").first).to_have_text("Hello from helpdesk. ")
    tool = page.locator('details.tool[data-tool="lookup"]')
    await expect(tool.locator(".tool-status")).to_have_text("running…")
    assert Helper.holding.is_set() and not Helper.release.is_set()
    Helper.release.set()
    await expect(tool.locator(".tool-status")).to_have_text("✓ done")
    await expect(page.locator(".bubble.bot")).to_contain_text("The answer is 42.")
    await expect(page.locator(".run-meta")).to_contain_text("completed · 12 in / 5 out tokens")
    await tool.locator("summary").click()
    await expect(tool.locator(".tool-result")).to_contain_text('"hits": 42')
    await shot(page, "chat")

    # The run page: its events, usage, and no invented cost.
    await page.click(".run-meta a")
    await expect(page.locator("#run-facts [data-fact=Status]")).to_have_text("completed")
    await expect(page.locator("#run-facts [data-fact='Input tokens']")).to_have_text("12")
    await expect(page.locator("#run-facts [data-fact=Model]")).to_have_text("fake-model")
    await expect(page.locator("#run-facts [data-fact=Cost]")).to_have_text("—")
    await expect(page.locator("#events details.tool")).to_have_count(1)
    generic = page.locator('#events details.generic[data-kind="state_updated"]')
    await generic.locator("summary").click()
    await expect(generic).to_contain_text("last_lookup")
    await expect(page.locator("#events")).to_contain_text("completed (stop)")
    await shot(page, "run")

    await page.click("nav >> text=Runs")
    await expect(page.locator("#runs tbody tr")).to_have_count(1)

    await page.click("nav >> text=Plugins")
    row = page.locator(f'tr[data-plugin="{TEST_PLUGIN}"]')
    await expect(row.locator(".state")).to_have_text("ready")
    await row.locator("text=Logs").click()
    await expect(page.locator("#logs pre")).to_have_text("(no log lines)")
    # Lines as the host's pump writes a plugin's stderr to <data>/logs/<plugin>.log; Refresh shows new ones.
    log_file = logs.plugin_log_path(console.host.data_dir, TEST_PLUGIN)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    log_file.write_text("INFO helper: serving on a unix socket\nINFO helper: run started\n")
    await page.click("#refresh-logs")
    await expect(page.locator("#logs pre")).to_contain_text("run started")
    with log_file.open("a") as f:
        f.write(f"WARNING helper: token {console.host.admin_token} leaked\n")
    await page.click("#refresh-logs")
    await expect(page.locator("#logs pre")).to_contain_text("token [redacted] leaked")
    await shot(page, "plugins")

    assert page.problems == [], page.problems  # no CSP violation, no script error on any page

    # Signing out ends the session on the server too.
    await page.click("#sign-out")
    await expect(page.locator("#sign-in")).to_be_visible()
    await page.goto(f"{console.url}/#/bots")
    await expect(page.locator("#sign-in")).to_be_visible()


async def test_a_person_approves_a_tool_call_in_the_chat_and_denies_one_from_the_list(console: Console, page) -> None:  # type: ignore[no-untyped-def]
    from playwright.async_api import expect

    await page.goto(console.url)
    await page.fill("#token", console.host.admin_token)
    await page.click("#sign-in button[type=submit]")
    await page.click("#bots >> text=testbot")
    page.problems.clear()  # the signed-out first load: its session check's 401 and the browser's favicon 404

    # The runner asks before its lookup: the card shows what and why, with the host's options as buttons.
    await page.fill("#chat-input", "ask about order 7")
    await page.click("#chat-send")
    card = page.locator("#chat-log .approval")
    await expect(card.locator("code")).to_have_text("lookup")
    await expect(card.locator(".approval-summary")).to_have_text("look up 'ask about order 7'")
    await expect(card.locator(".approval-reason")).to_have_text("lookups need a person's OK")
    await expect(card.locator(".approval-expiry")).to_have_text(re.compile(r"expires in (1:00|0:[0-5]\d)"))
    await expect(card.locator("button")).to_have_text(["Approve", "Deny"])
    await expect(card.locator(".approval-args pre")).to_be_hidden()  # collapsed until asked for
    await card.locator(".approval-args summary").click()
    await expect(card.locator(".approval-args pre")).to_contain_text('"depth": 2')
    await expect(page.locator("#approvals-count")).to_have_text("1")
    await expect(page.locator('details.tool[data-tool="lookup"]')).to_have_count(0)  # nothing runs before a yes
    await card.locator(".approval-note").fill("fine, read-only")
    await shot(page, "approval")

    await card.locator("button[data-option=approve]").click()
    await expect(card.locator(".approval-outcome")).to_have_text("✓ approved by admin — fine, read-only")
    await expect(card.locator("button")).to_have_count(0)
    await expect(page.locator('details.tool[data-tool="lookup"] .tool-status')).to_have_text("✓ done")
    await expect(page.locator(".bubble.bot")).to_contain_text("The answer is 42.")
    await expect(page.locator(".run-meta")).to_contain_text("completed")
    await expect(page.locator("#approvals-count")).to_be_hidden()
    (decision,) = Helper.decisions
    assert decision.approved and decision.decided_by == "admin" and decision.note == "fine, read-only"
    await shot(page, "approval-approved")

    # A second request, decided from the pending approvals page in another tab, while the chat stays open.
    await page.fill("#chat-input", "ask about everyone's orders")
    await page.click("#chat-send")
    await expect(page.locator("#chat-log .approval.pending")).to_have_count(1)
    await expect(page.locator("#approvals-count")).to_have_text("1")
    other = await page.context.new_page()
    other.on("pageerror", lambda e: page.problems.append(str(e)))
    other.shots_dir = page.shots_dir  # type: ignore[attr-defined]
    await other.goto(f"{console.url}/#/bots")  # one session: cookie and token (localStorage) are the browser's
    await other.click("nav >> text=Pending approvals")
    listed = other.locator("#approvals .approval")
    await expect(listed).to_have_count(1)
    await expect(listed).to_contain_text("bot testbot")
    await expect(listed.locator(".approval-summary")).to_have_text('look up "ask about everyone\'s orders"')
    await shot(other, "approvals")
    await listed.locator(".approval-note").fill("too broad")
    await listed.locator("button[data-option=deny]").click()
    await expect(listed.locator(".approval-outcome")).to_have_text("✗ denied by admin — too broad")
    await expect(other.locator("#approvals-count")).to_be_hidden()
    await other.close()

    # The chat's card follows the decision made elsewhere, the runner says why it stopped, the count is polled away.
    chat_card = page.locator("#chat-log .approval").nth(1)
    await expect(chat_card).to_have_attribute("data-outcome", "denied")
    await expect(page.locator(".bubble.bot").nth(1)).to_contain_text("Not looked up: denied by admin (too broad).")
    await expect(page.locator(".run-meta").nth(1)).to_contain_text("completed")
    await expect(page.locator("#approvals-count")).to_be_hidden()
    assert [d.outcome for d in Helper.decisions] == ["approved", "denied"]

    # The run page draws the same card from the stored events, already decided.
    await page.locator(".run-meta a").nth(1).click()
    await expect(page.locator("#events .approval")).to_have_attribute("data-outcome", "denied")
    await expect(page.locator("#events .approval .approval-outcome")).to_have_text("✗ denied by admin — too broad")
    await expect(page.locator("#events")).to_contain_text("Not looked up: denied by admin (too broad).")
    await expect(page.locator("#events details.tool")).to_have_count(0)

    assert page.problems == [], page.problems


async def test_a_conversation_id_built_to_look_like_another_shows_what_it_hides(console: Console, page) -> None:  # type: ignore[no-untyped-def]
    """A client names its conversation `invoice<U+202E>txt.exe` (a right-to-left override: it reads as
    "invoiceexe.txt"): the runs list and the run page show the override as an escape, not obeyed (ident)."""
    from playwright.async_api import expect

    result = await console.harness.send("hello", conversation_id="invoice\u202etxt.exe")
    assert result.run.status == "completed"
    await page.goto(console.url)
    await page.fill("#token", console.host.admin_token)
    await page.click("#sign-in button[type=submit]")
    await expect(page.locator("#bots")).to_contain_text("testbot")
    page.problems.clear()  # the browser's own request for /favicon.ico, which the gateway does not serve
    await page.click("nav >> text=Runs")
    row = page.locator("#runs tbody tr")
    await expect(row).to_have_count(1)
    await expect(row.locator("td").nth(3)).to_have_text("invoice\\u202etxt.exe")
    await row.locator("td a").first.click()
    await expect(page.locator("#run-facts [data-fact=Conversation]")).to_have_text("invoice\\u202etxt.exe")
    await expect(page.locator("#events details.tool code").first).to_have_text("lookup")
    assert page.problems == [], page.problems
