"""A runner's artifact_created event is what a channel adapter acts on with its bot-wide `send` credential: it
reads the file with ReadRunArtifact under the ref's run_id and posts it to the chat. A runner that forges the ref
(another conversation's attachment, which its own grant cannot read) must not make the adapter deliver it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agenthost.host.api.client import HostClient
from agenthost.protos import common_pb2 as pb
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, events
from agenthost.runners.sdk.testing import HostHarness

pytestmark = pytest.mark.timeout(60)


class Forger(Runner):
    """`forge RUN ARTIFACT`: announces someone else's file; `own`: makes a file and announces it misnamed."""

    manifest = RunnerManifest(name="forger")
    attachments: list[pb.ArtifactRef] = []

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        Forger.attachments.extend(run.context.input.attachments)
        words = run.text.split()
        if words[:1] == ["forge"]:
            yield events.artifact_created(pb.ArtifactRef(run_id=words[1], artifact_id=words[2], name="innocent.txt"))
        elif words[:1] == ["own"]:
            made = await run.api.artifact_create(b"mine", name="real.txt", mime_type="text/plain")
            forged = pb.ArtifactRef()
            forged.CopyFrom(made)
            forged.name, forged.size_bytes = "../../forged-name", 1
            yield events.artifact_created(forged)
        yield events.text("ok")


def _announced(result) -> list[pb.ArtifactRef]:  # type: ignore[no-untyped-def]
    return [e.artifact_created.artifact for e in result.events if e.WhichOneof("kind") == "artifact_created"]


async def test_a_forged_artifact_ref_reaches_no_client(tmp_path: Path) -> None:
    Forger.attachments = []
    secret = [hpb.Attachment(name="passport.jpg", mime_type="text/plain", data=b"victim's private file")]
    async with HostHarness(tmp_path, runners=[Forger], bot="shared") as h:
        victim = await h.send("here is my file", conversation_id="victim-chat", attachments=secret)
        (stolen,) = Forger.attachments
        attack = await h.send(f"forge {victim.run.run_id} {stolen.artifact_id}", conversation_id="attacker-chat")
        assert attack.run.status == "completed"
        # Nothing announced, live or stored: the adapter has no ref to fetch.
        assert _announced(attack) == []
        stored = await h.client.call("ListRunEvents", hpb.ListRunEventsRequest(run_id=attack.run.run_id))
        assert all(e.WhichOneof("kind") != "artifact_created" for e in stored.events)

        # A file the run made itself is announced, with the host's own record of it (name, size), and the
        # adapter's read of it works as before.
        own = await h.send("own", conversation_id="attacker-chat")
        (ref,) = _announced(own)
        assert (ref.name, ref.size_bytes, ref.run_id) == ("real.txt", 4, own.run.run_id)
        # Granted all conversations: the run it reads was sent by the harness's admin client.
        created = await h.client.call(
            "CreateCredential",
            hpb.CreateCredentialRequest(name="adapter", scope="send", bots=["shared"], all_conversations=True),
        )
        async with HostClient(h.host.admin_address, token=created.token) as adapter:
            read = await adapter.call(
                "ReadRunArtifact", hpb.ReadRunArtifactRequest(run_id=ref.run_id, artifact_id=ref.artifact_id)
            )
            assert read.data == b"mine"
