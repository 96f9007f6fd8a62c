from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OK: _ClassVar[Status]
    NOT_FOUND: _ClassVar[Status]
    ALREADY_EXISTS: _ClassVar[Status]
    NO_SPACE: _ClassVar[Status]
    QUOTA_EXCEEDED: _ClassVar[Status]
    NOT_READY: _ClassVar[Status]
    INVALID: _ClassVar[Status]
    UNAVAILABLE: _ClassVar[Status]
    PERMISSION_DENIED: _ClassVar[Status]
    EXPIRED: _ClassVar[Status]
    INTERNAL: _ClassVar[Status]

class NodeState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_STATE_UNSPECIFIED: _ClassVar[NodeState]
    NODE_STATE_ACTIVE: _ClassVar[NodeState]
    NODE_STATE_SUSPECT: _ClassVar[NodeState]
    NODE_STATE_EXPIRED: _ClassVar[NodeState]
    NODE_STATE_DRAINING: _ClassVar[NodeState]
OK: Status
NOT_FOUND: Status
ALREADY_EXISTS: Status
NO_SPACE: Status
QUOTA_EXCEEDED: Status
NOT_READY: Status
INVALID: Status
UNAVAILABLE: Status
PERMISSION_DENIED: Status
EXPIRED: Status
INTERNAL: Status
NODE_STATE_UNSPECIFIED: NodeState
NODE_STATE_ACTIVE: NodeState
NODE_STATE_SUSPECT: NodeState
NODE_STATE_EXPIRED: NodeState
NODE_STATE_DRAINING: NodeState

class RequestHeader(_message.Message):
    __slots__ = ("tenant", "client_id", "token", "request_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    client_id: str
    token: str
    request_id: int
    def __init__(self, tenant: _Optional[str] = ..., client_id: _Optional[str] = ..., token: _Optional[str] = ..., request_id: _Optional[int] = ...) -> None: ...

class ReplyHeader(_message.Message):
    __slots__ = ("epoch", "master_time_ms")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MASTER_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    master_time_ms: int
    def __init__(self, epoch: _Optional[int] = ..., master_time_ms: _Optional[int] = ...) -> None: ...

class Endpoint(_message.Message):
    __slots__ = ("transport", "address", "extra")
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    transport: str
    address: str
    extra: bytes
    def __init__(self, transport: _Optional[str] = ..., address: _Optional[str] = ..., extra: _Optional[bytes] = ...) -> None: ...

class SegmentInfo(_message.Message):
    __slots__ = ("segment_id", "node_id", "size_bytes", "host_id", "endpoints", "tier")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    node_id: str
    size_bytes: int
    host_id: str
    endpoints: _containers.RepeatedCompositeFieldContainer[Endpoint]
    tier: int
    def __init__(self, segment_id: _Optional[int] = ..., node_id: _Optional[str] = ..., size_bytes: _Optional[int] = ..., host_id: _Optional[str] = ..., endpoints: _Optional[_Iterable[_Union[Endpoint, _Mapping]]] = ..., tier: _Optional[int] = ...) -> None: ...

class Grant(_message.Message):
    __slots__ = ("op", "alloc_id", "epoch", "expiry_ms", "key_tag", "mac")
    OP_FIELD_NUMBER: _ClassVar[int]
    ALLOC_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EXPIRY_MS_FIELD_NUMBER: _ClassVar[int]
    KEY_TAG_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    op: int
    alloc_id: int
    epoch: int
    expiry_ms: int
    key_tag: int
    mac: bytes
    def __init__(self, op: _Optional[int] = ..., alloc_id: _Optional[int] = ..., epoch: _Optional[int] = ..., expiry_ms: _Optional[int] = ..., key_tag: _Optional[int] = ..., mac: _Optional[bytes] = ...) -> None: ...

class Replica(_message.Message):
    __slots__ = ("node_id", "segment_id", "offset", "length", "grant", "claim")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    GRANT_FIELD_NUMBER: _ClassVar[int]
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    segment_id: int
    offset: int
    length: int
    grant: Grant
    claim: bool
    def __init__(self, node_id: _Optional[str] = ..., segment_id: _Optional[int] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., grant: _Optional[_Union[Grant, _Mapping]] = ..., claim: _Optional[bool] = ...) -> None: ...

class KeyResult(_message.Message):
    __slots__ = ("status", "message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message: str
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ...) -> None: ...

class PutItem(_message.Message):
    __slots__ = ("key", "size_bytes", "replicas", "soft_pin", "hard_pin", "upsert", "preferred_host_id", "avoid_node_ids", "soft_pin_ttl_ms", "engine_hash")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    SOFT_PIN_FIELD_NUMBER: _ClassVar[int]
    HARD_PIN_FIELD_NUMBER: _ClassVar[int]
    UPSERT_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_HOST_ID_FIELD_NUMBER: _ClassVar[int]
    AVOID_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    SOFT_PIN_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_HASH_FIELD_NUMBER: _ClassVar[int]
    key: str
    size_bytes: int
    replicas: int
    soft_pin: bool
    hard_pin: bool
    upsert: bool
    preferred_host_id: str
    avoid_node_ids: _containers.RepeatedScalarFieldContainer[str]
    soft_pin_ttl_ms: int
    engine_hash: bytes
    def __init__(self, key: _Optional[str] = ..., size_bytes: _Optional[int] = ..., replicas: _Optional[int] = ..., soft_pin: _Optional[bool] = ..., hard_pin: _Optional[bool] = ..., upsert: _Optional[bool] = ..., preferred_host_id: _Optional[str] = ..., avoid_node_ids: _Optional[_Iterable[str]] = ..., soft_pin_ttl_ms: _Optional[int] = ..., engine_hash: _Optional[bytes] = ...) -> None: ...

class PutAheadAsk(_message.Message):
    __slots__ = ("count", "size_bytes", "replicas")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    count: int
    size_bytes: int
    replicas: int
    def __init__(self, count: _Optional[int] = ..., size_bytes: _Optional[int] = ..., replicas: _Optional[int] = ...) -> None: ...

class PutStartRequest(_message.Message):
    __slots__ = ("header", "items", "ahead")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    AHEAD_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    items: _containers.RepeatedCompositeFieldContainer[PutItem]
    ahead: PutAheadAsk
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., items: _Optional[_Iterable[_Union[PutItem, _Mapping]]] = ..., ahead: _Optional[_Union[PutAheadAsk, _Mapping]] = ...) -> None: ...

