"""`agenthost`: the command line. Every command but `serve` and `demo` talks to a running host over its admin
socket (found through <data dir>/host.json); errors print as `error: CODE: message` and exit 1."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict

from agenthost.host.client import HostClient, HostNotRunning, admin_address
from agenthost.host.server import Host, HostAlreadyRunning, default_data_dir
from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.sdk.events import STATE_SCOPES


def _config_pairs(pairs: list[str]) -> dict[str, Any]:
    """key=value pairs; a value that parses as JSON is taken as JSON (numbers, booleans, lists)."""
    config: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"error: --config takes key=value, got {pair!r}")
        try:
            config[key] = json.loads(value)
        except ValueError:
            config[key] = value
    return config


class Printer:
    """Renders a run's stream for a terminal: text as it arrives, tools and notes on their own lines."""

    def __init__(self, out: Any = sys.stdout) -> None:
        self.out = out
        self.mid_line = False

    def _line(self, text: str) -> None:
        if self.mid_line:
            self.out.write("\n")
            self.mid_line = False
        self.out.write(text + "\n")

    def event(self, ev: pb.RunEvent) -> None:
        kind = ev.WhichOneof("kind")
        if kind == "text_delta":
            self.out.write(ev.text_delta.text)
            self.mid_line = not ev.text_delta.text.endswith("\n")
        elif kind == "tool_started":
            self._line(f"  ⚙ {ev.tool_started.tool_name}({ev.tool_started.arguments_json[:200]})")
        elif kind == "tool_finished":
            mark = "✗" if ev.tool_finished.is_error else "✓"
            self._line(f"  {mark} {ev.tool_finished.result[:300].replace(chr(10), ' ')}")
        elif kind == "retry":
            self._line(f"  … retry {ev.retry.attempt} in {ev.retry.delay_seconds:.1f}s: {ev.retry.reason}")
        elif kind == "compaction":
            self._line(f"  … compacted context {ev.compaction.tokens_before} → {ev.compaction.tokens_after} tokens")
        elif kind == "progress":
            self._line(f"  … {ev.progress.message}")
        self.out.flush()

    def finished(self, run: hpb.RunInfo, streamed_text: bool) -> None:
        if not streamed_text and run.text:
            self._line(run.text)
        if self.mid_line:
            self.out.write("\n")
            self.mid_line = False
        if run.status != "completed":
            self._line(f"[run {run.run_id} {run.status}: {run.error_code} {run.error_message}]")


async def _stream_reply(client: HostClient, request: hpb.SendMessageRequest) -> hpb.RunInfo:
    printer = Printer()
    streamed = False
    finished: hpb.RunInfo | None = None
    async for reply in client.stream(request):
        kind = reply.WhichOneof("kind")
        if kind == "events":
            for ev in reply.events.events:
                streamed |= ev.WhichOneof("kind") == "text_delta"
                printer.event(ev)
        elif kind == "run_finished":
            finished = reply.run_finished
    if finished is None:
        raise errors.Unavailable("the host ended the stream before the run finished")
    printer.finished(finished, streamed)
    return finished


def _dump(message: Any) -> str:
    return json.dumps(MessageToDict(message, preserving_proto_field_name=True), indent=2, ensure_ascii=False)


# ---- commands (each receives the parsed args and a connected client) ----


async def cmd_plugins(args: argparse.Namespace, c: HostClient) -> int:
    if args.action == "install":
        info = await c.call(
            "InstallPlugin", hpb.InstallPluginRequest(source=args.source, offline=args.offline), timeout=900
        )
        runners = ", ".join(r.runner_id for r in info.runners)
        print(f"installed {info.plugin_id} {info.version} ({info.state}); runners: {runners}")
    elif args.action == "list":
        for p in (await c.call("ListPlugins", hpb.ListPluginsRequest())).plugins:
            flags = ("built-in " if p.builtin else "") + ("" if p.enabled else "disabled ")
            print(f"{p.plugin_id:24} {p.version:10} {flags}{p.state} restarts={p.restarts} {p.last_error}")
    elif args.action == "remove":
        await c.call("RemovePlugin", hpb.PluginRequest(plugin_id=args.plugin_id))
        print(f"removed {args.plugin_id}")
    else:
        info = await c.call(
            "SetPluginEnabled", hpb.SetPluginEnabledRequest(plugin_id=args.plugin_id, enabled=args.action == "enable")
        )
        print(f"{info.plugin_id}: {'enabled' if info.enabled else 'disabled'} ({info.state})")
    return 0


async def cmd_runners(args: argparse.Namespace, c: HostClient) -> int:
    for r in (await c.call("ListRunners", hpb.ListRunnersRequest())).runners:
        print(f"{r.runner_id:36} {r.description}")
    return 0


