"""What the providers of a binding config offer (`agenthost models`): one GET per distinct endpoint of the
binding's model and its fallbacks, each answer or failure reported on its own."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from agenthost.runners.local_agent.config import ConfigError, LocalAgentConfig, ModelRoute
from agenthost.runners.local_agent.errors import ProviderError
from agenthost.runners.local_agent.providers import build_provider, primary_route, split_model
from agenthost.runners.local_agent.providers.base import HttpProvider
from agenthost.runners.local_agent.providers.demo import DemoProvider

# A listing is interactive: a provider that has not answered by then is reported as such.
LIST_TIMEOUT = 8.0
# OpenRouter lists a few hundred; anything far beyond that is a server misbehaving, not a catalogue.
MAX_MODELS_PER_ENDPOINT = 2_000
MAX_ID_CHARS = 200


def routes(config: LocalAgentConfig, env: Mapping[str, str]) -> list[ModelRoute]:
    return [primary_route(config, env), *config.fallback_routes()]


async def list_models(config: LocalAgentConfig, env: Mapping[str, str]) -> list[dict[str, str]]:
    """Entries for every distinct (provider, endpoint, key) of the binding's routes, in route order. `env`: the
    binding's keys over the process environment, as a run resolves them."""
    listing = config.model_copy(update={"request_timeout_seconds": LIST_TIMEOUT})
    seen: set[str] = set()
    jobs: list[Any] = []
    for route in routes(config, env):
        try:
            provider_id, name = split_model(route.model)
            provider = build_provider(listing, env, route=route)
        except ConfigError as exc:
            provider_id = route.model.partition("/")[0]
            jobs.append(_failed(provider_id, route.base_url or "", f"{route.model}: {exc}"))
            continue
        if isinstance(provider, DemoProvider):
            key = f"demo\0{name}"
            if key not in seen:
                seen.add(key)
                jobs.append(_entries([{"provider": "demo", "model": name, "base_url": ""}]))
            continue
        assert isinstance(provider, HttpProvider)
        # The key's digest tells apart two routes to one endpoint under different keys (they may see different
        # models) without keeping the key itself in the set.
        key = f"{provider_id}\0{provider.base_url}\0{provider.key_digest}"
        if key in seen:
            await provider.aclose()
            continue
        seen.add(key)
        jobs.append(_ask(provider_id, provider))
    results = await asyncio.gather(*jobs)
    return [entry for entries in results for entry in entries]


async def _entries(entries: list[dict[str, str]]) -> list[dict[str, str]]:
    return entries


async def _failed(provider_id: str, base_url: str, error: str) -> list[dict[str, str]]:
    return [{"provider": provider_id, "base_url": base_url, "error": error}]


async def _ask(provider_id: str, provider: HttpProvider) -> list[dict[str, str]]:
    """The endpoint's model list, or one entry carrying the error (the provider redacts its key from it)."""
    try:
        _, ids = await provider.list_model_ids()
    except ProviderError as exc:
        url, _ = provider.models_request()
        return [{"provider": provider_id, "base_url": provider.base_url, "error": f"GET {url}: {exc}"}]
    finally:
        await provider.aclose()
    return [
        {"provider": provider_id, "model": model_id[:MAX_ID_CHARS], "base_url": provider.base_url}
        for model_id in ids[:MAX_MODELS_PER_ENDPOINT]
    ]
