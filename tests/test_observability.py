"""Host logs, metrics and traces: what they say about runs, plugins and refusals, what they never say (secrets),
how much disk they may take, and the `agenthost logs` command that reads them."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from agenthost.host.ops import logs
from agenthost.host.ops.logs import RefusalLimiter, RotatingFile
from agenthost.host.ops.metrics import Metrics
from agenthost.host.ops.tracing import Tracing
from agenthost.plugins.manifest import RunnerManifest
from agenthost.protos import common_pb2 as pb
from agenthost.protos import host_pb2 as hpb
from agenthost.protos import run_api_pb2 as api_pb
from agenthost.protos import run_api_pb2_grpc as api_grpc
from agenthost.runners.sdk import events
from agenthost.runners.sdk.runner import RunContext, Runner
from agenthost.runners.sdk.testing import HostHarness

PROVIDER_KEY = "pk-live-0123456789abcdefTHEVALUE"


class Leaky(Runner):
    """Writes a state value (one run-API call), then logs every secret it was handed, and fails or completes."""

    manifest = RunnerManifest(name="leaky")

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        await run.api.state_set("conversation", "seen", run.text)
        # In-process, the runner's logger reaches the host's handlers: the redactor must catch these.
        logging.getLogger("leaky").warning(
            "key=%s tool_token=%s run_token=%s", run.secrets.get("PROVIDER"), run.tool_token, run.api.run_token
        )
        if run.text == "fail":
            yield events.failed("boom", f"failing with {run.secrets.get('PROVIDER')}")
            return
        yield events.text("ok")


def _records(data_dir: Path) -> list[dict]:
    path = data_dir / "logs" / "host.log"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def _scrape(port: int, path: str = "/metrics") -> tuple[str, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = raw.decode().partition("\r\n\r\n")
    return head.split("\r\n", 1)[0], body


def _harness(tmp_path: Path, **host_options) -> HostHarness:
    return HostHarness(
        tmp_path,
        runners=[Leaky],
        host_options={"log_level": logging.INFO, "metrics_address": "127.0.0.1:0", **host_options},
    )


async def _bind_with_key(h: HostHarness) -> None:
    await h.client.call("SetKey", hpb.SetKeyRequest(name="PROVIDER", value=PROVIDER_KEY))
    await h.bind("test/leaky", priority=10, keys=["PROVIDER"])


async def test_run_lifecycle_lines_carry_fields_and_no_secret(tmp_path: Path) -> None:
    async with _harness(tmp_path) as h:
        await _bind_with_key(h)
        ok = await h.send("hello")
        failed = await h.send("fail")
        admin_token = h.host.admin_token
    assert ok.run.status == "completed" and failed.run.status == "failed"
    records = _records(tmp_path / "host")
    started = {r["run_id"]: r for r in records if r["msg"] == "run.started"}
    finished = {r["run_id"]: r for r in records if r["msg"] == "run.finished"}
    assert set(started) >= {ok.run.run_id, failed.run.run_id}
    done = finished[ok.run.run_id]
    assert done["runner"] == "test/leaky" and done["status"] == "completed" and done["error_code"] == ""
    assert done["level"] == "info" and isinstance(done["duration_s"], float) and done["duration_s"] >= 0
    bad = finished[failed.run.run_id]
    assert bad["status"] == "failed" and bad["error_code"] == "boom" and bad["level"] == "warning"
    text = (tmp_path / "host" / "logs" / "host.log").read_text()
    assert "key=[redacted] tool_token=[redacted] run_token=[redacted]" in text
    for secret in (PROVIDER_KEY, admin_token):
        assert secret not in text
    assert not re.search(r"\b(?:rt|tt|ps|adm|cred)_[A-Za-z0-9_-]{20,}", text)  # no token shape survives
    assert oct((tmp_path / "host" / "logs" / "host.log").stat().st_mode & 0o777) == "0o600"


async def test_metrics_endpoint_counts_runs_calls_and_serves_loopback(tmp_path: Path) -> None:
    async with _harness(tmp_path) as h:
        await _bind_with_key(h)
        await h.send("one")
        await h.send("fail")
        server = h.host.metrics_server
        assert server is not None and server.host == "127.0.0.1"
        status, body = await _scrape(server.port)
        missing, _ = await _scrape(server.port, "/other")
    assert status == "HTTP/1.1 200 OK"
    assert missing == "HTTP/1.1 404 Not Found"
    lines = set(body.splitlines())
    assert 'agenthost_runs_total{runner="test/leaky",status="completed"} 1' in lines
    assert 'agenthost_runs_total{runner="test/leaky",status="failed"} 1' in lines
    assert 'agenthost_run_duration_seconds_count{runner="test/leaky"} 2' in lines
    assert 'agenthost_run_duration_seconds_bucket{runner="test/leaky",le="+Inf"} 2' in lines
    assert 'agenthost_run_api_calls_total{method="StateSet",code="OK"} 2' in lines
    assert "agenthost_runs_live 0" in lines
    assert "# TYPE agenthost_db_write_queue_jobs gauge" in lines


async def test_refusals_are_logged_and_rate_limited(tmp_path: Path) -> None:
    async with _harness(tmp_path) as h:
        attempts = logs.REFUSALS_PER_WINDOW + 15
        async with grpc.aio.insecure_channel(h.host.api_address) as channel:
            stub = api_grpc.AgentRunAPIProxyStub(channel)
            for _ in range(attempts):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.StateGet(
                        api_pb.StateGetRequest(run_id="run_x", key="k"),
                        metadata=(("authorization", "Bearer rt_" + "A" * 43),),
                        timeout=5,
                    )
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        async with grpc.aio.insecure_channel(h.host.admin_address) as channel:
            from agenthost.protos import host_pb2_grpc

            with pytest.raises(grpc.aio.AioRpcError) as denied:
                await host_pb2_grpc.AgentHostStub(channel).ListPlugins(
                    hpb.ListPluginsRequest(), metadata=(("authorization", "Bearer adm_wrong"),), timeout=5
                )
            assert denied.value.code() == grpc.StatusCode.UNAUTHENTICATED
        _, body = await _scrape(h.host.metrics_server.port)
    refusals = [r for r in _records(tmp_path / "host") if r["msg"] == "refused"]
    run_api = [r for r in refusals if r["surface"] == "run_api"]
    assert len(run_api) == logs.REFUSALS_PER_WINDOW  # the rest were counted, not written
    assert run_api[0]["code"] == "UNAUTHENTICATED" and run_api[0]["method"] == "StateGet"
    assert [r["code"] for r in refusals if r["surface"] == "admin"] == ["UNAUTHENTICATED"]
    assert "adm_wrong" not in (tmp_path / "host" / "logs" / "host.log").read_text()
    assert f'agenthost_run_api_calls_total{{method="StateGet",code="UNAUTHENTICATED"}} {attempts}' in body


def test_refusal_limiter_reports_what_it_suppressed() -> None:
    limiter = RefusalLimiter(per_window=2, window=10.0)
    assert [limiter.allow("a", now=t)[0] for t in (0, 1, 2, 3)] == [True, True, False, False]
    assert limiter.allow("b", now=4) == (True, 0)  # kinds are counted apart
    assert limiter.allow("a", now=11) == (True, 2)  # the next window says how many were dropped


def test_rotating_file_bounds_disk_use(tmp_path: Path) -> None:
    path = tmp_path / "p.log"
    sink = RotatingFile(path, max_bytes=10_000, backups=2)
    line = b"x" * 99 + b"\n"
    for _ in range(5_000):  # 500 kB written
        sink.write(line)
    sink.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["p.log", "p.log.1", "p.log.2"]
    total = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert total <= 10_000 * 3
    for p in tmp_path.iterdir():
        assert p.read_bytes().endswith(b"\n") and p.stat().st_size <= 10_000  # whole lines, each under the cap


def test_the_host_log_rotates_whole_private_lines_each_formatted_once(tmp_path: Path) -> None:
    """host.log keeps to its cap in whole JSON lines, 0600, and each record is formatted (and so redacted) once:
    the standard handler formatted it twice, a tenth of the host's CPU under a burst of runs."""
    asked: list[int] = []

    def secrets() -> list[str]:  # the redactor asks for the secrets once per line it formats
        asked.append(1)
        return ["s3cret-value-1234"]

    installed = logs.install(tmp_path, logging.INFO, redactor=logs.Redactor(secrets), max_bytes=4_000, backups=2)
    log = logging.getLogger("agenthost.test.rotation")
    try:
        for n in range(200):
            logs.event(log, logging.INFO, "test.line", n=n, key="s3cret-value-1234")
    finally:
        installed.close()
    assert len(asked) == 200
    folder = logs.logs_dir(tmp_path)
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["host.log", "host.log.1", "host.log.2"]
    for p in folder.iterdir():
        assert p.stat().st_mode & 0o777 == 0o600 and p.stat().st_size <= 4_000
        for text in p.read_text().splitlines():
            line = json.loads(text)
            assert line["msg"] == "test.line" and line["key"] == logs.REDACTED
    newest = [json.loads(t)["n"] for t in (folder / "host.log").read_text().splitlines()]
    assert newest[-1] == 199 and newest == list(range(newest[0], 200))


