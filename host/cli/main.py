"""`agenthost`: the command line. Every command but `serve` and `demo` talks to a running host over its admin
socket (found through <data dir>/host.json); errors print as `error: CODE: message` and exit 1.

Start-up cost matters here (`--help`, `--version` and every command pay it), so this module imports nothing of
grpc, protobuf or the host at import time: each command imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agenthost.plugins import binding_paths
from agenthost.protos.text import ident, json_safe, terminal_safe

if TYPE_CHECKING:
    from agenthost.host.api.client import HostClient
    from agenthost.protos import host_pb2 as hpb

# Kept here rather than imported, so building the parser needs no protobuf; tests/test_cli.py checks both lists
# against their sources (agenthost.runners.sdk.events.STATE_SCOPES, the host's run states).
STATE_SCOPE_NAMES = ("run", "conversation", "actor", "binding", "runner")
RUN_STATUSES = ("queued", "running", "completed", "failed", "cancelled", "timed_out", "interrupted")
EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a process killed by SIGPIPE
# agenthost.host.ops.logs.LEVELS and LEVEL_ENV, repeated so building the parser imports nothing of the host.
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_LEVEL_ENV = "AGENTHOST_LOG_LEVEL"


def version() -> str:
    """The installed distribution's version: pyproject.toml is the one place it is written."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("agenthost")
    except PackageNotFoundError:
        return "unknown (not installed)"


# ---- output ----


def to_jsonable(message: Any) -> Any:
    """protos.json_values.to_jsonable, imported when first used (this module imports no protobuf at start-up)."""
    from agenthost.protos.json_values import to_jsonable as convert

    return convert(message)


def json_text(data: Any, indent: int | None = None) -> str:
    """JSON for a terminal or a pipe: readable non-ASCII text, but every character a terminal could act on (C1,
    DEL, bidi controls: a plugin's, a model's, a channel's) escaped, which ensure_ascii=False alone keeps raw."""
    return json_safe(json.dumps(data, indent=indent, ensure_ascii=False))


def print_json(data: Any) -> None:
    print(json_text(data, indent=2))


def say(text: str, *, file: Any = None) -> None:
    """Prints a line that may hold what a plugin, runner, model or channel wrote (names, errors, descriptions,
    conversation ids): its control and bidi characters are made inert first."""
    print(terminal_safe(text), file=file)


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    if args.json:
        print_json(data)
    else:
        say(text)


def _config_pairs(pairs: list[str], flag: str = "--config") -> dict[str, Any]:
    """key=value pairs; a value that parses as JSON is taken as JSON (numbers, booleans, lists, null)."""
    config: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"error: {flag} takes key=value, got {pair!r}")
        try:
            config[key] = json.loads(value)
        except ValueError:
            config[key] = value
    return config


def _when(timestamp: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp)) if timestamp else "-"


# ---- commands (each receives the parsed args and a connected client) ----


async def cmd_plugins(args: argparse.Namespace, c: HostClient) -> int:
    from agenthost.protos import host_pb2 as hpb

    if args.action == "install":
        source = args.source
        if Path(source).expanduser().exists():
            # The host resolves paths from its own working directory; a path is the user's, relative to theirs.
            source = str(Path(source).expanduser().resolve())
        request = hpb.InstallPluginRequest(
            source=source,
            offline=args.offline,
            allow_network=args.allow_network,
            require_hashes=args.require_hashes,
        )
        info = await c.call("InstallPlugin", request, timeout=900)
        if args.json:
            print_json(to_jsonable(info))
        else:
            runners = ", ".join(r.runner_id for r in info.runners)
            say(f"installed {info.plugin_id} {info.version} ({info.state}); runners: {runners}")
    elif args.action == "list":
        plugins = (await c.call("ListPlugins", hpb.ListPluginsRequest())).plugins
        if args.json:
            print_json([to_jsonable(p) for p in plugins])
        else:
            for p in plugins:
                flags = ("built-in " if p.builtin else "") + ("" if p.enabled else "disabled ")
                say(f"{p.plugin_id:24} {p.version:10} {flags}{p.state} restarts={p.restarts} {p.last_error}")
    elif args.action == "remove":
        await c.call("RemovePlugin", hpb.PluginRequest(plugin_id=args.plugin_id))
        _emit(args, {"removed": args.plugin_id}, f"removed {args.plugin_id}")
    else:
        request = hpb.SetPluginEnabledRequest(plugin_id=args.plugin_id, enabled=args.action == "enable")
        info = await c.call("SetPluginEnabled", request)
        if args.json:
            print_json(to_jsonable(info))
        else:
            say(f"{info.plugin_id}: {'enabled' if info.enabled else 'disabled'} ({info.state})")
    return 0


