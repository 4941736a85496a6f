from typing import Any

def frames(
    buf: bytes | bytearray | memoryview, max_frame: int, max_message: int, frame_type: type[Any], /
) -> tuple[int, list[Any]]:
    """Whole frames at the start of ``buf``; a streamed token's DATA frame as (stream_id, message)."""

def chunks(batch: list[bytes], output_type: type[Any], merge: bool, /) -> list[Any] | None:
    """Plain Generate chunks as ``output_type`` tuples; None if any message is not one."""