@pytest.mark.e2e
async def test_plugin_stderr_through_the_pipe_is_rotated(tmp_path: Path) -> None:
    """What the supervisor does with a child's stderr: a child writing 2 MB leaves at most the budget on disk."""
    sink = RotatingFile(tmp_path / "plugin.log", max_bytes=64 * 1024, backups=1)
    code = "import sys\nfor i in range(20000):\n    sys.stderr.write(f'{i:08d} ' + 'y' * 90 + '\\n')\n"
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    await asyncio.wait_for(logs.pump(proc.stderr, sink), 30)
    assert await proc.wait() == 0
    sink.close()
    total = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert total <= 2 * 64 * 1024 + logs.PLUGIN_READ_CHUNK
    assert (tmp_path / "plugin.log").read_text().splitlines()[-1].startswith("00019999 ")


@pytest.mark.e2e
async def test_plugin_lifecycle_logged_and_crash_counted(tmp_path: Path) -> None:
    """The built-in plugin as the supervisor runs it: start, ready, a crash (SIGKILL), the restart."""
    async with HostHarness(tmp_path, builtin=True, host_options={"log_level": logging.INFO}) as h:
        pp = await h.host.supervisor.start("agenthost")
        first = pp.proc.pid
        os.killpg(first, signal.SIGKILL)
        async with asyncio.timeout(60):
            await pp.wait_for_state("backoff", "starting")
            await pp.wait_for_state("ready")
        restarts = h.host.observer.metrics.plugin_restarts.get("agenthost")
    names = [(r["msg"], r.get("pid")) for r in _records(tmp_path / "host") if r.get("plugin") == "agenthost"]
    assert ("plugin.starting", first) in names and ("plugin.ready", first) in names
    msgs = [n for n, _ in names]
    crash = msgs.index("plugin.crashed")
    assert msgs[crash + 1] == "plugin.restarting" and "plugin.ready" in msgs[crash + 2 :]
    assert msgs[-1] == "plugin.stopped"
    assert restarts == 1
    assert (tmp_path / "host" / "logs" / "agenthost.log").exists()