def _schema_type(schema: dict[str, Any], defs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A readable type for one property ("integer", "string | null", "ShellConfig") and its resolved schema."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return name, defs.get(name, {})
    for key in ("anyOf", "oneOf"):
        if key in schema:
            parts = [_schema_type(s, defs) for s in schema[key]]
            concrete = next((resolved for _, resolved in parts if resolved.get("type") != "null"), {})
            return " | ".join(name for name, _ in parts), {**concrete, **schema}
    if "enum" in schema:
        return " | ".join(json.dumps(v) for v in schema["enum"]), schema
    kind = schema.get("type", "any")
    if kind == "array" and isinstance(schema.get("items"), dict):
        return f"list[{_schema_type(schema['items'], defs)[0]}]", schema
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"map[string, {_schema_type(schema['additionalProperties'], defs)[0]}]", schema
    return " | ".join(kind) if isinstance(kind, list) else str(kind), schema


_RULES = (
    ("minimum", ">="),
    ("exclusiveMinimum", ">"),
    ("maximum", "<="),
    ("exclusiveMaximum", "<"),
    ("minLength", "min length"),
    ("maxLength", "max length"),
    ("maxItems", "max items"),
    ("pattern", "pattern"),
)


def config_fields(schema: dict[str, Any], prefix: str = "", defs: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The settings a runner's config_schema declares, flattened (`shell.timeout_seconds`), with type, default,
    limits and documentation: what `runners show` prints."""
    defs = schema.get("$defs", {}) if defs is None else defs
    required = set(schema.get("required", ()))
    fields: list[dict[str, Any]] = []
    for name, prop in schema.get("properties", {}).items():
        type_name, resolved = _schema_type(prop, defs)
        merged = {**resolved, **prop}
        entry: dict[str, Any] = {"name": prefix + name, "type": type_name, "required": name in required}
        if "default" in merged:
            entry["default"] = merged["default"]
        rules = []
        for key, label in _RULES:
            for source in (prop, resolved):
                if key in source:
                    rules.append(f"{label} {source[key]}")
                    break
        if rules:
            entry["rules"] = rules
        doc = prop.get("description") or resolved.get("description") or ""
        if prop.get("writeOnly") or resolved.get("writeOnly"):
            doc = (doc + " (secret: never shown)").strip()
        mode = merged.get(binding_paths.PATH_KEY)
        if mode in binding_paths.MODE_TEXT:
            entry["host_path"] = mode
            doc = (
                doc + f" (host path: checked at bind time, shown {binding_paths.MODE_TEXT[mode]} to the runner)"
            ).strip()
        entry["description"] = doc
        fields.append(entry)
        if resolved.get("type") == "object" and "properties" in resolved:
            fields += config_fields(resolved, f"{prefix}{name}.", defs)
    return fields


async def cmd_runners(args: argparse.Namespace, c: HostClient) -> int:
    from agenthost.protos import errors
    from agenthost.protos import host_pb2 as hpb

    runners = (await c.call("ListRunners", hpb.ListRunnersRequest())).runners
    if args.action == "list":
        if args.json:
            print_json([{**to_jsonable(r), "manifest_json": json.loads(r.manifest_json or "{}")} for r in runners])
        else:
            for r in runners:
                say(f"{r.runner_id:36} {r.description}")
        return 0
    found = next((r for r in runners if r.runner_id == args.runner_id), None)
    if found is None:
        known = ", ".join(r.runner_id for r in runners) or "none"
        raise errors.NotFound(f"no runner {args.runner_id!r}; installed: {known}")
    manifest = json.loads(found.manifest_json or "{}")
    fields = config_fields(manifest.get("config_schema", {}))
    if args.json:
        print_json({"runner_id": found.runner_id, "plugin_id": found.plugin_id, "config_fields": fields, **manifest})
        return 0
    say(f"{found.runner_id} {manifest.get('version', '')}")
    say(f"  {manifest.get('description', '')}")
    perms = manifest.get("permissions", {})
    say("permissions:")
    say(f"  apis: {', '.join(perms.get('apis', [])) or 'none'}")
    say(f"  state scopes: {', '.join(perms.get('state_scopes', [])) or 'none'}")
    say(f"  cross-conversation reads: {'yes' if perms.get('cross_conversation') else 'no'}")
    say(f"  network: {'yes' if perms.get('network') else 'no'}")
    caps = manifest.get("capabilities", {})
    say("capabilities: " + (", ".join(k for k, v in caps.items() if v) or "none"))
    say("config (bots bind --config KEY=VALUE):" if fields else "config: none")
    for f in fields:
        default = f" = {json.dumps(f['default'])}" if "default" in f else (" (required)" if f["required"] else "")
        rules = f" [{', '.join(f['rules'])}]" if "rules" in f else ""
        say(f"  {f['name']}: {f['type']}{default}{rules}")
        if f["description"]:
            say(f"      {f['description']}")
    return 0


def _binding_line(b: hpb.Binding, schemas: dict[str, dict[str, Any]] | None = None) -> str:
    conversations = b.conversation_pattern or "*"
    route = f"{b.event_pattern!r} conv={conversations!r} prio={b.priority}"
    line = f"{b.binding_id} {route} → {b.runner_id} {b.config_json}"
    schema = (schemas or {}).get(b.runner_id)
    named = binding_paths.named_paths(schema, json.loads(b.config_json or "{}")) if schema else []
    for n in named:
        line += f"\n    host path {n.describe()}"
    return line


async def _config_schemas(c: HostClient) -> dict[str, dict[str, Any]]:
    """Each runner's config_schema, to show the host paths bindings name."""
    from agenthost.protos import host_pb2 as hpb

    runners = (await c.call("ListRunners", hpb.ListRunnersRequest())).runners
    return {r.runner_id: json.loads(r.manifest_json or "{}").get("config_schema", {}) for r in runners}


async def cmd_bots(args: argparse.Namespace, c: HostClient) -> int:
    from agenthost.protos import host_pb2 as hpb
    from agenthost.protos.wire import STATE_SCOPES

    if args.action == "create":
        bot = await c.call("CreateBot", hpb.CreateBotRequest(name=args.name, description=args.description))
        _emit(args, to_jsonable(bot), f"created bot {bot.name} ({bot.bot_id})")
    elif args.action == "list":
        bots = (await c.call("ListBots", hpb.ListBotsRequest())).bots
        if args.json:
            print_json([to_jsonable(b) for b in bots])
        else:
            for bot in bots:
                say(f"{bot.name:24} {bot.bot_id} {bot.description}")
    elif args.action == "delete":
        await c.call("DeleteBot", hpb.BotRequest(bot=args.name))
        _emit(args, {"deleted": args.name}, f"deleted bot {args.name}")
    elif args.action == "bind":
        binding = await c.bind(
            args.bot,
            args.runner,
            _config_pairs(args.config),
            event_pattern=args.event,
            conversation_pattern=args.conversation,
            priority=args.priority,
            timeout_seconds=args.timeout,
            apis=args.api,
            state_scopes=[STATE_SCOPES[s] for s in args.scope],
            cross_conversation=args.cross_conversation,
            streaming=not args.no_streaming,
            keys=args.key,
            pool=args.pool,
        )
        if args.json:
            print_json(to_jsonable(binding))
        else:
            say(f"bound {args.runner} to {args.bot} for {binding.event_pattern!r} as {binding.binding_id}")
            schema = (await _config_schemas(c)).get(binding.runner_id)
            for n in binding_paths.named_paths(schema or {}, json.loads(binding.config_json or "{}")):
                say(f"  host path {n.describe()}")
    elif args.action == "bindings":
        bindings = (await c.call("ListBindings", hpb.BotRequest(bot=args.bot))).bindings
        if args.json:
            print_json([to_jsonable(b) for b in bindings])
        else:
            schemas = await _config_schemas(c)
            for b in bindings:
                say(_binding_line(b, schemas))
    elif args.action == "update-binding":
        request = hpb.UpdateBindingRequest(binding_id=args.binding_id)
        if args.config:
            request.config_patch_json = json.dumps(_config_pairs(args.config))
        if args.priority is not None:
            request.priority = args.priority
        if args.timeout is not None:
            request.timeout_seconds = args.timeout
        if args.api is not None:
            request.apis.SetInParent()
            request.apis.values.extend(args.api)
        if args.key is not None:
            request.keys.SetInParent()
            request.keys.values.extend(args.key)
        binding = await c.call("UpdateBinding", request)
        _emit(args, to_jsonable(binding), f"updated {_binding_line(binding)}")
    elif args.action == "unbind":
        await c.call("DeleteBinding", hpb.DeleteBindingRequest(binding_id=args.binding_id))
        _emit(args, {"deleted": args.binding_id}, f"deleted binding {args.binding_id}")
    return 0


async def cmd_status(args: argparse.Namespace, c: HostClient) -> int:
    from agenthost.protos import host_pb2 as hpb

    status = await c.call("GetStatus", hpb.GetStatusRequest())
    if args.json:
        print_json({**to_jsonable(status), "cli_version": version()})
        return 0
    say(f"agenthost {status.version}, pid {status.pid}, serving {status.data_dir}")
    say(f"database: {status.database}")
    say(f"knowledge-base vectors: {status.kb_vectors}")
    say(f"sandbox: {status.sandbox}")
    say(f"resource limits: {_resource_limits_line(status.resource_limits)}")
    say(f"runs in flight: {status.runs_in_flight}")
    for p in status.plugins:
        say(f"  {p.plugin_id:24} {p.state:9} restarts={p.restarts} {p.last_error}")
    return 0


def _resource_limits_line(rl: Any) -> str:
    if not rl.on:
        return f"OFF ({rl.reason}); only no core dumps and {rl.open_files_max} open files per process"
    return (
        f"on ({rl.mechanism}): per plugin process {rl.memory_max_bytes // (1024 * 1024)} MiB of memory, "
        f"{rl.pids_max} processes, {rl.open_files_max} open files"
    )


async def cmd_keys(args: argparse.Namespace, c: HostClient) -> int:
    from agenthost.protos import host_pb2 as hpb

    if args.action == "set":
        import getpass

        # Read from stdin, never argv: a command line is visible to every local process.
        value = sys.stdin.readline().strip() if not sys.stdin.isatty() else getpass.getpass(f"{args.name}: ").strip()
        key = await c.call("SetKey", hpb.SetKeyRequest(name=args.name, value=value))
        _emit(args, to_jsonable(key), f"stored {key.name} ({key.length} characters)")
    elif args.action == "list":
        keys = (await c.call("ListKeys", hpb.ListKeysRequest())).keys
        if args.json:
            print_json([to_jsonable(k) for k in keys])
        else:
            for key in keys:
                say(f"{key.name:32} {key.length:5} chars  set {_when(key.updated_at)}")
    else:
        await c.call("RemoveKey", hpb.RemoveKeyRequest(name=args.name))
        _emit(args, {"removed": args.name}, f"removed {args.name}")
    return 0


async def cmd_models(args: argparse.Namespace, c: HostClient) -> int:
    from agenthost.protos import host_pb2 as hpb

    resp = await c.call("ListModels", hpb.ListModelsAdminRequest(bot=args.bot or ""))
    if args.json:
        print_json([to_jsonable(b) for b in resp.bindings])
        return 0
    if not resp.bindings:
        say("no bindings" + (f" on bot {args.bot}" if args.bot else ""))
        return 0
    say(f"{'RUNNER':28} {'PROVIDER':20} MODEL")
    for b in resp.bindings:
        if b.error:
            say(f"{b.runner_id:28} {'-':20} error: {b.error} (binding {b.binding_id})")
        for m in b.models:
            if m.error:
                say(f"{b.runner_id:28} {m.provider:20} error: {m.error}")
            else:
                say(f"{b.runner_id:28} {m.provider:20} {m.model}")
        if not b.error and not b.models:
            say(f"{b.runner_id:28} {'-':20} (this runner lists no models)")
    return 0


async def cmd_workers(args: argparse.Namespace, c: HostClient) -> int:
    import time

    from agenthost.host import limits
    from agenthost.protos import host_pb2 as hpb

    if args.action == "create":  # `workers token create` (the inner group's action)
        created = await c.call("CreateWorkerToken", hpb.CreateWorkerTokenRequest(pool=args.pool, ttl_seconds=args.ttl))
        if args.json:
            print_json(to_jsonable(created))
        else:
            print(created.token)
            say(
                f"(shown once, single use, until {_when(created.expires_at)}) pool {created.pool}; on the worker:"
                f" agenthost worker --host HOST:{created.workers_address.rpartition(':')[2]} --join TOKEN --name NAME",
                file=sys.stderr,
            )
        return 0
    if args.action in ("show", "begin-roll", "finish-roll"):  # `workers ca ACTION`
        step = {"show": "", "begin-roll": "begin", "finish-roll": "finish"}[args.action]
        ca = await c.call("RollWorkerCA", hpb.RollWorkerCARequest(step=step, force=getattr(args, "force", False)))
        lines = [f"CA {ca.ca}, expires {_when(ca.ca_expires_at)}"]
        if ca.next_ca:
            lines.append(f"rolling since {_when(ca.rolling_since)} to {ca.next_ca}")
            lines.append(
                "not yet renewed: " + (", ".join(ca.not_renewed) or "none (finish with `workers ca finish-roll`)")
            )
        _emit(args, to_jsonable(ca), "\n".join(lines))
        return 0
    if args.action == "list":
        workers = (await c.call("ListWorkers", hpb.ListWorkersRequest())).workers
        if args.json:
            print_json([to_jsonable(w) for w in workers])
        elif not workers:
            say("no workers enrolled; make a join token with `agenthost workers token create`")
        for w in workers if not args.json else []:
            runners = ", ".join(f"{r.runner_id} {r.version}" for r in w.runners) or "-"
            beat = f"{time.time() - w.last_heartbeat:.0f}s ago" if w.last_heartbeat else "-"
            say(
                f"{w.name:20} {w.pool:10} {w.state:12} {w.address or '-':24} runs {w.in_flight}/{w.capacity or '-'}"
                f"  heartbeat {beat}  cert {_cert_expiry(w)}  runners: {runners}"
            )
        return 0
    method = {"drain": "DrainWorker", "revoke": "RevokeWorker", "rotate": "RotateWorker"}[args.action]
    # The host answers a rotation once the worker has renewed (or says it did not in WORKER_ROTATE_WAIT_SECONDS).
    wait = limits.WORKER_ROTATE_WAIT_SECONDS + 10 if args.action == "rotate" else None
    info = await c.call(method, hpb.WorkerRequest(name=args.name), timeout=wait)
    if args.action == "rotate":
        _emit(args, to_jsonable(info), f"rotated {info.name}: certificate {info.serial}, {_cert_expiry(info)}")
    else:
        _emit(args, to_jsonable(info), f"{args.action} {info.name}: {info.state}")
    return 0


def _cert_expiry(w: Any) -> str:
    """A worker's certificate expiry for `workers list`/`rotate`: when, and how far off."""
    import time

    if not w.cert_expires_at:
        return "expiry not recorded (enrolled before renewal; rotate it)"
    left = w.cert_expires_at - time.time()
    if left <= 0:
        return f"EXPIRED {_when(w.cert_expires_at)}"
    span = f"{left / 86400:.0f}d" if left >= 2 * 86400 else f"{left / 3600:.1f}h" if left >= 3600 else f"{left:.0f}s"
    return f"expires {_when(w.cert_expires_at)} (in {span})"


def _duration(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    number, unit = (text[:-1], text[-1]) if text and text[-1] in units else (text, "s")
    try:
        value = float(number) * units[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a duration like 90s, 10m or 1h, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("a duration must be positive")
    return value


async def cmd_credentials(args: argparse.Namespace, c: HostClient) -> int:
    from agenthost.protos import host_pb2 as hpb

    if args.action == "create":
        created = await c.call(
            "CreateCredential",
            hpb.CreateCredentialRequest(
                name=args.name, scope=args.scope, bots=args.bot, all_conversations=args.all_conversations
            ),
        )
        if args.json:
            print_json(to_jsonable(created))
        else:
            print(created.token)
            say(f"(shown once) credential {created.credential.name}: {created.credential.scope}", file=sys.stderr)
    elif args.action == "list":
        credentials = (await c.call("ListCredentials", hpb.ListCredentialsRequest())).credentials
        if args.json:
            print_json([to_jsonable(cred) for cred in credentials])
        else:
            for cred in credentials:
                reach = "all conversations" if cred.all_conversations or cred.scope == "admin" else "own conversations"
                say(f"{cred.name:24} {cred.scope:6} {reach:17} {','.join(cred.bots)}")
    else:
        await c.call("RevokeCredential", hpb.RevokeCredentialRequest(name=args.name))
        _emit(args, {"revoked": args.name}, f"revoked {args.name}")
    return 0


async def cmd_channels(args: argparse.Namespace, c: HostClient) -> int:
    from agenthost.protos import host_pb2 as hpb

    if args.action == "add":
        try:
            config = json.loads(args.config)
        except ValueError as exc:
            raise SystemExit(f"error: --config is not JSON: {exc}") from None
        if not isinstance(config, dict):
            raise SystemExit("error: --config must be a JSON object")
        config.update(_config_pairs(args.set, "--set"))
        request = hpb.AddChannelRequest(
            name=args.name or args.adapter.rpartition("/")[2],
            bot=args.bot,
            adapter=args.adapter,
            config_json=json.dumps(config),
        )
        info = await c.call("AddChannel", request, timeout=120)
        _emit(args, to_jsonable(info), f"channel {info.name}: {info.adapter} for bot {info.bot_id} ({info.state})")
    elif args.action == "list":
        channels = (await c.call("ListChannels", hpb.ListChannelsRequest())).channels
        if args.json:
            print_json([to_jsonable(ch) for ch in channels])
        else:
            for ch in channels:
                error = f"  {ch.last_error}" if ch.last_error else ""
                say(f"{ch.name:16} {ch.adapter:24} {ch.bot_id:20} {ch.state:8} restarts={ch.restarts}{error}")
    else:
        await c.call("RemoveChannel", hpb.RemoveChannelRequest(name=args.name))
        _emit(args, {"removed": args.name}, f"removed channel {args.name}")
    return 0


def _attachments(paths: list[Path]) -> list[Any]:
    """Files to send with a message. Image types are left for the host to read from the bytes (a misnamed file is
    then sent as what it is); other types are guessed from the file name."""
    import mimetypes

    from agenthost.host import limits
    from agenthost.protos import host_pb2 as hpb

    out = []
    for path in paths:
        try:
            size = path.stat().st_size
            if size > limits.ATTACHMENT_MAX_BYTES:
                raise SystemExit(
                    f"error: {path} is {size} bytes; an attachment may be {limits.ATTACHMENT_MAX_BYTES} at most"
                )
            data = path.read_bytes()
        except OSError as exc:
            raise SystemExit(f"error: cannot read {path}: {exc.strerror}") from None
        guessed = mimetypes.guess_type(path.name)[0] or ""
        out.append(hpb.Attachment(name=path.name, mime_type="" if guessed.startswith("image/") else guessed, data=data))
    return out


def _idempotency_key(text: str) -> str:
    from agenthost.protos.wire import IDEMPOTENCY_KEY, IDEMPOTENCY_KEY_RULE

    if not IDEMPOTENCY_KEY.fullmatch(text):
        raise argparse.ArgumentTypeError(f"must be {IDEMPOTENCY_KEY_RULE}")
    return text


async def cmd_send(args: argparse.Namespace, c: HostClient) -> int:
    from agenthost.protos import host_pb2 as hpb

    request = hpb.SendMessageRequest(
        bot=args.bot,
        text=args.text,
        conversation_id=args.conversation,
        source="cli",
        attachments=_attachments(args.attach),
        idempotency_key=args.idempotency_key or "",
    )
    if args.json:
        run: hpb.RunInfo | None = None
        count = 0
        approvals: list[Any] = []
        async for reply in c.stream(request):
            kind = reply.WhichOneof("kind")
            if kind == "events":
                count += len(reply.events.events)
                for ev in reply.events.events:
                    if ev.WhichOneof("kind") in ("approval_requested", "approval_resolved"):
                        approvals.append(to_jsonable(ev))
                        if ev.WhichOneof("kind") == "approval_requested":
                            # Live, one JSON line on stderr: a wrapper can decide it while this call still waits.
                            print(json_text(approvals[-1]), file=sys.stderr, flush=True)
            elif kind == "run_finished":
                run = reply.run_finished
        if run is None:
            from agenthost.protos import errors

            raise errors.Unavailable("the host ended the stream before the run finished")
        out = to_jsonable(run)
        out["event_count"] = count
        out["approvals"] = approvals
        print_json(out)
        return 0 if run.status == "completed" else 1
    from agenthost.host.cli.render import stream_reply

    run = await stream_reply(c, request)
    return 0 if run.status == "completed" else 1


async def cmd_chat(args: argparse.Namespace, c: HostClient) -> int:
    import asyncio

    from agenthost.host.cli.render import stream_reply
    from agenthost.protos import errors
    from agenthost.protos import host_pb2 as hpb

    say(
        f"chatting with {args.bot} in conversation {args.conversation!r}; /attach FILE adds a file to your next"
        " message; Ctrl-D to leave"
    )
    loop = asyncio.get_running_loop()
    pending: list[Any] = []

    async def ask(req: Any) -> None:
        """An approval request, answered inline: y approves, anything else (or end of input) denies."""
        try:
            answer = await loop.run_in_executor(None, lambda: input("    approve? [y/N] "))
        except EOFError:
            answer = ""
        decision = "approve" if answer.strip().lower() in ("y", "yes") else "deny"
        try:
            await c.call("DecideApproval", hpb.DecideApprovalRequest(approval_id=req.approval_id, decision=decision))
        except errors.AgentHostError as exc:  # e.g. it timed out while the question was on screen
            say(f"    could not {decision}: {exc.message}")

    while True:
        try:
            line = await loop.run_in_executor(None, lambda: input("you> "))
        except EOFError:
            print()
            return 0
        if line.startswith("/attach "):
            try:
                pending.extend(_attachments([Path(line[len("/attach ") :].strip()).expanduser()]))
            except SystemExit as exc:
                say(str(exc))
            else:
                say(f"(attached {pending[-1].name}; it goes with your next message)")
            continue
        if not line.strip():
            continue
        sys.stdout.write(f"{args.bot}> ")
        files, pending = pending, []
        try:
            await stream_reply(
                c,
                hpb.SendMessageRequest(
                    bot=args.bot, text=line, conversation_id=args.conversation, source="cli", attachments=files
                ),
                ask=ask,
            )
        except errors.AgentHostError as exc:
            say(f"\nerror: {exc.code.name}: {exc.message}")


async def cmd_approvals(args: argparse.Namespace, c: HostClient) -> int:
    from agenthost.host.cli.render import approval_line
    from agenthost.protos import host_pb2 as hpb

    if args.action == "list":
        request = hpb.ListApprovalsRequest(bot=args.bot, run_id=args.run)
        approvals = (await c.call("ListApprovals", request)).approvals
        if args.json:
            print_json([to_jsonable(a) for a in approvals])
        elif not approvals:
            say("no approvals pending")
        else:
            for a in approvals:
                say(f"{a.approval_id} run {a.run_id} bot {a.bot_id} conversation {ident(a.conversation_id)}")
                say(approval_line(a.request))
        return 0
    decision = "approve" if args.action == "approve" else "deny"
    info = await c.call(
        "DecideApproval", hpb.DecideApprovalRequest(approval_id=args.approval_id, decision=decision, note=args.note)
    )
    _emit(args, to_jsonable(info), f"{info.approval_id}: {info.status}")
    return 0


async def cmd_runs(args: argparse.Namespace, c: HostClient) -> int:
    from agenthost.protos import host_pb2 as hpb

    if args.action == "list":
        request = hpb.ListRunsRequest(
            bot=args.bot, conversation_id=args.conversation, status=args.status, limit=args.limit
        )
        runs = (await c.call("ListRuns", request)).runs
        if args.json:
            print_json([to_jsonable(r) for r in runs])
        else:
            for r in runs:
                took = f"{r.finished_at - r.started_at:.1f}s" if r.finished_at and r.started_at else "-"
                child = f" (child of {r.parent_run_id})" if r.parent_run_id else ""
                runner, conversation = ident(r.runner_id), ident(r.conversation_id)
                line = f"{r.run_id} {r.status:11} {took:>7} {runner:28} {conversation} {r.error_code}{child}"
                say(line)  # the error code is the runner's
    elif args.action == "show":
        run = await c.call("GetRun", hpb.RunRequestById(run_id=args.run_id))
        shown: dict[str, Any] = to_jsonable(run)
        if run.child_run_ids:
            # Each child (a subagent) with its outcome and usage; `runs show CHILD --events` has its steps.
            children = [await c.call("GetRun", hpb.RunRequestById(run_id=cid)) for cid in run.child_run_ids]
            shown["children"] = [
                {
                    "run_id": ch.run_id,
                    "status": ch.status,
                    "error_code": ch.error_code,
                    "usage": to_jsonable(ch.usage),
                }
                for ch in children
            ]
        if args.events:
            resp = await c.call("ListRunEvents", hpb.ListRunEventsRequest(run_id=args.run_id, limit=5000))
            if args.json:
                shown["events"] = [to_jsonable(ev) for ev in resp.events]
        print_json(shown)
        if args.events and not args.json:
            for ev in resp.events:
                print(json_text(to_jsonable(ev)))
    elif args.action == "cancel":
        run = await c.call("CancelRun", hpb.RunRequestById(run_id=args.run_id))
        _emit(args, to_jsonable(run), f"{run.run_id}: {run.status}")
    return 0


async def cmd_history(args: argparse.Namespace, c: HostClient) -> int:
    from agenthost.protos import common_pb2 as pb
    from agenthost.protos import host_pb2 as hpb

    resp = await c.call(
        "GetHistory",
        hpb.GetHistoryRequest(bot=args.bot, conversation_id=args.conversation, limit=args.limit, direction=pb.BACKWARD),
    )
    items = list(reversed(resp.items))
    if args.json:
        print_json({"items": [to_jsonable(i) for i in items], "has_more": resp.has_more})
        return 0
    for item in items:
        if item.item_type == "tool_call":
            say(f"[{item.role}] ⚙ {ident(item.tool_name)}({ident(item.data_json[:200])})")
        elif item.item_type == "tool_result":
            say(f"[tool] {'✗' if item.is_error else '✓'} {item.text[:300]}")
        else:
            say(f"[{item.role}] {item.text}")
        for ref in item.attachments:
            say(f"    📎 {ref.name} ({ref.mime_type}, {ref.size_bytes} bytes) {ref.artifact_id}")
    if resp.has_more:
        say(f"(older items exist; showing the newest {len(resp.items)})")
    return 0


def _kb_space(space: str) -> str:
    return f"vectors: {space}" if space else "keyword search only"


async def cmd_kb(args: argparse.Namespace, c: HostClient) -> int:
    from agenthost.protos import errors
    from agenthost.protos import host_pb2 as hpb

    if args.action == "add":
        from agenthost.host.knowledge import MAX_DOCUMENT_BYTES

        failed = 0
        added = []
        for name in args.files:
            path = Path(name).expanduser()
            try:
                if not path.is_file():
                    raise errors.InvalidArgument("not a file")
                if path.stat().st_size > MAX_DOCUMENT_BYTES:
                    raise errors.ResourceExhausted(f"larger than MAX_DOCUMENT_BYTES = {MAX_DOCUMENT_BYTES}; split it")
                request = hpb.KbAddDocumentRequest(bot=args.bot, name=name, content=path.read_bytes())
                # Embedding a large document through a slow endpoint takes a while: the host bounds each request.
                doc = await c.call("KbAddDocument", request, timeout=1800)
            except (errors.AgentHostError, OSError) as exc:
                failed += 1
                reason = f"{exc.code.name}: {exc.message}" if isinstance(exc, errors.AgentHostError) else str(exc)
                say(f"error: {name}: {reason}", file=sys.stderr)
                continue
            added.append(doc)
            if not args.json:
                say(f"added {doc.doc_id} {doc.name} ({doc.chunks} chunks, {_kb_space(doc.embedding_space)})")
        if args.json:
            print_json([to_jsonable(d) for d in added])
        return 1 if failed else 0
    if args.action == "list":
        resp = await c.call("KbListDocuments", hpb.BotRequest(bot=args.bot))
        if args.json:
            print_json(to_jsonable(resp))
            return 0
        for d in resp.documents:
            say(
                f"{d.doc_id}  {d.chunks:5} chunks  {d.size_bytes:9} B  {_when(d.created_at)}  {d.name}"
                f"  ({_kb_space(d.embedding_space)})"
            )
        say(f"{len(resp.documents)} documents, {resp.chunks} chunks")
    elif args.action == "remove":
        await c.call("KbRemoveDocument", hpb.KbRemoveDocumentRequest(bot=args.bot, doc_id=args.doc_id))
        _emit(args, {"removed": args.doc_id}, f"removed {args.doc_id}")
    elif args.action == "search":
        resp = await c.call(
            "KbSearch", hpb.KbAdminSearchRequest(bot=args.bot, query=args.query, top_k=args.top_k), timeout=60
        )
        if args.json:
            print_json(to_jsonable(resp))
            return 0
        if resp.keyword_only:
            say(f"(keyword search only: {resp.keyword_only_reason})")
        if resp.documents_without_vectors:
            say(f"({resp.documents_without_vectors} documents have no vectors yet: `agenthost kb reindex {args.bot}`)")
        for n, hit in enumerate(resp.hits, start=1):
            passes = ", ".join(
                f"{what} #{rank}" for what, rank in (("keyword", hit.keyword_rank), ("vector", hit.vector_rank)) if rank
            )
            say(f"[{n}] {hit.document_name}:{hit.start_line}-{hit.end_line}  score {hit.score:.4f} ({passes})")
            say("    " + hit.text[:400].replace("\n", "\n    "))
        if not resp.hits:
            say("no matches")
    elif args.action == "reindex":
        resp = await c.call("KbReindex", hpb.BotRequest(bot=args.bot), timeout=3600)
        _emit(args, to_jsonable(resp), f"embedded {resp.documents} documents ({resp.chunks} chunks)")
    else:  # embeddings
        if args.clear or args.provider:
            request = hpb.KbSetEmbeddingsRequest(bot=args.bot, clear=args.clear)
            if not args.clear:
                request.embeddings.CopyFrom(
                    hpb.KbEmbeddings(
                        provider=args.provider,
                        url=args.url,
                        model=args.model,
                        key=args.key,
                        dimensions=args.dimensions,
                        timeout_seconds=args.timeout,
                    )
                )
            config = await c.call("KbSetEmbeddings", request)
        else:
            config = await c.call("KbGetEmbeddings", hpb.KbGetEmbeddingsRequest(bot=args.bot))
        where = {"": "not configured", "*": "host-wide"}.get(config.scope, f"bot {config.scope}")
        text = (
            f"{config.provider} {config.model} at {config.url}" + (f" (key {config.key})" if config.key else "")
            if config.provider != "none"
            else "none: keyword search only"
        )
        _emit(args, to_jsonable(config), f"{text} [{where}]")
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace, HostClient], Awaitable[int]]] = {
    "plugins": cmd_plugins,
    "runners": cmd_runners,
    "bots": cmd_bots,
    "send": cmd_send,
    "chat": cmd_chat,
    "runs": cmd_runs,
    "history": cmd_history,
    "status": cmd_status,
    "keys": cmd_keys,
    "models": cmd_models,
    "credentials": cmd_credentials,
    "channels": cmd_channels,
    "kb": cmd_kb,
    "approvals": cmd_approvals,
    "workers": cmd_workers,
}


async def serve(
    data_dir: Path,
    *,
    unsafe_no_sandbox: bool = False,
    log_level: str = "info",
    metrics: str | None = None,
    otlp: str | None = None,
    gateway: str | None = None,
    trusted_proxies: Sequence[str] = (),
    database: str | None = None,
    database_password: str | None = None,
    database_password_key: str | None = None,
    workers: str | None = None,
    standby: bool = False,
) -> int:
    import asyncio
    import signal

    from agenthost.host.ops import logs
    from agenthost.host.ops.tracing import TracingUnavailable
    from agenthost.host.server import Host, HostAlreadyRunning
    from agenthost.host.store.db import DatabaseUnavailable

    level = logs.parse_level(log_level)
    # stderr here; <data>/logs/host.log is the host's own (it creates the data dir, privately, first).
    to_stderr = logs.install(None, level, stderr=True)
    host = Host(
        data_dir,
        unsafe_no_sandbox=unsafe_no_sandbox,
        log_level=level,
        metrics_address=metrics,
        otlp_endpoint=otlp,
        gateway_address=gateway,
        gateway_trusted_proxies=trusted_proxies,
        database=database,
        database_password=database_password,
        database_password_key=database_password_key,
        workers_address=workers,
        standby=standby,
    )
    try:
        await host.start()
    except DatabaseUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        to_stderr.close()
        return 2
    except (HostAlreadyRunning, TracingUnavailable, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        to_stderr.close()
        return 1
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    metrics_line = f"\n  metrics: http://{host.metrics_server.address}/metrics" if host.metrics_server else ""
    if host.gateway is not None:
        metrics_line += f"\n  gateway: http://{host.gateway.address}/v1 (OpenAI-compatible)"
    if host.workers is not None:
        metrics_line += f"\n  workers: port {host.workers.port} (mutual TLS), enrolment port {host.workers.enrol_port}"
    print(
        f"agenthost serving {host.data_dir}\n  database: {host.db.description}\n  admin: {host.admin_address}\n"
        f"  run API: {host.api_address}\n"
        f"  sandbox: {host.sandbox_status}\n  resource limits: {host.resource_walls.describe()}\n"
        f"  log: {logs.logs_dir(host.data_dir) / logs.HOST_LOG}{metrics_line}",
        flush=True,
    )
    deposed = asyncio.ensure_future(host.deposed.wait())
    stop = asyncio.ensure_future(stopping.wait())
    await asyncio.wait([deposed, stop], return_when=asyncio.FIRST_COMPLETED)
    deposed.cancel()
    stop.cancel()
    print("agenthost stopping", flush=True)
    await host.stop()
    to_stderr.close()
    if host.lease_lost:
        print(f"error: {host.lease_lost}; stopped", file=sys.stderr)
        return 3
    return 0


def cmd_logs(args: argparse.Namespace, data_dir: Path) -> int:
    """Reads the log files directly (the CLI runs as the host's user): works with the host stopped, needs no grpc."""
    from agenthost.host.ops import logs

    if args.plugin:
        try:
            path = logs.plugin_log_path(data_dir, args.plugin)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    else:
        path = logs.logs_dir(data_dir) / logs.HOST_LOG
    if not path.exists() and not args.follow:
        print(f"error: no log at {path}", file=sys.stderr)
        return 1
    # The host's lines are JSON objects already; with --json a plugin's plain lines become JSON strings, so the
    # output is JSON lines either way.
    out: Any = _JsonLines(sys.stdout) if args.json and args.plugin else sys.stdout
    if args.plugin and not args.json:
        out = _InertText(out)  # a plugin's stderr is its own text: no escape sequence reaches the terminal
    elif not args.plugin:
        # The host's JSON lines quote plugins' and runners' words (errors, names): escaped like any JSON we print.
        out = _InertText(out, json_safe)
    lines, end = logs.tail_lines(path, args.lines)
    for line in lines:
        out.write(line + "\n")
    out.flush()
    if args.follow:
        try:
            logs.follow(path, out, offset=end)
        except KeyboardInterrupt:
            return 0
    return 0


class _InertText:
    """A text sink that writes what it is given with terminal control sequences made inert."""

    def __init__(self, out: Any, make_safe: Callable[[str], str] = terminal_safe) -> None:
        self.out = out
        self._safe = make_safe

    def write(self, text: str) -> None:
        self.out.write(self._safe(text))

    def flush(self) -> None:
        self.out.flush()


class _JsonLines:
    """A text sink that writes each complete line it is given as one JSON string."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self._partial = ""

    def write(self, text: str) -> None:
        *complete, self._partial = (self._partial + text).split("\n")
        for line in complete:
            self.out.write(json_text(line) + "\n")

    def flush(self) -> None:
        self.out.flush()


# ---- the parser ----


def _positive(limit: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not 1 <= n <= limit:
            raise argparse.ArgumentTypeError(f"must be between 1 and {limit}, got {n}")
        return n

    return parse


class _Version(argparse.Action):
    """`--version`, reading the installed version only when asked (argparse's own action formats it up front)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(
            option_strings, argparse.SUPPRESS, nargs=0, default=argparse.SUPPRESS, help="print the version and exit"
        )

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        print(f"agenthost {version()}")
        parser.exit()


class _Commands:
    """Adds subcommands that each carry `--json` and an example in their help."""

    def __init__(self, subparsers: Any, common: argparse.ArgumentParser) -> None:
        self.subparsers = subparsers
        self.common = common

    def add(self, name: str, help: str, *examples: str, json_output: bool = True) -> argparse.ArgumentParser:
        epilog = "example" + ("s" if len(examples) > 1 else "") + ":\n" + "\n".join(f"  {e}" for e in examples)
        return self.subparsers.add_parser(
            name,
            help=help,
            description=help,
            epilog=epilog if examples else None,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            parents=[self.common] if json_output else [],
        )


def _group(sub: _Commands, name: str, help: str, *examples: str) -> _Commands:
    parser = sub.add(name, help, *examples, json_output=False)
    return _Commands(parser.add_subparsers(dest="action", required=True, metavar="ACTION"), sub.common)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="agenthost",
        description="A plugin host for AI agent runners.",
        epilog="examples:\n  agenthost serve &\n  agenthost bots create support\n"
        "  agenthost bots bind support --runner agenthost/local-agent --config model=openai/gpt-4o\n"
        '  agenthost send support "hello"\n\n`agenthost COMMAND --help` shows each command with an example.',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action=_Version)
    p.add_argument("--data-dir", type=Path, default=None, help="default: $AGENTHOST_HOME or ~/.agenthost")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON (every command that prints data)")
    # Also accepted after the command (`agenthost runs list --json`); SUPPRESS keeps a --json given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    sub = _Commands(p.add_subparsers(dest="command", required=True, metavar="COMMAND"), common)

    srv = sub.add(
        "serve", "run the host", "agenthost serve", "agenthost --data-dir /srv/agenthost serve &", json_output=False
    )
    srv.add_argument(
        "--unsafe-no-sandbox",
        action="store_true",
        help="run third-party plugins without walls where no sandbox works (dangerous; logged)",
    )
    srv.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=None,
        help="debug, info, warning or error (default: $AGENTHOST_LOG_LEVEL or info)",
    )
    srv.add_argument(
        "--metrics",
        metavar="HOST:PORT",
        default=None,
        help="serve Prometheus metrics at http://HOST:PORT/metrics (e.g. 127.0.0.1:9464; :PORT binds loopback)",
    )
    srv.add_argument(
        "--gateway",
        metavar="HOST:PORT",
        default=None,
        help="serve the OpenAI-compatible HTTP gateway at http://HOST:PORT/v1 (e.g. 127.0.0.1:8080; :PORT binds "
        "loopback); its keys are `credentials create NAME --scope send --bot BOT`",
    )
    srv.add_argument(
        "--trusted-proxy",
        metavar="ADDRESS",
        action="append",
        default=[],
        help="a reverse proxy (address or CIDR network; repeat for more) whose X-Forwarded-For the gateway believes "
        "to name the client: its per-address connection caps then count clients, not the proxy (default: none)",
    )
    srv.add_argument(
        "--workers",
        metavar="HOST:PORT",
        default=None,
        help="listen for runner workers at HOST:PORT (mutual TLS; e.g. 0.0.0.0:7443), and for their enrolment at "
        "PORT+1 (server TLS, join tokens only)",
    )
    srv.add_argument(
        "--otlp",
        metavar="URL",
        default=None,
        help="export OpenTelemetry spans over OTLP/HTTP (default: $OTEL_EXPORTER_OTLP_ENDPOINT; needs agenthost[otel])",
    )
    srv.add_argument(
        "--database",
        metavar="DSN",
        default=None,
        help="keep the stores in PostgreSQL (postgresql://USER@HOST/DB; default: $AGENTHOST_DATABASE_URL, else the "
        "SQLite file in the data dir); never with a password on the command line: see --database-password-file",
    )
    srv.add_argument(
        "--database-password-file",
        metavar="PATH",
        default=None,
        help="read the database password from this file (default: $AGENTHOST_DATABASE_PASSWORD_FILE)",
    )
    srv.add_argument(
        "--database-password-key",
        metavar="NAME",
        default=None,
        help="take the database password from the host's key store (`agenthost keys set NAME`)",
    )
    srv.add_argument(
        "--standby",
        action="store_true",
        help="PostgreSQL: when another host holds the database, wait and take over when it goes (instead of exit 2)",
    )
    lg = sub.add(
        "logs",
        "print the host's log (or a plugin's), optionally following it",
        "agenthost logs -n 100",
        "agenthost logs --plugin agenthost --follow",
        "agenthost logs | jq 'select(.msg == \"run.finished\")'",
    )
    lg.add_argument("--plugin", metavar="ID", default="", help="a plugin's stderr log instead of the host's")
    lg.add_argument("--follow", "-f", action="store_true", help="keep printing what is appended")
    lg.add_argument("-n", "--lines", type=_positive(100_000), default=50, help="lines to print first (default 50)")
    sub.add(
        "status", "the host, its sandbox, plugins and runs in flight", "agenthost status", "agenthost status --json"
    )
    sub.add(
        "models",
        "the models each binding's providers offer (asked of the binding's runner)",
        "agenthost models",
        "agenthost models --bot support --json",
    ).add_argument("--bot", metavar="BOT", default="", help="only this bot's bindings (id or name)")
    demo = sub.add("demo", "a self-contained demo in a scratch data dir", "agenthost demo", json_output=False)
    demo.add_argument("--keep", action="store_true", help="keep the scratch data dir")

    db = _group(
        sub,
        "db",
        "the host's database (with the host stopped)",
        "agenthost db migrate-to postgresql://agenthost@db.internal/agenthost --database-password-file pw",
    )
    mig = db.add(
        "migrate-to",
        "copy this data dir's SQLite database into PostgreSQL (resumable; run again to go on or to verify)",
        "agenthost db migrate-to postgresql://agenthost@db.internal/agenthost --database-password-file pw",
    )
    mig.add_argument("dsn", metavar="DSN", help="postgresql://USER@HOST[:PORT]/DATABASE, without a password")
    mig.add_argument("--database-password-file", metavar="PATH", default=None, help="read the password from here")

    keys = _group(
        sub,
        "keys",
        "provider keys the host hands to bindings that name them",
        'printf %s "$OPENAI_API_KEY" | agenthost keys set OPENAI_API_KEY',
    )
    keys.add(
        "set",
        "store a key; the value is read from stdin (or prompted)",
        'printf %s "$OPENAI_API_KEY" | agenthost keys set OPENAI_API_KEY',
    ).add_argument("name")
    keys.add("list", "names and lengths, never values", "agenthost keys list --json")
    keys.add("remove", "forget a key", "agenthost keys remove OPENAI_API_KEY").add_argument("name")

    creds = _group(sub, "credentials", "scoped admin credentials", "agenthost credentials create gateway --bot support")
    cc = creds.add(
        "create",
        "print a new credential's token (shown once)",
        "agenthost credentials create gateway --scope send --bot support",
    )
    cc.add_argument("name")
    cc.add_argument("--scope", default="send", choices=["send", "admin"])
    cc.add_argument("--bot", action="append", default=[], help="a bot the credential may use (repeatable)")
    cc.add_argument(
        "--all-conversations",
        action="store_true",
        help="a send credential may use every conversation (and run) of its bots, not only those it started",
    )
    creds.add("list", "credentials by name, scope, conversations and bots", "agenthost credentials list")
    creds.add("revoke", "revoke a credential", "agenthost credentials revoke gateway").add_argument("name")

    chans = _group(
        sub,
        "channels",
        "chat platforms connected to bots (channel adapter plugins)",
        "agenthost channels add support telegram --set token_key=TELEGRAM_BOT_TOKEN",
    )
    ca = chans.add(
        "add",
        "connect a bot to a platform; secrets go in the key store (`keys set`), the config names them",
        'printf %s "$TOKEN" | agenthost keys set TELEGRAM_BOT_TOKEN && '
        "agenthost channels add support telegram --set token_key=TELEGRAM_BOT_TOKEN",
        "agenthost channels add support telegram --set token_key=TG_TOKEN --name tg-support "
        "--config '{\"allowed_users\": [12345]}'",
    )
    ca.add_argument("bot", help="bot id or name")
    ca.add_argument("adapter", help="PLUGIN/ADAPTER, or just ADAPTER for a built-in one (telegram)")
    ca.add_argument("--name", default="", help="the channel's name (default: the adapter's)")
    ca.add_argument("--config", default="{}", help="the adapter's settings as a JSON object")
    ca.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SETTING=VALUE",
        help="one setting, over --config (repeatable; a value that parses as JSON is JSON); name each key the "
        "adapter is handed this way "
        "(--set token_key=TELEGRAM_BOT_TOKEN): an adapter's default never picks a key",
    )
    chans.add("list", "channels with their process state", "agenthost channels list --json")
    chans.add("remove", "stop a channel and revoke its credential", "agenthost channels remove telegram").add_argument(
        "name"
    )

    plugins = _group(
        sub, "plugins", "install and manage runner plugins", "agenthost plugins install ./my-plugin --offline"
    )
    inst = plugins.add(
        "install",
        "from a directory, a wheel, a requirement, or an npm package (a directory or tarball)",
        "agenthost plugins install ./plugins/examples/notes-runner --offline",
        "agenthost plugins install dist/my_plugin-1.0-py3-none-any.whl",
        "agenthost plugins install 'my-plugin==1.0' --allow-network",
        "agenthost plugins install pinned.txt --require-hashes   # lines: pkg==1.0 --hash=sha256:…",
        "agenthost plugins install ./my-ts-runner --offline   # package.json names its command (node dist/main.js)",
        "agenthost plugins install my-ts-runner-1.0.0.tgz --offline   # the tarball `npm pack` makes",
    )
    inst.add_argument(
        "source",
        help="a directory (relative to here), a .whl file, a requirements .txt file, a pip requirement, or an npm"
        " package tarball (.tgz)",
    )
    inst.add_argument("--offline", action="store_true", help="use only local files and installed packages")
    inst.add_argument("--allow-network", action="store_true", help="accept the plugin's request for network access")
    inst.add_argument(
        "--require-hashes",
        action="store_true",
        help="install from a requirements file that pins every distribution by hash (pip --require-hashes)",
    )
    plugins.add("list", "each plugin's version, state, restarts and last error", "agenthost plugins list --json")
    for action, what in (("remove", "uninstall"), ("enable", "enable and start"), ("disable", "stop and disable")):
        plugins.add(action, f"{what} a plugin", f"agenthost plugins {action} agenthost-notes").add_argument("plugin_id")

    runners = _group(sub, "runners", "the runners installed plugins offer", "agenthost runners list")
    runners.subparsers.required = False
    runners.add("list", "runner ids and descriptions", "agenthost runners list --json")
    runners.add(
        "show",
        "a runner's description, config settings and permissions",
        "agenthost runners show agenthost/local-agent",
    ).add_argument("runner_id", metavar="RUNNER_ID")

    bots = _group(sub, "bots", "bots and bindings", "agenthost bots create support")
    create = bots.add("create", "create a bot", 'agenthost bots create support --description "help desk"')
    create.add_argument("name")
    create.add_argument("--description", default="")
    bots.add("list", "bots by name and id", "agenthost bots list")
    bots.add("delete", "delete a bot and its bindings", "agenthost bots delete support").add_argument("name")
    bind = bots.add(
        "bind",
        "route a bot's events to a runner; its config is checked by the runner's schema and its own rules",
        "agenthost bots bind support --runner agenthost/local-agent --config model=openai/gpt-4o --key OPENAI_API_KEY",
        "agenthost bots bind support --runner agenthost-notes/notes --config greeting=Noted.",
    )
    bind.add_argument("bot")
    bind.add_argument("--runner", required=True, help="<plugin>/<runner>, see `agenthost runners list`")
    bind.add_argument(
        "--config",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="runner settings (see `agenthost runners show RUNNER`); values parse as JSON when they can",
    )
    bind.add_argument("--event", default="message.*", help="event type glob (default message.*)")
    bind.add_argument("--conversation", default="", help="conversation id glob (default: any)")
    bind.add_argument("--priority", type=int, default=0)
    bind.add_argument("--timeout", type=float, default=0, help="run deadline in seconds (default 300)")
    bind.add_argument("--api", nargs="*", default=[], help="narrow the APIs granted (default: the manifest's)")
    bind.add_argument("--scope", nargs="*", default=[], choices=STATE_SCOPE_NAMES, help="narrow the state scopes")
    bind.add_argument(
        "--cross-conversation", nargs="*", default=[], metavar="GLOB", help="other conversations it may read"
    )
    bind.add_argument("--no-streaming", action="store_true")
    bind.add_argument(
        "--pool", default="", help="run on workers of this pool (`agenthost workers list`); default: the host chooses"
    )
    bind.add_argument(
        "--key", action="append", default=[], metavar="NAME", help="a stored provider key its runs receive"
    )
    bots.add(
        "bindings", "a bot's bindings (secrets in configs redacted)", "agenthost bots bindings support"
    ).add_argument("bot")
    update = bots.add(
        "update-binding",
        "change a binding in place (same id and state), checked like a new binding",
        "agenthost bots update-binding bnd_0123456789ab --config max_iterations=10 --priority 5",
        "agenthost bots update-binding bnd_0123456789ab --config model=null   # null removes a setting",
    )
    update.add_argument("binding_id")
    update.add_argument(
        "--config",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="settings to change; the others are kept (KEY=null removes one)",
    )
    update.add_argument("--priority", type=int, default=None)
    update.add_argument("--timeout", type=float, default=None, help="run deadline in seconds (0: the default)")
    update.add_argument("--api", nargs="*", default=None, help="replace the granted APIs (none given: the manifest's)")
    update.add_argument(
        "--key",
        nargs="*",
        action="extend",
        default=None,
        metavar="NAME",
        help="replace the provider keys its runs receive (none given: no keys)",
    )
    bots.add("unbind", "delete a binding", "agenthost bots unbind bnd_0123456789ab").add_argument("binding_id")

    chat = sub.add(
        "chat", "talk to a bot interactively", "agenthost chat support --conversation ticket-42", json_output=False
    )
    chat.add_argument("bot")
    chat.add_argument("--conversation", default="default")
    send = sub.add(
        "send",
        "send one message and print the reply as it streams",
        'agenthost send support "note buy milk"',
        'agenthost send support "hi" --json --conversation c1',
        'agenthost send support "what is in this picture?" --attach photo.jpg',
        'agenthost send support "refund order 42" --idempotency-key order-42-refund',
    )
    send.add_argument("bot")
    send.add_argument("text")
    send.add_argument("--conversation", default="default")
    send.add_argument(
        "--idempotency-key",
        type=_idempotency_key,
        default=None,  # not "": argparse passes a string default through `type`
        metavar="KEY",
        help="your name for this message (1-128 printable ASCII characters, no spaces): sent again with the same key"
        " (after a lost answer, a failover, to the other host), it gets the first send's run instead of a second",
    )
    send.add_argument(
        "--attach",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="send a file with the message (repeatable); images (png, jpeg, gif, webp) reach models that take them",
    )

    wk = _group(
        sub,
        "workers",
        "runner workers on other machines: enrolment, listing, drain, revoke, certificate rotation",
        "agenthost workers token create --pool gpu --ttl 10m",
        "agenthost workers list",
    )
    tok = _group(wk, "token", "join tokens", "agenthost workers token create --pool gpu")
    tc = tok.add("create", "print a short-lived, single-use join token", "agenthost workers token create --ttl 10m")
    tc.add_argument("--pool", default="", help="the pool the worker joins (default: default)")
    tc.add_argument("--ttl", type=_duration, default=600.0, help="how long the token may be used: 90s, 10m, 1h")
    wk.add(
        "list",
        "enrolled workers: pool, address, runners, in-flight runs, last heartbeat, certificate expiry",
        "agenthost workers list",
    )
    for action, what in (
        ("drain", "no new runs go to the worker; its runs in flight finish"),
        ("revoke", "cut its connections now and refuse its certificate from then on"),
        ("rotate", "the worker renews its certificate now (it does by itself at 2/3 of its lifetime)"),
    ):
        wk.add(action, what, f"agenthost workers {action} gpu-1").add_argument("name")
    ca = _group(wk, "ca", "the workers' CA, and rolling it to a new one", "agenthost workers ca show")
    ca.add("show", "the CA, and the roll under way if any", "agenthost workers ca show")
    ca.add(
        "begin-roll",
        "make the next CA: workers' certificates are signed by it, either CA is trusted",
        "agenthost workers ca begin-roll",
    )
    ca.add(
        "finish-roll",
        "the next CA becomes the CA; certificates of the old one are refused",
        "agenthost workers ca finish-roll",
    ).add_argument("--force", action="store_true", help="finish although some workers have not renewed")

    wrk = sub.add(
        "worker",
        "run the runner plugins installed here for a host on another machine",
        "agenthost worker --host host.example:7443 --join ahj1.7444.… --name gpu-1",
        "agenthost worker --host host.example:7443",
        json_output=False,
    )
    wrk.add_argument(
        "--host",
        required=True,
        action="append",
        metavar="HOST:PORT",
        help="the host's workers port (serve --workers); several (repeated, or comma-separated) for an active host"
        " and its standbys: the worker follows whichever is active",
    )
    wrk.add_argument("--join", default="", metavar="TOKEN", help="a join token, to enrol (once)")
    wrk.add_argument("--name", default="", help="this worker's name (default: the machine's host name)")
    wrk.add_argument("--capacity", type=_positive(4096), default=4, help="runs at once (default 4)")
    wrk.add_argument("--enrol-only", action="store_true", help="enrol and exit")
    wrk.add_argument(
        "--unsafe-no-sandbox",
        action="store_true",
        help="run third-party plugins without walls where no sandbox works (dangerous; logged)",
    )

    appr = _group(
        sub,
        "approvals",
        "tool calls waiting for a person's decision (a binding's `approvals`)",
        "agenthost approvals list --bot support",
        "agenthost approvals approve apr_0123 --note 'once'",
    )
    al = appr.add("list", "pending approvals, oldest first", "agenthost approvals list --bot support --json")
    al.add_argument("--bot", default="")
    al.add_argument("--run", default="", help="only this run's")
    for action, what in (("approve", "let the tool call run"), ("deny", "refuse it (the model is told)")):
        decide = appr.add(action, what, f"agenthost approvals {action} apr_0123 --note 'why'")
        decide.add_argument("approval_id")
        decide.add_argument("--note", default="", help="shown to the model with a denial (at most 1000 characters)")

    runs = _group(sub, "runs", "inspect and cancel runs", "agenthost runs list --status failed")
    ls = runs.add(
        "list",
        "the newest runs first",
        "agenthost runs list --bot support --status failed --limit 5",
        "agenthost runs list --json | jq '.[0].usage'",
    )
    ls.add_argument("--bot", default="")
    ls.add_argument("--conversation", default="")
    ls.add_argument(
        "--status", default="", choices=RUN_STATUSES, metavar="STATUS", help="one of: " + ", ".join(RUN_STATUSES)
    )
    ls.add_argument("--limit", type=_positive(1000), default=20, help="1-1000 (default 20)")
    show = runs.add("show", "one run, optionally with its events", "agenthost runs show run_0123 --events")
    show.add_argument("run_id")
    show.add_argument("--events", action="store_true")
    runs.add("cancel", "cancel a queued or running run", "agenthost runs cancel run_0123").add_argument("run_id")

    kb = _group(
        sub,
        "kb",
        "each bot's knowledge base: documents its runs search by keywords and meaning (the `kb` API)",
        "agenthost kb add support docs/*.md",
        'agenthost kb search support "how do I rotate a key"',
    )
    kb_add = kb.add(
        "add",
        "add text documents (UTF-8, up to 4 MiB each): stored, chunked by lines, indexed and embedded",
        "agenthost kb add support docs/*.md README.md",
    )
    kb_add.add_argument("bot")
    kb_add.add_argument("files", nargs="+", metavar="FILE")
    kb.add("list", "a bot's documents", "agenthost kb list support").add_argument("bot")
    kb_rm = kb.add("remove", "remove a document and its chunks", "agenthost kb remove support doc_0123")
    kb_rm.add_argument("bot")
    kb_rm.add_argument("doc_id")
    kb_search = kb.add(
        "search", "search as the bot's runs would", 'agenthost kb search support "refund policy" --top-k 3'
    )
    kb_search.add_argument("bot")
    kb_search.add_argument("query")
    kb_search.add_argument("--top-k", type=_positive(50), default=5, help="1-50 (default 5)")
    kb.add(
        "reindex",
        "embed the documents that have no vectors for the bot's current embeddings endpoint",
        "agenthost kb reindex support",
    ).add_argument("bot")
    emb = kb.add(
        "embeddings",
        "show or set the embeddings endpoint, host-wide or for one bot (no endpoint: keyword search only)",
        "agenthost kb embeddings --provider ollama --url http://127.0.0.1:11434 --model nomic-embed-text",
        "agenthost kb embeddings --bot support --provider openai --url https://api.openai.com/v1 "
        "--model text-embedding-3-small --key OPENAI_API_KEY",
        "agenthost kb embeddings --bot support --provider none   # keyword search only for this bot",
        "agenthost kb embeddings --bot support                   # what its searches use",
    )
    emb.add_argument("--bot", default="", help="a bot (default: the host-wide setting)")
    emb.add_argument("--provider", choices=["openai", "ollama", "none"], default="", help="set the endpoint's kind")
    emb.add_argument("--url", default="", help="openai: the base URL ending in /v1; ollama: http://HOST:11434")
    emb.add_argument("--model", default="")
    emb.add_argument("--key", default="", metavar="NAME", help="a key stored with `keys set` (sent as a bearer token)")
    emb.add_argument("--dimensions", type=int, default=0, help="shorter vectors, for endpoints that offer them")
    emb.add_argument("--timeout", type=float, default=0, help="seconds per request (default 30)")
    emb.add_argument("--clear", action="store_true", help="remove the setting (a bot then uses the host-wide one)")

    hist = sub.add("history", "a conversation's transcript", "agenthost history support --conversation c1 --limit 20")
    hist.add_argument("bot")
    hist.add_argument("--conversation", default="default")
    hist.add_argument("--limit", type=_positive(100), default=50, help="1-100 (default 50)")
    return p


