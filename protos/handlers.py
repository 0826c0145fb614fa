"""gRPC method handlers built from a service's descriptor instead of the generated `add_*_to_server`, for the two
servers whose codecs differ from the generated ones: the host's run API (deserializers that never raise, so a
malformed request is refused and audited like any other) and the runner SDK's Run stream (batches sent already
encoded)."""

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