def test_breaker_and_restart_lines() -> None:
    """The breaker's line is an error carrying the count and reason; restarts are counted per plugin."""
    from agenthost.host.ops.observability import Observer

    obs = Observer(metrics=Metrics())
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep()
    plugins_log = logging.getLogger("agenthost.host.plugins")
    plugins_log.addHandler(handler)
    previous = plugins_log.level
    plugins_log.setLevel(logging.INFO)
    try:
        obs.plugin_restarting("p", 1, 0.5)
        obs.plugin_breaker_open("p", 6, "crash loop")
    finally:
        plugins_log.removeHandler(handler)
        plugins_log.setLevel(previous)
    assert [r.getMessage() for r in records] == ["plugin.restarting", "plugin.breaker_open"]
    assert records[1].levelno == logging.ERROR and records[1].fields["consecutive_failures"] == 6
    assert obs.metrics.plugin_restarts.get("p") == 1


async def test_spans_per_run_and_per_api_call(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    tracing = Tracing.with_exporter(exporter, batch=False)
    async with _harness(tmp_path, tracing=tracing) as h:
        await _bind_with_key(h)
        result = await h.send("traced")
    spans = exporter.get_finished_spans()
    run_span = next(s for s in spans if s.name == "run test/leaky")
    assert run_span.attributes["agenthost.run_id"] == result.run.run_id
    assert run_span.attributes["agenthost.status"] == "completed"
    call = next(s for s in spans if s.name == "run_api/StateSet")
    assert call.parent is not None and call.parent.span_id == run_span.context.span_id
    assert call.attributes["rpc.grpc.status_code"] == "OK"


def _python_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return env


@pytest.mark.e2e
def test_opentelemetry_not_imported_when_tracing_is_off(tmp_path: Path) -> None:
    code = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from agenthost.host.server import Host\n"
        "async def main():\n"
        f"    host = Host(Path({str(tmp_path / 'd')!r}), builtin_plugins=False, log_level=20)\n"
        "    await host.start()\n"
        "    await host.stop()\n"
        "asyncio.run(main())\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'opentelemetry'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=_python_env(), capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "[]"


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "agenthost.host.cli", *args]


