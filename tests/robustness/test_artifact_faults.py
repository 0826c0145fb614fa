"""B7 #14: artifact uploads that hit a full disk or are cut mid-stream leave nothing visible: no row, no object,
no temp file; the caller gets a clear error and the run records it."""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from agenthost.host.store import artifacts as artifact_module
from agenthost.protos import common_pb2 as pb
from agenthost.protos import run_api_pb2 as api
from agenthost.protos import run_api_pb2_grpc
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, events
from agenthost.runners.sdk.testing import HostHarness

from .conftest import Parked

pytestmark = pytest.mark.timeout(60)
MiB = 1024 * 1024


class Uploader(Runner):
    """`<n>`: uploads n bytes as an artifact; a refused upload is not caught, so the run fails with it."""

    manifest = RunnerManifest(name="uploader")

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        ref = await run.api.artifact_create(b"z" * int(run.text), name="big.bin")
        yield events.text(ref.artifact_id)


def nothing_left(h: HostHarness, objects_before: set[Path]) -> None:
    root = h.host.data_dir / "artifacts"
    assert not list((root / "tmp").iterdir()), "a temp file was left behind"
    assert set((root / "objects").rglob("*")) == objects_before, "a partial object became visible"


async def _failed_upload(h: HostHarness, size: int, expect: str) -> None:
    before_rows = len(h.host.db.query("SELECT 1 FROM artifacts"))
    objects = set((h.host.data_dir / "artifacts" / "objects").rglob("*"))
    result = await h.send(str(size))
    assert result.run.status == "failed", result.run
    assert result.run.error_code == "host_resource_exhausted", (result.run.error_code, result.run.error_message)
    assert expect in result.run.error_message
    assert len(h.host.db.query("SELECT 1 FROM artifacts")) == before_rows
    nothing_left(h, objects)
    h.host.audit.flush()
    await h.host.db.flush()
    assert h.host.audit.rows()[-1]["outcome"] == "RESOURCE_EXHAUSTED"


async def test_disk_full_injected(tmp_path, monkeypatch):
    real_fdopen = os.fdopen

    class Full:
        def __init__(self, fh, budget: int) -> None:  # noqa: ANN001
            self.fh, self.budget = fh, budget

        def write(self, data: bytes) -> int:
            self.budget -= len(data)
            if self.budget < 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return self.fh.write(data)

        def __getattr__(self, name: str):  # noqa: ANN204
            return getattr(self.fh, name)

        def __enter__(self):  # noqa: ANN204
            return self

        def __exit__(self, *exc: object) -> None:
            self.fh.close()

    async with HostHarness(tmp_path, runners=[Uploader]) as h:
        tmp_dir = str(h.host.data_dir / "artifacts" / "tmp")

        def fdopen(fd: int, *args: object, **kwargs: object) -> object:
            # os is shared by the whole process: only the artifact store's temp files get the small budget
            fh = real_fdopen(fd, *args, **kwargs)
            if os.readlink(f"/proc/self/fd/{fd}").startswith(tmp_dir):
                return Full(fh, 600 * 1024)
            return fh

        monkeypatch.setattr(artifact_module.os, "fdopen", fdopen)
        await _failed_upload(h, 2 * MiB, "No space left on device")
        monkeypatch.setattr(artifact_module.os, "fdopen", real_fdopen)
        ok = await h.send(str(MiB))
        assert ok.run.status == "completed"


@pytest.mark.e2e
async def test_disk_full_real_filesystem(tmp_path):
    """The same on a real, really full filesystem (a 1 MiB tmpfs under the artifact root); needs mount rights."""
    artifacts_root = tmp_path / "host" / "artifacts"
    artifacts_root.mkdir(parents=True)
    mount = ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(artifacts_root)]
    mounted = subprocess.run(mount, capture_output=True).returncode == 0  # noqa: ASYNC221
    if not mounted:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        async with HostHarness(tmp_path, runners=[Uploader]) as h:
            await _failed_upload(h, 3 * MiB, "No space left on device")
            ok = await h.send(str(256 * 1024))  # the space the failed upload took is free again
            assert ok.run.status == "completed"
    finally:
        subprocess.run(["umount", "-l", str(artifacts_root)], check=False)  # noqa: ASYNC221


async def test_cut_uploads_leave_nothing(tmp_path):
    Parked.live = asyncio.Queue()
    Parked.release = asyncio.Event()
    async with HostHarness(tmp_path, runners=[Parked]) as h:
        send = asyncio.create_task(h.send("park"))
        run = await asyncio.wait_for(Parked.live.get(), 10)
        md = (("authorization", f"Bearer {run.api.run_token}"), ("x-agenthost-plugin", run.api.plugin_secret))
        objects = set((h.host.data_dir / "artifacts" / "objects").rglob("*"))
        rows = len(h.host.db.query("SELECT 1 FROM artifacts"))
        tmp_dir = h.host.data_dir / "artifacts" / "tmp"
        for how in ("cancel", "close channel", "short of declared size"):
            channel = grpc.aio.insecure_channel(h.host.api_address)
            stub = run_api_pb2_grpc.AgentRunAPIProxyStub(channel)
            midway = asyncio.Event()
            hang = asyncio.Event()

            async def parts(
                how: str = how, midway: asyncio.Event = midway, hang: asyncio.Event = hang
            ) -> AsyncIterator[api.ArtifactUpload]:
                size = 4 * 256 * 1024 if how == "short of declared size" else 0
                yield api.ArtifactUpload(header=api.ArtifactHeader(run_id=run.run_id, name="cut", expected_size=size))
                for _ in range(3):
                    yield api.ArtifactUpload(data=b"c" * 256 * 1024)
                midway.set()
                if how != "short of declared size":
                    await hang.wait()  # never ends on its own: the cut does it

            call = stub.ArtifactCreate(parts(), metadata=md, timeout=20)
            if how == "short of declared size":
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            else:
                await asyncio.wait_for(midway.wait(), 10)
                for _ in range(100):  # the host is holding a temp file for the upload
                    if list(tmp_dir.iterdir()):
                        break
                    await asyncio.sleep(0.01)
                if how == "cancel":
                    call.cancel()
                else:
                    await channel.close()
            hang.set()
            for _ in range(200):
                if not list(tmp_dir.iterdir()):
                    break
                await asyncio.sleep(0.01)
            await h.host.db.flush()
            assert len(h.host.db.query("SELECT 1 FROM artifacts")) == rows, how
            nothing_left(h, objects)
            await channel.close()
        # the run can still upload afterwards
        ref = await run.api.artifact_create(b"fine", name="ok")
        assert await run.api.artifact_read_all(ref.artifact_id) == b"fine"
        Parked.release.set()
        assert (await send).run.status == "completed"
