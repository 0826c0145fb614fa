from agenthost.protos import runner_pb2 as _runner_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EnrolRequest(_message.Message):
    __slots__ = ("join_token", "name", "csr_pem")
    JOIN_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    join_token: str
    name: str
    csr_pem: bytes
    def __init__(self, join_token: _Optional[str] = ..., name: _Optional[str] = ..., csr_pem: _Optional[bytes] = ...) -> None: ...

class EnrolResponse(_message.Message):
    __slots__ = ("name", "pool", "certificate_pem", "ca_pem", "server_name")
    NAME_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    CA_PEM_FIELD_NUMBER: _ClassVar[int]
    SERVER_NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    pool: str
    certificate_pem: bytes
    ca_pem: bytes
    server_name: str
    def __init__(self, name: _Optional[str] = ..., pool: _Optional[str] = ..., certificate_pem: _Optional[bytes] = ..., ca_pem: _Optional[bytes] = ..., server_name: _Optional[str] = ...) -> None: ...

class ForwardedCall(_message.Message):
    __slots__ = ("id", "method", "authorization", "request", "timeout", "cancel")
    ID_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    AUTHORIZATION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    id: int
    method: str
    authorization: str
    request: bytes
    timeout: float
    cancel: bool
    def __init__(self, id: _Optional[int] = ..., method: _Optional[str] = ..., authorization: _Optional[str] = ..., request: _Optional[bytes] = ..., timeout: _Optional[float] = ..., cancel: _Optional[bool] = ...) -> None: ...

class ForwardedReply(_message.Message):
    __slots__ = ("id", "reply", "code", "details", "retry_after_ms")
    ID_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    id: int
    reply: bytes
    code: int
    details: str
    retry_after_ms: int
    def __init__(self, id: _Optional[int] = ..., reply: _Optional[bytes] = ..., code: _Optional[int] = ..., details: _Optional[str] = ..., retry_after_ms: _Optional[int] = ...) -> None: ...

class RenewRequest(_message.Message):
    __slots__ = ("csr_pem",)
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    csr_pem: bytes
    def __init__(self, csr_pem: _Optional[bytes] = ...) -> None: ...

class RenewResponse(_message.Message):
    __slots__ = ("certificate_pem", "ca_pem", "not_after")
    CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    CA_PEM_FIELD_NUMBER: _ClassVar[int]
    NOT_AFTER_FIELD_NUMBER: _ClassVar[int]
    certificate_pem: bytes
    ca_pem: bytes
    not_after: float
    def __init__(self, certificate_pem: _Optional[bytes] = ..., ca_pem: _Optional[bytes] = ..., not_after: _Optional[float] = ...) -> None: ...

class WorkerOffer(_message.Message):
    __slots__ = ("plugin_id", "version", "manifests_json")
    PLUGIN_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MANIFESTS_JSON_FIELD_NUMBER: _ClassVar[int]
    plugin_id: str
    version: str
    manifests_json: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, plugin_id: _Optional[str] = ..., version: _Optional[str] = ..., manifests_json: _Optional[_Iterable[str]] = ...) -> None: ...

class WorkerHello(_message.Message):
    __slots__ = ("offers", "capacity", "held_runs", "version", "renewed")
    OFFERS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    HELD_RUNS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RENEWED_FIELD_NUMBER: _ClassVar[int]
    offers: _containers.RepeatedCompositeFieldContainer[WorkerOffer]
    capacity: int
    held_runs: _containers.RepeatedScalarFieldContainer[str]
    version: str
    renewed: bool
    def __init__(self, offers: _Optional[_Iterable[_Union[WorkerOffer, _Mapping]]] = ..., capacity: _Optional[int] = ..., held_runs: _Optional[_Iterable[str]] = ..., version: _Optional[str] = ..., renewed: _Optional[bool] = ...) -> None: ...

class WorkerHeartbeat(_message.Message):
    __slots__ = ("in_flight",)
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    in_flight: int
    def __init__(self, in_flight: _Optional[int] = ...) -> None: ...

class WorkerUp(_message.Message):
    __slots__ = ("hello", "heartbeat")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    hello: WorkerHello
    heartbeat: WorkerHeartbeat
    def __init__(self, hello: _Optional[_Union[WorkerHello, _Mapping]] = ..., heartbeat: _Optional[_Union[WorkerHeartbeat, _Mapping]] = ...) -> None: ...

class RunAssignment(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class WorkerDown(_message.Message):
    __slots__ = ("assign", "heartbeat", "drain", "drop", "welcome", "rotate", "cut")
    ASSIGN_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    DROP_FIELD_NUMBER: _ClassVar[int]
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    ROTATE_FIELD_NUMBER: _ClassVar[int]
    CUT_FIELD_NUMBER: _ClassVar[int]
    assign: RunAssignment
    heartbeat: WorkerHeartbeat
    drain: bool
    drop: RunAssignment
    welcome: str
    rotate: bool
    cut: WorkerCut
    def __init__(self, assign: _Optional[_Union[RunAssignment, _Mapping]] = ..., heartbeat: _Optional[_Union[WorkerHeartbeat, _Mapping]] = ..., drain: _Optional[bool] = ..., drop: _Optional[_Union[RunAssignment, _Mapping]] = ..., welcome: _Optional[str] = ..., rotate: _Optional[bool] = ..., cut: _Optional[_Union[WorkerCut, _Mapping]] = ...) -> None: ...

class WorkerCut(_message.Message):
    __slots__ = ("code", "reason")
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    code: str
    reason: str
    def __init__(self, code: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class WorkerRunUp(_message.Message):
    __slots__ = ("run_id", "batch", "end")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    batch: bytes
    end: bool
    def __init__(self, run_id: _Optional[str] = ..., batch: _Optional[bytes] = ..., end: _Optional[bool] = ...) -> None: ...

class WorkerRunDown(_message.Message):
    __slots__ = ("request",)
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    request: _runner_pb2.RunRequest
    def __init__(self, request: _Optional[_Union[_runner_pb2.RunRequest, _Mapping]] = ...) -> None: ...