@pytest.mark.e2e
def test_logs_command_prints_the_tail_without_grpc(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    (log_dir / "host.log.1").write_text("".join(f'{{"n": {i}}}\n' for i in range(5)))
    (log_dir / "host.log").write_text('{"n": 5}\n{"n": 6}\n')
    (log_dir / "agenthost.log").write_text("runner said hi\n")
    out = subprocess.run(
        _cli("--data-dir", str(tmp_path), "logs", "-n", "4"), capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ['{"n": 3}', '{"n": 4}', '{"n": 5}', '{"n": 6}']  # across the rotation
    plugin = subprocess.run(
        _cli("--data-dir", str(tmp_path), "logs", "--plugin", "agenthost"), capture_output=True, text=True, timeout=30
    )
    assert plugin.stdout == "runner said hi\n"
    bad = subprocess.run(
        _cli("--data-dir", str(tmp_path), "logs", "--plugin", "../../etc/passwd"), capture_output=True, text=True
    )
    assert bad.returncode == 1 and "not a plugin id" in bad.stderr
    code = (
        "import sys\nfrom agenthost.host.cli import main as cli\n"
        f"cli.main(['--data-dir', {str(tmp_path)!r}, 'logs', '-n', '1'])\n"
        "sys.stderr.write(str(sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'google'))))"
    )
    probe = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert probe.stderr.strip().endswith("[]")


@pytest.mark.e2e
def test_logs_follow_prints_appended_lines_across_rotation(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    path = log_dir / "host.log"
    path.write_text("old\n")
    proc = subprocess.Popen(
        _cli("--data-dir", str(tmp_path), "logs", "--follow", "-n", "1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))

    threading.Thread(target=read, daemon=True).start()
    try:

        def next_line() -> str:
            return lines.get(timeout=20)

        assert next_line() == "old"
        with open(path, "a") as f:
            f.write("appended\n")
        assert next_line() == "appended"
        os.replace(path, log_dir / "host.log.1")  # what rotation does
        path.write_text("after rotation\n")
        assert next_line() == "after rotation"
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.e2e
def test_log_level_flag_and_env_are_checked(tmp_path: Path) -> None:
    env = {**_python_env(), "AGENTHOST_LOG_LEVEL": "loud"}
    out = subprocess.run(
        _cli("--data-dir", str(tmp_path), "serve"), env=env, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 2 and "AGENTHOST_LOG_LEVEL" in out.stderr
    assert logs.parse_level("DEBUG") == logging.DEBUG
    with pytest.raises(ValueError):
        logs.parse_level("verbose")


def test_stderr_lines_wait_for_a_slow_reader_and_past_the_backlog_are_counted_not_blocking() -> None:
    """The handler's writer is stuck in a write (a reader that stopped): emitting does not block; past the backlog
    lines are dropped, and once the stream takes lines again it is told how many."""
    written: list[str] = []
    stuck, first_write = threading.Event(), threading.Event()

    class Stalled:
        def write(self, text: str) -> None:
            first_write.set()
            assert stuck.wait(30)
            written.append(text)

        def flush(self) -> None:
            pass

    handler = logs.StderrHandler(Stalled(), backlog=3)
    handler.setFormatter(logging.Formatter("%(message)s"))
    record = lambda n: logging.LogRecord("t", logging.INFO, __file__, 1, f"line {n}", None, None)  # noqa: E731
    handler.handle(record(0))
    assert first_write.wait(30)  # the writer holds line 0, stuck
    for n in range(1, 11):
        handler.handle(record(n))  # returns at once: 3 wait, 7 are dropped
    assert handler.dropped == 7
    stuck.set()
    handler.close()
    assert written[0] == "line 0\n"
    assert "7 log lines not written here: stderr was not read" in written[1]
    assert written[2:] == ["line 1\n", "line 2\n", "line 3\n"]


@pytest.mark.slow
def test_a_host_whose_stderr_nobody_reads_keeps_answering(tmp_path: Path) -> None:
    """`agenthost serve` with its output on a pipe nobody reads (a stalled log collector): a few hundred runs log far
    more than the pipe's 64 KiB, and the host still answers every send and `status`; host.log has every line."""
    from agenthost.host.api.client import HostClient
    from tests.cli_process import cli_env
    from tests.test_e2e_cli import FAULTY, cli, start_host

    env = cli_env(tmp_path / "h")
    host = start_host(env)  # its stdout and stderr: a pipe this test never reads
    try:
        cli(env, "plugins", "install", FAULTY, "--offline")
        cli(env, "bots", "create", "b")
        cli(env, "bots", "bind", "b", "--runner", "agenthost-faulty/faulty")

        async def send_all() -> list[str]:
            async with HostClient.for_data_dir(Path(env["AGENTHOST_HOME"]), timeout=60) as client:
                gate = asyncio.Semaphore(16)

                async def one(i: int) -> str:
                    async with gate:
                        return (await client.send("b", f"hi {i}", conversation_id=f"c{i % 25}", timeout=60)).run.status

                return await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(400))), 240)

        assert asyncio.run(send_all()) == ["completed"] * 400
        assert "agenthost" in cli(env, "status").stdout
        host_log = (tmp_path / "h" / "logs" / "host.log").read_text()
        assert host_log.count('"msg": "run.finished"') == 400
    finally:
        host.kill()
        host.wait(timeout=30)
