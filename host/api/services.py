"""What the API surfaces (the admin servicer, the gateway, the console) need of the host, as an interface.

The surfaces sit above the parts they call (runs, stores, processes, keys) and below the server that composes
them: they are handed the `Host` and use it through this Protocol, so nothing here imports the server
(tests/test_layering.py holds that line). `agenthost.host.server.Host` satisfies it structurally."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from agenthost.host.access.credentials import Credentials
    from agenthost.host.access.keys import KeyStore
    from agenthost.host.knowledge import KnowledgeBase
    from agenthost.host.processes.channels import Channels
    from agenthost.host.processes.supervisor import Supervisor
    from agenthost.host.runs.manager import RunManager
    from agenthost.host.store.artifacts import ArtifactStore
    from agenthost.host.store.conversations import Conversations
    from agenthost.host.store.registry import Registry
    from agenthost.host.store.runs import RunStore
    from agenthost.host.workers.hub import WorkerHub
    from agenthost.protos import host_pb2 as hpb


class HostServices(Protocol):
    data_dir: Path
    credentials: Credentials
    keys: KeyStore
    registry: Registry
    conversations: Conversations
    run_store: RunStore
    artifacts: ArtifactStore
    knowledge: KnowledgeBase
    supervisor: Supervisor
    runs: RunManager
    channels: Channels
    workers: WorkerHub | None

    def secret_values(self) -> list[str]: ...

    def plugin_infos(self) -> list[hpb.PluginInfo]: ...

    def status(self) -> hpb.HostStatus: ...

    async def install_plugin(
        self, source: str, *, offline: bool = False, allow_network: bool = False, require_hashes: bool = False
    ) -> hpb.PluginInfo: ...

    async def remove_plugin(self, plugin_id: str) -> None: ...

    async def set_plugin_enabled(self, plugin_id: str, enabled: bool) -> hpb.PluginInfo: ...

    async def create_binding(self, bot_ref: str, binding: hpb.Binding) -> hpb.Binding: ...

    async def update_binding(self, request: hpb.UpdateBindingRequest) -> hpb.Binding: ...
