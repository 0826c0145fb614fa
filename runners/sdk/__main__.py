"""`python -m agenthost.runners.sdk serve|describe`: the entry point of every runner plugin process.

serve:    started by the host's supervisor; reads its configuration as one JSON line on stdin.
describe: `--distribution NAME` prints the distribution's version, summary and runner manifests as JSON (the
          host's install-time check).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import threading
from importlib import metadata
from pathlib import Path

from agenthost.plugins.sandbox import harden_process
from agenthost.runners.sdk.discovery import DiscoveryError, runner_classes
from agenthost.runners.sdk.server import serve


def _describe(distribution: str) -> int:
    try:
        classes = runner_classes(distribution)
    except DiscoveryError as exc:
        print(json.dumps({"error": str(exc)}))
        return 2
    dist = metadata.distribution(distribution)
    described = {
        "version": dist.version,
        "summary": dist.metadata.get("Summary") or "",
        "runners": [cls.manifest.model_dump(mode="json") for cls in classes.values()],
    }
    print(json.dumps(described))
    return 0


def _watch_lifeline(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    """Blocks on stdin in a thread. Only the host holds the pipe's write end, so EOF means the host died or
    let go of us, whichever way it ended (kill -9 included): stop serving."""
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except OSError:
        pass
    loop.call_soon_threadsafe(stop.set)


async def _serve_main() -> int:
    # Before the secret arrives: the process holds it (and every run's token) in memory, and what the process
    # starts (a model's commands) runs as the same uid; non-dumpable closes /proc/<pid>/mem and ptrace to them.
    harden_process()
    line = sys.stdin.readline()
    try:
        config = json.loads(line)
        distribution = config["distribution"]
    except (ValueError, KeyError) as exc:
        print(f"agenthost runner: bad configuration line on stdin: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    classes = runner_classes(distribution)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    threading.Thread(target=_watch_lifeline, args=(loop, stop), daemon=True).start()
    await serve(
        classes,
        plugin_id=config["plugin_id"],
        listen=config["listen"],
        host_address=config["host"],
        plugin_secret=config["secret"],
        data_dir=Path(config["data_dir"]),
        stop=stop,
        handshake=True,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agenthost.runners.sdk")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve")
    d = sub.add_parser("describe")
    d.add_argument("--distribution", required=True)
    args = parser.parse_args(argv)
    if args.command == "describe":
        return _describe(args.distribution)
    try:
        return asyncio.run(_serve_main())
    except DiscoveryError as exc:
        print(f"agenthost runner: {exc}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
