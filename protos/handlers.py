"""gRPC method handlers built from a service's descriptor instead of the generated `add_*_to_server`, for the
services whose codecs differ from the generated ones: the host's run API (deserializers that never raise, so a
malformed request is refused and audited like any other), the runner SDK's Run stream (batches sent already
encoded) and the host's SendMessage stream (event batches the host numbered as bytes, sent as they are)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import Message

_FACTORIES = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def method_handlers(
    service: ServiceDescriptor,
    servicer: object,
    *,
    deserializer: Callable[[type[Message]], Callable[[bytes], Any]] = lambda cls: cls.FromString,
    serializers: Mapping[str, Callable[[Any], bytes]] | None = None,
) -> dict[str, grpc.RpcMethodHandler]:
    """Handlers by method name for every method of `service`, calling the servicer's method of that name.
    `deserializer` makes a request class's deserializer; `serializers` replaces a method's response serializer."""
    handlers = {}
    for method in service.methods:
        request_class = message_factory.GetMessageClass(method.input_type)
        response_class = message_factory.GetMessageClass(method.output_type)
        handlers[method.name] = _FACTORIES[(method.client_streaming, method.server_streaming)](
            getattr(servicer, method.name),
            request_deserializer=deserializer(request_class),
            response_serializer=(serializers or {}).get(method.name, response_class.SerializeToString),
        )
    return handlers


def add_service(
    server: grpc.aio.Server,
    service: ServiceDescriptor,
    servicer: object,
    *,
    serializers: Mapping[str, Callable[[Any], bytes]],
) -> dict[str, grpc.RpcMethodHandler]:
    """Serves `service` on `server` as its generated `add_*_to_server` does, with `serializers` replacing those
    methods' response serializers. Returns the handlers by fully qualified method name."""
    handlers = method_handlers(service, servicer, serializers=serializers)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)
    return {f"/{service.full_name}/{name}": handler for name, handler in handlers.items()}


def pass_encoded(reply: Message | bytes) -> bytes:
    """A response serializer for a stream whose replies may come serialized already."""
    return reply if isinstance(reply, bytes) else reply.SerializeToString()
