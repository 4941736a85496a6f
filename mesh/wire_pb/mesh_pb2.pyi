from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WireVersion(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WIRE_VERSION_UNSPECIFIED: _ClassVar[WireVersion]
    WIRE_VERSION_PROTOBUF: _ClassVar[WireVersion]

class MessageType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MESSAGE_TYPE_UNSPECIFIED: _ClassVar[MessageType]
    MESSAGE_TYPE_PING: _ClassVar[MessageType]
    MESSAGE_TYPE_INDIRECT_PING: _ClassVar[MessageType]
    MESSAGE_TYPE_ACK: _ClassVar[MessageType]
    MESSAGE_TYPE_NACK: _ClassVar[MessageType]
    MESSAGE_TYPE_SUSPECT: _ClassVar[MessageType]
    MESSAGE_TYPE_ALIVE: _ClassVar[MessageType]
    MESSAGE_TYPE_DEAD: _ClassVar[MessageType]
    MESSAGE_TYPE_PUSH_PULL: _ClassVar[MessageType]
    MESSAGE_TYPE_COMPOUND: _ClassVar[MessageType]
    MESSAGE_TYPE_USER: _ClassVar[MessageType]
    MESSAGE_TYPE_ENCRYPTED: _ClassVar[MessageType]
    MESSAGE_TYPE_ENCRYPTED_CHUNKS: _ClassVar[MessageType]

class MemberState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MEMBER_STATE_ALIVE: _ClassVar[MemberState]
    MEMBER_STATE_SUSPECT: _ClassVar[MemberState]
    MEMBER_STATE_DEAD: _ClassVar[MemberState]
    MEMBER_STATE_LEFT: _ClassVar[MemberState]
WIRE_VERSION_UNSPECIFIED: WireVersion
WIRE_VERSION_PROTOBUF: WireVersion
MESSAGE_TYPE_UNSPECIFIED: MessageType
MESSAGE_TYPE_PING: MessageType
MESSAGE_TYPE_INDIRECT_PING: MessageType
MESSAGE_TYPE_ACK: MessageType
MESSAGE_TYPE_NACK: MessageType
MESSAGE_TYPE_SUSPECT: MessageType
MESSAGE_TYPE_ALIVE: MessageType
MESSAGE_TYPE_DEAD: MessageType
MESSAGE_TYPE_PUSH_PULL: MessageType
MESSAGE_TYPE_COMPOUND: MessageType
MESSAGE_TYPE_USER: MessageType
MESSAGE_TYPE_ENCRYPTED: MessageType
MESSAGE_TYPE_ENCRYPTED_CHUNKS: MessageType
MEMBER_STATE_ALIVE: MemberState
MEMBER_STATE_SUSPECT: MemberState
MEMBER_STATE_DEAD: MemberState
MEMBER_STATE_LEFT: MemberState

class Role(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class NodeMeta(_message.Message):
    __slots__ = ("http_addr", "version", "roles")
    HTTP_ADDR_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    http_addr: str
    version: str
    roles: _containers.RepeatedCompositeFieldContainer[Role]
    def __init__(self, http_addr: _Optional[str] = ..., version: _Optional[str] = ..., roles: _Optional[_Iterable[_Union[Role, _Mapping]]] = ...) -> None: ...

class Ping(_message.Message):
    __slots__ = ("seq", "target", "source_name", "source_addr")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    SOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    SOURCE_ADDR_FIELD_NUMBER: _ClassVar[int]
    seq: int
    target: str
    source_name: str
    source_addr: str
    def __init__(self, seq: _Optional[int] = ..., target: _Optional[str] = ..., source_name: _Optional[str] = ..., source_addr: _Optional[str] = ...) -> None: ...

class IndirectPing(_message.Message):
    __slots__ = ("seq", "target", "target_addr", "nack", "source_name", "source_addr")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    TARGET_ADDR_FIELD_NUMBER: _ClassVar[int]
    NACK_FIELD_NUMBER: _ClassVar[int]
    SOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    SOURCE_ADDR_FIELD_NUMBER: _ClassVar[int]
    seq: int
    target: str
    target_addr: str
    nack: bool
    source_name: str
    source_addr: str
    def __init__(self, seq: _Optional[int] = ..., target: _Optional[str] = ..., target_addr: _Optional[str] = ..., nack: _Optional[bool] = ..., source_name: _Optional[str] = ..., source_addr: _Optional[str] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("seq",)
    SEQ_FIELD_NUMBER: _ClassVar[int]
    seq: int
    def __init__(self, seq: _Optional[int] = ...) -> None: ...

class Nack(_message.Message):
    __slots__ = ("seq",)
    SEQ_FIELD_NUMBER: _ClassVar[int]
    seq: int
    def __init__(self, seq: _Optional[int] = ...) -> None: ...

class Alive(_message.Message):
    __slots__ = ("incarnation", "node", "addr", "meta")
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    ADDR_FIELD_NUMBER: _ClassVar[int]
    META_FIELD_NUMBER: _ClassVar[int]
    incarnation: int
    node: str
    addr: str
    meta: NodeMeta
    def __init__(self, incarnation: _Optional[int] = ..., node: _Optional[str] = ..., addr: _Optional[str] = ..., meta: _Optional[_Union[NodeMeta, _Mapping]] = ...) -> None: ...

class Suspect(_message.Message):
    __slots__ = ("incarnation", "node", "sender")
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    incarnation: int
    node: str
    sender: str
    def __init__(self, incarnation: _Optional[int] = ..., node: _Optional[str] = ..., sender: _Optional[str] = ...) -> None: ...

class Dead(_message.Message):
    __slots__ = ("incarnation", "node", "sender")
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    incarnation: int
    node: str
    sender: str
    def __init__(self, incarnation: _Optional[int] = ..., node: _Optional[str] = ..., sender: _Optional[str] = ...) -> None: ...

class User(_message.Message):
    __slots__ = ("payload",)
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    def __init__(self, payload: _Optional[bytes] = ...) -> None: ...

class PushPullMember(_message.Message):
    __slots__ = ("name", "addr", "meta", "incarnation", "state")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDR_FIELD_NUMBER: _ClassVar[int]
    META_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    name: str
    addr: str
    meta: NodeMeta
    incarnation: int
    state: MemberState
    def __init__(self, name: _Optional[str] = ..., addr: _Optional[str] = ..., meta: _Optional[_Union[NodeMeta, _Mapping]] = ..., incarnation: _Optional[int] = ..., state: _Optional[_Union[MemberState, str]] = ...) -> None: ...

class PushPull(_message.Message):
    __slots__ = ("join", "members", "user_state")
    JOIN_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    USER_STATE_FIELD_NUMBER: _ClassVar[int]
    join: bool
    members: _containers.RepeatedCompositeFieldContainer[PushPullMember]
    user_state: bytes
    def __init__(self, join: _Optional[bool] = ..., members: _Optional[_Iterable[_Union[PushPullMember, _Mapping]]] = ..., user_state: _Optional[bytes] = ...) -> None: ...
