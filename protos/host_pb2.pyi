from agenthost.protos import common_pb2 as _common_pb2
from agenthost.protos import run_api_pb2 as _run_api_pb2
from agenthost.protos import runner_pb2 as _runner_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RollWorkerCARequest(_message.Message):
    __slots__ = ("step", "force")
    STEP_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    step: str
    force: bool
    def __init__(self, step: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class WorkerCAStatus(_message.Message):
    __slots__ = ("ca", "ca_expires_at", "next_ca", "rolling_since", "not_renewed")
    CA_FIELD_NUMBER: _ClassVar[int]
    CA_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    NEXT_CA_FIELD_NUMBER: _ClassVar[int]
    ROLLING_SINCE_FIELD_NUMBER: _ClassVar[int]
    NOT_RENEWED_FIELD_NUMBER: _ClassVar[int]
    ca: str
    ca_expires_at: float
    next_ca: str
    rolling_since: float
    not_renewed: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, ca: _Optional[str] = ..., ca_expires_at: _Optional[float] = ..., next_ca: _Optional[str] = ..., rolling_since: _Optional[float] = ..., not_renewed: _Optional[_Iterable[str]] = ...) -> None: ...

class CreateWorkerTokenRequest(_message.Message):
    __slots__ = ("pool", "ttl_seconds")
    POOL_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    pool: str
    ttl_seconds: float
    def __init__(self, pool: _Optional[str] = ..., ttl_seconds: _Optional[float] = ...) -> None: ...

class CreatedWorkerToken(_message.Message):
    __slots__ = ("token", "pool", "expires_at", "workers_address")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    WORKERS_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    token: str
    pool: str
    expires_at: float
    workers_address: str
    def __init__(self, token: _Optional[str] = ..., pool: _Optional[str] = ..., expires_at: _Optional[float] = ..., workers_address: _Optional[str] = ...) -> None: ...

class ListWorkersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerRunnerInfo(_message.Message):
    __slots__ = ("runner_id", "version")
    RUNNER_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    runner_id: str
    version: str
    def __init__(self, runner_id: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("name", "pool", "address", "runners", "in_flight", "capacity", "last_heartbeat", "state", "enrolled_at", "serial", "cert_expires_at", "renewed_at")
    NAME_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RUNNERS_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ENROLLED_AT_FIELD_NUMBER: _ClassVar[int]
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    CERT_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    RENEWED_AT_FIELD_NUMBER: _ClassVar[int]
    name: str
    pool: str
    address: str
    runners: _containers.RepeatedCompositeFieldContainer[WorkerRunnerInfo]
    in_flight: int
    capacity: int
    last_heartbeat: float
    state: str
    enrolled_at: float
    serial: str
    cert_expires_at: float
    renewed_at: float
    def __init__(self, name: _Optional[str] = ..., pool: _Optional[str] = ..., address: _Optional[str] = ..., runners: _Optional[_Iterable[_Union[WorkerRunnerInfo, _Mapping]]] = ..., in_flight: _Optional[int] = ..., capacity: _Optional[int] = ..., last_heartbeat: _Optional[float] = ..., state: _Optional[str] = ..., enrolled_at: _Optional[float] = ..., serial: _Optional[str] = ..., cert_expires_at: _Optional[float] = ..., renewed_at: _Optional[float] = ...) -> None: ...

class ListWorkersResponse(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerInfo]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerInfo, _Mapping]]] = ...) -> None: ...

class WorkerRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class CredentialInfo(_message.Message):
    __slots__ = ("name", "scope", "bots", "created_at", "all_conversations")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    BOTS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    ALL_CONVERSATIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    scope: str
    bots: _containers.RepeatedScalarFieldContainer[str]
    created_at: float
    all_conversations: bool
    def __init__(self, name: _Optional[str] = ..., scope: _Optional[str] = ..., bots: _Optional[_Iterable[str]] = ..., created_at: _Optional[float] = ..., all_conversations: _Optional[bool] = ...) -> None: ...

