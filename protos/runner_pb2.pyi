from agenthost.protos import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListModelsRequest(_message.Message):
    __slots__ = ("runner_name", "config_json", "secrets")
    class SecretsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUNNER_NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    runner_name: str
    config_json: str
    secrets: _containers.ScalarMap[str, str]
    def __init__(self, runner_name: _Optional[str] = ..., config_json: _Optional[str] = ..., secrets: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ModelEntry(_message.Message):
    __slots__ = ("provider", "model", "base_url", "error")
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BASE_URL_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    provider: str
    model: str
    base_url: str
    error: str
    def __init__(self, provider: _Optional[str] = ..., model: _Optional[str] = ..., base_url: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models", "error")
    MODELS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelEntry]
    error: str
    def __init__(self, models: _Optional[_Iterable[_Union[ModelEntry, _Mapping]]] = ..., error: _Optional[str] = ...) -> None: ...

class ValidateConfigRequest(_message.Message):
    __slots__ = ("runner_name", "config_json")
    RUNNER_NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    runner_name: str
    config_json: str
    def __init__(self, runner_name: _Optional[str] = ..., config_json: _Optional[str] = ...) -> None: ...

class ValidateConfigResponse(_message.Message):
    __slots__ = ("problems",)
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    problems: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, problems: _Optional[_Iterable[str]] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeResponse(_message.Message):
    __slots__ = ("plugin_id", "sdk_version", "protocol_version", "manifests_json", "entry_points")
    class EntryPointsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PLUGIN_ID_FIELD_NUMBER: _ClassVar[int]
    SDK_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    MANIFESTS_JSON_FIELD_NUMBER: _ClassVar[int]
    ENTRY_POINTS_FIELD_NUMBER: _ClassVar[int]
    plugin_id: str
    sdk_version: str
    protocol_version: int
    manifests_json: _containers.RepeatedScalarFieldContainer[str]
    entry_points: _containers.ScalarMap[str, str]
    def __init__(self, plugin_id: _Optional[str] = ..., sdk_version: _Optional[str] = ..., protocol_version: _Optional[int] = ..., manifests_json: _Optional[_Iterable[str]] = ..., entry_points: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ShutdownRequest(_message.Message):
    __slots__ = ("grace_seconds",)
    GRACE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    grace_seconds: float
    def __init__(self, grace_seconds: _Optional[float] = ...) -> None: ...

class ShutdownResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RunRequest(_message.Message):
    __slots__ = ("context", "run_token", "runner_name", "tool_token", "secrets")
    class SecretsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    RUN_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RUNNER_NAME_FIELD_NUMBER: _ClassVar[int]
    TOOL_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    context: AgentRunContext
    run_token: str
    runner_name: str
    tool_token: str
    secrets: _containers.ScalarMap[str, str]
    def __init__(self, context: _Optional[_Union[AgentRunContext, _Mapping]] = ..., run_token: _Optional[str] = ..., runner_name: _Optional[str] = ..., tool_token: _Optional[str] = ..., secrets: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Trigger(_message.Message):
    __slots__ = ("type", "source", "timestamp")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    type: str
    source: str
    timestamp: float
    def __init__(self, type: _Optional[str] = ..., source: _Optional[str] = ..., timestamp: _Optional[float] = ...) -> None: ...

class Conversation(_message.Message):
    __slots__ = ("conversation_id", "thread_id", "bot_id", "bot_name")
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    BOT_ID_FIELD_NUMBER: _ClassVar[int]
    BOT_NAME_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    thread_id: str
    bot_id: str
    bot_name: str
    def __init__(self, conversation_id: _Optional[str] = ..., thread_id: _Optional[str] = ..., bot_id: _Optional[str] = ..., bot_name: _Optional[str] = ...) -> None: ...

class Subject(_message.Message):
    __slots__ = ("subject_type", "subject_id", "data_json")
    SUBJECT_TYPE_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    subject_type: str
    subject_id: str
    data_json: str
    def __init__(self, subject_type: _Optional[str] = ..., subject_id: _Optional[str] = ..., data_json: _Optional[str] = ...) -> None: ...

class RunInput(_message.Message):
    __slots__ = ("text", "parts", "attachments")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    ATTACHMENTS_FIELD_NUMBER: _ClassVar[int]
    text: str
    parts: _containers.RepeatedCompositeFieldContainer[_common_pb2.ContentPart]
    attachments: _containers.RepeatedCompositeFieldContainer[_common_pb2.ArtifactRef]
    def __init__(self, text: _Optional[str] = ..., parts: _Optional[_Iterable[_Union[_common_pb2.ContentPart, _Mapping]]] = ..., attachments: _Optional[_Iterable[_Union[_common_pb2.ArtifactRef, _Mapping]]] = ...) -> None: ...

class Delivery(_message.Message):
    __slots__ = ("surface", "supports_streaming", "max_message_size")
    SURFACE_FIELD_NUMBER: _ClassVar[int]
    SUPPORTS_STREAMING_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    surface: str
    supports_streaming: bool
    max_message_size: int
    def __init__(self, surface: _Optional[str] = ..., supports_streaming: _Optional[bool] = ..., max_message_size: _Optional[int] = ...) -> None: ...

class Resources(_message.Message):
    __slots__ = ("apis", "state_scopes", "cross_conversation_patterns", "skills")
    APIS_FIELD_NUMBER: _ClassVar[int]
    STATE_SCOPES_FIELD_NUMBER: _ClassVar[int]
    CROSS_CONVERSATION_PATTERNS_FIELD_NUMBER: _ClassVar[int]
    SKILLS_FIELD_NUMBER: _ClassVar[int]
    apis: _containers.RepeatedScalarFieldContainer[str]
    state_scopes: _containers.RepeatedScalarFieldContainer[_common_pb2.StateScope]
    cross_conversation_patterns: _containers.RepeatedScalarFieldContainer[str]
    skills: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, apis: _Optional[_Iterable[str]] = ..., state_scopes: _Optional[_Iterable[_Union[_common_pb2.StateScope, str]]] = ..., cross_conversation_patterns: _Optional[_Iterable[str]] = ..., skills: _Optional[_Iterable[str]] = ...) -> None: ...

class InlinePolicy(_message.Message):
    __slots__ = ("mode", "delivered_count", "source_total_count", "complete", "reason")
    MODE_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_COUNT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_TOTAL_COUNT_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    mode: str
    delivered_count: int
    source_total_count: int
    complete: bool
    reason: str
    def __init__(self, mode: _Optional[str] = ..., delivered_count: _Optional[int] = ..., source_total_count: _Optional[int] = ..., complete: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class ContextAccess(_message.Message):
    __slots__ = ("conversation_id", "thread_id", "latest_cursor", "has_history_before", "transcript_count", "inline_policy", "available_apis")
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    LATEST_CURSOR_FIELD_NUMBER: _ClassVar[int]
    HAS_HISTORY_BEFORE_FIELD_NUMBER: _ClassVar[int]
    TRANSCRIPT_COUNT_FIELD_NUMBER: _ClassVar[int]
    INLINE_POLICY_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_APIS_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    thread_id: str
    latest_cursor: str
    has_history_before: bool
    transcript_count: int
    inline_policy: InlinePolicy
    available_apis: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, conversation_id: _Optional[str] = ..., thread_id: _Optional[str] = ..., latest_cursor: _Optional[str] = ..., has_history_before: _Optional[bool] = ..., transcript_count: _Optional[int] = ..., inline_policy: _Optional[_Union[InlinePolicy, _Mapping]] = ..., available_apis: _Optional[_Iterable[str]] = ...) -> None: ...

class Runtime(_message.Message):
    __slots__ = ("deadline_at", "host_version", "protocol_version", "binding_id", "runner_id", "plugin_id")
    DEADLINE_AT_FIELD_NUMBER: _ClassVar[int]
    HOST_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    BINDING_ID_FIELD_NUMBER: _ClassVar[int]
    RUNNER_ID_FIELD_NUMBER: _ClassVar[int]
    PLUGIN_ID_FIELD_NUMBER: _ClassVar[int]
    deadline_at: float
    host_version: str
    protocol_version: int
    binding_id: str
    runner_id: str
    plugin_id: str
    def __init__(self, deadline_at: _Optional[float] = ..., host_version: _Optional[str] = ..., protocol_version: _Optional[int] = ..., binding_id: _Optional[str] = ..., runner_id: _Optional[str] = ..., plugin_id: _Optional[str] = ...) -> None: ...

class AgentRunContext(_message.Message):
    __slots__ = ("run_id", "trigger", "event", "conversation", "actor", "subject", "input", "delivery", "resources", "context", "state_json", "runtime", "config_json", "bootstrap")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    BOOTSTRAP_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    trigger: Trigger
    event: _common_pb2.EventRecord
    conversation: Conversation
    actor: _common_pb2.Actor
    subject: Subject
    input: RunInput
    delivery: Delivery
    resources: Resources
    context: ContextAccess
    state_json: str
    runtime: Runtime
    config_json: str
    bootstrap: _containers.RepeatedCompositeFieldContainer[_common_pb2.TranscriptItem]
    def __init__(self, run_id: _Optional[str] = ..., trigger: _Optional[_Union[Trigger, _Mapping]] = ..., event: _Optional[_Union[_common_pb2.EventRecord, _Mapping]] = ..., conversation: _Optional[_Union[Conversation, _Mapping]] = ..., actor: _Optional[_Union[_common_pb2.Actor, _Mapping]] = ..., subject: _Optional[_Union[Subject, _Mapping]] = ..., input: _Optional[_Union[RunInput, _Mapping]] = ..., delivery: _Optional[_Union[Delivery, _Mapping]] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., context: _Optional[_Union[ContextAccess, _Mapping]] = ..., state_json: _Optional[str] = ..., runtime: _Optional[_Union[Runtime, _Mapping]] = ..., config_json: _Optional[str] = ..., bootstrap: _Optional[_Iterable[_Union[_common_pb2.TranscriptItem, _Mapping]]] = ...) -> None: ...
