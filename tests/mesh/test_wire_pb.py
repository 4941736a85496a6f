"""proto/mesh.proto and its generated code: fresh, and in step with the Python enums that frame the wire."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from mesh.limits import PROTOCOL_VERSION
from mesh.member import MemberState
from mesh.messages import MessageType
from mesh.wire_pb import mesh_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_is_fresh() -> None:
    # Regenerates with the pinned protoc into a temporary directory and compares byte for byte.
    done = subprocess.run(
        [sys.executable, "scripts/gen_proto.py", "--check"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def test_the_proto_enums_are_the_wire_values() -> None:
    assert pb.WireVersion.Value("WIRE_VERSION_PROTOBUF") == PROTOCOL_VERSION
    assert {f"MESSAGE_TYPE_{t.name}": t.value for t in MessageType} == {
        name: value for name, value in pb.MessageType.items() if value
    }
    assert {f"MEMBER_STATE_{s.name}": s.value for s in MemberState} == dict(pb.MemberState.items())


def test_retired_numbers_stay_reserved() -> None:
    # Version 1 (hand-written bodies) is retired: its number may never name another format.
    reserved = pb.DESCRIPTOR.enum_types_by_name["WireVersion"]
    assert 1 not in reserved.values_by_number
    assert "reserved 1;" in (ROOT / "proto" / "mesh.proto").read_text()


def test_every_scalar_has_presence_so_a_missing_field_is_detectable() -> None:
    for message in pb.DESCRIPTOR.message_types_by_name.values():
        for field in message.fields:
            if not field.is_repeated:
                assert field.has_presence, f"{message.name}.{field.name} must be optional"
