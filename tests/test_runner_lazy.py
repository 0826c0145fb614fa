"""The runner process loads its plugin's classes at first use, not at start (issue 8, 6b: idle RSS).

Each test starts `python -m agenthost.runners.sdk serve` as the supervisor does (config line on stdin, handshake on
stdout) for a throwaway distribution written to a temporary site dir, and looks at the process from outside: which
pid imported the plugin (the plugin appends its pid to a file at import) and which shared objects the serving
process has mapped (pydantic-core and Python's _ssl are what an idle process must not hold).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agenthost.protos import runner_pb2, runner_pb2_grpc
from agenthost.protos.wire import CHANNEL_OPTIONS, HANDSHAKE_PREFIX

pytestmark = pytest.mark.slow

PLUGIN = '''
import asyncio, os, ssl, sys
from agenthost.runners.sdk import Runner, RunnerManifest, events, hookimpl

with open(os.environ["LAZYPLUG_MARKS"], "a") as f:
    f.write(f"{os.getpid()}\\n")
FAULT = os.environ.get("LAZYPLUG_FAULT", "")
if FAULT == "import_error":
    raise ImportError("lazyplug is broken")
if FAULT == "exit":
    sys.exit(9)
if FAULT == "print":
    print("not a handshake", flush=True)


class Lazy(Runner):
    manifest = RunnerManifest(name="lazy", description="DESCRIPTION", config_schema={"type": "object"})

    async def setup(self):
        if FAULT == "setup":
            raise RuntimeError("setup refused")

    def validate_config(self, config):
        return ["n must be even"] if config.get("n", 0) % 2 else []

    async def run(self, run):
        yield events.text(f"pid={os.getpid()} ")
        if run.text == "tls":
            yield events.text(await tls_round_trip())
        if run.text == "park":
            await asyncio.sleep(3600)
        if run.text == "httpx":
            import httpx  # what a model client imports

            yield events.text(" ".join(m for m in ("httpx", "click", "pygments") if m in sys.modules))
        if run.text == "pydantic-plugins":
            loader = sys.modules.get("pydantic.plugin._loader")
            yield events.text("scanned" if getattr(loader, "_plugins", None) is not None else "not scanned")


async def tls_round_trip():
    """A TLS echo through asyncio's own ssl support, both ends in this process, over loopback."""
    cert, key = os.environ["LAZYPLUG_CERT"], os.environ["LAZYPLUG_KEY"]
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)

    async def echo(reader, writer):
        writer.write(await reader.readline())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=ssl.create_default_context(cafile=cert), server_hostname="localhost"
    )
    writer.write(b"over tls\\n")
    line = await reader.readline()
    version = writer.get_extra_info("ssl_object").version()
    writer.close()
    server.close()
    return line.decode().strip() + " " + version


@hookimpl
def agenthost_register_runners(register):
    register(Lazy)
