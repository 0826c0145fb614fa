"""`python -m agenthost.channels.sdk serve|describe`: the entry point of every channel adapter process.

serve:    started by the host's supervisor, one process per configured channel; reads its configuration as one
          JSON line on stdin (adapter, bot, settings, the named secrets, a scoped `send` credential and the admin
          socket's address), serves gRPC health on its assigned socket, announces itself with the handshake line,
          then runs the adapter until the host lets go (stdin EOF, SIGTERM) or the adapter fails (exit 1: the
          supervisor restarts it with backoff).
describe: `--distribution NAME` prints the distribution's channel adapter manifests as JSON (install and
          `channels add` checks).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

from agenthost.plugins import plugin_process
from agenthost.plugins.plugin_process import EXIT_DISCOVERY
from agenthost.protos.text import TerminalSafeFormatter

EXIT_FAILED = 1
STOP_GRACE = 3.0
_KEYS = ("plugin_id", "distribution", "adapter", "instance", "listen", "host", "credential", "bot", "data_dir")


def _describe(distribution: str) -> int:
    from agenthost.channels.sdk.discovery import channel_classes
    from agenthost.plugins.manifest import skip_schema_check

    skip_schema_check()
    return plugin_process.describe(
        distribution,
        "channels",
        lambda: [cls.manifest.model_dump(mode="json") for cls in channel_classes(distribution).values()],
    )


class MaskingFormatter(TerminalSafeFormatter):
    """Writes every line terminal-safe and with `[redacted]` for the process's secrets (a platform token can be part
    of a URL that an exception or a library's message carries), tracebacks included."""

    def __init__(self, secrets: list[str]) -> None:
        super().__init__("%(asctime)s %(name)s %(levelname)s %(message)s")
        self._secrets = sorted({s for s in secrets if len(s) >= 8}, key=len, reverse=True)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        for secret in self._secrets:
            text = text.replace(secret, "[redacted]")
        return text


def _check_config(config: dict[str, Any]) -> None:
    if not isinstance(config.get("config"), dict) or not isinstance(config.get("secrets"), dict):
        raise KeyError("config/secrets")


async def _serve(config: dict[str, Any], adapter_cls: Any) -> int:
    from agenthost.protos import wire

    stop = plugin_process.host_stop()
    # Health only: the host reaches the adapter through nothing else; the adapter reaches the host as a client.
    async with plugin_process.serving(config["listen"], wire.CHANNEL_HEALTH_SERVICE, grace=0.5):
        return await _run_adapter(config, adapter_cls, stop)


async def _run_adapter(config: dict[str, Any], adapter_cls: Any, stop: asyncio.Event) -> int:
    """Runs the adapter until `stop` (it gets STOP_GRACE to finish) or its own end: 0, or EXIT_FAILED when it
    failed or ended unasked."""
    from agenthost.channels.sdk.adapter import ChannelContext
    from agenthost.host.api.client import HostClient

    host = HostClient(config["host"], token=config["credential"])
    ctx = ChannelContext(
        instance=config["instance"],
        bot=config["bot"],
        config=config["config"],
        secrets={str(k): str(v) for k, v in config["secrets"].items()},
        data_dir=Path(config["data_dir"]),
        host=host,
        stop=stop,
        chats=str(config.get("chats", "")),
        source=adapter_cls.manifest.name,
        log=logging.getLogger(f"agenthost.channel.{config['instance']}"),
    )
    adapter = adapter_cls()
    task = asyncio.create_task(adapter.run(ctx), name="adapter")
    stopper = asyncio.create_task(stop.wait())
    code = 0
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            # Asked to stop: the adapter sees ctx.stop and finishes what it is delivering, within a grace period.
            done, _ = await asyncio.wait({task}, timeout=STOP_GRACE)
            if not done:
                task.cancel()
        outcome = (await asyncio.gather(task, return_exceptions=True))[0]
        if isinstance(outcome, BaseException) and not isinstance(outcome, asyncio.CancelledError):
            ctx.log.error("the adapter failed", exc_info=outcome)
            code = EXIT_FAILED
        elif not stop.is_set():
            ctx.log.error("the adapter's run() returned without being asked to stop")
            code = EXIT_FAILED
    finally:
        stopper.cancel()
        await host.close()
    return code


def _serve_main() -> int:
    # Hardened first: the process holds its credential and platform token in memory.
    config = plugin_process.start("channel", _KEYS, _check_config)
    plugin_process.log_to_stderr(
        MaskingFormatter([str(v) for v in config["secrets"].values()] + [config["credential"]])
    )
    # Libraries that log each request would write the bot token (it is in Telegram's URLs) into the log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from agenthost.channels.sdk.discovery import DiscoveryError, channel_classes

    try:
        classes = channel_classes(config["distribution"])
    except DiscoveryError as exc:
        print(f"agenthost channel: {exc}", file=sys.stderr)
        return EXIT_DISCOVERY
    adapter_cls = classes.get(config["adapter"])
    if adapter_cls is None:
        print(f"agenthost channel: {config['distribution']} has no adapter {config['adapter']!r}", file=sys.stderr)
        return EXIT_DISCOVERY
    return asyncio.run(_serve(config, adapter_cls))


def main(argv: list[str] | None = None) -> int:
    return plugin_process.main("python -m agenthost.channels.sdk", _serve_main, _describe, argv)


if __name__ == "__main__":
    sys.exit(main())