async def cmd_bots(args: argparse.Namespace, c: HostClient) -> int:
    if args.action == "create":
        bot = await c.call("CreateBot", hpb.CreateBotRequest(name=args.name, description=args.description))
        print(f"created bot {bot.name} ({bot.bot_id})")
    elif args.action == "list":
        for bot in (await c.call("ListBots", hpb.ListBotsRequest())).bots:
            print(f"{bot.name:24} {bot.bot_id} {bot.description}")
    elif args.action == "delete":
        await c.call("DeleteBot", hpb.BotRequest(bot=args.name))
        print(f"deleted bot {args.name}")
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
        )
        print(f"bound {args.runner} to {args.bot} for {binding.event_pattern!r} as {binding.binding_id}")
    elif args.action == "bindings":
        for b in (await c.call("ListBindings", hpb.BotRequest(bot=args.bot))).bindings:
            conversations = b.conversation_pattern or "*"
            route = f"{b.event_pattern!r} conv={conversations!r} prio={b.priority}"
            print(f"{b.binding_id} {route} → {b.runner_id} {b.config_json}")
    elif args.action == "unbind":
        await c.call("DeleteBinding", hpb.DeleteBindingRequest(binding_id=args.binding_id))
        print(f"deleted binding {args.binding_id}")
    return 0


async def cmd_send(args: argparse.Namespace, c: HostClient) -> int:
    request = hpb.SendMessageRequest(bot=args.bot, text=args.text, conversation_id=args.conversation, source="cli")
    if args.json:
        result = await c.send(args.bot, args.text, conversation_id=args.conversation, source="cli")
        out = MessageToDict(result.run, preserving_proto_field_name=True)
        out["event_count"] = len(result.events)
        print(json.dumps(out, indent=2, ensure_ascii=False))
        return 0 if result.run.status == "completed" else 1
    run = await _stream_reply(c, request)
    return 0 if run.status == "completed" else 1


async def cmd_chat(args: argparse.Namespace, c: HostClient) -> int:
    print(f"chatting with {args.bot} in conversation {args.conversation!r}; Ctrl-D to leave")
    loop = asyncio.get_running_loop()
    while True:
        try:
            line = await loop.run_in_executor(None, lambda: input("you> "))
        except EOFError:
            print()
            return 0
        if not line.strip():
            continue
        sys.stdout.write(f"{args.bot}> ")
        try:
            await _stream_reply(
                c, hpb.SendMessageRequest(bot=args.bot, text=line, conversation_id=args.conversation, source="cli")
            )
        except errors.AgentHostError as exc:
            print(f"\nerror: {exc.code.name}: {exc.message}")


async def cmd_runs(args: argparse.Namespace, c: HostClient) -> int:
    if args.action == "list":
        runs = (await c.call("ListRuns", hpb.ListRunsRequest(bot=args.bot, status=args.status, limit=args.limit))).runs
        for r in runs:
            took = f"{r.finished_at - r.started_at:.1f}s" if r.finished_at and r.started_at else "-"
            print(f"{r.run_id} {r.status:11} {took:>7} {r.runner_id:28} {r.conversation_id} {r.error_code}")
    elif args.action == "show":
        print(_dump(await c.call("GetRun", hpb.RunRequestById(run_id=args.run_id))))
        if args.events:
            resp = await c.call("ListRunEvents", hpb.ListRunEventsRequest(run_id=args.run_id, limit=5000))
            for ev in resp.events:
                print(json.dumps(MessageToDict(ev, preserving_proto_field_name=True), ensure_ascii=False))
    elif args.action == "cancel":
        run = await c.call("CancelRun", hpb.RunRequestById(run_id=args.run_id))
        print(f"{run.run_id}: {run.status}")
    return 0


async def cmd_history(args: argparse.Namespace, c: HostClient) -> int:
    resp = await c.call(
        "GetHistory",
        hpb.GetHistoryRequest(bot=args.bot, conversation_id=args.conversation, limit=args.limit, direction=pb.BACKWARD),
    )
    for item in reversed(resp.items):
        if item.item_type == "tool_call":
            print(f"[{item.role}] ⚙ {item.tool_name}({item.data_json[:200]})")
        elif item.item_type == "tool_result":
            print(f"[tool] {'✗' if item.is_error else '✓'} {item.text[:300]}")
        else:
            print(f"[{item.role}] {item.text}")
    if resp.has_more:
        print(f"(older items exist; showing the newest {len(resp.items)})")
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace, HostClient], Awaitable[int]]] = {
    "plugins": cmd_plugins,
    "runners": cmd_runners,
    "bots": cmd_bots,
    "send": cmd_send,
    "chat": cmd_chat,
    "runs": cmd_runs,
    "history": cmd_history,
}


