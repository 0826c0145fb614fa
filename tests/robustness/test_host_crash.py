"""kill -9 of the host (a real `agenthost serve` process) mid-run, then a restart on the same data dir.

Guarantees: runner processes exit when their host dies (lifeline), or — if one is too wedged to notice — the next
host's startup sweep kills it; runs in flight are marked interrupted; their tokens are worthless on the new host;
what they had streamed is consistently persisted; the new host serves.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest

from agenthost.protos import common_pb2 as pb
from agenthost.protos import run_api_pb2 as api
from agenthost.protos import run_api_pb2_grpc

from .conftest import FAULTY, ROOT, pid_alive

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture
def env(tmp_path):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC", "OPENAI", "AGENTHOST_TEST"))}
    e["AGENTHOST_HOME"] = str(tmp_path / "home")
    e["AGENTHOST_TEST_LEAK_DIR"] = str(tmp_path / "leak")
    e["AGENTHOST_SANDBOX_RW"] = str(tmp_path / "leak")  # the leak dir is the one thing outside it may write
    (tmp_path / "leak").mkdir()
    return e


def cli(env, *args, check=True, timeout=120):
    proc = subprocess.run(
        [sys.executable, "-m", "agenthost.host.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"agenthost {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


class Served:
    def __init__(self, env, *serve_args):
        self.env = env
        self.home = Path(env["AGENTHOST_HOME"])
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agenthost.host.cli", "serve", *serve_args],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 30
        while time.time() < deadline:
            if (self.home / "host.json").exists() and cli(env, "plugins", "list", check=False).returncode == 0:
                self.info = json.loads((self.home / "host.json").read_text())
                return
            if self.proc.poll() is not None:
                raise AssertionError("host exited at start")
            time.sleep(0.1)
        self.kill()
        raise AssertionError("host did not come up")

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


def leaked(env, timeout=20) -> dict:
    leak = Path(env["AGENTHOST_TEST_LEAK_DIR"])
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = list(leak.glob("run_*.json"))
        if found:
            record = json.loads(found[0].read_text())
            found[0].unlink()
            return record
        time.sleep(0.05)
    raise AssertionError("the run never started")


def replay(api_address: str, record: dict) -> grpc.StatusCode:
    with grpc.insecure_channel(api_address) as channel:
        stub = run_api_pb2_grpc.AgentRunAPIProxyStub(channel)
        md = (("authorization", f"Bearer {record['token']}"), ("x-agenthost-plugin", record["secret"]))
        try:
            stub.StateSet(
                api.StateSetRequest(run_id=record["run_id"], scope=pb.CONVERSATION, key="k", value_json="1"),
                metadata=md,
                timeout=10,
            )
        except grpc.RpcError as exc:
            return exc.code()
        return grpc.StatusCode.OK


def faulty_runner(host_pid: int, inner: int) -> int:
    """The host's pid of the faulty plugin's runner process (which reports its sandbox's pid, `inner`)."""
    for pid in _descendants(host_pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline[0].endswith(b"plugins/agenthost-faulty/env/bin/python"):
            return pid
    raise AssertionError(f"no faulty runner (inner pid {inner}) under {host_pid}")


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_kill9_host_mid_run_and_restart(env):
    host = Served(env)
    senders: list[subprocess.Popen] = []
    stray: list[int] = []
    try:
        cli(env, "plugins", "install", FAULTY, "--offline")
        cli(env, "bots", "create", "b")
        cli(env, "bots", "bind", "b", "--runner", "agenthost-faulty/faulty", "--timeout", "120")

        # 1. a run streaming when the host dies: the runner exits on its own (lifeline EOF)
        senders.append(
            subprocess.Popen(
                [sys.executable, "-m", "agenthost.host.cli", "send", "b", "stream", "--conversation", "a"],
                env=env,
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        a = leaked(env)
        runner_a = faulty_runner(host.proc.pid, a["pid"])
        stray.append(runner_a)
        time.sleep(0.5)  # deltas flowing
        old_api = host.info["api"]
        host.kill()
        assert wait_gone(runner_a, 10), "runner outlived its host"
        assert senders[0].wait(10) != 0

        host = Served(env)
        assert replay(host.info["api"], a) == grpc.StatusCode.UNAUTHENTICATED
        assert replay(old_api, a) in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED)
        interrupted = cli(env, "runs", "list", "--status", "interrupted").stdout
        assert a["run_id"] in interrupted
        lines = cli(env, "runs", "show", a["run_id"], "--events").stdout.splitlines()
        events = [json.loads(line) for line in lines if line.startswith('{"seq"') or '"text_delta"' in line]
        assert events, "nothing the run streamed before the crash was kept"
        assert [int(e["seq"]) for e in events] == list(range(1, len(events) + 1)), "persisted events have gaps"

        # 2. a runner too wedged to notice the lifeline (blocked loop, SIGTERM ignored): its sandbox dies with the
        #    host all the same (bwrap --die-with-parent, then the pid namespace), and the next host interrupts its
        #    run. (Without a sandbox, the startup sweep is what kills such a runner.)
        senders.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "agenthost.host.cli",
                    "send",
                    "b",
                    "stall_ignore_term",
                    "--conversation",
                    "b",
                ],
                env=env,
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        b = leaked(env)
        runner_b = faulty_runner(host.proc.pid, b["pid"])
        stray.append(runner_b)
        time.sleep(0.5)
        host.kill()
        assert wait_gone(runner_b, 10), "a wedged runner outlived its host"
        host = Served(env)
        assert b["run_id"] in cli(env, "runs", "list", "--status", "interrupted").stdout
        assert replay(host.info["api"], b) == grpc.StatusCode.UNAUTHENTICATED
        assert "ok: fine" in cli(env, "send", "b", "fine").stdout
    finally:
        if host.proc.poll() is None:
            host.proc.send_signal(signal.SIGTERM)
            try:
                assert host.proc.wait(20) == 0
            finally:
                host.kill()
        for p in senders:
            if p.poll() is None:
                p.kill()
            p.wait(5)
        for pid in stray:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_kill9_host_leaves_no_gateway_body_parser(env):
    """The gateway parses a large body in a parser process (gateway.bodies): one that outlived a host killed with
    -9 would keep the host's environment and memory for ever, one more each crash."""
    port = _free_port()
    host = Served(env, "--gateway", f"127.0.0.1:{port}")
    parsers: list[int] = []
    try:
        cli(env, "bots", "create", "b")
        key = cli(env, "credentials", "create", "k", "--scope", "send", "--bot", "b").stdout.split()[-1]
        body = json.dumps({"model": "b", "messages": [{"role": "user", "content": "x" * (300 * 1024)}]}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            data=body,
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        with contextlib.suppress(urllib.error.HTTPError):  # parsed, then refused for want of a binding
            urllib.request.urlopen(request, timeout=60).close()
        parsers = [
            p for p in _descendants(host.proc.pid) if b"multiprocessing" in Path(f"/proc/{p}/cmdline").read_bytes()
        ]
        assert parsers, "the large body started no parser process"
        host.kill()
        assert all(wait_gone(p, 30) for p in parsers), "a body parser outlived its host"
    finally:
        host.kill()
        for pid in parsers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