class PutStartResult(_message.Message):
    __slots__ = ("status", "message", "put_id", "replicas")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PUT_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message: str
    put_id: int
    replicas: _containers.RepeatedCompositeFieldContainer[Replica]
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ..., put_id: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[Replica, _Mapping]]] = ...) -> None: ...

class PutStartReply(_message.Message):
    __slots__ = ("header", "results", "segments", "ahead")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    AHEAD_FIELD_NUMBER: _ClassVar[int]
    header: ReplyHeader
    results: _containers.RepeatedCompositeFieldContainer[PutStartResult]
    segments: _containers.RepeatedCompositeFieldContainer[SegmentInfo]
    ahead: _containers.RepeatedCompositeFieldContainer[PutStartResult]
    def __init__(self, header: _Optional[_Union[ReplyHeader, _Mapping]] = ..., results: _Optional[_Iterable[_Union[PutStartResult, _Mapping]]] = ..., segments: _Optional[_Iterable[_Union[SegmentInfo, _Mapping]]] = ..., ahead: _Optional[_Iterable[_Union[PutStartResult, _Mapping]]] = ...) -> None: ...

class PutEndItem(_message.Message):
    __slots__ = ("key", "put_id", "checksum", "receipts", "bind")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PUT_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    RECEIPTS_FIELD_NUMBER: _ClassVar[int]
    BIND_FIELD_NUMBER: _ClassVar[int]
    key: str
    put_id: int
    checksum: int
    receipts: _containers.RepeatedScalarFieldContainer[bytes]
    bind: PutItem
    def __init__(self, key: _Optional[str] = ..., put_id: _Optional[int] = ..., checksum: _Optional[int] = ..., receipts: _Optional[_Iterable[bytes]] = ..., bind: _Optional[_Union[PutItem, _Mapping]] = ...) -> None: ...

