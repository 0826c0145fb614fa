"""The host's observation points: what runs, the run API, the supervisor and the admin surface report, turned
into log lines (agenthost.host.ops.logs), metrics (agenthost.host.ops.metrics) and spans (agenthost.host.ops.tracing).

The modules that report call one method of an `Observer` per happening and know nothing of the three outputs;
an Observer built without arguments logs and counts, and traces nothing.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from agenthost.host.ops.logs import RefusalLimiter, event
from agenthost.host.ops.metrics import Metrics
from agenthost.host.ops.tracing import Tracing

_runs_log = logging.getLogger("agenthost.host.runs.manager")
_plugins_log = logging.getLogger("agenthost.host.plugins")
_refusals_log = logging.getLogger("agenthost.host.refusals")

REFUSAL_CODES = frozenset({"PERMISSION_DENIED", "UNAUTHENTICATED"})


class Observer:
    def __init__(
        self,
        metrics: Metrics | None = None,
        tracing: Tracing | None = None,
        refusals: RefusalLimiter | None = None,
    ) -> None:
        self.metrics = metrics or Metrics()
        self.tracing = tracing or Tracing.off()
        self.refusals = refusals or RefusalLimiter()
        self._started: dict[str, float] = {}  # run id -> monotonic start, for the duration

    # ---- runs ----

    def run_started(self, info: Any) -> None:
        self._started[info.run_id] = time.monotonic()
        event(
            _runs_log,
            logging.INFO,
            "run.started",
            run_id=info.run_id,
            runner=info.runner_id,
            bot_id=info.bot_id,
            binding_id=info.binding_id,
            conversation_id=info.conversation_id[:128],
        )
        self.tracing.run_started(
            info.run_id,
            info.runner_id,
            {"agenthost.runner": info.runner_id, "agenthost.bot_id": info.bot_id},
        )

    def run_finished(self, info: Any) -> None:
        began = self._started.pop(info.run_id, None)
        # A run that never started (refused in its queue, cancelled while waiting) has no running time.
        duration = time.monotonic() - began if began is not None else 0.0
        level = logging.INFO if info.status in ("completed", "cancelled", "interrupted") else logging.WARNING
        event(
            _runs_log,
            level,
            "run.finished",
            run_id=info.run_id,
            runner=info.runner_id,
            status=info.status,
            duration_s=round(duration, 3),
            error_code=info.error_code,
        )
        self.metrics.runs.inc(info.runner_id, info.status)
        if began is not None:
            self.metrics.run_duration.observe(duration, info.runner_id)
        self.tracing.run_finished(info.run_id, info.status, info.error_code, duration)

    # ---- run API ----

    def api_call(self, method: str, code: str) -> None:
        """Every run-API call's outcome. The hot path: one counter increment unless the call was refused."""
        self.metrics.api_calls.count(method, code)
        if code in REFUSAL_CODES:
            self._refusal("run_api", method, code)

    def admin_refused(self, method: str, code: str) -> None:
        self._refusal("admin", method, code)

    def _refusal(self, surface: str, method: str, code: str) -> None:
        self._limited(f"{surface}:{code}", {"surface": surface, "code": code}, "refused", method=method[:64])

    def _limited(self, kind: str, what: dict[str, str], name: str, **fields: object) -> None:
        """The event `name` with `what` and `fields`, limited per `kind` (self.refusals); the count of those not
        logged is reported with `what` alone."""
        allowed, suppressed = self.refusals.allow(kind)
        if suppressed:
            event(_refusals_log, logging.WARNING, "refusals.suppressed", **what, count=suppressed)
        if allowed:
            event(_refusals_log, logging.WARNING, name, **what, **fields)

    def runner_event_dropped(self, run_id: str, kind: str, why: str) -> None:
        """A runner sent an event it may not (one only the host writes, a ref to an artifact it may not read): it
        is dropped. Limited like refusals, per kind: a runner sends such events by the thousand in a few bytes
        each, and a line apiece would roll `host.log` past everything before them."""
        self._limited(
            f"runner_event:{kind}",
            {"surface": "runner_event", "kind": kind},
            "runner_event.dropped",
            run_id=run_id,
            why=why,
        )

    # ---- plugins ----

    def plugin_installed(self, plugin_id: str, version: str, source: str) -> None:
        event(_plugins_log, logging.INFO, "plugin.installed", plugin=plugin_id, version=version, source=source)

    def plugin_removed(self, plugin_id: str) -> None:
        event(_plugins_log, logging.INFO, "plugin.removed", plugin=plugin_id)

    def plugin_spawned(self, plugin_id: str, pid: int, attempt: int) -> None:
        event(_plugins_log, logging.INFO, "plugin.starting", plugin=plugin_id, pid=pid, restarts=attempt)

    def plugin_ready(self, plugin_id: str, pid: int, runners: list[str]) -> None:
        event(_plugins_log, logging.INFO, "plugin.ready", plugin=plugin_id, pid=pid, runners=runners)

    def plugin_failed(self, plugin_id: str, reason: str, *, crashed: bool) -> None:
        """The process died after it was ready (`crashed`) or never got there."""
        self.metrics.plugin_crashes.inc(plugin_id)
        name = "plugin.crashed" if crashed else "plugin.start_failed"
        event(_plugins_log, logging.WARNING, name, plugin=plugin_id, reason=reason[:500])

    def plugin_restarting(self, plugin_id: str, attempt: int, delay: float) -> None:
        self.metrics.plugin_restarts.inc(plugin_id)
        event(
            _plugins_log, logging.INFO, "plugin.restarting", plugin=plugin_id, restarts=attempt, delay_s=round(delay, 2)
        )

    def plugin_breaker_open(self, plugin_id: str, failures: int, reason: str) -> None:
        event(
            _plugins_log,
            logging.ERROR,
            "plugin.breaker_open",
            plugin=plugin_id,
            consecutive_failures=failures,
            reason=reason[:500],
        )

    def plugin_stopped(self, plugin_id: str) -> None:
        event(_plugins_log, logging.INFO, "plugin.stopped", plugin=plugin_id)
