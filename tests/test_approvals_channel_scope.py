"""A channel adapter's credential, and a send key not granted all conversations, decides only approvals of the runs
it started itself: not those of runs the CLI, a script or another channel started on the same bot. The adapter is
untrusted (a plugin; anyone on its chat platform drives it), as is an application holding a send key, and a press in
one chat must not approve a tool call someone else is waiting on."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agenthost.host.access.credentials import CHANNEL_PREFIX
from agenthost.host.api.client import HostClient
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.sdk.testing import HostHarness
from tests.test_approvals import Asker, Stream, decide

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[HostHarness]:
    async with HostHarness(tmp_path, runners=[Asker]) as harness:
        yield harness


def _channel_client(h: HostHarness, name: str, prefix: str = CHANNEL_PREFIX) -> HostClient:
    # What Channels does at each adapter start: a `send` credential for the channel's bot alone (or, with no prefix,
    # what `agenthost credentials create NAME --bot BOT` makes for an application).
    # A channel's chats are `tg:` (Telegram's) or `<channel name>:` (Channels' chat_prefix): `<name>:` for both here.
    channel = prefix == CHANNEL_PREFIX
    _, token = h.host.credentials.create(
        prefix + name, "send", [h.host.registry.bot(h.bot).bot_id], replace=channel, chats=f"{name}:" if channel else ""
    )
    return HostClient(h.host.admin_address, token=token)


@pytest.mark.parametrize("prefix", [CHANNEL_PREFIX, ""], ids=["channel", "send-key"])
async def test_a_channel_decides_only_approvals_of_its_own_runs(h: HostHarness, prefix: str) -> None:
    async with _channel_client(h, "tg", prefix) as tg, _channel_client(h, "slack", prefix) as slack:
        from_cli = Stream(h.client, h.bot, {}, conversation="ops")
        sep = ":" if prefix else "-"  # a chat's conversation name (tg:1) is a channel's to start, never a key's
        from_tg = Stream(tg, h.bot, {}, conversation=f"tg{sep}1")
        from_slack = Stream(slack, h.bot, {}, conversation=f"slack{sep}1")
        (req_cli,) = await from_cli.wait_for("approval_requested")
        (req_tg,) = await from_tg.wait_for("approval_requested")
        (req_slack,) = await from_slack.wait_for("approval_requested")

        listed = (await tg.call("ListApprovals", hpb.ListApprovalsRequest())).approvals
        assert [a.approval_id for a in listed] == [req_tg.approval_id]
        listed = (await tg.call("ListApprovals", hpb.ListApprovalsRequest(bot=h.bot))).approvals
        assert [a.approval_id for a in listed] == [req_tg.approval_id]
        by_run = hpb.ListApprovalsRequest(run_id=from_cli.started.run_id)
        assert list((await tg.call("ListApprovals", by_run)).approvals) == []
        for other in (req_cli, req_slack):  # another's approval does not exist to it, as another bot's does not
            with pytest.raises(errors.NotFound):
                await decide(tg, other.approval_id, "approve")
        pending = (await h.client.call("ListApprovals", hpb.ListApprovalsRequest())).approvals
        assert sorted(a.approval_id for a in pending) == sorted(r.approval_id for r in (req_cli, req_tg, req_slack))

        assert (await decide(tg, req_tg.approval_id, "approve")).resolved.decided_by == prefix + "tg"
        assert (await decide(slack, req_slack.approval_id, "deny")).status == "denied"
        await decide(h.client, req_cli.approval_id, "deny")
        with pytest.raises(errors.NotFound):  # decided: still not its to know about ("already denied" would tell)
            await decide(tg, req_cli.approval_id, "approve")
        with pytest.raises(errors.FailedPrecondition):
            await decide(tg, req_tg.approval_id, "deny")  # its own, decided once
        assert (await from_tg.finished()).text == f"approved:True:{prefix}tg:"
        assert (await from_slack.finished()).text == f"denied:False:{prefix}slack:"
        assert (await from_cli.finished()).text == "denied:False:admin:"


async def test_a_channel_restarted_with_a_fresh_token_still_decides_its_runs(h: HostHarness) -> None:
    """The host rotates a channel's token at every start; the runs the channel started before stay its own."""
    async with _channel_client(h, "tg") as before:
        s = Stream(before, h.bot, {}, conversation="tg:7")
        (req,) = await s.wait_for("approval_requested")
        async with _channel_client(h, "tg") as after:
            assert (await decide(after, req.approval_id, "approve")).status == "approved"
        assert (await s.finished()).text.startswith("approved:True")
