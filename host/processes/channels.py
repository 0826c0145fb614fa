"""Channel instances: which adapter connects which bot to a platform, with what settings, and their processes.

`agenthost channels add BOT ADAPTER --name N --config '{…}'` stores an instance in `<data>/channels.json` (0600):
the bot, the adapter (`plugin/name`; `telegram` is agenthost's built-in `agenthost/telegram`), its settings, and
the names of the key-store keys its secret settings name (a bot token is set with `agenthost keys set`, never
put in the config; only the operator names those keys: a default in the adapter's schema never selects one).
The host runs each instance as a supervised, sandboxed process (agenthost.host.processes.supervisor, kind "channel"); at
each start it hands the process a freshly rotated `send` credential for that bot alone (`channel.<name>`; the
previous token stops working), the keys its settings name, read from the key store at that moment, and the admin
socket — never the admin token, never the run API. Removing the instance stops the process
and revokes the credential.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from agenthost.host.access.credentials import CHANNEL_PREFIX, CHAT_CONVERSATION
from agenthost.host.access.private_files import read_json, write_json
from agenthost.host.processes import binding_config, describe_cache
from agenthost.host.processes.supervisor import PluginSpec
from agenthost.plugins import sandbox
from agenthost.plugins.manifest import ChannelManifest, ManifestError, parse_many
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb

if TYPE_CHECKING:
    from agenthost.host.access.credentials import Credentials
    from agenthost.host.access.keys import KeyStore
    from agenthost.host.processes.supervisor import Supervisor
    from agenthost.host.store.registry import PluginRecord, Registry

log = logging.getLogger(__name__)

CHANNELS_FILE = "channels.json"
PROCESS_PREFIX = "channel."  # supervisor key; plugin ids never contain a dot (they are canonical names)
MODULE = "agenthost.channels.sdk"
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")

BUILTIN = "agenthost"


def _adapter_id(ref: str) -> tuple[str, str]:
    plugin, _, name = ref.rpartition("/")
    return (plugin or BUILTIN), name


def chat_prefix(name: str, record: dict[str, Any]) -> str:
    """The head of every conversation name channel `name` may start (Principal.chats), from its record alone, never
    from what its adapter says: agenthost's Telegram adapter keeps `tg:`, so the conversations of channels made
    before this rule stay theirs with no migration; any other adapter's chats are `<channel name>:<id>`. Unique
    among one bot's channels (Channels.add refuses a second), since conversations are per bot."""
    if record["plugin_id"] == BUILTIN and record["adapter"] == "telegram":
        return "tg:"
    return f"{name}:"


@dataclass(frozen=True)
class _Source:
    """Where an adapter's code lives: agenthost itself (always there, network allowed) or an installed plugin."""

    plugin_id: str
    distribution: str
    python: str
    builtin: bool
    network: bool  # the user accepted the plugin's request for network access at install
    enabled: bool


class ChannelsHost(Protocol):
    """What channels need of the host that owns them (agenthost.host.server.Host satisfies it): the parts they
    use, never the server itself, so this module sits below the server in the layering (tests/test_layering.py)."""

    data_dir: Path
    admin_address: str
    sandbox_status: str
    registry: Registry
    supervisor: Supervisor
    keys: KeyStore
    credentials: Credentials

    def check_walls(self, plugin: PluginRecord) -> None: ...

    def start_in_background(self, plugin_id: str) -> None: ...


