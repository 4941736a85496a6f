"""Anti-entropy planning (pure): what each peer's documents had reached, so push-pull sends diffs.

A push-pull request and its reply are built before either side has seen the other's (memberlist's
order), so a state cannot be a diff against *that* peer's state vector. Instead each section is a diff
against the pointwise minimum of the state vectors every live peer last reported for the document at
the same generation: whoever receives it has reached that base. When any live peer is unheard of, or at
another generation, or the exchange is a join, the section is the full document. State vectors only
grow within a generation, so an old report never overstates a live peer; a restarted peer (new,
empty documents) does overstate until it reports again — its receiver then sees a base it has not
reached, ignores that section (counted), and its next state corrects every peer's knowledge of it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from mesh.state.wire import Generation, sv_min


class PeerKnowledge:
    """Not thread-safe: owned by one ClusterState."""

    __slots__ = ("_known",)

    def __init__(self) -> None:
        #: peer -> document -> (generation, state vector) as the peer last reported it.
        self._known: dict[str, dict[str, tuple[Generation, Mapping[int, int]]]] = {}

    def learn(self, peer: str, doc: str, gen: Generation, sv: Mapping[int, int]) -> None:
        self._known.setdefault(peer, {})[doc] = (gen, sv)

    def forget(self, peers: Collection[str]) -> None:
        for peer in peers:
            self._known.pop(peer, None)

    def peers(self) -> set[str]:
        return set(self._known)

    def base(self, doc: str, gen: Generation, peers: Collection[str]) -> dict[int, int] | None:
        """The state vector every one of ``peers`` has reached for ``doc``, or None if a full state is
        needed (no peers, or one unheard of or at another generation)."""
        if not peers:
            return None
        svs = []
        for peer in peers:
            known = self._known.get(peer, {}).get(doc)
            if known is None or known[0] != gen:
                return None
            svs.append(known[1])
        return sv_min(svs)
