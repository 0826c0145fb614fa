"""Plugins, bots and bindings: the host's configuration, in the same file as the facts it governs."""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from agenthost.host.store.db import Database, connect
from agenthost.protos import host_pb2 as hpb
from agenthost.protos.errors import AlreadyExists, InvalidArgument, NotFound


@dataclass(frozen=True)
class PluginRecord:
    plugin_id: str
    distribution: str
    version: str
    source: str
    builtin: bool
    enabled: bool
    # The interpreter of the plugin's isolated environment, or a command plugin's launch file (plugins.command_plugin).
    python: str
    manifests_json: str
    description: str
    network: bool = False  # the user let this plugin's sandbox reach the network


class Registry:
    def __init__(self, db: Database) -> None:
        self.db = db

    # ---- plugins ----

    @staticmethod
    def _plugin(row: sqlite3.Row) -> PluginRecord:
        return PluginRecord(
            plugin_id=row["plugin_id"],
            distribution=row["distribution"],
            version=row["version"],
            source=row["source"],
            builtin=bool(row["builtin"]),
            enabled=bool(row["enabled"]),
            python=row["python"],
            manifests_json=row["manifests_json"],
            description=row["description"],
            network=bool(row["network"]),
        )

    @classmethod
    def installed(cls, path: Path) -> list[PluginRecord]:
        """The plugins recorded in a data dir's database file, read without opening it for writing (a worker reads
        what `agenthost plugins install --data-dir` put in its own data dir); none when there is no such file."""
        if not path.exists():
            return []
        conn = connect(path, readonly=True)
        try:
            return [cls._plugin(r) for r in conn.execute("SELECT * FROM plugins ORDER BY plugin_id")]
        finally:
            conn.close()

    def plugins(self) -> list[PluginRecord]:
        return [self._plugin(r) for r in self.db.query("SELECT * FROM plugins ORDER BY builtin DESC, plugin_id")]

    def find_plugin(self, plugin_id: str) -> PluginRecord | None:
        row = self.db.query_one("SELECT * FROM plugins WHERE plugin_id = ?", (plugin_id,))
        return self._plugin(row) if row is not None else None

    def plugin(self, plugin_id: str) -> PluginRecord:
        row = self.db.query_one("SELECT * FROM plugins WHERE plugin_id = ?", (plugin_id,))
        if row is None:
            raise NotFound(f"no plugin {plugin_id!r} is installed")
        return self._plugin(row)

    async def put_plugin(self, rec: PluginRecord) -> None:
        await self.db.write(
            lambda conn: conn.execute(
                "INSERT INTO plugins(plugin_id, distribution, version, source, builtin, enabled, python,"
                " manifests_json, description, installed_at, network) VALUES (?,?,?,?,?,?,?,?,?,?,?)"
                " ON CONFLICT(plugin_id) DO UPDATE SET distribution=excluded.distribution, version=excluded.version,"
                " source=excluded.source, builtin=excluded.builtin, python=excluded.python,"
                " manifests_json=excluded.manifests_json, description=excluded.description,"
                " network=excluded.network",
                (
                    rec.plugin_id,
                    rec.distribution,
                    rec.version,
                    rec.source,
                    int(rec.builtin),
                    int(rec.enabled),
                    rec.python,
                    rec.manifests_json,
                    rec.description,
                    time.time(),
                    int(rec.network),
                ),
            )
        )

    async def set_plugin_enabled(self, plugin_id: str, enabled: bool) -> None:
        self.plugin(plugin_id)
        await self.db.write(
            lambda conn: conn.execute("UPDATE plugins SET enabled = ? WHERE plugin_id = ?", (int(enabled), plugin_id))
        )

    async def delete_plugin(self, plugin_id: str) -> None:
        await self.db.write(lambda conn: conn.execute("DELETE FROM plugins WHERE plugin_id = ?", (plugin_id,)))

    # ---- bots ----

    @staticmethod
    def _bot(row: sqlite3.Row) -> hpb.Bot:
        return hpb.Bot(
            bot_id=row["bot_id"], name=row["name"], description=row["description"], created_at=row["created_at"]
        )

    async def create_bot(self, name: str, description: str) -> hpb.Bot:
        bot = hpb.Bot(bot_id=f"bot_{uuid.uuid4().hex[:12]}", name=name, description=description, created_at=time.time())

        def insert(conn: sqlite3.Connection) -> None:
            if conn.execute("SELECT 1 FROM bots WHERE name = ?", (name,)).fetchone():
                raise AlreadyExists(f"a bot named {name!r} already exists")
            conn.execute(
                "INSERT INTO bots(bot_id, name, description, created_at) VALUES (?,?,?,?)",
                (bot.bot_id, name, description, bot.created_at),
            )

        await self.db.write(insert)
        return bot

    def bots(self) -> list[hpb.Bot]:
        return [self._bot(r) for r in self.db.query("SELECT * FROM bots ORDER BY name")]

    def bot(self, id_or_name: str) -> hpb.Bot:
        if not id_or_name:
            raise InvalidArgument("a bot id or name is required")
        row = self.db.query_one("SELECT * FROM bots WHERE bot_id = ? OR name = ?", (id_or_name, id_or_name))
        if row is None:
            raise NotFound(f"no bot {id_or_name!r}")
        return self._bot(row)

    async def delete_bot(self, bot_id: str) -> None:
        await self.db.write(lambda conn: conn.execute("DELETE FROM bots WHERE bot_id = ?", (bot_id,)))

    # ---- bindings ----

    @staticmethod
    def _binding(row: sqlite3.Row) -> hpb.Binding:
        b = hpb.Binding(
            binding_id=row["binding_id"],
            bot_id=row["bot_id"],
            event_pattern=row["event_pattern"],
            conversation_pattern=row["conversation_pattern"],
            priority=row["priority"],
            runner_id=row["runner_id"],
            config_json=row["config_json"],
            created_at=row["created_at"],
            timeout_seconds=row["timeout_seconds"],
            pool=row["pool"],
            manifest_json=row["manifest_json"],
        )
        rp = json.loads(row["resource_policy_json"])
        b.resource_policy.apis.extend(rp.get("apis", []))
        b.resource_policy.state_scopes.extend(rp.get("state_scopes", []))
        b.resource_policy.cross_conversation_patterns.extend(rp.get("cross_conversation_patterns", []))
        b.resource_policy.keys.extend(rp.get("keys", []))
        dp = json.loads(row["delivery_policy_json"])
        b.delivery_policy.streaming = dp.get("streaming", True)
        b.delivery_policy.max_message_size = dp.get("max_message_size", 0)
        return b

    def bindings(self, bot_id: str) -> list[hpb.Binding]:
        rows = self.db.query(
            "SELECT * FROM bindings WHERE bot_id = ? ORDER BY priority DESC, created_at ASC", (bot_id,)
        )
        return [self._binding(r) for r in rows]

    def plugin_bindings(self, plugin_id: str) -> list[hpb.Binding]:
        """Every bot's bindings to a runner of this plugin."""
        prefix = plugin_id + "/"
        rows = self.db.query("SELECT * FROM bindings WHERE substr(runner_id, 1, ?) = ?", (len(prefix), prefix))
        return [self._binding(r) for r in rows]

    @staticmethod
    def _policies_json(b: hpb.Binding) -> tuple[str, str]:
        rp = {
            "apis": list(b.resource_policy.apis),
            "state_scopes": list(b.resource_policy.state_scopes),
            "cross_conversation_patterns": list(b.resource_policy.cross_conversation_patterns),
            "keys": list(b.resource_policy.keys),
        }
        dp = {"streaming": b.delivery_policy.streaming, "max_message_size": b.delivery_policy.max_message_size}
        return json.dumps(rp), json.dumps(dp)

    @staticmethod
    def _refuse_tie(conn: sqlite3.Connection, b: hpb.Binding) -> None:
        """Exactly one binding must win each route: an equal-priority twin (other than `b` itself) is refused."""
        clash = conn.execute(
            "SELECT binding_id FROM bindings WHERE bot_id = ? AND event_pattern = ? AND conversation_pattern = ?"
            " AND priority = ? AND binding_id != ?",
            (b.bot_id, b.event_pattern, b.conversation_pattern, b.priority, b.binding_id),
        ).fetchone()
        if clash:
            raise AlreadyExists(
                f"binding {clash[0]} already routes {b.event_pattern!r} at priority {b.priority};"
                " delete it or choose another priority so exactly one binding wins"
            )

    async def create_binding(self, b: hpb.Binding) -> hpb.Binding:
        b.binding_id = f"bnd_{uuid.uuid4().hex[:12]}"
        b.created_at = time.time()
        rp, dp = self._policies_json(b)

        def insert(conn: sqlite3.Connection) -> None:
            self._refuse_tie(conn, b)
            conn.execute(
                "INSERT INTO bindings(binding_id, bot_id, event_pattern, conversation_pattern, priority, runner_id,"
                " config_json, resource_policy_json, delivery_policy_json, timeout_seconds, created_at, pool,"
                " manifest_json)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    b.binding_id,
                    b.bot_id,
                    b.event_pattern,
                    b.conversation_pattern,
                    b.priority,
                    b.runner_id,
                    b.config_json,
                    rp,
                    dp,
                    b.timeout_seconds,
                    b.created_at,
                    b.pool,
                    b.manifest_json,
                ),
            )

        await self.db.write(insert)
        return b

    def binding(self, binding_id: str) -> hpb.Binding:
        row = self.db.query_one("SELECT * FROM bindings WHERE binding_id = ?", (binding_id,))
        if row is None:
            raise NotFound(f"no binding {binding_id!r}")
        return self._binding(row)

    async def update_binding(self, b: hpb.Binding) -> hpb.Binding:
        """Rewrites a binding's routing, config and policies in place (id, bot and created_at stay)."""
        rp, dp = self._policies_json(b)

        def update(conn: sqlite3.Connection) -> None:
            self._refuse_tie(conn, b)
            changed = conn.execute(
                "UPDATE bindings SET event_pattern = ?, conversation_pattern = ?, priority = ?, config_json = ?,"
                " resource_policy_json = ?, delivery_policy_json = ?, timeout_seconds = ?, manifest_json = ?"
                " WHERE binding_id = ?",
                (
                    b.event_pattern,
                    b.conversation_pattern,
                    b.priority,
                    b.config_json,
                    rp,
                    dp,
                    b.timeout_seconds,
                    b.manifest_json,
                    b.binding_id,
                ),
            ).rowcount
            if not changed:
                raise NotFound(f"no binding {b.binding_id!r}")

        await self.db.write(update)
        return b

    async def delete_binding(self, binding_id: str) -> None:
        deleted = await self.db.write(
            lambda conn: conn.execute("DELETE FROM bindings WHERE binding_id = ?", (binding_id,)).rowcount
        )
        if not deleted:
            raise NotFound(f"no binding {binding_id!r}")
