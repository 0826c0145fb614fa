from agenthost.protos import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class HistoryPageRequest(_message.Message):
    __slots__ = ("run_id", "conversation_id", "cursor", "direction", "limit")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    conversation_id: str
    cursor: str
    direction: _common_pb2.Direction
    limit: int
    def __init__(self, run_id: _Optional[str] = ..., conversation_id: _Optional[str] = ..., cursor: _Optional[str] = ..., direction: _Optional[_Union[_common_pb2.Direction, str]] = ..., limit: _Optional[int] = ...) -> None: ...

class HistoryPageResponse(_message.Message):
    __slots__ = ("items", "next_cursor", "has_more")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    NEXT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    HAS_MORE_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[_common_pb2.TranscriptItem]
    next_cursor: str
    has_more: bool
    def __init__(self, items: _Optional[_Iterable[_Union[_common_pb2.TranscriptItem, _Mapping]]] = ..., next_cursor: _Optional[str] = ..., has_more: _Optional[bool] = ...) -> None: ...

class HistorySearchRequest(_message.Message):
    __slots__ = ("run_id", "conversation_id", "query", "roles", "item_types", "top_k")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    ITEM_TYPES_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    conversation_id: str
    query: str
    roles: _containers.RepeatedScalarFieldContainer[str]
    item_types: _containers.RepeatedScalarFieldContainer[str]
    top_k: int
    def __init__(self, run_id: _Optional[str] = ..., conversation_id: _Optional[str] = ..., query: _Optional[str] = ..., roles: _Optional[_Iterable[str]] = ..., item_types: _Optional[_Iterable[str]] = ..., top_k: _Optional[int] = ...) -> None: ...

