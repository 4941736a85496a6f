from array import array

def packed_uint32(ids: array[int] | bytes, /) -> bytes | None:
    """Shortest varints of 4-byte ids; None if a signed id is negative."""