class Channels:
    """Owned by the Host; every method is an admin call's body."""

    def __init__(self, host: ChannelsHost) -> None:
        self.host = host
        self.path = host.data_dir / CHANNELS_FILE
        self._doc: dict[str, dict[str, Any]] = (read_json(self.path) or {}).get("channels", {})

    # ---- describing adapters ----

    def source(self, plugin_id: str) -> _Source:
        if plugin_id == BUILTIN:
            return _Source(BUILTIN, "agenthost", sys.executable, True, True, True)
        plugin = self.host.registry.plugin(plugin_id)
        return _Source(plugin_id, plugin.distribution, plugin.python, False, plugin.network, plugin.enabled)

    async def describe(self, source: _Source) -> dict[str, ChannelManifest]:
        """The channel adapters a plugin offers, asked of its own environment in a sandbox without network."""
        plugin_id, python = source.plugin_id, source.python
        from agenthost.plugins import command_plugin, install

        if command_plugin.is_launch_file(python):
            raise errors.FailedPrecondition(
                f"plugin {plugin_id} is not a Python plugin: channel adapters are written with agenthost.channels.sdk"
            )

        def wrap(argv: list[str]) -> list[str]:
            if self.host.sandbox_status != "on":
                return argv
            walls = sandbox.Sandbox(ro=[*sandbox.python_paths(), str(Path(python).parent.parent)], network=False)
            return walls.argv(argv)

        env = sandbox.plugin_environment({}, home=Path("/tmp"))
        directory = describe_cache.cache_dir(self.host.data_dir)
        try:
            kept_as = await asyncio.to_thread(
                describe_cache.key,
                kind="channels",
                python=python,
                distribution=source.distribution,
                builtin=source.builtin,
                sandboxed=self.host.sandbox_status == "on",
                network=False,
                bound=(),
                env=env,
            )
        except (OSError, ImportError, ValueError):  # no key: described, as ever
            kept_as = ""
        described = await asyncio.to_thread(describe_cache.load, directory, kept_as, "channels") if kept_as else None
        if described is None:
            described, reason = await install.describe(python, source.distribution, "channels", wrap, env)
            if reason:
                raise errors.FailedPrecondition(f"plugin {plugin_id} offers no channel adapters: {reason}")
            if kept_as:
                with contextlib.suppress(OSError):  # not kept: the next `channels add` describes it again
                    await asyncio.to_thread(describe_cache.store, directory, kept_as, described)
        try:
            raws = [json.dumps(raw) for raw in described["channels"]]
            manifests = await asyncio.to_thread(parse_many, ChannelManifest, raws)
        except ManifestError as exc:
            raise errors.FailedPrecondition(f"plugin {plugin_id}: {exc}") from None
        return {m.name: m for m in manifests}

    # ---- admin calls ----

    async def add(self, request: hpb.AddChannelRequest) -> hpb.ChannelInfo:
        name = request.name
        if not _NAME.fullmatch(name):
            raise errors.InvalidArgument("channel name: 1-32 of a-z, 0-9, '_', '-', starting with a letter or digit")
        if name in self._doc:
            raise errors.AlreadyExists(f"channel {name!r} exists; remove it first")
        bot = self.host.registry.bot(request.bot)
        plugin_id, adapter = _adapter_id(request.adapter)
        plugin = self.source(plugin_id)
        if not plugin.enabled:
            raise errors.FailedPrecondition(f"plugin {plugin_id} is disabled")
        if not plugin.builtin:
            self.host.check_walls(self.host.registry.plugin(plugin_id))
        manifest = (await self.describe(plugin)).get(adapter)
        if manifest is None:
            raise errors.NotFound(f"plugin {plugin_id} has no channel adapter {adapter!r}")
        config = binding_config.config_object(request.config_json)
        keys = self._keys(manifest, config)  # first: its refusal says what to pass, the schema's would not
        self._check_config(manifest, config)
        self.host.keys.resolve(keys)  # a key the store lacks is refused now, not at the first start
        if name in self._doc:  # added by a concurrent call while this one described the adapter
            raise errors.AlreadyExists(f"channel {name!r} exists; remove it first")
        self._check_chats(name, {"bot_id": bot.bot_id, "plugin_id": plugin_id, "adapter": adapter}, request.bot)
        record = {
            "bot_id": bot.bot_id,
            "plugin_id": plugin_id,
            "adapter": adapter,
            "config": config,
            "keys": keys,
            "network": plugin.builtin or (plugin.network and manifest.permissions.network),
            "created_at": time.time(),
        }
        self._save({**self._doc, name: record})
        self._start(name)
        return self.info(name)

    def _check_chats(self, name: str, record: dict[str, Any], bot: str) -> None:
        """Refuses a channel whose conversations would be another channel's of the same bot: two Telegram bots on
        one agenthost bot (a user's chat has the same id with both), or a channel whose name is another's head."""
        prefix = chat_prefix(name, record)
        if CHAT_CONVERSATION.fullmatch(prefix) is None:
            raise errors.InvalidArgument(
                f"channel {name!r}: a plugin's adapter names its chats '<channel name>:<id>', so the name must start"
                " with a letter: choose another name"
            )
        for other, theirs in self._doc.items():
            if other != name and theirs["bot_id"] == record["bot_id"] and chat_prefix(other, theirs) == prefix:
                raise errors.FailedPrecondition(
                    f"bot {bot!r} already has channel {other!r}, whose chats are its conversations {prefix}<id>:"
                    f" channel {name!r} would share them (the same chat id in both). Give it a bot of its own"
                    " (`agenthost bots create NAME`, bound to the same runner), or remove channel"
                    f" {other!r} first"
                )

    def _check_config(self, manifest: ChannelManifest, config: dict[str, Any]) -> None:

        problems = binding_config.schema_problems(manifest.config_schema, config)
        if problems:
            raise errors.InvalidArgument(
                f"config for channel adapter {manifest.name} is invalid: {'; '.join(problems)}"
            )
        for key in config:
            if key not in manifest.secret_settings and binding_config.SECRET_SETTING.search(key):
                raise errors.InvalidArgument(
                    f"config setting {key!r} looks like a secret: store it with `agenthost keys set NAME` and name "
                    "the key in a setting the adapter reads keys from "
                    f"({', '.join(manifest.secret_settings) or 'none'})"
                )

    def _keys(self, manifest: ChannelManifest, config: dict[str, Any]) -> list[str]:
        """The key-store names this instance's secret settings name. Only the operator names a key: a default in
        the adapter's own schema would let the adapter pick which stored key it is handed (`"default":
        "OPENAI_API_KEY"`), so defaults never count. A secret setting the operator left out is refused when the
        adapter's schema requires it or offers a default for it (the adapter counts on a key there), and is
        otherwise absent (the adapter gets no key for it)."""
        from agenthost.host.access.keys import check_name

        properties = manifest.config_schema.get("properties", {})
        required = set(manifest.config_schema.get("required", ()))
        names = []
        for setting in manifest.secret_settings:
            if setting not in config:
                if setting in required or "default" in properties.get(setting, {}):
                    raise errors.InvalidArgument(
                        f"channel adapter {manifest.name} needs a key from the key store in its setting {setting!r}:"
                        f' name it with `--set {setting}=NAME` (or {{"{setting}": "NAME"}} in --config), NAME'
                        " being a key stored with `agenthost keys set NAME`; the adapter's own default never picks"
                        " a key"
                    )
                continue
            value = config[setting]
            if not isinstance(value, str):
                raise errors.InvalidArgument(f"setting {setting!r} must name a key in the key store")
            names.append(check_name(value))
        return names

    async def remove(self, name: str) -> None:
        if name not in self._doc:
            raise errors.NotFound(f"no channel {name!r}")
        await self.host.supervisor.stop(PROCESS_PREFIX + name)
        self.host.supervisor.processes.pop(PROCESS_PREFIX + name, None)
        self._save({k: v for k, v in self._doc.items() if k != name})
        try:
            self.host.credentials.revoke(CHANNEL_PREFIX + name)
        except errors.NotFound:
            pass

    def of_bot(self, bot_id: str) -> list[str]:
        return sorted(name for name, record in self._doc.items() if record["bot_id"] == bot_id)

    def using(self, plugin_id: str) -> list[str]:
        return sorted(name for name, record in self._doc.items() if record["plugin_id"] == plugin_id)

    def list(self) -> list[hpb.ChannelInfo]:
        return [self.info(name) for name in sorted(self._doc)]

    def info(self, name: str) -> hpb.ChannelInfo:
        record = self._doc[name]
        pp = self.host.supervisor.processes.get(PROCESS_PREFIX + name)
        return hpb.ChannelInfo(
            name=name,
            bot_id=record["bot_id"],
            adapter=f"{record['plugin_id']}/{record['adapter']}",
            config_json=json.dumps(record["config"], sort_keys=True),
            keys=record["keys"],
            state=pp.state if pp else "stopped",
            last_error=pp.last_error if pp else "",
            pid=pp.proc.pid if pp and pp.proc and pp.proc.returncode is None else 0,
            restarts=pp.restarts if pp else 0,
            created_at=record["created_at"],
        )

    # ---- processes ----

    def start_all(self) -> None:
        for name in sorted(self._doc):
            self._start(name)

    def _start(self, name: str) -> None:
        record = self._doc[name]
        try:
            plugin = self.source(record["plugin_id"])
        except errors.NotFound:
            log.error("channel %s: its plugin %s is not installed", name, record["plugin_id"])
            return
        spec = PluginSpec(
            plugin_id=PROCESS_PREFIX + name,
            distribution=plugin.distribution,
            python=plugin.python,
            builtin=plugin.builtin,
            network=bool(record["network"]),
            kind="channel",
            module=MODULE,
            data_dir=self.host.data_dir / "channels" / name,
            host_socket=self.host.admin_address,
            prepare=self._preparer(name),
        )
        pp = self.host.supervisor.add(spec)
        first = min(
            (
                o
                for o, r in self._doc.items()
                if r["bot_id"] == record["bot_id"] and chat_prefix(o, r) == chat_prefix(name, record)
            ),
            key=lambda o: (self._doc[o]["created_at"], o),
        )
        if first != name:  # two channels made before Channels.add refused the second
            pp.last_error = (
                f"channel {first!r} of the same bot names its chats {chat_prefix(name, record)}<id> too: this one"
                f" would share its conversations; remove one, or add this one again on a bot of its own"
            )
            log.error("channel %s: %s", name, pp.last_error)
            return
        if not plugin.enabled:
            pp.last_error = f"plugin {plugin.plugin_id} is disabled"
            return
        if not plugin.builtin:
            try:
                self.host.check_walls(self.host.registry.plugin(plugin.plugin_id))
            except errors.FailedPrecondition as exc:
                pp.last_error = exc.message
                log.error("channel %s: %s", name, exc.message)
                return
        self.host.start_in_background(spec.plugin_id)

    def _preparer(self, name: str) -> Callable[[], Any]:
        async def prepare() -> dict[str, Any]:
            record = self._doc[name]
            # A fresh token at every start: a token that leaked from a dead process is already worthless.
            prefix = chat_prefix(name, record)
            _, token = self.host.credentials.create(
                CHANNEL_PREFIX + name, "send", [record["bot_id"]], replace=True, chats=prefix
            )
            return {
                "chats": prefix,
                "adapter": record["adapter"],
                "instance": name,
                "bot": record["bot_id"],
                "config": record["config"],
                "secrets": self.host.keys.resolve(list(record["keys"])),
                "credential": token,
            }

        return prepare

    def _save(self, doc: dict[str, dict[str, Any]]) -> None:
        write_json(self.path, {"channels": doc})
        self._doc = doc


__all__ = ["Channels"]