class PutEndRequest(_message.Message):
    __slots__ = ("header", "items", "ahead", "read_back")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    AHEAD_FIELD_NUMBER: _ClassVar[int]
    READ_BACK_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    items: _containers.RepeatedCompositeFieldContainer[PutEndItem]
    ahead: PutAheadAsk
    read_back: bool
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., items: _Optional[_Iterable[_Union[PutEndItem, _Mapping]]] = ..., ahead: _Optional[_Union[PutAheadAsk, _Mapping]] = ..., read_back: _Optional[bool] = ...) -> None: ...

class PutEndReply(_message.Message):
    __slots__ = ("header", "results", "ahead", "segments", "reads", "read_trust_ms")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    AHEAD_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    READS_FIELD_NUMBER: _ClassVar[int]
    READ_TRUST_MS_FIELD_NUMBER: _ClassVar[int]
    header: ReplyHeader
    results: _containers.RepeatedCompositeFieldContainer[KeyResult]
    ahead: _containers.RepeatedCompositeFieldContainer[PutStartResult]
    segments: _containers.RepeatedCompositeFieldContainer[SegmentInfo]
    reads: _containers.RepeatedCompositeFieldContainer[GetResult]
    read_trust_ms: int
    def __init__(self, header: _Optional[_Union[ReplyHeader, _Mapping]] = ..., results: _Optional[_Iterable[_Union[KeyResult, _Mapping]]] = ..., ahead: _Optional[_Iterable[_Union[PutStartResult, _Mapping]]] = ..., segments: _Optional[_Iterable[_Union[SegmentInfo, _Mapping]]] = ..., reads: _Optional[_Iterable[_Union[GetResult, _Mapping]]] = ..., read_trust_ms: _Optional[int] = ...) -> None: ...

class PutRef(_message.Message):
    __slots__ = ("key", "put_id")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PUT_ID_FIELD_NUMBER: _ClassVar[int]
    key: str
    put_id: int
    def __init__(self, key: _Optional[str] = ..., put_id: _Optional[int] = ...) -> None: ...

class PutRevokeRequest(_message.Message):
    __slots__ = ("header", "items")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    items: _containers.RepeatedCompositeFieldContainer[PutRef]
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., items: _Optional[_Iterable[_Union[PutRef, _Mapping]]] = ...) -> None: ...

class PutRevokeReply(_message.Message):
    __slots__ = ("header", "results")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    header: ReplyHeader
    results: _containers.RepeatedCompositeFieldContainer[KeyResult]
    def __init__(self, header: _Optional[_Union[ReplyHeader, _Mapping]] = ..., results: _Optional[_Iterable[_Union[KeyResult, _Mapping]]] = ...) -> None: ...

class GetReplicasRequest(_message.Message):
    __slots__ = ("header", "keys", "unpin_ids")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    UNPIN_IDS_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    keys: _containers.RepeatedScalarFieldContainer[str]
    unpin_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., keys: _Optional[_Iterable[str]] = ..., unpin_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class GetResult(_message.Message):
    __slots__ = ("status", "message", "size_bytes", "checksum", "pin_id", "replicas")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    PIN_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message: str
    size_bytes: int
    checksum: int
    pin_id: int
    replicas: _containers.RepeatedCompositeFieldContainer[Replica]
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ..., size_bytes: _Optional[int] = ..., checksum: _Optional[int] = ..., pin_id: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[Replica, _Mapping]]] = ...) -> None: ...

class GetReplicasReply(_message.Message):
    __slots__ = ("header", "results", "segments", "read_trust_ms")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    READ_TRUST_MS_FIELD_NUMBER: _ClassVar[int]
    header: ReplyHeader
    results: _containers.RepeatedCompositeFieldContainer[GetResult]
    segments: _containers.RepeatedCompositeFieldContainer[SegmentInfo]
    read_trust_ms: int
    def __init__(self, header: _Optional[_Union[ReplyHeader, _Mapping]] = ..., results: _Optional[_Iterable[_Union[GetResult, _Mapping]]] = ..., segments: _Optional[_Iterable[_Union[SegmentInfo, _Mapping]]] = ..., read_trust_ms: _Optional[int] = ...) -> None: ...

