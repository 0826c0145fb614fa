"""`HostClient`: a typed async client of the AgentHost service, used by the CLI and the test harness."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from agenthost.host.access.private_files import read_admin_token, read_standby
from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors, host_pb2_grpc
from agenthost.protos import host_pb2 as hpb
from agenthost.protos.wire import CHANNEL_OPTIONS


class HostNotRunning(RuntimeError):
    pass


def admin_address(data_dir: Path) -> str:
    try:
        info = json.loads((data_dir / "host.json").read_text())
    except (OSError, ValueError):
        standby = read_standby(data_dir)
        if standby is not None:
            raise HostNotRunning(
                f"the agenthost on {data_dir} (pid {standby['pid']}) is a standby: {standby['active']} is the active"
                " host, ask it instead (only `agenthost status` answers here until this one takes over)"
            ) from None
        raise HostNotRunning(f"no agenthost is serving {data_dir} (start one with `agenthost serve`)") from None
    return info["admin"]


def _with_token(details: grpc.aio.ClientCallDetails, pair: tuple[str, str]) -> grpc.aio.ClientCallDetails:
    metadata = grpc.aio.Metadata(*(details.metadata or ()), pair)
    return grpc.aio.ClientCallDetails(
        details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
    )


# grpc.aio files an interceptor under the first call kind it implements, so each kind needs its own instance.
class _UnaryCredential(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, pair: tuple[str, str]) -> None:
        self._pair = pair

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_token(details, self._pair), request)


class _StreamCredential(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, pair: tuple[str, str]) -> None:
        self._pair = pair

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_token(details, self._pair), request)


@dataclass
class SendResult:
    """Everything one SendMessage produced: the finished run, its events in order, and the reply text."""

    run: hpb.RunInfo
    events: list[pb.RunEvent] = field(default_factory=list)

    @property
    def text(self) -> str:
        return self.run.text

    def kinds(self) -> list[str]:
        return [e.WhichOneof("kind") for e in self.events]


class HostClient:
    """`token` is an admin credential: the host's full-admin token (`for_data_dir` reads it) or a scoped one."""

    def __init__(self, address: str, *, token: str, timeout: float = 30.0) -> None:
        # Every call on the channel carries the credential, whoever makes it through the stub.
        pair = ("authorization", f"Bearer {token}")
        self.channel = grpc.aio.insecure_channel(
            address, options=CHANNEL_OPTIONS, interceptors=[_UnaryCredential(pair), _StreamCredential(pair)]
        )
        self.stub = host_pb2_grpc.AgentHostStub(self.channel)
        self.timeout = timeout

    @classmethod
    def for_data_dir(cls, data_dir: Path, *, timeout: float = 30.0) -> HostClient:
        """A full-admin client of the host serving `data_dir` (what the CLI uses)."""
        return cls(admin_address(data_dir), token=read_admin_token(data_dir), timeout=timeout)

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> HostClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def call(self, method: str, request: Any, timeout: float | None = None) -> Any:
        try:
            return await getattr(self.stub, method)(request, timeout=timeout or self.timeout)
        except grpc.RpcError as exc:
            raise errors.from_rpc_error(exc) from None

    async def stream(
        self, request: hpb.SendMessageRequest, timeout: float | None = None
    ) -> AsyncIterator[hpb.SendMessageReply]:
        call = self.stub.SendMessage(request, timeout=timeout)
        try:
            async for reply in call:
                yield reply
        except grpc.RpcError as exc:
            raise errors.from_rpc_error(exc) from None
        finally:
            call.cancel()

    async def send(
        self, bot: str, text: str, *, conversation_id: str = "", timeout: float | None = None, **fields: Any
    ) -> SendResult:
        fields.setdefault("source", "api")
        request = hpb.SendMessageRequest(bot=bot, text=text, conversation_id=conversation_id, **fields)
        result: SendResult | None = None
        events: list[pb.RunEvent] = []
        async for reply in self.stream(request, timeout=timeout):
            kind = reply.WhichOneof("kind")
            if kind == "events":
                events.extend(reply.events.events)
            elif kind == "run_finished":
                result = SendResult(reply.run_finished, events)
        if result is None:
            raise errors.Unavailable("the host ended the stream before the run finished")
        return result

    async def bind(
        self,
        bot: str,
        runner_id: str,
        config: dict[str, Any] | None = None,
        *,
        event_pattern: str = "message.*",
        conversation_pattern: str = "",
        priority: int = 0,
        timeout_seconds: float = 0,
        apis: list[str] | None = None,
        state_scopes: list[int] | None = None,
        cross_conversation: list[str] | None = None,
        streaming: bool = True,
        keys: list[str] | None = None,
        pool: str = "",
    ) -> hpb.Binding:
        binding = hpb.Binding(
            pool=pool,
            event_pattern=event_pattern,
            conversation_pattern=conversation_pattern,
            priority=priority,
            runner_id=runner_id,
            config_json=json.dumps(config or {}),
            timeout_seconds=timeout_seconds,
            resource_policy=hpb.ResourcePolicy(
                apis=apis or [],
                state_scopes=state_scopes or [],
                cross_conversation_patterns=cross_conversation or [],
                keys=keys or [],
            ),
            delivery_policy=hpb.DeliveryPolicy(streaming=streaming),
        )
        return await self.call("CreateBinding", hpb.CreateBindingRequest(bot=bot, binding=binding))
