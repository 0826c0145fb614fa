from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Direction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DIRECTION_UNSPECIFIED: _ClassVar[Direction]
    BACKWARD: _ClassVar[Direction]
    FORWARD: _ClassVar[Direction]

class StateScope(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATE_SCOPE_UNSPECIFIED: _ClassVar[StateScope]
    RUN: _ClassVar[StateScope]
    CONVERSATION: _ClassVar[StateScope]
    ACTOR: _ClassVar[StateScope]
    BINDING: _ClassVar[StateScope]
    RUNNER: _ClassVar[StateScope]
DIRECTION_UNSPECIFIED: Direction
BACKWARD: Direction
FORWARD: Direction
STATE_SCOPE_UNSPECIFIED: StateScope
RUN: StateScope
CONVERSATION: StateScope
ACTOR: StateScope
BINDING: StateScope
RUNNER: StateScope

class Actor(_message.Message):
    __slots__ = ("actor_type", "actor_id", "display_name")
    ACTOR_TYPE_FIELD_NUMBER: _ClassVar[int]
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    actor_type: str
    actor_id: str
    display_name: str
    def __init__(self, actor_type: _Optional[str] = ..., actor_id: _Optional[str] = ..., display_name: _Optional[str] = ...) -> None: ...

class ArtifactRef(_message.Message):
    __slots__ = ("artifact_id", "name", "mime_type", "size_bytes", "sha256", "conversation_id", "run_id", "created_at", "metadata_json")
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    METADATA_JSON_FIELD_NUMBER: _ClassVar[int]
    artifact_id: str
    name: str
    mime_type: str
    size_bytes: int
    sha256: str
    conversation_id: str
    run_id: str
    created_at: float
    metadata_json: str
    def __init__(self, artifact_id: _Optional[str] = ..., name: _Optional[str] = ..., mime_type: _Optional[str] = ..., size_bytes: _Optional[int] = ..., sha256: _Optional[str] = ..., conversation_id: _Optional[str] = ..., run_id: _Optional[str] = ..., created_at: _Optional[float] = ..., metadata_json: _Optional[str] = ...) -> None: ...

class ContentPart(_message.Message):
    __slots__ = ("type", "text", "artifact_id", "mime_type")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    type: str
    text: str
    artifact_id: str
    mime_type: str
    def __init__(self, type: _Optional[str] = ..., text: _Optional[str] = ..., artifact_id: _Optional[str] = ..., mime_type: _Optional[str] = ...) -> None: ...

class TranscriptItem(_message.Message):
    __slots__ = ("item_id", "conversation_id", "run_id", "event_id", "role", "item_type", "text", "data_json", "tool_call_id", "tool_name", "attachments", "seq", "cursor", "created_at", "is_error")
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ITEM_TYPE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    ATTACHMENTS_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    IS_ERROR_FIELD_NUMBER: _ClassVar[int]
    item_id: str
    conversation_id: str
    run_id: str
    event_id: str
    role: str
    item_type: str
    text: str
    data_json: str
    tool_call_id: str
    tool_name: str
    attachments: _containers.RepeatedCompositeFieldContainer[ArtifactRef]
    seq: int
    cursor: str
    created_at: float
    is_error: bool
    def __init__(self, item_id: _Optional[str] = ..., conversation_id: _Optional[str] = ..., run_id: _Optional[str] = ..., event_id: _Optional[str] = ..., role: _Optional[str] = ..., item_type: _Optional[str] = ..., text: _Optional[str] = ..., data_json: _Optional[str] = ..., tool_call_id: _Optional[str] = ..., tool_name: _Optional[str] = ..., attachments: _Optional[_Iterable[_Union[ArtifactRef, _Mapping]]] = ..., seq: _Optional[int] = ..., cursor: _Optional[str] = ..., created_at: _Optional[float] = ..., is_error: _Optional[bool] = ...) -> None: ...

class EventRecord(_message.Message):
    __slots__ = ("event_id", "event_type", "bot_id", "conversation_id", "actor", "text", "data_json", "attachments", "seq", "cursor", "created_at", "source")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    BOT_ID_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    ATTACHMENTS_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    event_type: str
    bot_id: str
    conversation_id: str
    actor: Actor
    text: str
    data_json: str
    attachments: _containers.RepeatedCompositeFieldContainer[ArtifactRef]
    seq: int
    cursor: str
    created_at: float
    source: str
    def __init__(self, event_id: _Optional[str] = ..., event_type: _Optional[str] = ..., bot_id: _Optional[str] = ..., conversation_id: _Optional[str] = ..., actor: _Optional[_Union[Actor, _Mapping]] = ..., text: _Optional[str] = ..., data_json: _Optional[str] = ..., attachments: _Optional[_Iterable[_Union[ArtifactRef, _Mapping]]] = ..., seq: _Optional[int] = ..., cursor: _Optional[str] = ..., created_at: _Optional[float] = ..., source: _Optional[str] = ...) -> None: ...

class TextDelta(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("role", "text", "parts")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    role: str
    text: str
    parts: _containers.RepeatedCompositeFieldContainer[ContentPart]
    def __init__(self, role: _Optional[str] = ..., text: _Optional[str] = ..., parts: _Optional[_Iterable[_Union[ContentPart, _Mapping]]] = ...) -> None: ...

class ToolStarted(_message.Message):
    __slots__ = ("tool_call_id", "tool_name", "arguments_json")
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    tool_call_id: str
    tool_name: str
    arguments_json: str
    def __init__(self, tool_call_id: _Optional[str] = ..., tool_name: _Optional[str] = ..., arguments_json: _Optional[str] = ...) -> None: ...

class ToolFinished(_message.Message):
    __slots__ = ("tool_call_id", "tool_name", "result", "is_error", "artifact_id")
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    IS_ERROR_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    tool_call_id: str
    tool_name: str
    result: str
    is_error: bool
    artifact_id: str
    def __init__(self, tool_call_id: _Optional[str] = ..., tool_name: _Optional[str] = ..., result: _Optional[str] = ..., is_error: _Optional[bool] = ..., artifact_id: _Optional[str] = ...) -> None: ...

class Compaction(_message.Message):
    __slots__ = ("tokens_before", "tokens_after", "summary", "artifact_id")
    TOKENS_BEFORE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_AFTER_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    tokens_before: int
    tokens_after: int
    summary: str
    artifact_id: str
    def __init__(self, tokens_before: _Optional[int] = ..., tokens_after: _Optional[int] = ..., summary: _Optional[str] = ..., artifact_id: _Optional[str] = ...) -> None: ...

class Retry(_message.Message):
    __slots__ = ("attempt", "delay_seconds", "reason")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    DELAY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    delay_seconds: float
    reason: str
    def __init__(self, attempt: _Optional[int] = ..., delay_seconds: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class StateUpdated(_message.Message):
    __slots__ = ("scope", "key")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    scope: StateScope
    key: str
    def __init__(self, scope: _Optional[_Union[StateScope, str]] = ..., key: _Optional[str] = ...) -> None: ...

class ArtifactCreated(_message.Message):
    __slots__ = ("artifact",)
    ARTIFACT_FIELD_NUMBER: _ClassVar[int]
    artifact: ArtifactRef
    def __init__(self, artifact: _Optional[_Union[ArtifactRef, _Mapping]] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "cost_usd", "model")
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHE_READ_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHE_WRITE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COST_USD_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cost_usd: float
    model: str
    def __init__(self, input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., cache_read_tokens: _Optional[int] = ..., cache_write_tokens: _Optional[int] = ..., cost_usd: _Optional[float] = ..., model: _Optional[str] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("message", "fraction")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FRACTION_FIELD_NUMBER: _ClassVar[int]
    message: str
    fraction: float
    def __init__(self, message: _Optional[str] = ..., fraction: _Optional[float] = ...) -> None: ...

class Completed(_message.Message):
    __slots__ = ("finish_reason",)
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    finish_reason: str
    def __init__(self, finish_reason: _Optional[str] = ...) -> None: ...

class Failed(_message.Message):
    __slots__ = ("code", "message", "retryable")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    retryable: bool
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., retryable: _Optional[bool] = ...) -> None: ...

class ApprovalOption(_message.Message):
    __slots__ = ("id", "label")
    ID_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    id: str
    label: str
    def __init__(self, id: _Optional[str] = ..., label: _Optional[str] = ...) -> None: ...

class ApprovalRequested(_message.Message):
    __slots__ = ("approval_id", "tool_name", "summary", "arguments_json", "reason", "expires_at", "options", "arguments_truncated", "tool_call_id", "from_sandbox")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_SANDBOX_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    tool_name: str
    summary: str
    arguments_json: str
    reason: str
    expires_at: float
    options: _containers.RepeatedCompositeFieldContainer[ApprovalOption]
    arguments_truncated: bool
    tool_call_id: str
    from_sandbox: bool
    def __init__(self, approval_id: _Optional[str] = ..., tool_name: _Optional[str] = ..., summary: _Optional[str] = ..., arguments_json: _Optional[str] = ..., reason: _Optional[str] = ..., expires_at: _Optional[float] = ..., options: _Optional[_Iterable[_Union[ApprovalOption, _Mapping]]] = ..., arguments_truncated: _Optional[bool] = ..., tool_call_id: _Optional[str] = ..., from_sandbox: _Optional[bool] = ...) -> None: ...

class ApprovalResolved(_message.Message):
    __slots__ = ("approval_id", "outcome", "decided_by", "note", "decided_at")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    outcome: str
    decided_by: str
    note: str
    decided_at: float
    def __init__(self, approval_id: _Optional[str] = ..., outcome: _Optional[str] = ..., decided_by: _Optional[str] = ..., note: _Optional[str] = ..., decided_at: _Optional[float] = ...) -> None: ...

class SubagentStarted(_message.Message):
    __slots__ = ("child_run_id", "tool_call_id", "subagent_type", "description")
    CHILD_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    SUBAGENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    child_run_id: str
    tool_call_id: str
    subagent_type: str
    description: str
    def __init__(self, child_run_id: _Optional[str] = ..., tool_call_id: _Optional[str] = ..., subagent_type: _Optional[str] = ..., description: _Optional[str] = ...) -> None: ...

class SubagentFinished(_message.Message):
    __slots__ = ("child_run_id", "tool_call_id", "status", "error_code", "usage")
    CHILD_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    child_run_id: str
    tool_call_id: str
    status: str
    error_code: str
    usage: Usage
    def __init__(self, child_run_id: _Optional[str] = ..., tool_call_id: _Optional[str] = ..., status: _Optional[str] = ..., error_code: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ...) -> None: ...

class RunEvent(_message.Message):
    __slots__ = ("text_delta", "message", "tool_started", "tool_finished", "compaction", "retry", "state_updated", "artifact_created", "usage", "progress", "completed", "failed", "approval_requested", "approval_resolved", "subagent_started", "subagent_finished", "seq", "created_at")
    TEXT_DELTA_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TOOL_STARTED_FIELD_NUMBER: _ClassVar[int]
    TOOL_FINISHED_FIELD_NUMBER: _ClassVar[int]
    COMPACTION_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    STATE_UPDATED_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_CREATED_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_RESOLVED_FIELD_NUMBER: _ClassVar[int]
    SUBAGENT_STARTED_FIELD_NUMBER: _ClassVar[int]
    SUBAGENT_FINISHED_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    text_delta: TextDelta
    message: Message
    tool_started: ToolStarted
    tool_finished: ToolFinished
    compaction: Compaction
    retry: Retry
    state_updated: StateUpdated
    artifact_created: ArtifactCreated
    usage: Usage
    progress: Progress
    completed: Completed
    failed: Failed
    approval_requested: ApprovalRequested
    approval_resolved: ApprovalResolved
    subagent_started: SubagentStarted
    subagent_finished: SubagentFinished
    seq: int
    created_at: float
    def __init__(self, text_delta: _Optional[_Union[TextDelta, _Mapping]] = ..., message: _Optional[_Union[Message, _Mapping]] = ..., tool_started: _Optional[_Union[ToolStarted, _Mapping]] = ..., tool_finished: _Optional[_Union[ToolFinished, _Mapping]] = ..., compaction: _Optional[_Union[Compaction, _Mapping]] = ..., retry: _Optional[_Union[Retry, _Mapping]] = ..., state_updated: _Optional[_Union[StateUpdated, _Mapping]] = ..., artifact_created: _Optional[_Union[ArtifactCreated, _Mapping]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., progress: _Optional[_Union[Progress, _Mapping]] = ..., completed: _Optional[_Union[Completed, _Mapping]] = ..., failed: _Optional[_Union[Failed, _Mapping]] = ..., approval_requested: _Optional[_Union[ApprovalRequested, _Mapping]] = ..., approval_resolved: _Optional[_Union[ApprovalResolved, _Mapping]] = ..., subagent_started: _Optional[_Union[SubagentStarted, _Mapping]] = ..., subagent_finished: _Optional[_Union[SubagentFinished, _Mapping]] = ..., seq: _Optional[int] = ..., created_at: _Optional[float] = ...) -> None: ...

class RunEventBatch(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[RunEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[RunEvent, _Mapping]]] = ...) -> None: ...

class EncodedRunEventBatch(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, events: _Optional[_Iterable[bytes]] = ...) -> None: ...
