"""Wire limits on api.sock: one abusive local client must not deny service to live runs.

The attacker is a separate process (any local user's process can connect to the socket's directory if it can
reach it; a plugin can too) that opens thousands of calls and never sends a message. Against a real host in
process, with a real runner, the test checks the attacker's statuses and that a legitimate run completes
while the attack is under way.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from agenthost.host import limits
from agenthost.protos import common_pb2 as pb
from agenthost.protos import run_api_pb2 as api
from agenthost.protos.wire import CHANNEL_OPTIONS
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, RunnerPermissions, events
from agenthost.runners.sdk.testing import HostHarness

pytestmark = pytest.mark.timeout(180)
SERVICE = "/agenthost.v1.AgentRunAPIProxy/"

# Keeps `hold` calls open at once (half uploads, half unary methods whose request never comes), replacing each
# one the host ends, until `total` calls were made or stdin closes; prints the status counts as JSON.
ATTACKER = textwrap.dedent(
    """
    import asyncio, collections, json, sys
    import grpc

    SERVICE = "/agenthost.v1.AgentRunAPIProxy/"

    async def main(address, hold, total, seconds):
        channel = grpc.aio.insecure_channel(address)
        methods = [channel.stream_unary(SERVICE + name) for name in ("ArtifactCreate", "StateGet")]
        codes = collections.Counter()
        made = 0
        stop = asyncio.get_running_loop().time() + seconds

        async def one(i):
            call = methods[i % 2]()
            try:
                await call
                codes["OK"] += 1
            except grpc.RpcError as exc:
                codes[exc.code().name] += 1

        pending = set()
        announced = False
        while made < total and asyncio.get_running_loop().time() < stop:
            while len(pending) < hold and made < total:
                pending.add(asyncio.ensure_future(one(made)))
                made += 1
            if made >= hold and not announced:  # once: on a loaded machine no call may end within the 1 s wait
                print("holding", flush=True)
                announced = True
            done, pending = await asyncio.wait(pending, timeout=1, return_when=asyncio.FIRST_COMPLETED)
        if pending:  # the host must end these too, promptly: none may be left waiting for a message
            done, pending = await asyncio.wait(pending, timeout=30)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        print(json.dumps({"made": made, "codes": codes, "still_open": len(pending)}), flush=True)
        await channel.close()

    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])))
    """
)


class Worker(Runner):
    """A legitimate run touching state and artifacts; or, for "park", hands its context to the test and waits."""

    manifest = RunnerManifest(name="worker", permissions=RunnerPermissions(state_scopes=["run"]))
    parked: asyncio.Queue[RunContext]
    release: asyncio.Event

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        if run.context.input.text == "park":
            await Worker.parked.put(run)
            await Worker.release.wait()
        else:
            await run.api.state_set("run", "k", "v")
            # A burst of calls at once, as a real runner makes them (history, state, artifacts in parallel).
            values = await asyncio.gather(*(run.api.state_get("run", "k") for _ in range(32)))
            assert values == ["v"] * 32
            ref = await run.api.artifact_create(b"legit bytes", name="legit.txt")
            assert await run.api.artifact_read_all(ref.artifact_id) == b"legit bytes"
        yield events.message("done")


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[HostHarness]:
    Worker.parked = asyncio.Queue()
    Worker.release = asyncio.Event()
    async with HostHarness(tmp_path, runners=[Worker]) as h:
        try:
            yield h
        finally:
            Worker.release.set()


@pytest.mark.slow
async def test_idle_unauthenticated_streams_do_not_lock_runners_out(host: HostHarness) -> None:
    hold = 4_200  # more than the host's maximum_concurrent_rpcs (4096)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        ATTACKER,
        host.host.api_address,
        str(hold),
        str(3 * hold),
        "60",
        stdout=subprocess.PIPE,
    )
    try:
        assert (await asyncio.wait_for(proc.stdout.readline(), 60)).strip() == b"holding"
        started = time.monotonic()
        result = await asyncio.wait_for(host.send("work", conversation_id="legit"), 60)
        elapsed = time.monotonic() - started
        report = json.loads(await asyncio.wait_for(proc.stdout.readline(), 90))
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
    assert result.run.status == "completed", result.run.error_message
    assert elapsed < 30
    # Every idle call was refused on its metadata alone, none left hanging for a message it would never get.
    assert report["still_open"] == 0
    # UNAUTHENTICATED from the gate; a burst of thousands at once can also meet gRPC's own admission control
    # (CANCELLED when its pending queue overflows): refused at once too, never held.
    codes = report["codes"]
    assert set(codes) <= {"UNAUTHENTICATED", "CANCELLED"}, codes
    assert codes["UNAUTHENTICATED"] >= report["made"] - 100
    assert report["made"] >= hold
    host.host.audit.flush()
    await host.host.db.flush()
    refused = host.host.db.query("SELECT COUNT(*) FROM audit WHERE outcome = 'UNAUTHENTICATED'")[0][0]
    assert refused >= hold  # refused and audited, not silently dropped


def _md(run: RunContext) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {run.api.run_token}"), ("x-agenthost-plugin", run.api.plugin_secret))


async def test_idle_authenticated_uploads_are_capped_and_timed_out(
    host: HostHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "UPLOAD_HEADER_SECONDS", 1.0)
    monkeypatch.setattr(limits, "MAX_UPLOADS_PER_RUN", 4)
    parked_send = asyncio.ensure_future(host.send("park", conversation_id="p"))
    run = await asyncio.wait_for(Worker.parked.get(), 10)
    async with grpc.aio.insecure_channel(host.host.api_address, options=CHANNEL_OPTIONS) as channel:
        create = channel.stream_unary(SERVICE + "ArtifactCreate")

        async def idle() -> tuple[grpc.StatusCode, float]:
            t0 = time.monotonic()
            try:
                await create(metadata=_md(run), timeout=30)
            except grpc.RpcError as exc:
                return exc.code(), time.monotonic() - t0
            return grpc.StatusCode.OK, time.monotonic() - t0

        attempts = [asyncio.ensure_future(idle()) for _ in range(10)]
        await asyncio.sleep(0.3)
        # The other conversation's run uploads meanwhile: one run's cap is not the host's.
        other = await asyncio.wait_for(host.send("work", conversation_id="o"), 30)
        outcomes = await asyncio.wait_for(asyncio.gather(*attempts), 30)
    codes = sorted(code.name for code, _ in outcomes)
    assert codes == ["DEADLINE_EXCEEDED"] * 4 + ["RESOURCE_EXHAUSTED"] * 6
    assert all(took < 0.9 for code, took in outcomes if code == grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert other.run.status == "completed", other.run.error_message
    Worker.release.set()
    assert (await asyncio.wait_for(parked_send, 30)).run.status == "completed"
    assert list((host.host.data_dir / "artifacts" / "tmp").iterdir()) == []


async def test_trickling_upload_is_cut_and_leaves_nothing(host: HostHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "UPLOAD_IDLE_SECONDS", 1.0)
    parked_send = asyncio.ensure_future(host.send("park", conversation_id="t"))
    run = await asyncio.wait_for(Worker.parked.get(), 10)
    async with grpc.aio.insecure_channel(host.host.api_address, options=CHANNEL_OPTIONS) as channel:
        call = channel.stream_unary(
            SERVICE + "ArtifactCreate",
            request_serializer=api.ArtifactUpload.SerializeToString,
            response_deserializer=pb.ArtifactRef.FromString,
        )(metadata=_md(run), timeout=30)
        await call.write(api.ArtifactUpload(header=api.ArtifactHeader(run_id=run.run_id, name="slow")))
        await call.write(api.ArtifactUpload(data=b"x" * 1000))
        with pytest.raises(grpc.RpcError) as caught:
            await call  # and then nothing more
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "UPLOAD_IDLE_SECONDS" in caught.value.details()
    assert host.host.db.query("SELECT COUNT(*) FROM artifacts WHERE name = 'slow'")[0][0] == 0
    assert list((host.host.data_dir / "artifacts" / "tmp").iterdir()) == []
    Worker.release.set()
    assert (await asyncio.wait_for(parked_send, 30)).run.status == "completed"


@pytest.mark.e2e
def test_descriptor_soft_limit_is_raised_to_the_hard_limit() -> None:
    probe = textwrap.dedent(
        """
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        from agenthost.host.limits import raise_fd_limit
        result = raise_fd_limit()
        after = resource.getrlimit(resource.RLIMIT_NOFILE)
        print(result == after, after[0] == hard)
        """
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["True", "True"]
