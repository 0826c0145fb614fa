"""Test a runner against a real host, in process. Also registered as a pytest plugin (fixture `agenthost_harness`).

    async with HostHarness(tmp_path, runners=[MyRunner]) as h:
        result = await h.send("hello")              # through the real AgentHost gRPC API
        assert result.run.status == "completed"

The host is the real one (stores, grants, run API, orchestration); the runner classes are served by the real
SDK server on a unix socket in the same process, attached to the host as plugin `test`. With `builtin=True`
the host also supervises agenthost's built-in runners as real subprocesses (plugin `agenthost`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from agenthost.host.api.client import HostClient, SendResult
from agenthost.host.processes.supervisor import SupervisorPolicy
from agenthost.host.server import Host
from agenthost.host.store.registry import PluginRecord
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.sdk.runner import Runner
from agenthost.runners.sdk.server import serve

TEST_PLUGIN = "test"


class HostHarness:
    def __init__(
        self,
        data_dir: Path,
        *,
        runners: Sequence[type[Runner]] = (),
        config: dict[str, Any] | None = None,
        bot: str = "testbot",
        builtin: bool = False,
        policy: SupervisorPolicy | None = None,
        host_options: dict[str, Any] | None = None,
    ) -> None:
        """`host_options` go to agenthost.host.server.Host (log_level, metrics_address, tracing, ...)."""
        self.data_dir = Path(data_dir)
        self.runner_classes = {cls.manifest.name: cls for cls in runners}
        self.config = config or {}
        self.bot = bot
        self.host = Host(self.data_dir / "host", policy=policy, builtin_plugins=builtin, **(host_options or {}))
        self._stop = asyncio.Event()
        self._serve_task: asyncio.Task[None] | None = None
        self.client: HostClient

    async def __aenter__(self) -> HostHarness:
        await self.host.start()
        self.client = HostClient(self.host.admin_address, token=self.host.admin_token)
        await self.client.call("CreateBot", hpb.CreateBotRequest(name=self.bot))
        if self.runner_classes:
            await self._attach()
            first = next(iter(self.runner_classes))
            await self.client.bind(self.bot, f"{TEST_PLUGIN}/{first}", self.config)
        return self

    async def _attach(self) -> None:
        address = f"unix:{self.host.runtime_dir / 'test-runner.sock'}"
        secret = self.plugin_secret = secrets.token_urlsafe(32)
        ready = asyncio.Event()
        self._serve_task = asyncio.create_task(
            serve(
                self.runner_classes,
                plugin_id=TEST_PLUGIN,
                listen=address,
                host_address=self.host.api_address,
                plugin_secret=secret,
                data_dir=self.data_dir / "runner-data",
                ready=ready,
                stop=self._stop,
            )
        )
        await asyncio.wait_for(ready.wait(), 10)
        manifests = {name: cls.manifest for name, cls in self.runner_classes.items()}
        await self.host.registry.put_plugin(
            PluginRecord(
                plugin_id=TEST_PLUGIN,
                distribution=TEST_PLUGIN,
                version="0",
                source="in-process",
                builtin=False,
                enabled=True,
                python="",
                manifests_json=json.dumps([m.model_dump(mode="json") for m in manifests.values()]),
                description="runners under test",
            )
        )
        await self.host.supervisor.attach(TEST_PLUGIN, address, secret, manifests)

    async def __aexit__(self, *exc: Any) -> None:
        await self.client.close()
        await self.host.stop()
        self._stop.set()
        if self._serve_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._serve_task, 10)

    async def send(
        self, text: str, *, conversation_id: str = "default", bot: str | None = None, **fields: Any
    ) -> SendResult:
        return await self.client.send(bot or self.bot, text, conversation_id=conversation_id, **fields)

    async def bind(self, runner_id: str, config: dict[str, Any] | None = None, **kwargs: Any) -> hpb.Binding:
        """Adds another binding to the harness's bot (e.g. a built-in runner with a higher priority)."""
        return await self.client.bind(self.bot, runner_id, config, **kwargs)


@pytest.fixture
async def agenthost_harness(tmp_path: Path) -> AsyncIterator[type[HostHarness]]:
    """Yields a factory: `async with agenthost_harness(runners=[MyRunner]) as h: ...` rooted in tmp_path."""

    def factory(**kwargs: Any) -> HostHarness:
        return HostHarness(tmp_path, **kwargs)

    yield factory  # type: ignore[misc]