class UnpinRequest(_message.Message):
    __slots__ = ("header", "pin_ids")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PIN_IDS_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    pin_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., pin_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class UnpinReply(_message.Message):
    __slots__ = ("header", "released")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    header: ReplyHeader
    released: int
    def __init__(self, header: _Optional[_Union[ReplyHeader, _Mapping]] = ..., released: _Optional[int] = ...) -> None: ...

class KeysRequest(_message.Message):
    __slots__ = ("header", "keys")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., keys: _Optional[_Iterable[str]] = ...) -> None: ...

class ExistsReply(_message.Message):
    __slots__ = ("header", "statuses")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    header: ReplyHeader
    statuses: _containers.RepeatedScalarFieldContainer[Status]
    def __init__(self, header: _Optional[_Union[ReplyHeader, _Mapping]] = ..., statuses: _Optional[_Iterable[_Union[Status, str]]] = ...) -> None: ...

class PrefixLenReply(_message.Message):
    __slots__ = ("header", "prefix_len")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PREFIX_LEN_FIELD_NUMBER: _ClassVar[int]
    header: ReplyHeader
    prefix_len: int
    def __init__(self, header: _Optional[_Union[ReplyHeader, _Mapping]] = ..., prefix_len: _Optional[int] = ...) -> None: ...

class TierRun(_message.Message):
    __slots__ = ("tier", "keys", "bytes")
    TIER_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    tier: str
    keys: int
    bytes: int
    def __init__(self, tier: _Optional[str] = ..., keys: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class LookupReply(_message.Message):
    __slots__ = ("header", "prefix_len", "prefix_bytes", "tiers")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PREFIX_LEN_FIELD_NUMBER: _ClassVar[int]
    PREFIX_BYTES_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    header: ReplyHeader
    prefix_len: int
    prefix_bytes: int
    tiers: _containers.RepeatedCompositeFieldContainer[TierRun]
    def __init__(self, header: _Optional[_Union[ReplyHeader, _Mapping]] = ..., prefix_len: _Optional[int] = ..., prefix_bytes: _Optional[int] = ..., tiers: _Optional[_Iterable[_Union[TierRun, _Mapping]]] = ...) -> None: ...

class RemoveReply(_message.Message):
    __slots__ = ("header", "results")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    header: ReplyHeader
    results: _containers.RepeatedCompositeFieldContainer[KeyResult]
    def __init__(self, header: _Optional[_Union[ReplyHeader, _Mapping]] = ..., results: _Optional[_Iterable[_Union[KeyResult, _Mapping]]] = ...) -> None: ...

class RemovePrefixRequest(_message.Message):
    __slots__ = ("header", "prefix")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    prefix: str
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., prefix: _Optional[str] = ...) -> None: ...

class RemoveAllRequest(_message.Message):
    __slots__ = ("header",)
    HEADER_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ...) -> None: ...

class RemoveCountReply(_message.Message):
    __slots__ = ("header", "removed")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    header: ReplyHeader
    removed: int
    def __init__(self, header: _Optional[_Union[ReplyHeader, _Mapping]] = ..., removed: _Optional[int] = ...) -> None: ...

class ListKeysRequest(_message.Message):
    __slots__ = ("header", "prefix", "start_after", "limit")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    START_AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    prefix: str
    start_after: str
    limit: int
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., prefix: _Optional[str] = ..., start_after: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListKeysReply(_message.Message):
    __slots__ = ("header", "keys", "more")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    header: ReplyHeader
    keys: _containers.RepeatedScalarFieldContainer[str]
    more: bool
    def __init__(self, header: _Optional[_Union[ReplyHeader, _Mapping]] = ..., keys: _Optional[_Iterable[str]] = ..., more: _Optional[bool] = ...) -> None: ...

class KvEventsRequest(_message.Message):
    __slots__ = ("header", "from_seq")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    FROM_SEQ_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    from_seq: int
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., from_seq: _Optional[int] = ...) -> None: ...

