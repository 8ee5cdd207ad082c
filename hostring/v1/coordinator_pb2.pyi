from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Member(_message.Message):
    __slots__ = ("node_id", "address", "weight", "healthy", "last_seen_ms")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_MS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    weight: int
    healthy: bool
    last_seen_ms: int
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., weight: _Optional[int] = ..., healthy: _Optional[bool] = ..., last_seen_ms: _Optional[int] = ...) -> None: ...

class RingState(_message.Message):
    __slots__ = ("epoch", "members")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    members: _containers.RepeatedCompositeFieldContainer[Member]
    def __init__(self, epoch: _Optional[int] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("node_id", "address", "weight", "known_epoch")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    KNOWN_EPOCH_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    weight: int
    known_epoch: int
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., weight: _Optional[int] = ..., known_epoch: _Optional[int] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("epoch", "ring", "heartbeat_timeout_ms")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    RING_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    ring: RingState
    heartbeat_timeout_ms: int
    def __init__(self, epoch: _Optional[int] = ..., ring: _Optional[_Union[RingState, _Mapping]] = ..., heartbeat_timeout_ms: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("epoch", "ok")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    ok: bool
    def __init__(self, epoch: _Optional[int] = ..., ok: _Optional[bool] = ...) -> None: ...

class LeaveRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class LeaveResponse(_message.Message):
    __slots__ = ("epoch", "left")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEFT_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    left: bool
    def __init__(self, epoch: _Optional[int] = ..., left: _Optional[bool] = ...) -> None: ...

class GetRingRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("known_epoch",)
    KNOWN_EPOCH_FIELD_NUMBER: _ClassVar[int]
    known_epoch: int
    def __init__(self, known_epoch: _Optional[int] = ...) -> None: ...
