from typing import Final

L: Final[int]
N: Final[int]
WS: Final[int]
SLOW: Final[int]

class Encoder:
    def __init__(
        self, ranks: dict[bytes, int], classes: bytes, digit_run: int, added: dict[str, int] | None = None
    ) -> None: ...
    def encode(self, text: str, plain: bool = False, /) -> bytes | None:
        """The ids of ``text`` as native-endian 32-bit unsigned ints. Unless ``plain``, added tokens are matched
        first and None is returned for a text holding a character whose class has SLOW. Raises
        UnicodeEncodeError on a lone surrogate."""

    def split(self, text: str) -> list[str]:
        """The pieces the split regex makes of ``text`` (for tests)."""
