"""Rolling prefix hashes over a prompt's token blocks, and the walk that finds how many leading blocks each
worker holds. Shared by the KV-event index and cache_aware's approximate tree.

The hash of a prefix of ``i`` full blocks is ``XOR over j < i of hash((j, *block_j))``, where ``block_j``
is the block's token ids. Salting each block with its position makes the XOR order-sensitive
(Zobrist hashing), so one 64-bit value names one exact prefix: the same prefix always hashes alike, and two
different prefixes collide with probability ~2^-64. It is our own hash, computed the same way for token ids
carried by KV events and for prompts, so matching never depends on the engine's hash function.

Python's tuple hash of ints is deterministic (only str/bytes hashing is salted per process). Every stage
runs in C (``map``/``zip``/``accumulate``): a 7,800-token prompt is ~490 blocks, and a Python-level loop per
block would cost several times the routing budget.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import accumulate, islice, repeat
from operator import xor

# The walk hashes blocks in growing chunks so that a prompt no worker holds costs one small chunk, and one a
# worker holds entirely costs few chunk set-ups: 8 blocks, then 64, then 512, ...
FIRST_CHUNK_BLOCKS = 8
CHUNK_GROWTH = 8


def block_hash(position: int, token_ids: tuple[int, ...]) -> int:
    """The salted hash of one full block; a prefix hash is the XOR of its blocks'."""
    return hash((position, *token_ids))


class BlockHashes:
    """A prompt's prefix hashes at one block size, computed on demand and kept."""

    __slots__ = ("_block_size", "_full_blocks", "_hashes", "_tokens")

    def __init__(self, prompt_ids: Sequence[int], block_size: int) -> None:
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        self._tokens = prompt_ids  # read, never copied whole: the prompt must not change while routed
        self._block_size = block_size
        self._full_blocks = len(self._tokens) // block_size
        self._hashes: list[int] = []

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def full_blocks(self) -> int:
        """Blocks the prompt fills completely; a trailing partial block is never cached, so never matched."""
        return self._full_blocks

    @property
    def token_count(self) -> int:
        return len(self._tokens)

    def resized(self, block_size: int) -> BlockHashes:
        """The same prompt at ``block_size`` (this object when the size is the same)."""
        return self if block_size == self._block_size else BlockHashes(self._tokens, block_size)

    def upto(self, blocks: int) -> list[int]:
        """The prefix hashes of the first ``blocks`` blocks (at most ``full_blocks``)."""
        blocks = min(blocks, self._full_blocks)
        self._extend(blocks)
        return self._hashes[:blocks]

    def between(self, start: int, stop: int) -> list[int]:
        """The prefix hashes of blocks ``start`` to ``stop - 1``."""
        self._extend(min(stop, self._full_blocks))
        return self._hashes[start:stop]

    def all(self) -> list[int]:
        self._extend(self._full_blocks)
        return self._hashes

    def _extend(self, blocks: int) -> None:
        done = len(self._hashes)
        if blocks <= done:
            return
        size = self._block_size
        tokens = iter(self._tokens)
        if done:
            next(islice(tokens, done * size, done * size), None)  # skip the blocks already hashed, in C
        # zip over the position and ``size`` references to one token iterator yields (position, *block)
        # tuples, in C; the range stops it at ``blocks`` (and a trailing partial block is never yielded).
        salted = map(hash, zip(range(done, blocks), *[tokens] * size, strict=False))
        if done == 0:
            self._hashes.extend(accumulate(salted, xor))
        else:
            # accumulate emits ``initial`` (the previous prefix, not a block) first: skip it.
            self._hashes.extend(islice(accumulate(salted, xor, initial=self._hashes[-1]), 1, None))


def leading_depths(hashes: BlockHashes, masks: Callable[[int, int], int]) -> dict[int, int]:
    """For each worker bit, the number of leading blocks of the prompt it holds (workers holding none omitted).

    ``masks(prefix_hash, 0)`` is the bitmask of workers holding that prefix (``dict.get`` fits). A worker's
    count stops at the first block it does not hold, even if it holds later ones.
    """
    total = hashes.full_blocks
    depths: dict[int, int] = {}
    alive = 0
    start = 0
    step = FIRST_CHUNK_BLOCKS
    while start < total:
        stop = min(total, start + step)
        chunk = list(map(masks, hashes.between(start, stop), repeat(0, stop - start)))
        if start == 0:
            alive = chunk[0]
        # Fast path, in C: the same workers hold every block of the chunk.
        if chunk.count(alive) != len(chunk):
            for position, mask in enumerate(chunk, start):
                if mask != alive:
                    _record(depths, alive & ~mask, position)
                    alive &= mask
                    if not alive:
                        return depths
        if not alive:
            return depths
        start = stop
        step *= CHUNK_GROWTH
    _record(depths, alive, total)
    return depths


def _record(depths: dict[int, int], bits: int, depth: int) -> None:
    for bit in bits_of(bits):
        depths[bit] = depth


def bits_of(mask: int) -> list[int]:
    """The worker bits set in ``mask``, lowest first."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out
