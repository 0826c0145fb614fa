"""`agenthost models`: what the providers of each binding offer, asked of the binding's own runner (the host knows
no provider; a runner's ListModels does, like its ValidateConfig).

A runner is untrusted: its answer is cut to size and any failure (the call, the runner's own error) becomes the
binding's error text, so one broken plugin does not hide the others' lists."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from agenthost.protos import errors, runner_pb2
from agenthost.protos import host_pb2 as hpb
from agenthost.protos.text import UNSAFE_IN_A_LINE

if TYPE_CHECKING:
    from agenthost.host.access.keys import KeyStore
    from agenthost.host.processes.supervisor import Supervisor
    from agenthost.host.store.registry import Registry

# Above the runner's own bound (agenthost.runners.sdk.server.LIST_MODELS_TIMEOUT), which answers with the reason.
LIST_MODELS_TIMEOUT = 25.0
MAX_ENTRIES = 2_000
MAX_FIELD_CHARS = 300
MAX_ERROR_CHARS = 500
# Bindings asked at once: each is a runner call that may wait on a remote provider.
CONCURRENCY = 8


def _clip(text: str, limit: int = MAX_FIELD_CHARS) -> str:
    # Shown in a terminal: control characters from a runner could rewrite what the user sees.
    cleaned = UNSAFE_IN_A_LINE.sub("?", text[:limit])
    return cleaned + ("…" if len(text) > limit else "")


def _entry(raw: runner_pb2.ModelEntry) -> runner_pb2.ModelEntry:
    return runner_pb2.ModelEntry(
        provider=_clip(raw.provider),
        model=_clip(raw.model),
        base_url=_clip(raw.base_url),
        error=_clip(raw.error, MAX_ERROR_CHARS),
    )


async def binding_models(supervisor: Supervisor, keys: KeyStore, binding: hpb.Binding) -> hpb.BindingModels:
    import grpc

    out = hpb.BindingModels(bot_id=binding.bot_id, binding_id=binding.binding_id, runner_id=binding.runner_id)
    plugin_id, _, runner_name = binding.runner_id.partition("/")
    try:
        secrets = keys.resolve(list(binding.resource_policy.keys))
    except errors.FailedPrecondition as exc:
        out.error = exc.message
        return out
    pp = supervisor.processes.get(plugin_id)
    if pp is None or pp.state != "ready" or pp.stub is None:
        out.error = f"plugin not running ({pp.state if pp else 'not installed or disabled'})"
        return out
    request = runner_pb2.ListModelsRequest(runner_name=runner_name, config_json=binding.config_json, secrets=secrets)
    try:
        response = await pp.stub.ListModels(request, timeout=LIST_MODELS_TIMEOUT)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.UNIMPLEMENTED:  # a plugin built on an SDK older than the hook
            out.error = "this runner's SDK cannot list models"
        else:
            out.error = _clip(f"{exc.code().name}: {exc.details() or ''}", MAX_ERROR_CHARS)
        return out
    out.models.extend(_entry(m) for m in response.models[:MAX_ENTRIES])
    if response.error:
        out.error = _clip(response.error, MAX_ERROR_CHARS)
    return out


async def list_models(
    registry: Registry, supervisor: Supervisor, keys: KeyStore, bot: str = ""
) -> hpb.ListModelsAdminResponse:
    bots = [registry.bot(bot)] if bot else registry.bots()
    bindings = [b for each in bots for b in registry.bindings(each.bot_id)]
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(binding: hpb.Binding) -> hpb.BindingModels:
        async with gate:
            return await binding_models(supervisor, keys, binding)

    return hpb.ListModelsAdminResponse(bindings=await asyncio.gather(*(one(b) for b in bindings)))