'''


def make_distribution(site: Path) -> Path:
    info = site / "lazyplug-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lazyplug\nVersion: 0.1\nSummary: lazy test\n")
    (info / "entry_points.txt").write_text("[agenthost.runners]\nlazy = lazyplug\n")
    module = site / "lazyplug.py"
    module.write_text(PLUGIN)
    return module


class RunnerProcess:
    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root = root
        self.listen = f"unix:{root / 'r.sock'}"
        self.stderr_path = root / "stderr.log"
        self.env = env
        self.proc: asyncio.subprocess.Process
        self.channel: grpc.aio.Channel | None = None

    async def start(self) -> str:
        """Starts the process and returns its first stdout line ('' if it exited first)."""
        config = {
            "plugin_id": "lazyplug",
            "distribution": "lazyplug",
            "listen": self.listen,
            "host": f"unix:{self.root / 'no-host.sock'}",  # the runs here never call the run API
            "secret": "s" * 32,
            "data_dir": str(self.root / "data"),
        }
        self.stderr = open(self.stderr_path, "wb")  # noqa: SIM115 — closed in stop()
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "agenthost.runners.sdk",
            "serve",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env=self.env,
            start_new_session=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write((json.dumps(config) + "\n").encode())
        await self.proc.stdin.drain()
        line = await asyncio.wait_for(self.proc.stdout.readline(), 30)
        return line.decode().strip()

    async def serving(self) -> runner_pb2_grpc.RunnerStub:
        line = await self.start()
        assert line == f"{HANDSHAKE_PREFIX}|1|{self.listen}", (line, self.log())
        self.channel = grpc.aio.insecure_channel(self.listen, options=CHANNEL_OPTIONS)
        status = await health_pb2_grpc.HealthStub(self.channel).Check(
            health_pb2.HealthCheckRequest(service="agenthost.v1.Runner"), timeout=10
        )
        assert status.status == health_pb2.HealthCheckResponse.SERVING
        return runner_pb2_grpc.RunnerStub(self.channel)

    def mapped(self, name: str) -> bool:
        return name in Path(f"/proc/{self.proc.pid}/maps").read_text()

    def log(self) -> str:
        self.stderr.flush()
        return self.stderr_path.read_text(errors="replace")

    async def exit_code(self) -> int:
        return await asyncio.wait_for(self.proc.wait(), 30)

    async def stop(self) -> None:
        if self.channel is not None:
            await self.channel.close()
        if self.proc.returncode is None:
            os.killpg(self.proc.pid, 9)
            await self.proc.wait()
        self.stderr.close()


@pytest.fixture
async def plugin(tmp_path) -> AsyncIterator[tuple[Path, dict[str, str], list[RunnerProcess]]]:
    # A short root: unix socket paths are limited to ~107 bytes.
    root = Path(tempfile.mkdtemp(prefix="lazy-", dir="/tmp"))
    site = tmp_path / "site"
    make_distribution(site)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTHOST_", "LAZYPLUG_"))}
    env.update(
        PYTHONPATH=os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]),
        PYTHONUNBUFFERED="1",
        LAZYPLUG_MARKS=str(tmp_path / "imported-by"),
    )
    started: list[RunnerProcess] = []
    yield root, env, started
    for p in started:
        await p.stop()
    shutil.rmtree(root, ignore_errors=True)


def process(plugin: tuple[Path, dict[str, str], list[RunnerProcess]], **env: str) -> RunnerProcess:
    root, base, started = plugin
    p = RunnerProcess(root, {**base, **env})
    started.append(p)
    return p


def importers(env: dict[str, str]) -> list[int]:
    marks = Path(env["LAZYPLUG_MARKS"])
    return [int(line) for line in marks.read_text().split()] if marks.exists() else []


def run_request(text: str, runner: str = "lazy") -> runner_pb2.RunRequest:
    request = runner_pb2.RunRequest(runner_name=runner, run_token="t")
    request.context.run_id = "r1"
    request.context.input.text = text
    request.context.runtime.deadline_at = 4e9
    return request


async def run_texts(stub: runner_pb2_grpc.RunnerStub, text: str) -> tuple[str, list]:
    out, terminal = "", []
    async for batch in stub.Run(run_request(text), timeout=30):
        for event in batch.events:
            kind = event.WhichOneof("kind")
            if kind == "text_delta":
                out += event.text_delta.text
            elif kind in ("completed", "failed"):
                terminal.append(event)
    return out, terminal


async def test_idle_process_holds_no_plugin_code_until_the_first_call(plugin):
    p = process(plugin)
    stub = await p.serving()
    described = await stub.Describe(runner_pb2.DescribeRequest(), timeout=10)
    assert [json.loads(m)["name"] for m in described.manifests_json] == ["lazy"]
    assert json.loads(described.manifests_json[0])["description"] == "DESCRIPTION"
    assert described.sdk_version  # the describe child's agenthost version, without importlib.metadata here
    # Imported once, at start, by a process that is gone; the serving process has neither pydantic nor ssl.
    child = importers(p.env)
    assert len(child) == 1 and child[0] != p.proc.pid
    assert not p.mapped("pydantic_core") and not p.mapped("/_ssl.")
    # An unknown runner is refused without loading anything.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.ValidateConfig(runner_pb2.ValidateConfigRequest(runner_name="nope", config_json="{}"), timeout=10)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert importers(p.env) == child
    # The first call that needs the runner loads it, in the serving process.
    checked = await stub.ValidateConfig(
        runner_pb2.ValidateConfigRequest(runner_name="lazy", config_json='{"n": 1}'), timeout=30
    )
    assert list(checked.problems) == ["n must be even"]
    assert importers(p.env) == [*child, p.proc.pid]
    assert p.mapped("pydantic_core")
    text, terminal = await run_texts(stub, "hi")
    assert text == f"pid={p.proc.pid} " and terminal[0].WhichOneof("kind") == "completed"
    assert importers(p.env) == [*child, p.proc.pid]  # loaded once


OTHER = """
import os
from agenthost.runners.sdk import Runner, RunnerManifest, events, hookimpl

with open(os.environ["LAZYPLUG_MARKS"] + ".other", "a") as f:
    f.write(f"{os.getpid()}\\n")


class Other(Runner):
    manifest = RunnerManifest(name="other")

    def validate_config(self, config):
        return ["other checked it"]


@hookimpl
def agenthost_register_runners(register):
    register(Other)
"""


async def test_a_call_loads_only_the_entry_point_of_the_runner_it_names(plugin, tmp_path):
    # Two entry points, as the built-in plugin has (the local agent, the harness runners): a process serving
    # one runner must not hold the other's modules (issue 26: runner RSS).
    site = tmp_path / "site"
    (site / "lazyplug_other.py").write_text(OTHER)
    (site / "lazyplug-0.1.dist-info" / "entry_points.txt").write_text(
        "[agenthost.runners]\nlazy = lazyplug\nother = lazyplug_other\n"
    )
    p = process(plugin)
    stub = await p.serving()
    described = await stub.Describe(runner_pb2.DescribeRequest(), timeout=10)
    assert sorted(json.loads(m)["name"] for m in described.manifests_json) == ["lazy", "other"]
    other_marks = Path(p.env["LAZYPLUG_MARKS"] + ".other")
    child = importers(p.env)
    assert len(child) == 1 and other_marks.read_text().split() == [str(child[0])]  # the describe child's
    checked = await stub.ValidateConfig(
        runner_pb2.ValidateConfigRequest(runner_name="lazy", config_json='{"n": 1}'), timeout=30
    )
    assert list(checked.problems) == ["n must be even"]
    assert importers(p.env) == [*child, p.proc.pid]
    assert other_marks.read_text().split() == [str(child[0])]
    text, terminal = await run_texts(stub, "hi")
    assert text == f"pid={p.proc.pid} " and terminal[0].WhichOneof("kind") == "completed"
    assert other_marks.read_text().split() == [str(child[0])]
    # The other runner's call loads its entry point, once, in the same process; the first stays loaded.
    for _ in range(2):
        checked = await stub.ValidateConfig(
            runner_pb2.ValidateConfigRequest(runner_name="other", config_json="{}"), timeout=30
        )
        assert list(checked.problems) == ["other checked it"]
    assert other_marks.read_text().split() == [str(child[0]), str(p.proc.pid)]
    assert importers(p.env) == [*child, p.proc.pid]


async def test_concurrent_first_runs_share_one_load(plugin):
    p = process(plugin)
    stub = await p.serving()
    results = await asyncio.gather(*(run_texts(stub, "hi") for _ in range(5)))
    assert all(t[1][0].WhichOneof("kind") == "completed" for t in results)
    assert importers(p.env).count(p.proc.pid) == 1


@pytest.fixture
def certificate(tmp_path) -> tuple[Path, Path]:
    """A throwaway self-signed certificate for localhost and its key."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("needs the openssl CLI to make a throwaway certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


async def test_asyncio_tls_works_after_the_deferred_ssl_is_restored(plugin, certificate):
    cert, key = certificate
    p = process(plugin, LAZYPLUG_CERT=str(cert), LAZYPLUG_KEY=str(key))
    stub = await p.serving()
    assert not p.mapped("/_ssl.")
    text, terminal = await run_texts(stub, "tls")
    assert terminal[0].WhichOneof("kind") == "completed", (terminal, p.log())
    assert text.endswith("over tls TLSv1.3"), text


@pytest.mark.parametrize(
    ("fault", "code", "said"),
    [
        ("import_error", 3, "lazyplug is broken"),
        ("exit", 9, ""),
    ],
)
async def test_a_plugin_that_no_longer_imports_fails_the_start(plugin, fault, code, said):
    p = process(plugin, LAZYPLUG_FAULT=fault)
    assert await p.start() == ""  # no handshake
    assert await p.exit_code() == code
    assert said in p.log()


async def test_a_print_at_import_still_breaks_the_handshake(plugin):
    """What the plugin prints at import reaches stdout ahead of the handshake, as when it was imported in place,
    so the supervisor reports it ('unrecognized handshake line') instead of it going unnoticed."""
    p = process(plugin, LAZYPLUG_FAULT="print")
    assert await p.start() == "not a handshake"


async def test_a_runner_that_cannot_load_fails_the_call_and_ends_the_process(plugin):
    p = process(plugin, LAZYPLUG_FAULT="setup")
    stub = await p.serving()  # setup has not run yet: the start succeeds
    text, terminal = await run_texts(stub, "hi")
    assert text == ""
    assert terminal[0].failed.code == "runner_unavailable"
    assert "RuntimeError: setup refused" in terminal[0].failed.message
    # A fresh process is the only clean retry: this one exits and the supervisor starts another.
    assert await p.exit_code() == 4


async def test_a_plugin_changed_on_disk_after_start_is_not_served(plugin, tmp_path):
    p = process(plugin)
    stub = await p.serving()
    module = tmp_path / "site" / "lazyplug.py"
    module.write_text(module.read_text().replace("DESCRIPTION", "SOMETHING ELSE ALTOGETHER"))
    checked = await stub.ValidateConfig(runner_pb2.ValidateConfigRequest(runner_name="lazy", config_json="{}"))
    assert len(checked.problems) == 1 and "differ from those this process described" in checked.problems[0]
    assert await p.exit_code() == 4


async def test_eager_switch_loads_at_start(plugin):
    p = process(plugin, AGENTHOST_RUNNER_EAGER="1")
    await p.serving()
    assert importers(p.env) == [p.proc.pid]
    assert p.mapped("pydantic_core")


async def test_eager_setup_failure_fails_the_start(plugin):
    p = process(plugin, AGENTHOST_RUNNER_EAGER="1", LAZYPLUG_FAULT="setup")
    assert await p.start() == ""
    assert await p.exit_code() == 4
    assert "setup refused" in p.log()


def test_only_asyncio_learns_that_ssl_is_missing():
    """Every module the idle process imports while ssl is deferred and that imports ssl itself must be one that
    `restore_ssl` repairs; a new one (http.client, say) would keep believing there is no ssl after the load."""
    code = textwrap.dedent(
        """
        import json
        from agenthost.runners.sdk import lean
        assert lean.defer_ssl()
        import asyncio, grpc
        import agenthost.runners.sdk.server, agenthost.runners.sdk.__main__
        from grpc_health.v1 import health
        print(json.dumps(lean.modules_without_ssl()))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    found = json.loads(out.stdout)
    assert "asyncio.sslproto" in found  # the probe sees what it is meant to see
    assert all(name.startswith("asyncio.") for name in found), found


# Imported by a run only when it needs them (a tool call's arguments checked, a malformed argument text repaired):
# a runner process that loads the built-in plugin's classes must not hold them (issue 26: runner RSS).
RUN_TIME_ONLY = ("jsonschema", "json_repair")


def test_loading_the_built_in_runners_imports_nothing_only_a_run_may_need():
    code = textwrap.dedent(
        f"""
        import json, sys
        from agenthost.runners.sdk.__main__ import _runner_classes
        assert len(_runner_classes("agenthost")) >= 3  # the local agent and the harness runners
        held = [m for m in {RUN_TIME_ONLY!r} if m in sys.modules]
        import asyncio
        from agenthost.runners.local_agent.messages import ToolCall
        from agenthost.runners.local_agent.providers.tool_args import repair_arguments
        from agenthost.runners.local_agent.tools.base import ToolRegistry
        from agenthost.runners.local_agent.tools.todo import TodoWrite
        registry = ToolRegistry([TodoWrite()])  # what every run of the local agent builds, tools called or not
        built = [m for m in {RUN_TIME_ONLY!r} if m in sys.modules]
        call = ToolCall(id="c1", name="todo_write", arguments='{{"items": 3}}')
        refused = asyncio.run(registry.run(call, None)).content  # arguments checked before anything reads ctx
        repair_arguments("{{'a': True,}}")
        print(json.dumps([held, built, [m for m in {RUN_TIME_ONLY!r} if m in sys.modules], refused]))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    held, built, after_use, refused = json.loads(out.stdout)
    assert held == []
    assert built == []  # a run that calls no tool (a plain chat turn) does not import jsonschema either
    assert after_use == list(RUN_TIME_ONLY)  # the probe sees them once a run uses them
    assert refused.startswith("error: invalid arguments at items: ")  # checked at the call, as before


async def test_a_runner_importing_httpx_does_not_hold_its_command_line_client(plugin):
    """httpx's __init__ tries its CLI (click, pygments: ~2.5 MiB); a runner process never runs it (issue 26)."""
    p = process(plugin)
    stub = await p.serving()
    text, terminal = await run_texts(stub, "httpx")
    assert terminal[0].WhichOneof("kind") == "completed"
    assert text == f"pid={p.proc.pid} httpx"


async def test_a_runner_process_does_not_scan_every_distribution_for_pydantic_plugins(plugin):
    """pydantic reads every installed distribution's entry points for its plugins when it builds the first model (the
    manifest): ~1 MiB and tens of ms of CPU in every runner process (issue 26). Not in a runner process."""
    p = process(plugin)
    stub = await p.serving()
    text, terminal = await run_texts(stub, "pydantic-plugins")
    assert terminal[0].WhichOneof("kind") == "completed"
    assert text == f"pid={p.proc.pid} not scanned"


@pytest.mark.parametrize("in_flight", [False, True])
async def test_lifeline_eof_ends_the_process(plugin, in_flight):
    """The host's end of stdin closing (the host died) ends the process, idle or with a run streaming; the loop
    watches the pipe now, not a thread."""
    p = process(plugin)
    stub = await p.serving()
    if in_flight:
        call = stub.Run(run_request("park"), timeout=30)
        await call.read()  # the first batch: the runner is loaded and the run waits, in flight
    assert p.proc.stdin is not None
    p.proc.stdin.close()
    assert await p.exit_code() == 0


@pytest.mark.parametrize(
    ("module", "kind"), [("agenthost.runners.sdk", "runner"), ("agenthost.channels.sdk", "channel")]
)
def test_a_bad_configuration_line_ends_either_kind_with_code_2(module: str, kind: str) -> None:
    """Both SDKs' serve read their line through plugin_process.start: a key that is not a string is said and exit 2."""
    out = subprocess.run(
        [sys.executable, "-m", module, "serve"], input='{"plugin_id": 1}\n', capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2, out.stderr
    assert f"agenthost {kind}: bad configuration line on stdin: KeyError('plugin_id')" in out.stderr


def test_trim_heap_returns_freed_memory_to_the_kernel():
    """What a runner process's load and runs free is handed back when it goes idle (issue 26: runner RSS)."""
    code = textwrap.dedent(
        """
        import json
        from agenthost.runners.sdk import lean

        def anon():
            status = open("/proc/self/status").read()
            return int(status.split("RssAnon:")[1].split()[0]) / 1024

        assert lean.tune_malloc()
        # ~50 MiB of blocks malloc serves from its heap (above pymalloc's 512 bytes, below the mmap threshold)
        garbage = [bytes(1000) + bytes([i % 256]) for i in range(50_000)]
        pin = bytes(1000) + b"pin"  # a live block at the top of the heap: free() alone cannot shrink it
        del garbage
        held = anon()
        lean.trim_heap()
        print(json.dumps([held, anon()]))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    held, trimmed = json.loads(out.stdout)
    assert held - trimmed > 20, (held, trimmed)