class KvEventBatch(_message.Message):
    __slots__ = ("seq", "payload", "epoch")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    seq: int
    payload: bytes
    epoch: int
    def __init__(self, seq: _Optional[int] = ..., payload: _Optional[bytes] = ..., epoch: _Optional[int] = ...) -> None: ...

class MountSegmentRequest(_message.Message):
    __slots__ = ("header", "node_id", "incarnation", "segments", "report_follows", "previous_epoch")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    REPORT_FOLLOWS_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_EPOCH_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    node_id: str
    incarnation: int
    segments: _containers.RepeatedCompositeFieldContainer[SegmentInfo]
    report_follows: bool
    previous_epoch: int
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., node_id: _Optional[str] = ..., incarnation: _Optional[int] = ..., segments: _Optional[_Iterable[_Union[SegmentInfo, _Mapping]]] = ..., report_follows: _Optional[bool] = ..., previous_epoch: _Optional[int] = ...) -> None: ...

class MountSegmentReply(_message.Message):
    __slots__ = ("header", "results", "heartbeat_interval_ms", "cluster_secret_check", "write_grant_ttl_ms", "read_grant_ttl_ms")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_SECRET_CHECK_FIELD_NUMBER: _ClassVar[int]
    WRITE_GRANT_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    READ_GRANT_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    header: ReplyHeader
    results: _containers.RepeatedCompositeFieldContainer[KeyResult]
    heartbeat_interval_ms: int
    cluster_secret_check: bytes
    write_grant_ttl_ms: int
    read_grant_ttl_ms: int
    def __init__(self, header: _Optional[_Union[ReplyHeader, _Mapping]] = ..., results: _Optional[_Iterable[_Union[KeyResult, _Mapping]]] = ..., heartbeat_interval_ms: _Optional[int] = ..., cluster_secret_check: _Optional[bytes] = ..., write_grant_ttl_ms: _Optional[int] = ..., read_grant_ttl_ms: _Optional[int] = ...) -> None: ...

class ReportedObject(_message.Message):
    __slots__ = ("tenant", "key", "alloc_id", "offset", "length", "checksum", "epoch", "engine_hash", "value_alloc_id", "soft_pin_until_ms")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    ALLOC_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ENGINE_HASH_FIELD_NUMBER: _ClassVar[int]
    VALUE_ALLOC_ID_FIELD_NUMBER: _ClassVar[int]
    SOFT_PIN_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    key: str
    alloc_id: int
    offset: int
    length: int
    checksum: int
    epoch: int
    engine_hash: bytes
    value_alloc_id: int
    soft_pin_until_ms: int
    def __init__(self, tenant: _Optional[str] = ..., key: _Optional[str] = ..., alloc_id: _Optional[int] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., checksum: _Optional[int] = ..., epoch: _Optional[int] = ..., engine_hash: _Optional[bytes] = ..., value_alloc_id: _Optional[int] = ..., soft_pin_until_ms: _Optional[int] = ...) -> None: ...

class ReportObjectsRequest(_message.Message):
    __slots__ = ("header", "node_id", "incarnation", "segment_id", "entries", "last")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    node_id: str
    incarnation: int
    segment_id: int
    entries: _containers.RepeatedCompositeFieldContainer[ReportedObject]
    last: bool
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., node_id: _Optional[str] = ..., incarnation: _Optional[int] = ..., segment_id: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[ReportedObject, _Mapping]]] = ..., last: _Optional[bool] = ...) -> None: ...

class ReportObjectsReply(_message.Message):
    __slots__ = ("header", "status", "message", "refused_alloc_ids", "accepted")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REFUSED_ALLOC_IDS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    header: ReplyHeader
    status: Status
    message: str
    refused_alloc_ids: _containers.RepeatedScalarFieldContainer[int]
    accepted: int
    def __init__(self, header: _Optional[_Union[ReplyHeader, _Mapping]] = ..., status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ..., refused_alloc_ids: _Optional[_Iterable[int]] = ..., accepted: _Optional[int] = ...) -> None: ...

