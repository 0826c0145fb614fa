"""Provider routing: `provider/model` strings, base URLs and keys from the binding config and the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from agenthost.runners.local_agent.config import ConfigError, LocalAgentConfig, ModelRoute
from agenthost.runners.local_agent.errors import ContextWindowUnknown, ErrorKind, ProviderError
from agenthost.runners.local_agent.providers.anthropic import AnthropicProvider
from agenthost.runners.local_agent.providers.base import Provider
from agenthost.runners.local_agent.providers.demo import DemoProvider
from agenthost.runners.local_agent.providers.openai import OpenAICompatProvider
from agenthost.runners.sdk.keys import how_to_give_key


@dataclass(frozen=True)
class Route:
    protocol: str  # "openai" | "anthropic" | "demo"
    base_url: str | None
    key_env: str | None  # default environment variable holding the key
    flavor: str = "openai"


ROUTES: dict[str, Route] = {
    "openai": Route("openai", "https://api.openai.com/v1", "OPENAI_API_KEY"),
    "anthropic": Route("anthropic", "https://api.anthropic.com", "ANTHROPIC_API_KEY"),
    "openrouter": Route("openai", "https://openrouter.ai/api/v1", "OPENROUTER_API_KEY"),
    "deepseek": Route("openai", "https://api.deepseek.com/v1", "DEEPSEEK_API_KEY", flavor="openai"),
    "ollama": Route("openai", "http://127.0.0.1:11434/v1", None, flavor="ollama"),
    "vllm": Route("openai", "http://127.0.0.1:8000/v1", None, flavor="vllm"),
    "llamacpp": Route("openai", "http://127.0.0.1:8080/v1", None, flavor="llamacpp"),
    "lmstudio": Route("openai", "http://127.0.0.1:1234/v1", None, flavor="lmstudio"),
    "openai-compatible": Route("openai", None, None, flavor="compat"),
    "anthropic-compatible": Route("anthropic", None, None),
    "demo": Route("demo", None, None),
}
RUNNER_NAME = "agenthost/local-agent"  # what `bots bind --runner` takes, for the key hint
ALIASES = {"llama.cpp": "llamacpp", "llama-cpp": "llamacpp", "lm-studio": "lmstudio", "compat": "openai-compatible"}

# With a key in the environment but no model named, these are used; without any key the offline demo runs.
DEFAULT_MODELS = (
    ("ANTHROPIC_API_KEY", "anthropic/claude-sonnet-4-5"),
    ("OPENAI_API_KEY", "openai/gpt-4.1-mini"),
)
DEFAULT_MODEL_ENV = "AGENTHOST_LOCAL_AGENT_MODEL"
DEMO_MODEL = "demo/offline"


def choose_model(config: LocalAgentConfig, env: Mapping[str, str]) -> str:
    if config.model:
        return config.model
    if env.get(DEFAULT_MODEL_ENV):
        return env[DEFAULT_MODEL_ENV]
    for key_env, model in DEFAULT_MODELS:
        if env.get(key_env):
            return model
    return DEMO_MODEL


def split_model(model: str) -> tuple[str, str]:
    provider, sep, name = model.partition("/")
    if not sep or not provider or not name:
        raise ConfigError(f"model {model!r} must be 'provider/model', e.g. 'openai/gpt-4o'")
    provider = ALIASES.get(provider.lower(), provider.lower())
    if provider not in ROUTES:
        raise ConfigError(f"unknown provider {provider!r} in model {model!r}; known: {', '.join(sorted(ROUTES))}")
    return provider, name


def primary_route(config: LocalAgentConfig, env: Mapping[str, str]) -> ModelRoute:
    """The binding's own model as a route, so the primary and its fallbacks are built by one function."""
    return ModelRoute(
        model=choose_model(config, env),
        base_url=config.base_url,
        api_key_env=config.api_key_env,
        api_key=config.api_key,
        context_window=config.context_window,
    )


def build_provider(
    config: LocalAgentConfig,
    env: Mapping[str, str] | None = None,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    route: ModelRoute | None = None,
) -> Provider:
    """The provider for `route` (default: the binding's own model); timeouts and thinking come from `config`."""
    env = os.environ if env is None else env
    route = route or primary_route(config, env)
    provider_id, name = split_model(route.model)
    spec = ROUTES[provider_id]
    if spec.protocol == "demo":
        return DemoProvider(name)
    base_url = route.base_url or env.get(f"{provider_id.upper().replace('-', '_')}_BASE_URL") or spec.base_url
    if not base_url:
        raise ConfigError(f"provider {provider_id!r} ({route.model}) needs base_url in the binding config")
    if not base_url.startswith(("http://", "https://")):
        raise ConfigError(f"base_url {base_url!r} must start with http:// or https://")
    key: str | None = None
    if route.api_key is not None:
        key = route.api_key.get_secret_value()
    else:
        key_env = route.api_key_env or spec.key_env
        if key_env:
            key = env.get(key_env)
            # A run sees only the keys its binding names from the host's key store, never the host's environment.
            if not key and route.api_key_env:
                raise ConfigError(
                    f"{route.api_key_env} (api_key_env of {route.model}) is not set for this binding. "
                    f"{how_to_give_key(route.api_key_env, RUNNER_NAME)}."
                )
            if not key and spec.base_url and spec.base_url.startswith("https://"):
                raise ConfigError(
                    f"provider {provider_id!r} needs a key: {key_env} is not set for this binding. "
                    f"{how_to_give_key(key_env, RUNNER_NAME)}."
                )
    timeout = config.request_timeout_seconds
    if spec.protocol == "anthropic":
        return AnthropicProvider(
            provider_id,
            name,
            base_url=base_url,
            api_key=key,
            timeout=timeout,
            thinking_budget=config.thinking_budget,
            transport=transport,
        )
    return OpenAICompatProvider(
        provider_id, name, base_url=base_url, api_key=key, timeout=timeout, flavor=spec.flavor, transport=transport
    )


CONTEXT_WINDOW_ENV = "AGENTHOST_LOCAL_AGENT_CONTEXT_WINDOW"


async def resolve_context_window(
    provider: Provider, config: LocalAgentConfig, env: Mapping[str, str] | None = None
) -> int:
    """Config first, then the environment, then the server's own report (or a published limit); otherwise a
    clear error. Never a default: a guessed window either wastes most of a large one or silently overflows a
    small one (Ollama's OpenAI endpoint runs at 4096 whatever the model could do)."""
    if config.context_window:
        return config.context_window
    env = os.environ if env is None else env
    raw = env.get(CONTEXT_WINDOW_ENV, "").strip()
    if raw:
        if not raw.isdigit() or int(raw) < 1024:
            raise ConfigError(f"{CONTEXT_WINDOW_ENV}={raw!r} must be an integer number of tokens >= 1024")
        return int(raw)
    detail = ""
    try:
        result = await provider.probe()
        if result.context_window:
            return result.context_window
        detail = result.detail
    except ProviderError as err:
        if err.kind not in (ErrorKind.NOT_FOUND, ErrorKind.BAD_REQUEST):
            raise  # unreachable or a bad key: that is the problem to report, not the window
        detail = f"the server has no model listing ({err})"
    raise ContextWindowUnknown(
        f"cannot determine the context window of {provider.full_model}; set context_window in the binding config"
        + (f" ({detail})" if detail else "")
    )


__all__ = [
    "ROUTES",
    "build_provider",
    "primary_route",
    "choose_model",
    "resolve_context_window",
    "split_model",
    "DEMO_MODEL",
]