async def _client_command(args: argparse.Namespace, data_dir: Path) -> int:
    from agenthost.host.access.private_files import read_standby
    from agenthost.host.api.client import HostClient

    standby = read_standby(data_dir) if args.command == "status" and not (data_dir / "host.json").exists() else None
    if standby is not None:
        if args.json:
            print_json({"state": "standby", **standby, "cli_version": version()})
        else:
            say(f"agenthost standby, pid {standby['pid']}, serving {data_dir}")
            say(f"database: {standby['database']}")
            say(f"active host: {standby['active']} (this one takes over when it goes)")
        return 0

    async with HostClient.for_data_dir(data_dir) as client:
        return await COMMANDS[args.command](args, client)


DATABASE_ENV = "AGENTHOST_DATABASE_URL"
DATABASE_PASSWORD_FILE_ENV = "AGENTHOST_DATABASE_PASSWORD_FILE"


def _database_options(args: argparse.Namespace) -> dict[str, Any] | int:
    """serve's database options (the DSN, its password from a file or the key store); an exit status (2) with the
    error printed when they are unusable. A password on the command line is refused: every local user can read it."""
    from agenthost.host.store.dsn import has_password, is_dsn

    dsn = args.database or os.environ.get(DATABASE_ENV) or None
    if dsn is None:
        if args.database_password_file or args.database_password_key:
            print(
                "error: a database password was given but no --database (or $AGENTHOST_DATABASE_URL)", file=sys.stderr
            )
            return 2
        return {}
    if not is_dsn(dsn):
        print("error: --database takes a postgresql://USER@HOST[:PORT]/DATABASE URL", file=sys.stderr)
        return 2
    if args.database and has_password(args.database):
        print(
            "error: --database carries a password, which every local user can read on a command line; give the DSN"
            " without it and the password in a file (--database-password-file PATH) or the key store"
            " (--database-password-key NAME)",
            file=sys.stderr,
        )
        return 2
    password = None
    path = args.database_password_file or os.environ.get(DATABASE_PASSWORD_FILE_ENV)
    if path:
        try:
            password = Path(path).read_text().rstrip("\r\n")
        except OSError as exc:
            print(f"error: cannot read the database password file {path}: {exc.strerror}", file=sys.stderr)
            return 2
    return {"database": dsn, "database_password": password, "database_password_key": args.database_password_key}


