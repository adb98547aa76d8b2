from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NullValue(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NULL_VALUE: _ClassVar[NullValue]

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_CODE_OK: _ClassVar[ErrorCode]
    ERROR_CODE_NOT_FOUND: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_ARGUMENT: _ClassVar[ErrorCode]
    ERROR_CODE_TIMEOUT: _ClassVar[ErrorCode]
    ERROR_CODE_ABORTED: _ClassVar[ErrorCode]
    ERROR_CODE_APPLICATION: _ClassVar[ErrorCode]
    ERROR_CODE_UNAVAILABLE: _ClassVar[ErrorCode]
    ERROR_CODE_RESOURCE_EXHAUSTED: _ClassVar[ErrorCode]
    ERROR_CODE_ALREADY_EXISTS: _ClassVar[ErrorCode]
    ERROR_CODE_INTERNAL: _ClassVar[ErrorCode]
    ERROR_CODE_UNAUTHENTICATED: _ClassVar[ErrorCode]
    ERROR_CODE_PERMISSION_DENIED: _ClassVar[ErrorCode]

class Consistency(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONSISTENCY_LINEARIZABLE: _ClassVar[Consistency]
    CONSISTENCY_SEQUENTIAL: _ClassVar[Consistency]
NULL_VALUE: NullValue
ERROR_CODE_OK: ErrorCode
ERROR_CODE_NOT_FOUND: ErrorCode
ERROR_CODE_INVALID_ARGUMENT: ErrorCode
ERROR_CODE_TIMEOUT: ErrorCode
ERROR_CODE_ABORTED: ErrorCode
ERROR_CODE_APPLICATION: ErrorCode
ERROR_CODE_UNAVAILABLE: ErrorCode
ERROR_CODE_RESOURCE_EXHAUSTED: ErrorCode
ERROR_CODE_ALREADY_EXISTS: ErrorCode
ERROR_CODE_INTERNAL: ErrorCode
ERROR_CODE_UNAUTHENTICATED: ErrorCode
ERROR_CODE_PERMISSION_DENIED: ErrorCode
CONSISTENCY_LINEARIZABLE: Consistency
CONSISTENCY_SEQUENTIAL: Consistency

class Value(_message.Message):
    __slots__ = ("null_value", "bool_value", "int_value", "double_value", "string_value", "bytes_value", "list_value", "map_value")
    NULL_VALUE_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_VALUE_FIELD_NUMBER: _ClassVar[int]
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    BYTES_VALUE_FIELD_NUMBER: _ClassVar[int]
    LIST_VALUE_FIELD_NUMBER: _ClassVar[int]
    MAP_VALUE_FIELD_NUMBER: _ClassVar[int]
    null_value: NullValue
    bool_value: bool
    int_value: int
    double_value: float
    string_value: str
    bytes_value: bytes
    list_value: ListValue
    map_value: MapValue
    def __init__(self, null_value: _Optional[_Union[NullValue, str]] = ..., bool_value: _Optional[bool] = ..., int_value: _Optional[int] = ..., double_value: _Optional[float] = ..., string_value: _Optional[str] = ..., bytes_value: _Optional[bytes] = ..., list_value: _Optional[_Union[ListValue, _Mapping]] = ..., map_value: _Optional[_Union[MapValue, _Mapping]] = ...) -> None: ...

class ListValue(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedCompositeFieldContainer[Value]
    def __init__(self, values: _Optional[_Iterable[_Union[Value, _Mapping]]] = ...) -> None: ...

class MapValue(_message.Message):
    __slots__ = ("fields",)
    class FieldsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    fields: _containers.MessageMap[str, Value]
    def __init__(self, fields: _Optional[_Mapping[str, Value]] = ...) -> None: ...

class ErrorDetail(_message.Message):
    __slots__ = ("code", "message", "type", "leader_hint")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    LEADER_HINT_FIELD_NUMBER: _ClassVar[int]
    code: ErrorCode
    message: str
    type: str
    leader_hint: str
    def __init__(self, code: _Optional[_Union[ErrorCode, str]] = ..., message: _Optional[str] = ..., type: _Optional[str] = ..., leader_hint: _Optional[str] = ...) -> None: ...

class ReadOptions(_message.Message):
    __slots__ = ("consistency", "min_index")
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    MIN_INDEX_FIELD_NUMBER: _ClassVar[int]
    consistency: Consistency
    min_index: int
    def __init__(self, consistency: _Optional[_Union[Consistency, str]] = ..., min_index: _Optional[int] = ...) -> None: ...

class OpenSessionRequest(_message.Message):
    __slots__ = ("ttl",)
    TTL_FIELD_NUMBER: _ClassVar[int]
    ttl: float
    def __init__(self, ttl: _Optional[float] = ...) -> None: ...

class OpenSessionResponse(_message.Message):
    __slots__ = ("session", "ttl", "leader", "session_secret", "applied_index")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    SESSION_SECRET_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    session: int
    ttl: float
    leader: str
    session_secret: str
    applied_index: int
    def __init__(self, session: _Optional[int] = ..., ttl: _Optional[float] = ..., leader: _Optional[str] = ..., session_secret: _Optional[str] = ..., applied_index: _Optional[int] = ...) -> None: ...

class KeepAliveRequest(_message.Message):
    __slots__ = ("session", "session_secret")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    SESSION_SECRET_FIELD_NUMBER: _ClassVar[int]
    session: int
    session_secret: str
    def __init__(self, session: _Optional[int] = ..., session_secret: _Optional[str] = ...) -> None: ...

class KeepAliveResponse(_message.Message):
    __slots__ = ("ttl", "applied_index")
    TTL_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    ttl: float
    applied_index: int
    def __init__(self, ttl: _Optional[float] = ..., applied_index: _Optional[int] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session", "session_secret")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    SESSION_SECRET_FIELD_NUMBER: _ClassVar[int]
    session: int
    session_secret: str
    def __init__(self, session: _Optional[int] = ..., session_secret: _Optional[str] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ("applied_index",)
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    applied_index: int
    def __init__(self, applied_index: _Optional[int] = ...) -> None: ...

class InvokeRequest(_message.Message):
    __slots__ = ("session", "seq", "ack", "class_name", "object_name", "method", "args", "kwargs", "timeout", "create", "ctor_args", "ctor_kwargs", "session_secret", "read")
    class KwargsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    class CtorKwargsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    SESSION_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    CLASS_NAME_FIELD_NUMBER: _ClassVar[int]
    OBJECT_NAME_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    KWARGS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    CREATE_FIELD_NUMBER: _ClassVar[int]
    CTOR_ARGS_FIELD_NUMBER: _ClassVar[int]
    CTOR_KWARGS_FIELD_NUMBER: _ClassVar[int]
    SESSION_SECRET_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    session: int
    seq: int
    ack: int
    class_name: str
    object_name: str
    method: str
    args: _containers.RepeatedCompositeFieldContainer[Value]
    kwargs: _containers.MessageMap[str, Value]
    timeout: float
    create: bool
    ctor_args: _containers.RepeatedCompositeFieldContainer[Value]
    ctor_kwargs: _containers.MessageMap[str, Value]
    session_secret: str
    read: ReadOptions
    def __init__(self, session: _Optional[int] = ..., seq: _Optional[int] = ..., ack: _Optional[int] = ..., class_name: _Optional[str] = ..., object_name: _Optional[str] = ..., method: _Optional[str] = ..., args: _Optional[_Iterable[_Union[Value, _Mapping]]] = ..., kwargs: _Optional[_Mapping[str, Value]] = ..., timeout: _Optional[float] = ..., create: _Optional[bool] = ..., ctor_args: _Optional[_Iterable[_Union[Value, _Mapping]]] = ..., ctor_kwargs: _Optional[_Mapping[str, Value]] = ..., session_secret: _Optional[str] = ..., read: _Optional[_Union[ReadOptions, _Mapping]] = ...) -> None: ...

class InvokeResponse(_message.Message):
    __slots__ = ("result", "applied_index")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    result: Value
    applied_index: int
    def __init__(self, result: _Optional[_Union[Value, _Mapping]] = ..., applied_index: _Optional[int] = ...) -> None: ...

class Call(_message.Message):
    __slots__ = ("id", "invoke", "cancel", "deadline", "follow")
    ID_FIELD_NUMBER: _ClassVar[int]
    INVOKE_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    id: int
    invoke: InvokeRequest
    cancel: bool
    deadline: float
    follow: Follow
    def __init__(self, id: _Optional[int] = ..., invoke: _Optional[_Union[InvokeRequest, _Mapping]] = ..., cancel: _Optional[bool] = ..., deadline: _Optional[float] = ..., follow: _Optional[_Union[Follow, _Mapping]] = ...) -> None: ...

class Follow(_message.Message):
    __slots__ = ("argument", "key", "merge")
    ARGUMENT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    MERGE_FIELD_NUMBER: _ClassVar[int]
    argument: str
    key: str
    merge: bool
    def __init__(self, argument: _Optional[str] = ..., key: _Optional[str] = ..., merge: _Optional[bool] = ...) -> None: ...

class CallAnswer(_message.Message):
    __slots__ = ("id", "response", "error", "more", "also")
    ID_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    ALSO_FIELD_NUMBER: _ClassVar[int]
    id: int
    response: InvokeResponse
    error: ErrorDetail
    more: bool
    also: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, id: _Optional[int] = ..., response: _Optional[_Union[InvokeResponse, _Mapping]] = ..., error: _Optional[_Union[ErrorDetail, _Mapping]] = ..., more: _Optional[bool] = ..., also: _Optional[_Iterable[int]] = ...) -> None: ...

class CreateObjectRequest(_message.Message):
    __slots__ = ("session", "class_name", "object_name", "args", "kwargs", "session_secret")
    class KwargsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    SESSION_FIELD_NUMBER: _ClassVar[int]
    CLASS_NAME_FIELD_NUMBER: _ClassVar[int]
    OBJECT_NAME_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    KWARGS_FIELD_NUMBER: _ClassVar[int]
    SESSION_SECRET_FIELD_NUMBER: _ClassVar[int]
    session: int
    class_name: str
    object_name: str
    args: _containers.RepeatedCompositeFieldContainer[Value]
    kwargs: _containers.MessageMap[str, Value]
    session_secret: str
    def __init__(self, session: _Optional[int] = ..., class_name: _Optional[str] = ..., object_name: _Optional[str] = ..., args: _Optional[_Iterable[_Union[Value, _Mapping]]] = ..., kwargs: _Optional[_Mapping[str, Value]] = ..., session_secret: _Optional[str] = ...) -> None: ...

class CreateObjectResponse(_message.Message):
    __slots__ = ("created", "applied_index")
    CREATED_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    created: bool
    applied_index: int
    def __init__(self, created: _Optional[bool] = ..., applied_index: _Optional[int] = ...) -> None: ...

class DeleteObjectRequest(_message.Message):
    __slots__ = ("object_name",)
    OBJECT_NAME_FIELD_NUMBER: _ClassVar[int]
    object_name: str
    def __init__(self, object_name: _Optional[str] = ...) -> None: ...

class DeleteObjectResponse(_message.Message):
    __slots__ = ("applied_index",)
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    applied_index: int
    def __init__(self, applied_index: _Optional[int] = ...) -> None: ...

class ObjectInfo(_message.Message):
    __slots__ = ("name", "class_name", "class_version", "waiters")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CLASS_NAME_FIELD_NUMBER: _ClassVar[int]
    CLASS_VERSION_FIELD_NUMBER: _ClassVar[int]
    WAITERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    class_name: str
    class_version: int
    waiters: int
    def __init__(self, name: _Optional[str] = ..., class_name: _Optional[str] = ..., class_version: _Optional[int] = ..., waiters: _Optional[int] = ...) -> None: ...

class ListObjectsRequest(_message.Message):
    __slots__ = ("limit", "page_token", "prefix", "class_name", "read")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    CLASS_NAME_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    limit: int
    page_token: str
    prefix: str
    class_name: str
    read: ReadOptions
    def __init__(self, limit: _Optional[int] = ..., page_token: _Optional[str] = ..., prefix: _Optional[str] = ..., class_name: _Optional[str] = ..., read: _Optional[_Union[ReadOptions, _Mapping]] = ...) -> None: ...

class ListObjectsResponse(_message.Message):
    __slots__ = ("objects", "next_page_token", "applied_index")
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    objects: _containers.RepeatedCompositeFieldContainer[ObjectInfo]
    next_page_token: str
    applied_index: int
    def __init__(self, objects: _Optional[_Iterable[_Union[ObjectInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., applied_index: _Optional[int] = ...) -> None: ...

class ClassInfo(_message.Message):
    __slots__ = ("name", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class RegisterClassRequest(_message.Message):
    __slots__ = ("source",)
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    source: str
    def __init__(self, source: _Optional[str] = ...) -> None: ...

class RegisterClassResponse(_message.Message):
    __slots__ = ("classes", "applied_index")
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    classes: _containers.RepeatedCompositeFieldContainer[ClassInfo]
    applied_index: int
    def __init__(self, classes: _Optional[_Iterable[_Union[ClassInfo, _Mapping]]] = ..., applied_index: _Optional[int] = ...) -> None: ...

class ListClassesRequest(_message.Message):
    __slots__ = ("read",)
    READ_FIELD_NUMBER: _ClassVar[int]
    read: ReadOptions
    def __init__(self, read: _Optional[_Union[ReadOptions, _Mapping]] = ...) -> None: ...

class ListClassesResponse(_message.Message):
    __slots__ = ("classes", "applied_index")
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    classes: _containers.RepeatedCompositeFieldContainer[ClassInfo]
    applied_index: int
    def __init__(self, classes: _Optional[_Iterable[_Union[ClassInfo, _Mapping]]] = ..., applied_index: _Optional[int] = ...) -> None: ...

class GetClassRequest(_message.Message):
    __slots__ = ("name", "version", "read")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    read: ReadOptions
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ..., read: _Optional[_Union[ReadOptions, _Mapping]] = ...) -> None: ...

class GetClassResponse(_message.Message):
    __slots__ = ("name", "version", "source", "applied_index")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    source: str
    applied_index: int
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ..., source: _Optional[str] = ..., applied_index: _Optional[int] = ...) -> None: ...

class NodeHealth(_message.Message):
    __slots__ = ("node_id", "address", "connected", "match_index")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    MATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    connected: bool
    match_index: int
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., connected: _Optional[bool] = ..., match_index: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("with_digest", "read")
    WITH_DIGEST_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    with_digest: bool
    read: ReadOptions
    def __init__(self, with_digest: _Optional[bool] = ..., read: _Optional[_Union[ReadOptions, _Mapping]] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("node_id", "leader_address", "is_leader", "term", "commit_index", "last_applied", "nodes", "object_count", "waiter_count", "session_count", "state_digest", "rejoining", "applied_index")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    IS_LEADER_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_APPLIED_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    OBJECT_COUNT_FIELD_NUMBER: _ClassVar[int]
    WAITER_COUNT_FIELD_NUMBER: _ClassVar[int]
    SESSION_COUNT_FIELD_NUMBER: _ClassVar[int]
    STATE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    REJOINING_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    leader_address: str
    is_leader: bool
    term: int
    commit_index: int
    last_applied: int
    nodes: _containers.RepeatedCompositeFieldContainer[NodeHealth]
    object_count: int
    waiter_count: int
    session_count: int
    state_digest: str
    rejoining: bool
    applied_index: int
    def __init__(self, node_id: _Optional[str] = ..., leader_address: _Optional[str] = ..., is_leader: _Optional[bool] = ..., term: _Optional[int] = ..., commit_index: _Optional[int] = ..., last_applied: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[NodeHealth, _Mapping]]] = ..., object_count: _Optional[int] = ..., waiter_count: _Optional[int] = ..., session_count: _Optional[int] = ..., state_digest: _Optional[str] = ..., rejoining: _Optional[bool] = ..., applied_index: _Optional[int] = ...) -> None: ...

class AddNodeRequest(_message.Message):
    __slots__ = ("raft_addr", "client_addr")
    RAFT_ADDR_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ADDR_FIELD_NUMBER: _ClassVar[int]
    raft_addr: str
    client_addr: str
    def __init__(self, raft_addr: _Optional[str] = ..., client_addr: _Optional[str] = ...) -> None: ...

class AddNodeResponse(_message.Message):
    __slots__ = ("changed", "applied_index")
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    changed: bool
    applied_index: int
    def __init__(self, changed: _Optional[bool] = ..., applied_index: _Optional[int] = ...) -> None: ...

class RemoveNodeRequest(_message.Message):
    __slots__ = ("raft_addr",)
    RAFT_ADDR_FIELD_NUMBER: _ClassVar[int]
    raft_addr: str
    def __init__(self, raft_addr: _Optional[str] = ...) -> None: ...

class RemoveNodeResponse(_message.Message):
    __slots__ = ("changed", "applied_index")
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    changed: bool
    applied_index: int
    def __init__(self, changed: _Optional[bool] = ..., applied_index: _Optional[int] = ...) -> None: ...

class BackupRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BackupInfo(_message.Message):
    __slots__ = ("index", "state_digest", "sha256", "size", "checkpoint_format", "members", "node_id", "created")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    STATE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    index: int
    state_digest: str
    sha256: str
    size: int
    checkpoint_format: int
    members: _containers.RepeatedScalarFieldContainer[str]
    node_id: str
    created: float
    def __init__(self, index: _Optional[int] = ..., state_digest: _Optional[str] = ..., sha256: _Optional[str] = ..., size: _Optional[int] = ..., checkpoint_format: _Optional[int] = ..., members: _Optional[_Iterable[str]] = ..., node_id: _Optional[str] = ..., created: _Optional[float] = ...) -> None: ...

class BackupChunk(_message.Message):
    __slots__ = ("info", "data", "applied_index")
    INFO_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    info: BackupInfo
    data: bytes
    applied_index: int
    def __init__(self, info: _Optional[_Union[BackupInfo, _Mapping]] = ..., data: _Optional[bytes] = ..., applied_index: _Optional[int] = ...) -> None: ...

class AuthenticateRequest(_message.Message):
    __slots__ = ("user", "password")
    USER_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    user: str
    password: str
    def __init__(self, user: _Optional[str] = ..., password: _Optional[str] = ...) -> None: ...

class AuthenticateResponse(_message.Message):
    __slots__ = ("token", "ttl", "applied_index")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    token: str
    ttl: float
    applied_index: int
    def __init__(self, token: _Optional[str] = ..., ttl: _Optional[float] = ..., applied_index: _Optional[int] = ...) -> None: ...

class AuthRequest(_message.Message):
    __slots__ = ("op", "args")
    class ArgsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    OP_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    op: str
    args: _containers.MessageMap[str, Value]
    def __init__(self, op: _Optional[str] = ..., args: _Optional[_Mapping[str, Value]] = ...) -> None: ...

class AuthResponse(_message.Message):
    __slots__ = ("result", "applied_index")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    result: Value
    applied_index: int
    def __init__(self, result: _Optional[_Union[Value, _Mapping]] = ..., applied_index: _Optional[int] = ...) -> None: ...