class HistorySearchResponse(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[_common_pb2.TranscriptItem]
    def __init__(self, items: _Optional[_Iterable[_Union[_common_pb2.TranscriptItem, _Mapping]]] = ...) -> None: ...

class EventGetRequest(_message.Message):
    __slots__ = ("run_id", "event_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    event_id: str
    def __init__(self, run_id: _Optional[str] = ..., event_id: _Optional[str] = ...) -> None: ...

class EventPageRequest(_message.Message):
    __slots__ = ("run_id", "conversation_id", "cursor", "direction", "limit", "event_types")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPES_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    conversation_id: str
    cursor: str
    direction: _common_pb2.Direction
    limit: int
    event_types: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, run_id: _Optional[str] = ..., conversation_id: _Optional[str] = ..., cursor: _Optional[str] = ..., direction: _Optional[_Union[_common_pb2.Direction, str]] = ..., limit: _Optional[int] = ..., event_types: _Optional[_Iterable[str]] = ...) -> None: ...

class EventPageResponse(_message.Message):
    __slots__ = ("events", "next_cursor", "has_more")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    HAS_MORE_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[_common_pb2.EventRecord]
    next_cursor: str
    has_more: bool
    def __init__(self, events: _Optional[_Iterable[_Union[_common_pb2.EventRecord, _Mapping]]] = ..., next_cursor: _Optional[str] = ..., has_more: _Optional[bool] = ...) -> None: ...

class ArtifactMetadataRequest(_message.Message):
    __slots__ = ("run_id", "artifact_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    artifact_id: str
    def __init__(self, run_id: _Optional[str] = ..., artifact_id: _Optional[str] = ...) -> None: ...

class ArtifactReadRangeRequest(_message.Message):
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

class ArtifactReadRequest(_message.Message):
    __slots__ = ("run_id", "artifact_id", "offset")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    artifact_id: str
    offset: int
    def __init__(self, run_id: _Optional[str] = ..., artifact_id: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class ArtifactChunk(_message.Message):
    __slots__ = ("data", "offset", "eof", "size_bytes")
    DATA_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    EOF_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    offset: int
    eof: bool
    size_bytes: int
    def __init__(self, data: _Optional[bytes] = ..., offset: _Optional[int] = ..., eof: _Optional[bool] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class ArtifactHeader(_message.Message):
    __slots__ = ("run_id", "name", "mime_type", "metadata_json", "expected_size")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    METADATA_JSON_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SIZE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    name: str
    mime_type: str
    metadata_json: str
    expected_size: int
    def __init__(self, run_id: _Optional[str] = ..., name: _Optional[str] = ..., mime_type: _Optional[str] = ..., metadata_json: _Optional[str] = ..., expected_size: _Optional[int] = ...) -> None: ...

class ArtifactUpload(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: ArtifactHeader
    data: bytes
    def __init__(self, header: _Optional[_Union[ArtifactHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class StateGetRequest(_message.Message):
    __slots__ = ("run_id", "scope", "key")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    scope: _common_pb2.StateScope
    key: str
    def __init__(self, run_id: _Optional[str] = ..., scope: _Optional[_Union[_common_pb2.StateScope, str]] = ..., key: _Optional[str] = ...) -> None: ...

class StateValue(_message.Message):
    __slots__ = ("found", "value_json", "version", "updated_at")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    VALUE_JSON_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    found: bool
    value_json: str
    version: int
    updated_at: float
    def __init__(self, found: _Optional[bool] = ..., value_json: _Optional[str] = ..., version: _Optional[int] = ..., updated_at: _Optional[float] = ...) -> None: ...

class StateSetRequest(_message.Message):
    __slots__ = ("run_id", "scope", "key", "value_json", "if_version")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_JSON_FIELD_NUMBER: _ClassVar[int]
    IF_VERSION_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    scope: _common_pb2.StateScope
    key: str
    value_json: str
    if_version: int
    def __init__(self, run_id: _Optional[str] = ..., scope: _Optional[_Union[_common_pb2.StateScope, str]] = ..., key: _Optional[str] = ..., value_json: _Optional[str] = ..., if_version: _Optional[int] = ...) -> None: ...

class StateDeleteRequest(_message.Message):
    __slots__ = ("run_id", "scope", "key")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    scope: _common_pb2.StateScope
    key: str
    def __init__(self, run_id: _Optional[str] = ..., scope: _Optional[_Union[_common_pb2.StateScope, str]] = ..., key: _Optional[str] = ...) -> None: ...

class StateDeleteResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class StateListRequest(_message.Message):
    __slots__ = ("run_id", "scope", "prefix", "cursor", "limit")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    scope: _common_pb2.StateScope
    prefix: str
    cursor: str
    limit: int
    def __init__(self, run_id: _Optional[str] = ..., scope: _Optional[_Union[_common_pb2.StateScope, str]] = ..., prefix: _Optional[str] = ..., cursor: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class StateListResponse(_message.Message):
    __slots__ = ("keys", "next_cursor", "has_more")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    NEXT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    HAS_MORE_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    next_cursor: str
    has_more: bool
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., next_cursor: _Optional[str] = ..., has_more: _Optional[bool] = ...) -> None: ...

class KbSearchRequest(_message.Message):
    __slots__ = ("run_id", "query", "top_k")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    query: str
    top_k: int
    def __init__(self, run_id: _Optional[str] = ..., query: _Optional[str] = ..., top_k: _Optional[int] = ...) -> None: ...

class KbHit(_message.Message):
    __slots__ = ("doc_id", "document_name", "artifact_id", "chunk_index", "start_line", "end_line", "text", "score", "keyword_rank", "vector_rank")
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_NAME_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_INDEX_FIELD_NUMBER: _ClassVar[int]
    START_LINE_FIELD_NUMBER: _ClassVar[int]
    END_LINE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    KEYWORD_RANK_FIELD_NUMBER: _ClassVar[int]
    VECTOR_RANK_FIELD_NUMBER: _ClassVar[int]
    doc_id: str
    document_name: str
    artifact_id: str
    chunk_index: int
    start_line: int
    end_line: int
    text: str
    score: float
    keyword_rank: int
    vector_rank: int
    def __init__(self, doc_id: _Optional[str] = ..., document_name: _Optional[str] = ..., artifact_id: _Optional[str] = ..., chunk_index: _Optional[int] = ..., start_line: _Optional[int] = ..., end_line: _Optional[int] = ..., text: _Optional[str] = ..., score: _Optional[float] = ..., keyword_rank: _Optional[int] = ..., vector_rank: _Optional[int] = ...) -> None: ...

class KbSearchResponse(_message.Message):
    __slots__ = ("hits", "keyword_only", "keyword_only_reason", "documents_without_vectors")
    HITS_FIELD_NUMBER: _ClassVar[int]
    KEYWORD_ONLY_FIELD_NUMBER: _ClassVar[int]
    KEYWORD_ONLY_REASON_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_WITHOUT_VECTORS_FIELD_NUMBER: _ClassVar[int]
    hits: _containers.RepeatedCompositeFieldContainer[KbHit]
    keyword_only: bool
    keyword_only_reason: str
    documents_without_vectors: int
    def __init__(self, hits: _Optional[_Iterable[_Union[KbHit, _Mapping]]] = ..., keyword_only: _Optional[bool] = ..., keyword_only_reason: _Optional[str] = ..., documents_without_vectors: _Optional[int] = ...) -> None: ...

class ApprovalRequest(_message.Message):
    __slots__ = ("run_id", "tool_name", "summary", "arguments_json", "reason", "timeout_seconds", "tool_call_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    tool_name: str
    summary: str
    arguments_json: str
    reason: str
    timeout_seconds: float
    tool_call_id: str
    def __init__(self, run_id: _Optional[str] = ..., tool_name: _Optional[str] = ..., summary: _Optional[str] = ..., arguments_json: _Optional[str] = ..., reason: _Optional[str] = ..., timeout_seconds: _Optional[float] = ..., tool_call_id: _Optional[str] = ...) -> None: ...

class ApprovalDecision(_message.Message):
    __slots__ = ("approval_id", "approved", "outcome", "decided_by", "note", "timeout_seconds")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    APPROVED_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    approved: bool
    outcome: str
    decided_by: str
    note: str
    timeout_seconds: float
    def __init__(self, approval_id: _Optional[str] = ..., approved: _Optional[bool] = ..., outcome: _Optional[str] = ..., decided_by: _Optional[str] = ..., note: _Optional[str] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class ChildRunHeader(_message.Message):
    __slots__ = ("run_id", "description", "subagent_type", "tool_call_id", "timeout_seconds")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    SUBAGENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    description: str
    subagent_type: str
    tool_call_id: str
    timeout_seconds: float
    def __init__(self, run_id: _Optional[str] = ..., description: _Optional[str] = ..., subagent_type: _Optional[str] = ..., tool_call_id: _Optional[str] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class ChildRunRequest(_message.Message):
    __slots__ = ("header", "events")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    header: ChildRunHeader
    events: _common_pb2.RunEventBatch
    def __init__(self, header: _Optional[_Union[ChildRunHeader, _Mapping]] = ..., events: _Optional[_Union[_common_pb2.RunEventBatch, _Mapping]] = ...) -> None: ...

class ChildRunStarted(_message.Message):
    __slots__ = ("child_run_id", "deadline_at")
    CHILD_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_AT_FIELD_NUMBER: _ClassVar[int]
    child_run_id: str
    deadline_at: float
    def __init__(self, child_run_id: _Optional[str] = ..., deadline_at: _Optional[float] = ...) -> None: ...

class ChildRunFinished(_message.Message):
    __slots__ = ("child_run_id", "status", "error_code", "error_message", "usage")
    CHILD_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    child_run_id: str
    status: str
    error_code: str
    error_message: str
    usage: _common_pb2.Usage
    def __init__(self, child_run_id: _Optional[str] = ..., status: _Optional[str] = ..., error_code: _Optional[str] = ..., error_message: _Optional[str] = ..., usage: _Optional[_Union[_common_pb2.Usage, _Mapping]] = ...) -> None: ...

class ChildRunReply(_message.Message):
    __slots__ = ("started", "finished")
    STARTED_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    started: ChildRunStarted
    finished: ChildRunFinished
    def __init__(self, started: _Optional[_Union[ChildRunStarted, _Mapping]] = ..., finished: _Optional[_Union[ChildRunFinished, _Mapping]] = ...) -> None: ...