def cmd_db(args: argparse.Namespace, data_dir: Path) -> int:
    """`db migrate-to`: runs here, not in a host; holds the data dir's lock so no host starts on it meanwhile."""
    import fcntl

    from agenthost.host.store.dsn import has_password, is_dsn

    if not is_dsn(args.dsn):
        print("error: migrate-to takes a postgresql://USER@HOST[:PORT]/DATABASE URL", file=sys.stderr)
        return 2
    if has_password(args.dsn):
        print(
            "error: the DSN carries a password, which every local user can read on a command line; give it in a"
            " file (--database-password-file PATH)",
            file=sys.stderr,
        )
        return 2
    password = None
    if args.database_password_file:
        try:
            password = Path(args.database_password_file).read_text().rstrip("\r\n")
        except OSError as exc:
            print(f"error: cannot read {args.database_password_file}: {exc.strerror}", file=sys.stderr)
            return 2
    try:
        from agenthost.host.store.transfer import Transfer, TransferError
    except ImportError as exc:
        print(f"error: PostgreSQL needs the psycopg driver ({exc}): pip install 'agenthost[postgres]'", file=sys.stderr)
        return 2
    try:
        lock = os.open(data_dir / "host.lock", os.O_RDWR)
    except FileNotFoundError:
        print(f"error: {data_dir} is not an agenthost data dir (no host.lock)", file=sys.stderr)
        return 2
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"error: a host is serving {data_dir}; stop it first (agenthost stops on SIGTERM)", file=sys.stderr)
            return 2
        try:
            reports = Transfer(data_dir / "agenthost.db", args.dsn, password=password).run(
                progress=lambda line: print(line, file=sys.stderr, flush=True)
            )
        except TransferError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    finally:
        os.close(lock)
    rows = [
        {
            "table": r.table,
            "copied": r.copied,
            "source_rows": r.source_rows,
            "target_rows": r.target_rows,
            "source_checksum": r.source_checksum,
            "target_checksum": r.target_checksum,
            "ok": r.ok,
        }
        for r in reports
    ]
    if args.json:
        print_json(rows)
    else:
        for r in reports:
            mark = "ok" if r.ok else "MISMATCH"
            say(
                f"{r.table:20} {r.target_rows:>9}/{r.source_rows:<9} rows  checksum {r.target_checksum}"
                f"  copied now {r.copied:<8} {mark}"
            )
    if all(r.ok for r in reports):
        say("verified: every table's row count and checksum match", file=sys.stderr)
        return 0
    say("error: some tables differ from the source (see MISMATCH); run the command again", file=sys.stderr)
    return 1


