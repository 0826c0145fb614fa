"""Host metrics in the Prometheus text format, served on an opt-in local HTTP endpoint (`serve --metrics`).

Written here rather than with prometheus_client: the host needs four counters, one histogram and a few gauges
with small, host-chosen label sets; the text exposition of that is a page of code, costs no dependency, and is
served from the host's own event loop instead of a second HTTP thread. Counting is a dict update, cheap enough for
the run API's hot path.

Label values are never taken from a caller: statuses and gRPC codes are the host's own names, methods come from
the run API's handler table, runner and plugin ids from the registry, so no client can grow the tables.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from agenthost.host import limits

log = logging.getLogger(__name__)

# Run durations span a trivial reply (milliseconds) to a long agent session (the 24 h deadline cap).
RUN_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 3600, 14400, 86400)
MAX_REQUEST_BYTES = 8 * 1024  # a request line, a header; and a body (a scraper sends none)
MAX_HEADERS = 64
REQUEST_TIMEOUT = 5.0  # to send a request head


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: tuple[str, ...], values: tuple[str, ...], extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


class Counter:
    def __init__(self, name: str, help: str, labels: tuple[str, ...] = ()) -> None:
        self.name = name
        self.help = help
        self.label_names = labels
        self.values: dict[tuple[str, ...], float] = {}

    def inc(self, *labels: str, by: float = 1.0) -> None:
        self.values[labels] = self.values.get(labels, 0.0) + by

    def get(self, *labels: str) -> float:
        return self.values.get(labels, 0.0)

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        for labels, value in sorted(self.values.items()):
            lines.append(f"{self.name}{_labels(self.label_names, labels)} {_number(value)}")
        return lines


class CallCounter(Counter):
    """Counts run-API calls by method and status code in nested dicts: the hot path indexes with the strings it
    already holds and builds no key tuple."""

    def __init__(self, name: str, help: str) -> None:
        super().__init__(name, help, ("method", "code"))
        self.by_method: dict[str, dict[str, int]] = {}

    def count(self, method: str, code: str) -> None:
        codes = self.by_method.get(method)
        if codes is None:
            codes = self.by_method[method] = {}
        codes[code] = codes.get(code, 0) + 1

    def get(self, *labels: str) -> float:
        method, code = labels
        return float(self.by_method.get(method, {}).get(code, 0))

    def render(self) -> list[str]:
        self.values = {(m, c): float(n) for m, codes in self.by_method.items() for c, n in codes.items()}
        return super().render()


class Histogram:
    def __init__(self, name: str, help: str, labels: tuple[str, ...] = (), buckets: tuple[float, ...] = ()) -> None:
        self.name = name
        self.help = help
        self.label_names = labels
        self.buckets = tuple(sorted(buckets)) + (math.inf,)
        self.series: dict[tuple[str, ...], tuple[list[int], list[float]]] = {}  # labels -> (counts, [sum])

    def observe(self, value: float, *labels: str) -> None:
        series = self.series.get(labels)
        if series is None:
            series = self.series[labels] = ([0] * len(self.buckets), [0.0])
        counts, total = series
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                counts[i] += 1
                break
        total[0] += value

    def count(self, *labels: str) -> int:
        series = self.series.get(labels)
        return sum(series[0]) if series else 0

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        for labels, (counts, total) in sorted(self.series.items()):
            cumulative = 0
            for bound, n in zip(self.buckets, counts, strict=True):
                cumulative += n
                le = f'le="{_number(bound)}"'
                lines.append(f"{self.name}_bucket{_labels(self.label_names, labels, le)} {cumulative}")
            lines.append(f"{self.name}_sum{_labels(self.label_names, labels)} {_number(total[0])}")
            lines.append(f"{self.name}_count{_labels(self.label_names, labels)} {cumulative}")
        return lines


class Gauge:
    """A value read when scraped (queue depths, runs in flight): nothing to keep up to date in between."""

    def __init__(self, name: str, help: str, read: Callable[[], float]) -> None:
        self.name = name
        self.help = help
        self.read = read

    def render(self) -> list[str]:
        try:
            value = float(self.read())
        except Exception:  # a gauge that cannot be read is left out of this scrape, not the whole page
            return []
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} gauge", f"{self.name} {_number(value)}"]


class Metrics:
    """One host's metrics."""

    def __init__(self) -> None:
        self.runs = Counter("agenthost_runs_total", "Runs that ended, by runner and status.", ("runner", "status"))
        self.run_duration = Histogram(
            "agenthost_run_duration_seconds",
            "Wall time of runs from start to end, by runner.",
            ("runner",),
            RUN_DURATION_BUCKETS,
        )
        self.api_calls = CallCounter("agenthost_run_api_calls_total", "Run API calls by method and gRPC status code.")
        self.plugin_restarts = Counter(
            "agenthost_plugin_restarts_total", "Runner processes restarted after they died, by plugin.", ("plugin",)
        )
        self.plugin_crashes = Counter(
            "agenthost_plugin_crashes_total", "Runner processes that died or failed to start, by plugin.", ("plugin",)
        )
        self.gauges: list[Gauge] = []

    def gauge(self, name: str, help: str, read: Callable[[], float]) -> None:
        self.gauges.append(Gauge(name, help, read))

    def render(self) -> str:
        lines: list[str] = []
        for metric in (self.runs, self.run_duration, self.api_calls, self.plugin_restarts, self.plugin_crashes):
            lines.extend(metric.render())
        for gauge in self.gauges:
            lines.extend(gauge.render())
        return "\n".join(lines) + "\n"


