from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StateWireVersion(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATE_WIRE_VERSION_UNSPECIFIED: _ClassVar[StateWireVersion]
    STATE_WIRE_VERSION_PROTOBUF: _ClassVar[StateWireVersion]

class StateKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATE_KIND_UNSPECIFIED: _ClassVar[StateKind]
    STATE_KIND_DELTA: _ClassVar[StateKind]
    STATE_KIND_STATE: _ClassVar[StateKind]
STATE_WIRE_VERSION_UNSPECIFIED: StateWireVersion
STATE_WIRE_VERSION_PROTOBUF: StateWireVersion
STATE_KIND_UNSPECIFIED: StateKind
STATE_KIND_DELTA: StateKind
STATE_KIND_STATE: StateKind

class Generation(_message.Message):
    __slots__ = ("number", "node", "wall_ms")
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    WALL_MS_FIELD_NUMBER: _ClassVar[int]
    number: int
    node: str
    wall_ms: int
    def __init__(self, number: _Optional[int] = ..., node: _Optional[str] = ..., wall_ms: _Optional[int] = ...) -> None: ...

class Delta(_message.Message):
    __slots__ = ("doc", "gen_number", "gen_node", "client", "start", "end", "update")
    DOC_FIELD_NUMBER: _ClassVar[int]
    GEN_NUMBER_FIELD_NUMBER: _ClassVar[int]
    GEN_NODE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    doc: str
    gen_number: int
    gen_node: str
    client: int
    start: int
    end: int
    update: bytes
    def __init__(self, doc: _Optional[str] = ..., gen_number: _Optional[int] = ..., gen_node: _Optional[str] = ..., client: _Optional[int] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., update: _Optional[bytes] = ...) -> None: ...

class DocState(_message.Message):
    __slots__ = ("doc", "gen", "full", "sv", "base", "update")
    DOC_FIELD_NUMBER: _ClassVar[int]
    GEN_FIELD_NUMBER: _ClassVar[int]
    FULL_FIELD_NUMBER: _ClassVar[int]
    SV_FIELD_NUMBER: _ClassVar[int]
    BASE_FIELD_NUMBER: _ClassVar[int]
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    doc: str
    gen: Generation
    full: bool
    sv: bytes
    base: bytes
    update: bytes
    def __init__(self, doc: _Optional[str] = ..., gen: _Optional[_Union[Generation, _Mapping]] = ..., full: _Optional[bool] = ..., sv: _Optional[bytes] = ..., base: _Optional[bytes] = ..., update: _Optional[bytes] = ...) -> None: ...

class PeerState(_message.Message):
    __slots__ = ("node", "docs")
    NODE_FIELD_NUMBER: _ClassVar[int]
    DOCS_FIELD_NUMBER: _ClassVar[int]
    node: str
    docs: _containers.RepeatedCompositeFieldContainer[DocState]
    def __init__(self, node: _Optional[str] = ..., docs: _Optional[_Iterable[_Union[DocState, _Mapping]]] = ...) -> None: ...