def _default_data_dir() -> Path:
    # The host's own rule (agenthost.host.server.default_data_dir), without importing the host to learn it.
    return Path(os.environ.get("AGENTHOST_HOME") or Path.home() / ".agenthost")


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader went away (`agenthost runs list | head -1`): stop quietly, like a process killed by SIGPIPE.
        # stdout is pointed at /dev/null so the interpreter's final flush has nowhere to fail.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "logs":
        return cmd_logs(args, (args.data_dir or _default_data_dir()).expanduser().resolve())
    if args.command == "db":
        return cmd_db(args, (args.data_dir or _default_data_dir()).expanduser().resolve())
    import asyncio
    import logging

    from agenthost.host.api.client import HostNotRunning
    from agenthost.protos import errors

    # Relative to the user's working directory, whoever resolves it later.
    data_dir = (args.data_dir or _default_data_dir()).expanduser().resolve()
    if args.command != "serve":
        # `serve` logs JSON lines (agenthost.host.ops.logs); the client commands print plain warnings.
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "serve":
            level = args.log_level or os.environ.get(LOG_LEVEL_ENV) or "info"
            if level.lower() not in LOG_LEVELS:
                print(f"error: {LOG_LEVEL_ENV} must be one of {', '.join(LOG_LEVELS)}, got {level!r}", file=sys.stderr)
                return 2
            database = _database_options(args)
            if isinstance(database, int):
                return database
            if args.standby and not database:
                print("error: --standby needs a PostgreSQL --database (or $AGENTHOST_DATABASE_URL)", file=sys.stderr)
                return 2
            return asyncio.run(
                serve(
                    data_dir,
                    unsafe_no_sandbox=args.unsafe_no_sandbox,
                    log_level=level,
                    metrics=args.metrics,
                    otlp=args.otlp,
                    gateway=args.gateway,
                    trusted_proxies=args.trusted_proxy,
                    **database,
                    workers=args.workers,
                    standby=args.standby,
                )
            )
        if args.command == "worker":
            from agenthost.host.workers.agent import run_worker

            return asyncio.run(run_worker(args, data_dir))
        if args.command == "demo":
            from agenthost.host.cli.demo import run_demo

            return asyncio.run(run_demo(keep=args.keep))
        if args.command == "runners" and args.action is None:
            args.action = "list"
        return asyncio.run(_client_command(args, data_dir))
    except HostNotRunning as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except errors.AgentHostError as exc:  # a host's message may quote a plugin's (a failed start, an install)
        say(f"error: {exc.code.name}: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