class MetricsServer:
    """`GET /metrics` answers the exposition, anything else 404, one request per connection, on the capped
    listener every untrusted HTTP door uses (protos/listeners.py): anyone who reaches the port (another local
    user) may connect, and the endpoint has no credential, so one client address may hold at most
    METRICS_MAX_CONNECTIONS_PER_ADDRESS connections (past it 429, closed at once) and a connection must send its
    request head within REQUEST_TIMEOUT: a flood from one address leaves the scraper, from its own, a way in."""

    def __init__(self, metrics: Metrics, host: str, port: int) -> None:
        self.metrics = metrics
        self.host = host
        self.port = port
        self._runner: Any = None  # aiohttp's AppRunner: aiohttp is imported only when metrics are served

    async def start(self) -> None:
        from aiohttp import web

        from agenthost.protos.listeners import CappedSite, Caps, Clients, json_body

        def caps() -> Caps:
            per_address = limits.METRICS_MAX_CONNECTIONS_PER_ADDRESS
            names = ("METRICS_MAX_CONNECTIONS", "METRICS_MAX_CONNECTIONS_PER_ADDRESS", "")
            # No credential: every connection is unauthenticated, so its cap is the per-address one.
            return Caps(limits.METRICS_MAX_CONNECTIONS, per_address, per_address, names, "")

        async def one_request(request: web.Request) -> web.Response:
            clients.request(request)
            if request.method == "GET" and request.path == "/metrics":
                body, kind = self.metrics.render(), "text/plain; version=0.0.4"
                response = web.Response(text=body, content_type="text/plain", charset="utf-8")
                response.headers["Content-Type"] = f"{kind}; charset=utf-8"
            else:
                response = web.Response(text="not found; try /metrics\n", status=404)
            response.force_close()
            return response

        clients = Clients(caps)
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        app.router.add_route("*", "/{path:.*}", one_request)
        # keepalive_timeout is also the request-head timeout: aiohttp arms it when a connection opens.
        self._runner = web.AppRunner(
            app,
            access_log=None,
            keepalive_timeout=REQUEST_TIMEOUT,
            logger=clients.server_log,
            max_line_size=MAX_REQUEST_BYTES,
            max_field_size=MAX_REQUEST_BYTES,
            max_headers=MAX_HEADERS,
        )
        await self._runner.setup()
        site = CappedSite(self._runner, self.host, self.port, clients=clients, render=json_body, reuse_address=True)
        try:
            await site.start()
        except BaseException:  # the address is taken, say: nothing of the listener stays behind
            runner, self._runner = self._runner, None
            await runner.cleanup()
            raise
        self.port = self._runner.addresses[0][1]

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
