"""ReadRunArtifact, the one door this feature adds to the admin surface: a `send` credential reads the files its
own bots' runs made or were sent with (so an adapter can deliver them), and nothing else — not another bot's, not
another run's, even of its own bot."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Scripted

from agenthost.host.api.client import HostClient
from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.sdk.testing import HostHarness

pytestmark = pytest.mark.timeout(60)


def _made(result) -> list[pb.ArtifactRef]:  # type: ignore[no-untyped-def]
    return [e.artifact_created.artifact for e in result.events if e.WhichOneof("kind") == "artifact_created"]


async def test_send_credential_reads_only_what_its_runs_made(tmp_path: Path) -> None:
    Scripted.seen = []
    files = [hpb.Attachment(name="note.txt", mime_type="text/plain", data=b"x" * 5000)]
    async with HostHarness(tmp_path, runners=[Scripted], bot="mine") as h:
        await h.client.call("CreateBot", hpb.CreateBotRequest(name="theirs"))
        await h.client.bind("theirs", "test/scripted")
        theirs = await h.client.send("theirs", "files", attachments=files)
        mine = await h.client.send("mine", "files", attachments=files)
        other_mine = await h.client.send("mine", "more files", attachments=files)
        # Granted all conversations: it reads the admin's runs; the walls under test are the bot's and the run's.
        created = await h.client.call(
            "CreateCredential",
            hpb.CreateCredentialRequest(name="adapter", scope="send", bots=["mine"], all_conversations=True),
        )
        async with HostClient(h.host.admin_address, token=created.token) as c:

            async def read(run: str, artifact: str, offset: int = 0, length: int = 0) -> hpb.ReadRunArtifactResponse:
                request = hpb.ReadRunArtifactRequest(run_id=run, artifact_id=artifact, offset=offset, length=length)
                return await c.call("ReadRunArtifact", request)

            own = _made(mine)[0]
            whole = await read(mine.run.run_id, own.artifact_id)
            assert whole.data == b"x" * 5000 and whole.eof and whole.artifact.name == "back-note.txt"
            part = await read(mine.run.run_id, own.artifact_id, offset=4000, length=600)
            assert len(part.data) == 600 and not part.eof
            with pytest.raises(errors.NotFound):  # another bot's run does not exist for this credential
                await read(theirs.run.run_id, _made(theirs)[0].artifact_id)
            with pytest.raises(errors.NotFound):  # another bot's artifact through one's own run
                await read(mine.run.run_id, _made(theirs)[0].artifact_id)
            with pytest.raises(errors.NotFound):  # another run's artifact, same bot
                await read(mine.run.run_id, _made(other_mine)[0].artifact_id)
            # The files sent with the run's own message are the run's too (the caller sent those bytes) …
            assert (await read(mine.run.run_id, Scripted.seen[1].attachments[0].artifact_id)).data == b"x" * 5000
            with pytest.raises(errors.NotFound):  # … another message's are not
                await read(mine.run.run_id, Scripted.seen[2].attachments[0].artifact_id)
            with pytest.raises(errors.NotFound):
                await read(mine.run.run_id, "")
            for offset, length in ((-1, 10), (0, 5 * 1024 * 1024), (9000, 10)):
                with pytest.raises(errors.OutOfRange):
                    await read(mine.run.run_id, own.artifact_id, offset, length)
