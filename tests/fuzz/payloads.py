"""Hostile request bodies, built cheaply."""

from __future__ import annotations

import struct
import zlib

_MIB = 1 << 20


def gzip_bomb(inflated_mib: int, filler: bytes = b" ") -> bytes:
    """A single-member gzip body inflating to ``inflated_mib`` MiB of a JSON string (about 1 KB per MiB).

    After a full flush a deflate stream no longer refers back, so the compressed form of one MiB repeats
    verbatim: one compression, not ``inflated_mib`` of them. The CRC is left 0: every decoder stops (or is
    stopped) long before it would check it."""
    head = b'{"model": "llama3", "messages": [{"role": "user", "content": "'
    tail = b'"}]}'
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    first = deflate.compress(head) + deflate.flush(zlib.Z_FULL_FLUSH)
    unit = deflate.compress(filler * _MIB) + deflate.flush(zlib.Z_FULL_FLUSH)
    last = deflate.compress(tail) + deflate.flush(zlib.Z_FINISH)
    size = (len(head) + inflated_mib * _MIB + len(tail)) & 0xFFFFFFFF
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    return header + first + unit * inflated_mib + last + struct.pack("<II", 0, size)


def vm_hwm_mb(pid: int) -> float:
    """Peak resident set size of process ``pid`` so far (VmHWM), in MB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")