class UnmountSegmentRequest(_message.Message):
    __slots__ = ("header", "node_id", "segment_ids")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    node_id: str
    segment_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., node_id: _Optional[str] = ..., segment_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class UnmountSegmentReply(_message.Message):
    __slots__ = ("header", "results")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    header: ReplyHeader
    results: _containers.RepeatedCompositeFieldContainer[KeyResult]
    def __init__(self, header: _Optional[_Union[ReplyHeader, _Mapping]] = ..., results: _Optional[_Iterable[_Union[KeyResult, _Mapping]]] = ...) -> None: ...

class FreedRange(_message.Message):
    __slots__ = ("segment_id", "alloc_id", "offset", "length")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    ALLOC_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    alloc_id: int
    offset: int
    length: int
    def __init__(self, segment_id: _Optional[int] = ..., alloc_id: _Optional[int] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class CopyTask(_message.Message):
    __slots__ = ("alloc_id", "tenant", "key", "length", "checksum", "source_address", "source_node_id", "source_grant", "source_segment_id", "source_offset", "target_grant", "target_segment_id", "target_offset", "value_alloc_id")
    ALLOC_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    SOURCE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_GRANT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    TARGET_GRANT_FIELD_NUMBER: _ClassVar[int]
    TARGET_SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_OFFSET_FIELD_NUMBER: _ClassVar[int]
    VALUE_ALLOC_ID_FIELD_NUMBER: _ClassVar[int]
    alloc_id: int
    tenant: str
    key: str
    length: int
    checksum: int
    source_address: str
    source_node_id: str
    source_grant: Grant
    source_segment_id: int
    source_offset: int
    target_grant: Grant
    target_segment_id: int
    target_offset: int
    value_alloc_id: int
    def __init__(self, alloc_id: _Optional[int] = ..., tenant: _Optional[str] = ..., key: _Optional[str] = ..., length: _Optional[int] = ..., checksum: _Optional[int] = ..., source_address: _Optional[str] = ..., source_node_id: _Optional[str] = ..., source_grant: _Optional[_Union[Grant, _Mapping]] = ..., source_segment_id: _Optional[int] = ..., source_offset: _Optional[int] = ..., target_grant: _Optional[_Union[Grant, _Mapping]] = ..., target_segment_id: _Optional[int] = ..., target_offset: _Optional[int] = ..., value_alloc_id: _Optional[int] = ...) -> None: ...

class CopyDone(_message.Message):
    __slots__ = ("alloc_id", "segment_id", "offset", "length", "checksum", "status", "message", "receipt")
    ALLOC_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    alloc_id: int
    segment_id: int
    offset: int
    length: int
    checksum: int
    status: Status
    message: str
    receipt: bytes
    def __init__(self, alloc_id: _Optional[int] = ..., segment_id: _Optional[int] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., checksum: _Optional[int] = ..., status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ..., receipt: _Optional[bytes] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("header", "node_id", "incarnation", "freed_ack_seq", "lost", "copied", "moved")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    FREED_ACK_SEQ_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    COPIED_FIELD_NUMBER: _ClassVar[int]
    MOVED_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    node_id: str
    incarnation: int
    freed_ack_seq: int
    lost: _containers.RepeatedCompositeFieldContainer[FreedRange]
    copied: _containers.RepeatedCompositeFieldContainer[CopyDone]
    moved: _containers.RepeatedCompositeFieldContainer[MoveDone]
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., node_id: _Optional[str] = ..., incarnation: _Optional[int] = ..., freed_ack_seq: _Optional[int] = ..., lost: _Optional[_Iterable[_Union[FreedRange, _Mapping]]] = ..., copied: _Optional[_Iterable[_Union[CopyDone, _Mapping]]] = ..., moved: _Optional[_Iterable[_Union[MoveDone, _Mapping]]] = ...) -> None: ...

class Move(_message.Message):
    __slots__ = ("src_segment_id", "src_alloc_id", "src_offset", "length", "dst_segment_id", "dst_alloc_id", "dst_offset", "expires_in_ms")
    SRC_SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    SRC_ALLOC_ID_FIELD_NUMBER: _ClassVar[int]
    SRC_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    DST_SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    DST_ALLOC_ID_FIELD_NUMBER: _ClassVar[int]
    DST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_MS_FIELD_NUMBER: _ClassVar[int]
    src_segment_id: int
    src_alloc_id: int
    src_offset: int
    length: int
    dst_segment_id: int
    dst_alloc_id: int
    dst_offset: int
    expires_in_ms: int
    def __init__(self, src_segment_id: _Optional[int] = ..., src_alloc_id: _Optional[int] = ..., src_offset: _Optional[int] = ..., length: _Optional[int] = ..., dst_segment_id: _Optional[int] = ..., dst_alloc_id: _Optional[int] = ..., dst_offset: _Optional[int] = ..., expires_in_ms: _Optional[int] = ...) -> None: ...

class MoveDone(_message.Message):
    __slots__ = ("dst_segment_id", "dst_alloc_id", "ok")
    DST_SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    DST_ALLOC_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    dst_segment_id: int
    dst_alloc_id: int
    ok: bool
    def __init__(self, dst_segment_id: _Optional[int] = ..., dst_alloc_id: _Optional[int] = ..., ok: _Optional[bool] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("header", "remount", "freed", "freed_seq", "copies", "moves", "engine_hashes", "soft_pins")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    REMOUNT_FIELD_NUMBER: _ClassVar[int]
    FREED_FIELD_NUMBER: _ClassVar[int]
    FREED_SEQ_FIELD_NUMBER: _ClassVar[int]
    COPIES_FIELD_NUMBER: _ClassVar[int]
    MOVES_FIELD_NUMBER: _ClassVar[int]
    ENGINE_HASHES_FIELD_NUMBER: _ClassVar[int]
    SOFT_PINS_FIELD_NUMBER: _ClassVar[int]
    header: ReplyHeader
    remount: bool
    freed: _containers.RepeatedCompositeFieldContainer[FreedRange]
    freed_seq: int
    copies: _containers.RepeatedCompositeFieldContainer[CopyTask]
    moves: _containers.RepeatedCompositeFieldContainer[Move]
    engine_hashes: _containers.RepeatedCompositeFieldContainer[EngineHashNote]
    soft_pins: _containers.RepeatedCompositeFieldContainer[SoftPinNote]
    def __init__(self, header: _Optional[_Union[ReplyHeader, _Mapping]] = ..., remount: _Optional[bool] = ..., freed: _Optional[_Iterable[_Union[FreedRange, _Mapping]]] = ..., freed_seq: _Optional[int] = ..., copies: _Optional[_Iterable[_Union[CopyTask, _Mapping]]] = ..., moves: _Optional[_Iterable[_Union[Move, _Mapping]]] = ..., engine_hashes: _Optional[_Iterable[_Union[EngineHashNote, _Mapping]]] = ..., soft_pins: _Optional[_Iterable[_Union[SoftPinNote, _Mapping]]] = ...) -> None: ...

class EngineHashNote(_message.Message):
    __slots__ = ("segment_id", "alloc_id", "engine_hash")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    ALLOC_ID_FIELD_NUMBER: _ClassVar[int]
    ENGINE_HASH_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    alloc_id: int
    engine_hash: bytes
    def __init__(self, segment_id: _Optional[int] = ..., alloc_id: _Optional[int] = ..., engine_hash: _Optional[bytes] = ...) -> None: ...

class SoftPinNote(_message.Message):
    __slots__ = ("segment_id", "alloc_id", "until_ms")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    ALLOC_ID_FIELD_NUMBER: _ClassVar[int]
    UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    alloc_id: int
    until_ms: int
    def __init__(self, segment_id: _Optional[int] = ..., alloc_id: _Optional[int] = ..., until_ms: _Optional[int] = ...) -> None: ...

class ClusterStatusRequest(_message.Message):
    __slots__ = ("header",)
    HEADER_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ...) -> None: ...

class SegmentStatus(_message.Message):
    __slots__ = ("info", "state", "used_bytes", "object_count")
    INFO_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    OBJECT_COUNT_FIELD_NUMBER: _ClassVar[int]
    info: SegmentInfo
    state: NodeState
    used_bytes: int
    object_count: int
    def __init__(self, info: _Optional[_Union[SegmentInfo, _Mapping]] = ..., state: _Optional[_Union[NodeState, str]] = ..., used_bytes: _Optional[int] = ..., object_count: _Optional[int] = ...) -> None: ...

class TenantStatus(_message.Message):
    __slots__ = ("name", "used_bytes", "quota_bytes", "object_count", "quota_objects", "quarantined_bytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    QUOTA_BYTES_FIELD_NUMBER: _ClassVar[int]
    OBJECT_COUNT_FIELD_NUMBER: _ClassVar[int]
    QUOTA_OBJECTS_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    used_bytes: int
    quota_bytes: int
    object_count: int
    quota_objects: int
    quarantined_bytes: int
    def __init__(self, name: _Optional[str] = ..., used_bytes: _Optional[int] = ..., quota_bytes: _Optional[int] = ..., object_count: _Optional[int] = ..., quota_objects: _Optional[int] = ..., quarantined_bytes: _Optional[int] = ...) -> None: ...

class TierStats(_message.Message):
    __slots__ = ("tier", "hits", "read_bytes", "write_bytes")
    TIER_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    READ_BYTES_FIELD_NUMBER: _ClassVar[int]
    WRITE_BYTES_FIELD_NUMBER: _ClassVar[int]
    tier: int
    hits: int
    read_bytes: int
    write_bytes: int
    def __init__(self, tier: _Optional[int] = ..., hits: _Optional[int] = ..., read_bytes: _Optional[int] = ..., write_bytes: _Optional[int] = ...) -> None: ...

class TierMoves(_message.Message):
    __slots__ = ("demotions", "promotions", "disk_evictions", "spills")
    DEMOTIONS_FIELD_NUMBER: _ClassVar[int]
    PROMOTIONS_FIELD_NUMBER: _ClassVar[int]
    DISK_EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    SPILLS_FIELD_NUMBER: _ClassVar[int]
    demotions: int
    promotions: int
    disk_evictions: int
    spills: int
    def __init__(self, demotions: _Optional[int] = ..., promotions: _Optional[int] = ..., disk_evictions: _Optional[int] = ..., spills: _Optional[int] = ...) -> None: ...

class ClusterStatusReply(_message.Message):
    __slots__ = ("header", "segments", "tenants", "object_count", "capacity_bytes", "used_bytes", "role", "leader_address", "max_key_bytes", "max_object_bytes", "max_batch_keys", "max_list_keys", "tier_stats", "tier_moves")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    OBJECT_COUNT_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MAX_KEY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_OBJECT_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_KEYS_FIELD_NUMBER: _ClassVar[int]
    MAX_LIST_KEYS_FIELD_NUMBER: _ClassVar[int]
    TIER_STATS_FIELD_NUMBER: _ClassVar[int]
    TIER_MOVES_FIELD_NUMBER: _ClassVar[int]
    header: ReplyHeader
    segments: _containers.RepeatedCompositeFieldContainer[SegmentStatus]
    tenants: _containers.RepeatedCompositeFieldContainer[TenantStatus]
    object_count: int
    capacity_bytes: int
    used_bytes: int
    role: str
    leader_address: str
    max_key_bytes: int
    max_object_bytes: int
    max_batch_keys: int
    max_list_keys: int
    tier_stats: _containers.RepeatedCompositeFieldContainer[TierStats]
    tier_moves: TierMoves
    def __init__(self, header: _Optional[_Union[ReplyHeader, _Mapping]] = ..., segments: _Optional[_Iterable[_Union[SegmentStatus, _Mapping]]] = ..., tenants: _Optional[_Iterable[_Union[TenantStatus, _Mapping]]] = ..., object_count: _Optional[int] = ..., capacity_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., role: _Optional[str] = ..., leader_address: _Optional[str] = ..., max_key_bytes: _Optional[int] = ..., max_object_bytes: _Optional[int] = ..., max_batch_keys: _Optional[int] = ..., max_list_keys: _Optional[int] = ..., tier_stats: _Optional[_Iterable[_Union[TierStats, _Mapping]]] = ..., tier_moves: _Optional[_Union[TierMoves, _Mapping]] = ...) -> None: ...
