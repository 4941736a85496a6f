from typing import Final

L: Final[int]
N: Final[int]
WS: Final[int]

class Encoder:
    def __init__(self, ranks: dict[bytes, int], classes: bytes, digit_run: int) -> None: ...
    def encode(self, text: str) -> bytes:
        """The ids of ``text`` as native-endian 32-bit unsigned ints. Raises UnicodeEncodeError on a lone
        surrogate."""

    def split(self, text: str) -> list[str]:
        """The pieces the split regex makes of ``text`` (for tests)."""