async def serve(data_dir: Path) -> int:
    host = Host(data_dir)
    try:
        await host.start()
    except HostAlreadyRunning as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    print(
        f"agenthost serving {host.data_dir}\n  admin: {host.admin_address}\n  run API: {host.api_address}", flush=True
    )
    await stopping.wait()
    print("agenthost stopping", flush=True)
    await host.stop()
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agenthost", description="A plugin host for AI agent runners.")
    p.add_argument("--data-dir", type=Path, default=None, help="default: $AGENTHOST_HOME or ~/.agenthost")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="run the host")
    demo = sub.add_parser("demo", help="a self-contained demo in a scratch data dir")
    demo.add_argument("--keep", action="store_true", help="keep the scratch data dir")

    plugins = sub.add_parser("plugins", help="install and manage runner plugins").add_subparsers(
        dest="action", required=True
    )
    inst = plugins.add_parser("install", help="from a directory, a wheel, or a requirement")
    inst.add_argument("source")
    inst.add_argument("--offline", action="store_true", help="use only local files and installed packages")
    plugins.add_parser("list")
    for action in ("remove", "enable", "disable"):
        plugins.add_parser(action).add_argument("plugin_id")

    sub.add_parser("runners", help="list runners").add_subparsers(dest="action").add_parser("list")

    bots = sub.add_parser("bots", help="bots and bindings").add_subparsers(dest="action", required=True)
    create = bots.add_parser("create")
    create.add_argument("name")
    create.add_argument("--description", default="")
    bots.add_parser("list")
    bots.add_parser("delete").add_argument("name")
    bind = bots.add_parser("bind", help="route a bot's events to a runner")
    bind.add_argument("bot")
    bind.add_argument("--runner", required=True, help="<plugin>/<runner>, see `agenthost runners list`")
    bind.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE")
    bind.add_argument("--event", default="message.*", help="event type glob (default message.*)")
    bind.add_argument("--conversation", default="", help="conversation id glob (default: any)")
    bind.add_argument("--priority", type=int, default=0)
    bind.add_argument("--timeout", type=float, default=0, help="run deadline in seconds (default 300)")
    bind.add_argument("--api", nargs="*", default=[], help="narrow the APIs granted (default: the manifest's)")
    bind.add_argument("--scope", nargs="*", default=[], choices=sorted(STATE_SCOPES), help="narrow the state scopes")
    bind.add_argument(
        "--cross-conversation", nargs="*", default=[], metavar="GLOB", help="other conversations it may read"
    )
    bind.add_argument("--no-streaming", action="store_true")
    bots.add_parser("bindings").add_argument("bot")
    bots.add_parser("unbind").add_argument("binding_id")

    chat = sub.add_parser("chat", help="talk to a bot interactively")
    chat.add_argument("bot")
    chat.add_argument("--conversation", default="default")
    send = sub.add_parser("send", help="send one message and print the reply")
    send.add_argument("bot")
    send.add_argument("text")
    send.add_argument("--conversation", default="default")
    send.add_argument("--json", action="store_true")

    runs = sub.add_parser("runs", help="inspect and cancel runs").add_subparsers(dest="action", required=True)
    ls = runs.add_parser("list")
    ls.add_argument("--bot", default="")
    ls.add_argument("--status", default="")
    ls.add_argument("--limit", type=int, default=20)
    show = runs.add_parser("show")
    show.add_argument("run_id")
    show.add_argument("--events", action="store_true")
    runs.add_parser("cancel").add_argument("run_id")

    hist = sub.add_parser("history", help="a conversation's transcript")
    hist.add_argument("bot")
    hist.add_argument("--conversation", default="default")
    hist.add_argument("--limit", type=int, default=50)
    return p


async def _client_command(args: argparse.Namespace, data_dir: Path) -> int:
    async with HostClient(admin_address(data_dir)) as client:
        return await COMMANDS[args.command](args, client)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    data_dir = (args.data_dir or default_data_dir()).expanduser()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "serve":
            logging.getLogger().setLevel(logging.INFO)
            return asyncio.run(serve(data_dir))
        if args.command == "demo":
            from agenthost.host.demo import run_demo

            return asyncio.run(run_demo(keep=args.keep))
        if args.command == "runners" and args.action is None:
            args.action = "list"
        return asyncio.run(_client_command(args, data_dir))
    except HostNotRunning as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except errors.AgentHostError as exc:
        print(f"error: {exc.code.name}: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