class CreateCredentialRequest(_message.Message):
    __slots__ = ("name", "scope", "bots", "all_conversations")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    BOTS_FIELD_NUMBER: _ClassVar[int]
    ALL_CONVERSATIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    scope: str
    bots: _containers.RepeatedScalarFieldContainer[str]
    all_conversations: bool
    def __init__(self, name: _Optional[str] = ..., scope: _Optional[str] = ..., bots: _Optional[_Iterable[str]] = ..., all_conversations: _Optional[bool] = ...) -> None: ...

class CreatedCredential(_message.Message):
    __slots__ = ("credential", "token")
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    credential: CredentialInfo
    token: str
    def __init__(self, credential: _Optional[_Union[CredentialInfo, _Mapping]] = ..., token: _Optional[str] = ...) -> None: ...

class ListCredentialsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListCredentialsResponse(_message.Message):
    __slots__ = ("credentials",)
    CREDENTIALS_FIELD_NUMBER: _ClassVar[int]
    credentials: _containers.RepeatedCompositeFieldContainer[CredentialInfo]
    def __init__(self, credentials: _Optional[_Iterable[_Union[CredentialInfo, _Mapping]]] = ...) -> None: ...

class RevokeCredentialRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class RevokeCredentialResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class KeyInfo(_message.Message):
    __slots__ = ("name", "updated_at", "length")
    NAME_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    name: str
    updated_at: float
    length: int
    def __init__(self, name: _Optional[str] = ..., updated_at: _Optional[float] = ..., length: _Optional[int] = ...) -> None: ...

