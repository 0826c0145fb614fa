"""OpenTelemetry spans for runs and run-API calls, only when an OTLP endpoint is configured.

`serve --otlp URL` or OTEL_EXPORTER_OTLP_ENDPOINT turns it on; the SDK and exporter are the optional extra
`agenthost[otel]`. With neither, nothing of opentelemetry is imported: `Tracing.off()` holds no tracer, and the
run-API interceptor is not installed at all, so the calls pay nothing.

One span per run (`run <runner>`, from start to end, with its status and error code) and one per run-API call
(`run_api/<Method>`), a child of its run's span when the call names a live run. Runners are untrusted and get
no trace context: the parenting is the host's own, by run id.
"""

from __future__ import annotations

import contextvars
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

log = logging.getLogger(__name__)

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
SERVICE_NAME = "agenthost"


class TracingUnavailable(RuntimeError):
    pass


class Tracing:
    def __init__(self, tracer: Any = None, provider: Any = None) -> None:
        self.tracer = tracer
        self._provider = provider
        self._runs: dict[str, Any] = {}  # run id -> its open span

    @classmethod
    def off(cls) -> Tracing:
        return cls()

    @classmethod
    def configure(cls, endpoint: str | None, *, required: bool = False) -> Tracing:
        """`endpoint` (else the environment's OTEL_EXPORTER_OTLP_ENDPOINT) exporting over OTLP/HTTP. Without the
        extra installed: an error when the user asked for it (`required`), else a warning and no traces."""
        endpoint = endpoint or os.environ.get(ENDPOINT_ENV) or ""
        if not endpoint:
            return cls.off()
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            message = "OTLP tracing needs the optional extra: pip install 'agenthost[otel]'"
            if required:
                raise TracingUnavailable(message) from None
            log.warning("%s (%s is set; no traces)", message, ENDPOINT_ENV)
            return cls.off()
        # The exporter reads the signal path itself from the environment variable; a URL given on the command
        # line is the full traces URL, as OTEL_EXPORTER_OTLP_TRACES_ENDPOINT would be.
        if os.environ.get(ENDPOINT_ENV) == endpoint:
            exporter = OTLPSpanExporter()
        else:
            exporter = OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces")
        return cls.with_exporter(exporter)

    @classmethod
    def with_exporter(cls, exporter: Any, *, batch: bool = True) -> Tracing:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        # A provider of our own, not the global one: the host must not capture spans of a process embedding it.
        provider = TracerProvider(resource=Resource.create({"service.name": SERVICE_NAME}))
        provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
        return cls(provider.get_tracer("agenthost.host"), provider)

    @property
    def on(self) -> bool:
        return self.tracer is not None

    # ---- runs ----

    def run_started(self, run_id: str, runner_id: str, attributes: dict[str, Any]) -> None:
        if self.tracer is None:
            return
        span = self.tracer.start_span(f"run {runner_id}", attributes={"agenthost.run_id": run_id, **attributes})
        self._runs[run_id] = span

    def run_finished(self, run_id: str, status: str, error_code: str, duration: float) -> None:
        if self.tracer is None:
            return
        span = self._runs.pop(run_id, None)
        if span is None:
            return
        from opentelemetry.trace import Status, StatusCode

        span.set_attribute("agenthost.status", status)
        if error_code:
            span.set_attribute("agenthost.error_code", error_code)
        span.set_status(Status(StatusCode.OK if status == "completed" else StatusCode.ERROR, error_code or None))
        span.end()

    # ---- run API calls ----

    def interceptor(self) -> grpc.aio.ServerInterceptor:
        return _RunAPISpans(self)

    def _parent(self, run_id: str) -> Any:
        span = self._runs.get(run_id)
        if span is None:
            return None
        from opentelemetry import trace

        return trace.set_span_in_context(span)

    def call_span(self, method: str, run_id: str, start_ns: int, code: str) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        span = self.tracer.start_span(
            f"run_api/{method}",
            context=self._parent(run_id),
            kind=SpanKind.SERVER,
            start_time=start_ns,
            attributes={"agenthost.run_id": run_id[:128], "rpc.method": method, "rpc.grpc.status_code": code},
        )
        if code != "OK":
            span.set_status(Status(StatusCode.ERROR, code))
        span.end()

    def shutdown(self) -> None:
        if self._provider is not None:
            for span in self._runs.values():
                span.end()
            self._runs.clear()
            self._provider.shutdown()


def _code(context: grpc.aio.ServicerContext, exc: BaseException | None) -> str:
    try:
        code = context.code()
    except Exception:
        code = None
    if isinstance(code, grpc.StatusCode):
        return code.name
    if isinstance(code, int):
        for candidate in grpc.StatusCode:
            if candidate.value[0] == code:
                return candidate.name
    return "OK" if exc is None else "UNKNOWN"


# The run id a run-API call named, set by the call's handler (agenthost.host.api.run_api) in the call's own task, so
# that its span (made once the handler returns, in the same task) is its run's child.
CALL_RUN_ID: contextvars.ContextVar[str] = contextvars.ContextVar("agenthost_call_run_id", default="")


class _RunAPISpans(grpc.aio.ServerInterceptor):
    """Wraps each run-API handler in a span, recorded when the call ends (the span's start is the call's)."""

    def __init__(self, tracing: Tracing) -> None:
        self.tracing = tracing

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        method = details.method.rsplit("/", 1)[-1]
        tracing = self.tracing

        def finish(start: int, request: Any, context: Any, exc: BaseException | None) -> None:
            # The run API's gate serves every method request-streaming, so the run id comes from the call itself.
            run_id = getattr(request, "run_id", "") or CALL_RUN_ID.get()
            tracing.call_span(method, run_id if isinstance(run_id, str) else "", start, _code(context, exc))

        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                start = time.time_ns()
                exc: BaseException | None = None
                try:
                    return await inner(request, context)
                except BaseException as e:
                    exc = e
                    raise
                finally:
                    finish(start, request, context, exc)

            return grpc.unary_unary_rpc_method_handler(unary, handler.request_deserializer, handler.response_serializer)
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                start = time.time_ns()
                exc: BaseException | None = None
                try:
                    async for reply in inner_stream(request, context):
                        yield reply
                except BaseException as e:
                    exc = e
                    raise
                finally:
                    finish(start, request, context, exc)

            return grpc.unary_stream_rpc_method_handler(
                stream, handler.request_deserializer, handler.response_serializer
            )
        if handler.stream_unary is not None:
            inner_upload = handler.stream_unary

            async def upload(request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
                start = time.time_ns()
                exc: BaseException | None = None
                try:
                    return await inner_upload(request_iterator, context)
                except BaseException as e:
                    exc = e
                    raise
                finally:
                    finish(start, None, context, exc)

            return grpc.stream_unary_rpc_method_handler(
                upload, handler.request_deserializer, handler.response_serializer
            )
        return handler
