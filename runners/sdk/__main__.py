"""`python -m agenthost.runners.sdk serve|describe`: the entry point of every runner plugin process.

serve:    started by the host's supervisor; reads its configuration as one JSON line on stdin.
describe: `--distribution NAME` prints the distribution's version, summary and runner manifests as JSON (the
          host's install-time check).

`serve` keeps the plugin's code out of the serving process until a call needs it. At start it forks a describe
child, which imports the runner classes exactly as the old in-process start did (so a plugin that no longer
imports, exits or prints at import fails the start the same way, with the same exit code), hands their manifests
over a pipe and exits, taking pydantic, the plugin and its dependencies with it; meanwhile the parent imports gRPC.
The parent serves health and Describe from those manifests and imports the classes at the first Run or
ValidateConfig (agenthost.runners.sdk.server.Deferred). AGENTHOST_RUNNER_EAGER=1 loads them in the serving process
at start instead (the old way; the RSS benchmark's baseline). When the configuration line brings "described", the
report of an earlier child for the same files (agenthost.host.processes.describe_cache), no child is forked.

This module imports little at the top on purpose: whatever it imports, every idle runner process holds.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agenthost.plugins import plugin_process
from agenthost.plugins.plugin_process import EXIT_DISCOVERY

if TYPE_CHECKING:
    from collections.abc import Collection

    from agenthost.runners.sdk.runner import Runner

EAGER_ENV = "AGENTHOST_RUNNER_EAGER"
# (A describe child that fails says so with EXIT_DISCOVERY, the code a discovery error always had.)
# The serving process could not load (import, check or set up) its runners at first use.
EXIT_UNAVAILABLE = 4


def _runner_classes(
    distribution: str, only: Collection[str] | None = None, origins: dict[str, str] | None = None
) -> dict[str, type[Runner]]:
    from agenthost.plugins.manifest import skip_schema_check
    from agenthost.runners.sdk.discovery import runner_classes

    # The host checks every manifest's config_schema when it reads it; this process need not hold jsonschema.
    skip_schema_check()
    return runner_classes(distribution, only=only, origins=origins)


def _manifests(distribution: str, origins: dict[str, str] | None = None) -> list[dict[str, Any]]:
    return [cls.manifest.model_dump(mode="json") for cls in _runner_classes(distribution, origins=origins).values()]


def _describe(distribution: str) -> int:
    return plugin_process.describe(distribution, "runners", lambda: _manifests(distribution))


def _describe_child(distribution: str) -> tuple[int, int]:
    """Forks the child that imports the plugin and writes {"sdk_version", "runners"} or {"error"} to a pipe.
    Returns its pid and the pipe's read end. Must run before this process starts a thread (gRPC's above all)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write_end)
        return pid, read_end
    os.close(read_end)
    code, report = 0, None
    try:
        from agenthost.runners.sdk.discovery import DiscoveryError

        try:
            from agenthost.protos.wire import VERSION

            # Which entry point registered each runner: the serving process imports only the one a call needs.
            origins: dict[str, str] = {}
            report = {"sdk_version": VERSION, "runners": _manifests(distribution, origins), "origins": origins}
        except DiscoveryError as exc:
            code, report = EXIT_DISCOVERY, {"error": str(exc)}
    except SystemExit as exc:
        # A plugin that exits at import: the start fails with its exit code, as when it was imported in place.
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException as exc:  # noqa: BLE001 — whatever the plugin raised, the parent must hear of it
        import traceback

        traceback.print_exc()
        code, report = EXIT_DISCOVERY, {"error": f"importing the plugin failed: {type(exc).__name__}: {exc}"}
    try:
        if report is not None:
            data = json.dumps(report).encode()
            while data:
                data = data[os.write(write_end, data) :]
        # What the plugin printed at import goes where it always went: a stray line on stdout before the handshake
        # is still the start failure it was.
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _await_describe_child(pid: int, read_end: int) -> tuple[int, dict[str, Any]]:
    """The child's exit code (128 + N if signal N killed it) and its report."""
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        code = 128 - code
    try:
        report = json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        report = {}
    return code, report if isinstance(report, dict) else {}


async def _serve(config: dict[str, Any], runners: dict[str, type[Runner]] | Any) -> None:
    from agenthost.runners.sdk.server import serve

    await serve(
        runners,
        plugin_id=config["plugin_id"],
        listen=config["listen"],
        host_address=config["host"],
        plugin_secret=config["secret"],
        data_dir=Path(config["data_dir"]),
        stop=plugin_process.host_stop(),
        handshake=True,
    )


def _serve_main() -> int:
    # A forked describe child inherits the hardening.
    config = plugin_process.start("runner", ("plugin_id", "distribution", "listen", "host", "secret", "data_dir"))
    distribution = config["distribution"]
    eager = os.environ.get(EAGER_ENV) == "1"
    from agenthost.runners.sdk import lean

    # Before gRPC starts its threads (and before the describe child, which inherits it).
    lean.tune_malloc()
    lean.skip_unused_imports()
    # What the host kept from describing these same files before (agenthost.host.processes.describe_cache): the
    # child's report without the child. The first Run still imports the classes and checks them against it.
    kept = config.get("described")
    given = kept if isinstance(kept, dict) and isinstance(kept.get("runners"), list) else None
    if not eager:
        child = _describe_child(distribution) if given is None else None
        lean.defer_ssl()
    import asyncio

    from agenthost.protos.text import TerminalSafeFormatter
    from agenthost.runners.sdk.server import Deferred, RunnersUnavailable

    # What a model or harness wrote, quoted in a log line, must not drive the terminal that reads the log.
    plugin_process.log_to_stderr(TerminalSafeFormatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    runners: dict[str, type[Runner]] | Deferred
    if eager:
        from agenthost.runners.sdk.discovery import DiscoveryError

        try:
            runners = _runner_classes(distribution)
        except DiscoveryError as exc:
            print(f"agenthost runner: {exc}", file=sys.stderr)
            return EXIT_DISCOVERY
    else:
        code, report = _await_describe_child(*child) if child is not None else (0, given or {})
        if code != 0 or "runners" not in report:
            reason = report.get("error") or f"the plugin's describe child exited with code {code} and no manifests"
            print(f"agenthost runner: {reason}", file=sys.stderr)
            return code or EXIT_DISCOVERY

        def load(entry_points: Collection[str] | None) -> dict[str, type[Runner]]:
            lean.restore_ssl()
            return _runner_classes(distribution, entry_points)

        origins = report.get("origins")
        runners = Deferred(
            [json.dumps(m) for m in report["runners"]],
            str(report.get("sdk_version", "")),
            load,
            origins if isinstance(origins, dict) else {},
        )
    try:
        asyncio.run(_serve(config, runners))
    except RunnersUnavailable as exc:
        print(f"agenthost runner: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    return 0


def main(argv: list[str] | None = None) -> int:
    return plugin_process.main("python -m agenthost.runners.sdk", _serve_main, _describe, argv)


if __name__ == "__main__":
    sys.exit(main())