class SetKeyRequest(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class ListKeysRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListKeysResponse(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[KeyInfo]
    def __init__(self, keys: _Optional[_Iterable[_Union[KeyInfo, _Mapping]]] = ...) -> None: ...

class RemoveKeyRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class RemoveKeyResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HostStatus(_message.Message):
    __slots__ = ("version", "data_dir", "pid", "started_at", "plugins", "sandbox", "runs_in_flight", "resource_limits", "database", "kb_vectors")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DATA_DIR_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    PLUGINS_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_FIELD_NUMBER: _ClassVar[int]
    RUNS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_LIMITS_FIELD_NUMBER: _ClassVar[int]
    DATABASE_FIELD_NUMBER: _ClassVar[int]
    KB_VECTORS_FIELD_NUMBER: _ClassVar[int]
    version: str
    data_dir: str
    pid: int
    started_at: float
    plugins: _containers.RepeatedCompositeFieldContainer[PluginInfo]
    sandbox: str
    runs_in_flight: int
    resource_limits: ResourceLimits
    database: str
    kb_vectors: str
    def __init__(self, version: _Optional[str] = ..., data_dir: _Optional[str] = ..., pid: _Optional[int] = ..., started_at: _Optional[float] = ..., plugins: _Optional[_Iterable[_Union[PluginInfo, _Mapping]]] = ..., sandbox: _Optional[str] = ..., runs_in_flight: _Optional[int] = ..., resource_limits: _Optional[_Union[ResourceLimits, _Mapping]] = ..., database: _Optional[str] = ..., kb_vectors: _Optional[str] = ...) -> None: ...

class ResourceLimits(_message.Message):
    __slots__ = ("on", "mechanism", "memory_max_bytes", "pids_max", "open_files_max", "reason")
    ON_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    PIDS_MAX_FIELD_NUMBER: _ClassVar[int]
    OPEN_FILES_MAX_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    on: bool
    mechanism: str
    memory_max_bytes: int
    pids_max: int
    open_files_max: int
    reason: str
    def __init__(self, on: _Optional[bool] = ..., mechanism: _Optional[str] = ..., memory_max_bytes: _Optional[int] = ..., pids_max: _Optional[int] = ..., open_files_max: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class InstallPluginRequest(_message.Message):
    __slots__ = ("source", "offline", "allow_network", "require_hashes")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    OFFLINE_FIELD_NUMBER: _ClassVar[int]
    ALLOW_NETWORK_FIELD_NUMBER: _ClassVar[int]
    REQUIRE_HASHES_FIELD_NUMBER: _ClassVar[int]
    source: str
    offline: bool
    allow_network: bool
    require_hashes: bool
    def __init__(self, source: _Optional[str] = ..., offline: _Optional[bool] = ..., allow_network: _Optional[bool] = ..., require_hashes: _Optional[bool] = ...) -> None: ...

class PluginInfo(_message.Message):
    __slots__ = ("plugin_id", "distribution", "version", "source", "enabled", "builtin", "state", "last_error", "pid", "restarts", "runners", "description")
    PLUGIN_ID_FIELD_NUMBER: _ClassVar[int]
    DISTRIBUTION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    BUILTIN_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    RUNNERS_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    plugin_id: str
    distribution: str
    version: str
    source: str
    enabled: bool
    builtin: bool
    state: str
    last_error: str
    pid: int
    restarts: int
    runners: _containers.RepeatedCompositeFieldContainer[RunnerInfo]
    description: str
    def __init__(self, plugin_id: _Optional[str] = ..., distribution: _Optional[str] = ..., version: _Optional[str] = ..., source: _Optional[str] = ..., enabled: _Optional[bool] = ..., builtin: _Optional[bool] = ..., state: _Optional[str] = ..., last_error: _Optional[str] = ..., pid: _Optional[int] = ..., restarts: _Optional[int] = ..., runners: _Optional[_Iterable[_Union[RunnerInfo, _Mapping]]] = ..., description: _Optional[str] = ...) -> None: ...

class ListPluginsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPluginsResponse(_message.Message):
    __slots__ = ("plugins",)
    PLUGINS_FIELD_NUMBER: _ClassVar[int]
    plugins: _containers.RepeatedCompositeFieldContainer[PluginInfo]
    def __init__(self, plugins: _Optional[_Iterable[_Union[PluginInfo, _Mapping]]] = ...) -> None: ...

class PluginRequest(_message.Message):
    __slots__ = ("plugin_id",)
    PLUGIN_ID_FIELD_NUMBER: _ClassVar[int]
    plugin_id: str
    def __init__(self, plugin_id: _Optional[str] = ...) -> None: ...

class RemovePluginResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SetPluginEnabledRequest(_message.Message):
    __slots__ = ("plugin_id", "enabled")
    PLUGIN_ID_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    plugin_id: str
    enabled: bool
    def __init__(self, plugin_id: _Optional[str] = ..., enabled: _Optional[bool] = ...) -> None: ...

class RunnerInfo(_message.Message):
    __slots__ = ("runner_id", "plugin_id", "name", "description", "manifest_json")
    RUNNER_ID_FIELD_NUMBER: _ClassVar[int]
    PLUGIN_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_JSON_FIELD_NUMBER: _ClassVar[int]
    runner_id: str
    plugin_id: str
    name: str
    description: str
    manifest_json: str
    def __init__(self, runner_id: _Optional[str] = ..., plugin_id: _Optional[str] = ..., name: _Optional[str] = ..., description: _Optional[str] = ..., manifest_json: _Optional[str] = ...) -> None: ...

class ListRunnersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListRunnersResponse(_message.Message):
    __slots__ = ("runners",)
    RUNNERS_FIELD_NUMBER: _ClassVar[int]
    runners: _containers.RepeatedCompositeFieldContainer[RunnerInfo]
    def __init__(self, runners: _Optional[_Iterable[_Union[RunnerInfo, _Mapping]]] = ...) -> None: ...

class Bot(_message.Message):
    __slots__ = ("bot_id", "name", "description", "created_at")
    BOT_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    bot_id: str
    name: str
    description: str
    created_at: float
    def __init__(self, bot_id: _Optional[str] = ..., name: _Optional[str] = ..., description: _Optional[str] = ..., created_at: _Optional[float] = ...) -> None: ...

class CreateBotRequest(_message.Message):
    __slots__ = ("name", "description")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ...) -> None: ...

class ListBotsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListBotsResponse(_message.Message):
    __slots__ = ("bots",)
    BOTS_FIELD_NUMBER: _ClassVar[int]
    bots: _containers.RepeatedCompositeFieldContainer[Bot]
    def __init__(self, bots: _Optional[_Iterable[_Union[Bot, _Mapping]]] = ...) -> None: ...

class BotRequest(_message.Message):
    __slots__ = ("bot",)
    BOT_FIELD_NUMBER: _ClassVar[int]
    bot: str
    def __init__(self, bot: _Optional[str] = ...) -> None: ...

class DeleteBotResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResourcePolicy(_message.Message):
    __slots__ = ("apis", "state_scopes", "cross_conversation_patterns", "keys")
    APIS_FIELD_NUMBER: _ClassVar[int]
    STATE_SCOPES_FIELD_NUMBER: _ClassVar[int]
    CROSS_CONVERSATION_PATTERNS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    apis: _containers.RepeatedScalarFieldContainer[str]
    state_scopes: _containers.RepeatedScalarFieldContainer[_common_pb2.StateScope]
    cross_conversation_patterns: _containers.RepeatedScalarFieldContainer[str]
    keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, apis: _Optional[_Iterable[str]] = ..., state_scopes: _Optional[_Iterable[_Union[_common_pb2.StateScope, str]]] = ..., cross_conversation_patterns: _Optional[_Iterable[str]] = ..., keys: _Optional[_Iterable[str]] = ...) -> None: ...

class DeliveryPolicy(_message.Message):
    __slots__ = ("streaming", "max_message_size")
    STREAMING_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    streaming: bool
    max_message_size: int
    def __init__(self, streaming: _Optional[bool] = ..., max_message_size: _Optional[int] = ...) -> None: ...

class Binding(_message.Message):
    __slots__ = ("binding_id", "bot_id", "event_pattern", "conversation_pattern", "priority", "runner_id", "config_json", "resource_policy", "delivery_policy", "created_at", "timeout_seconds", "pool", "manifest_json")
    BINDING_ID_FIELD_NUMBER: _ClassVar[int]
    BOT_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_PATTERN_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_PATTERN_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    RUNNER_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_POLICY_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_POLICY_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_JSON_FIELD_NUMBER: _ClassVar[int]
    binding_id: str
    bot_id: str
    event_pattern: str
    conversation_pattern: str
    priority: int
    runner_id: str
    config_json: str
    resource_policy: ResourcePolicy
    delivery_policy: DeliveryPolicy
    created_at: float
    timeout_seconds: float
    pool: str
    manifest_json: str
    def __init__(self, binding_id: _Optional[str] = ..., bot_id: _Optional[str] = ..., event_pattern: _Optional[str] = ..., conversation_pattern: _Optional[str] = ..., priority: _Optional[int] = ..., runner_id: _Optional[str] = ..., config_json: _Optional[str] = ..., resource_policy: _Optional[_Union[ResourcePolicy, _Mapping]] = ..., delivery_policy: _Optional[_Union[DeliveryPolicy, _Mapping]] = ..., created_at: _Optional[float] = ..., timeout_seconds: _Optional[float] = ..., pool: _Optional[str] = ..., manifest_json: _Optional[str] = ...) -> None: ...

class CreateBindingRequest(_message.Message):
    __slots__ = ("bot", "binding")
    BOT_FIELD_NUMBER: _ClassVar[int]
    BINDING_FIELD_NUMBER: _ClassVar[int]
    bot: str
    binding: Binding
    def __init__(self, bot: _Optional[str] = ..., binding: _Optional[_Union[Binding, _Mapping]] = ...) -> None: ...

class ListBindingsResponse(_message.Message):
    __slots__ = ("bindings",)
    BINDINGS_FIELD_NUMBER: _ClassVar[int]
    bindings: _containers.RepeatedCompositeFieldContainer[Binding]
    def __init__(self, bindings: _Optional[_Iterable[_Union[Binding, _Mapping]]] = ...) -> None: ...

class DeleteBindingRequest(_message.Message):
    __slots__ = ("binding_id",)
    BINDING_ID_FIELD_NUMBER: _ClassVar[int]
    binding_id: str
    def __init__(self, binding_id: _Optional[str] = ...) -> None: ...

class DeleteBindingResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UpdateBindingRequest(_message.Message):
    __slots__ = ("binding_id", "config_patch_json", "priority", "timeout_seconds", "apis", "keys")
    BINDING_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_PATCH_JSON_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    APIS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    binding_id: str
    config_patch_json: str
    priority: int
    timeout_seconds: float
    apis: StringList
    keys: StringList
    def __init__(self, binding_id: _Optional[str] = ..., config_patch_json: _Optional[str] = ..., priority: _Optional[int] = ..., timeout_seconds: _Optional[float] = ..., apis: _Optional[_Union[StringList, _Mapping]] = ..., keys: _Optional[_Union[StringList, _Mapping]] = ...) -> None: ...

class StringList(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, values: _Optional[_Iterable[str]] = ...) -> None: ...

class SendMessageRequest(_message.Message):
    __slots__ = ("bot", "conversation_id", "text", "actor", "event_type", "data_json", "source", "attachments", "idempotency_key")
    BOT_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    ATTACHMENTS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    bot: str
    conversation_id: str
    text: str
    actor: _common_pb2.Actor
    event_type: str
    data_json: str
    source: str
    attachments: _containers.RepeatedCompositeFieldContainer[Attachment]
    idempotency_key: str
    def __init__(self, bot: _Optional[str] = ..., conversation_id: _Optional[str] = ..., text: _Optional[str] = ..., actor: _Optional[_Union[_common_pb2.Actor, _Mapping]] = ..., event_type: _Optional[str] = ..., data_json: _Optional[str] = ..., source: _Optional[str] = ..., attachments: _Optional[_Iterable[_Union[Attachment, _Mapping]]] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class Attachment(_message.Message):
    __slots__ = ("name", "mime_type", "data")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    name: str
    mime_type: str
    data: bytes
    def __init__(self, name: _Optional[str] = ..., mime_type: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class RunInfo(_message.Message):
    __slots__ = ("run_id", "bot_id", "conversation_id", "binding_id", "runner_id", "event_id", "status", "error_code", "error_message", "created_at", "started_at", "finished_at", "deadline_at", "usage", "text", "parent_run_id", "child_run_ids", "origin")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    BOT_ID_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    BINDING_ID_FIELD_NUMBER: _ClassVar[int]
    RUNNER_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_AT_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    PARENT_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CHILD_RUN_IDS_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    bot_id: str
    conversation_id: str
    binding_id: str
    runner_id: str
    event_id: str
    status: str
    error_code: str
    error_message: str
    created_at: float
    started_at: float
    finished_at: float
    deadline_at: float
    usage: _common_pb2.Usage
    text: str
    parent_run_id: str
    child_run_ids: _containers.RepeatedScalarFieldContainer[str]
    origin: str
    def __init__(self, run_id: _Optional[str] = ..., bot_id: _Optional[str] = ..., conversation_id: _Optional[str] = ..., binding_id: _Optional[str] = ..., runner_id: _Optional[str] = ..., event_id: _Optional[str] = ..., status: _Optional[str] = ..., error_code: _Optional[str] = ..., error_message: _Optional[str] = ..., created_at: _Optional[float] = ..., started_at: _Optional[float] = ..., finished_at: _Optional[float] = ..., deadline_at: _Optional[float] = ..., usage: _Optional[_Union[_common_pb2.Usage, _Mapping]] = ..., text: _Optional[str] = ..., parent_run_id: _Optional[str] = ..., child_run_ids: _Optional[_Iterable[str]] = ..., origin: _Optional[str] = ...) -> None: ...

class SendMessageReply(_message.Message):
    __slots__ = ("run_started", "events", "run_finished", "queued")
    RUN_STARTED_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    RUN_FINISHED_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    run_started: RunInfo
    events: _common_pb2.RunEventBatch
    run_finished: RunInfo
    queued: RunQueued
    def __init__(self, run_started: _Optional[_Union[RunInfo, _Mapping]] = ..., events: _Optional[_Union[_common_pb2.RunEventBatch, _Mapping]] = ..., run_finished: _Optional[_Union[RunInfo, _Mapping]] = ..., queued: _Optional[_Union[RunQueued, _Mapping]] = ...) -> None: ...

class RunQueued(_message.Message):
    __slots__ = ("run", "waiting_on", "position", "bots_waiting")
    RUN_FIELD_NUMBER: _ClassVar[int]
    WAITING_ON_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    BOTS_WAITING_FIELD_NUMBER: _ClassVar[int]
    run: RunInfo
    waiting_on: str
    position: int
    bots_waiting: int
    def __init__(self, run: _Optional[_Union[RunInfo, _Mapping]] = ..., waiting_on: _Optional[str] = ..., position: _Optional[int] = ..., bots_waiting: _Optional[int] = ...) -> None: ...

class RunRequestById(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ("bot", "conversation_id", "status", "limit")
    BOT_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    bot: str
    conversation_id: str
    status: str
    limit: int
    def __init__(self, bot: _Optional[str] = ..., conversation_id: _Optional[str] = ..., status: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ("runs",)
    RUNS_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[RunInfo]
    def __init__(self, runs: _Optional[_Iterable[_Union[RunInfo, _Mapping]]] = ...) -> None: ...

class ListRunEventsRequest(_message.Message):
    __slots__ = ("run_id", "after_seq", "limit")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    after_seq: int
    limit: int
    def __init__(self, run_id: _Optional[str] = ..., after_seq: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class ListRunEventsResponse(_message.Message):
    __slots__ = ("events", "has_more")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    HAS_MORE_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[_common_pb2.RunEvent]
    has_more: bool
    def __init__(self, events: _Optional[_Iterable[_Union[_common_pb2.RunEvent, _Mapping]]] = ..., has_more: _Optional[bool] = ...) -> None: ...

class ConversationInfo(_message.Message):
    __slots__ = ("conversation_id", "bot_id", "item_count", "updated_at")
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    BOT_ID_FIELD_NUMBER: _ClassVar[int]
    ITEM_COUNT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    bot_id: str
    item_count: int
    updated_at: float
    def __init__(self, conversation_id: _Optional[str] = ..., bot_id: _Optional[str] = ..., item_count: _Optional[int] = ..., updated_at: _Optional[float] = ...) -> None: ...

class ListConversationsResponse(_message.Message):
    __slots__ = ("conversations",)
    CONVERSATIONS_FIELD_NUMBER: _ClassVar[int]
    conversations: _containers.RepeatedCompositeFieldContainer[ConversationInfo]
    def __init__(self, conversations: _Optional[_Iterable[_Union[ConversationInfo, _Mapping]]] = ...) -> None: ...

class GetHistoryRequest(_message.Message):
    __slots__ = ("bot", "conversation_id", "cursor", "limit", "direction")
    BOT_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    bot: str
    conversation_id: str
    cursor: str
    limit: int
    direction: _common_pb2.Direction
    def __init__(self, bot: _Optional[str] = ..., conversation_id: _Optional[str] = ..., cursor: _Optional[str] = ..., limit: _Optional[int] = ..., direction: _Optional[_Union[_common_pb2.Direction, str]] = ...) -> None: ...

class GetHistoryResponse(_message.Message):
    __slots__ = ("items", "next_cursor", "has_more")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    NEXT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    HAS_MORE_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[_common_pb2.TranscriptItem]
    next_cursor: str
    has_more: bool
    def __init__(self, items: _Optional[_Iterable[_Union[_common_pb2.TranscriptItem, _Mapping]]] = ..., next_cursor: _Optional[str] = ..., has_more: _Optional[bool] = ...) -> None: ...

class KbDocument(_message.Message):
    __slots__ = ("doc_id", "bot_id", "name", "artifact_id", "sha256", "size_bytes", "chunks", "embedding_space", "created_at")
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    BOT_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_SPACE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    doc_id: str
    bot_id: str
    name: str
    artifact_id: str
    sha256: str
    size_bytes: int
    chunks: int
    embedding_space: str
    created_at: float
    def __init__(self, doc_id: _Optional[str] = ..., bot_id: _Optional[str] = ..., name: _Optional[str] = ..., artifact_id: _Optional[str] = ..., sha256: _Optional[str] = ..., size_bytes: _Optional[int] = ..., chunks: _Optional[int] = ..., embedding_space: _Optional[str] = ..., created_at: _Optional[float] = ...) -> None: ...

class KbAddDocumentRequest(_message.Message):
    __slots__ = ("bot", "name", "content")
    BOT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    bot: str
    name: str
    content: bytes
    def __init__(self, bot: _Optional[str] = ..., name: _Optional[str] = ..., content: _Optional[bytes] = ...) -> None: ...

class KbListDocumentsResponse(_message.Message):
    __slots__ = ("documents", "chunks")
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    documents: _containers.RepeatedCompositeFieldContainer[KbDocument]
    chunks: int
    def __init__(self, documents: _Optional[_Iterable[_Union[KbDocument, _Mapping]]] = ..., chunks: _Optional[int] = ...) -> None: ...

class KbRemoveDocumentRequest(_message.Message):
    __slots__ = ("bot", "doc_id")
    BOT_FIELD_NUMBER: _ClassVar[int]
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    bot: str
    doc_id: str
    def __init__(self, bot: _Optional[str] = ..., doc_id: _Optional[str] = ...) -> None: ...

class KbRemoveDocumentResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class KbAdminSearchRequest(_message.Message):
    __slots__ = ("bot", "query", "top_k")
    BOT_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    bot: str
    query: str
    top_k: int
    def __init__(self, bot: _Optional[str] = ..., query: _Optional[str] = ..., top_k: _Optional[int] = ...) -> None: ...

class KbReindexResponse(_message.Message):
    __slots__ = ("documents", "chunks")
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    documents: int
    chunks: int
    def __init__(self, documents: _Optional[int] = ..., chunks: _Optional[int] = ...) -> None: ...

class KbEmbeddings(_message.Message):
    __slots__ = ("provider", "url", "model", "key", "dimensions", "timeout_seconds", "scope")
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    provider: str
    url: str
    model: str
    key: str
    dimensions: int
    timeout_seconds: float
    scope: str
    def __init__(self, provider: _Optional[str] = ..., url: _Optional[str] = ..., model: _Optional[str] = ..., key: _Optional[str] = ..., dimensions: _Optional[int] = ..., timeout_seconds: _Optional[float] = ..., scope: _Optional[str] = ...) -> None: ...

class KbSetEmbeddingsRequest(_message.Message):
    __slots__ = ("bot", "embeddings", "clear")
    BOT_FIELD_NUMBER: _ClassVar[int]
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    CLEAR_FIELD_NUMBER: _ClassVar[int]
    bot: str
    embeddings: KbEmbeddings
    clear: bool
    def __init__(self, bot: _Optional[str] = ..., embeddings: _Optional[_Union[KbEmbeddings, _Mapping]] = ..., clear: _Optional[bool] = ...) -> None: ...

class KbGetEmbeddingsRequest(_message.Message):
    __slots__ = ("bot",)
    BOT_FIELD_NUMBER: _ClassVar[int]
    bot: str
    def __init__(self, bot: _Optional[str] = ...) -> None: ...

class ListModelsAdminRequest(_message.Message):
    __slots__ = ("bot",)
    BOT_FIELD_NUMBER: _ClassVar[int]
    bot: str
    def __init__(self, bot: _Optional[str] = ...) -> None: ...

class BindingModels(_message.Message):
    __slots__ = ("bot_id", "binding_id", "runner_id", "models", "error")
    BOT_ID_FIELD_NUMBER: _ClassVar[int]
    BINDING_ID_FIELD_NUMBER: _ClassVar[int]
    RUNNER_ID_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    bot_id: str
    binding_id: str
    runner_id: str
    models: _containers.RepeatedCompositeFieldContainer[_runner_pb2.ModelEntry]
    error: str
    def __init__(self, bot_id: _Optional[str] = ..., binding_id: _Optional[str] = ..., runner_id: _Optional[str] = ..., models: _Optional[_Iterable[_Union[_runner_pb2.ModelEntry, _Mapping]]] = ..., error: _Optional[str] = ...) -> None: ...

class ListModelsAdminResponse(_message.Message):
    __slots__ = ("bindings",)
    BINDINGS_FIELD_NUMBER: _ClassVar[int]
    bindings: _containers.RepeatedCompositeFieldContainer[BindingModels]
    def __init__(self, bindings: _Optional[_Iterable[_Union[BindingModels, _Mapping]]] = ...) -> None: ...

class ApprovalInfo(_message.Message):
    __slots__ = ("approval_id", "run_id", "bot_id", "conversation_id", "created_at", "status", "request", "resolved")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    BOT_ID_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    run_id: str
    bot_id: str
    conversation_id: str
    created_at: float
    status: str
    request: _common_pb2.ApprovalRequested
    resolved: _common_pb2.ApprovalResolved
    def __init__(self, approval_id: _Optional[str] = ..., run_id: _Optional[str] = ..., bot_id: _Optional[str] = ..., conversation_id: _Optional[str] = ..., created_at: _Optional[float] = ..., status: _Optional[str] = ..., request: _Optional[_Union[_common_pb2.ApprovalRequested, _Mapping]] = ..., resolved: _Optional[_Union[_common_pb2.ApprovalResolved, _Mapping]] = ...) -> None: ...

class ListApprovalsRequest(_message.Message):
    __slots__ = ("bot", "run_id")
    BOT_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    bot: str
    run_id: str
    def __init__(self, bot: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class ListApprovalsResponse(_message.Message):
    __slots__ = ("approvals",)
    APPROVALS_FIELD_NUMBER: _ClassVar[int]
    approvals: _containers.RepeatedCompositeFieldContainer[ApprovalInfo]
    def __init__(self, approvals: _Optional[_Iterable[_Union[ApprovalInfo, _Mapping]]] = ...) -> None: ...

class DecideApprovalRequest(_message.Message):
    __slots__ = ("approval_id", "decision", "note")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    decision: str
    note: str
    def __init__(self, approval_id: _Optional[str] = ..., decision: _Optional[str] = ..., note: _Optional[str] = ...) -> None: ...

class AddChannelRequest(_message.Message):
    __slots__ = ("name", "bot", "adapter", "config_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    BOT_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    bot: str
    adapter: str
    config_json: str
    def __init__(self, name: _Optional[str] = ..., bot: _Optional[str] = ..., adapter: _Optional[str] = ..., config_json: _Optional[str] = ...) -> None: ...

class ChannelInfo(_message.Message):
    __slots__ = ("name", "bot_id", "adapter", "config_json", "keys", "state", "last_error", "pid", "restarts", "created_at")
    NAME_FIELD_NUMBER: _ClassVar[int]
    BOT_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    name: str
    bot_id: str
    adapter: str
    config_json: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    state: str
    last_error: str
    pid: int
    restarts: int
    created_at: float
    def __init__(self, name: _Optional[str] = ..., bot_id: _Optional[str] = ..., adapter: _Optional[str] = ..., config_json: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., state: _Optional[str] = ..., last_error: _Optional[str] = ..., pid: _Optional[int] = ..., restarts: _Optional[int] = ..., created_at: _Optional[float] = ...) -> None: ...

class ListChannelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListChannelsResponse(_message.Message):
    __slots__ = ("channels",)
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    channels: _containers.RepeatedCompositeFieldContainer[ChannelInfo]
    def __init__(self, channels: _Optional[_Iterable[_Union[ChannelInfo, _Mapping]]] = ...) -> None: ...

class RemoveChannelRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ReadRunArtifactRequest(_message.Message):
    __slots__ = ("run_id", "artifact_id", "offset", "length")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    artifact_id: str
    offset: int
    length: int
    def __init__(self, run_id: _Optional[str] = ..., artifact_id: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class ReadRunArtifactResponse(_message.Message):
    __slots__ = ("artifact", "data", "eof")
    ARTIFACT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    EOF_FIELD_NUMBER: _ClassVar[int]
    artifact: _common_pb2.ArtifactRef
    data: bytes
    eof: bool
    def __init__(self, artifact: _Optional[_Union[_common_pb2.ArtifactRef, _Mapping]] = ..., data: _Optional[bytes] = ..., eof: _Optional[bool] = ...) -> None: ...

class RemoveChannelResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
