"""Counters the core keeps, and the immutable snapshot it hands out.

Counters only grow (except the member gauges and the health score); an exporter turns a snapshot into
Prometheus series. ``malformed_packets`` counts every inbound packet or frame dropped as undecodable,
oversized or of the wrong version; ``decrypt_failures`` the ones no key authenticated.
``tls_handshake_failures`` is the asyncio shell's (TLS lives in the transport, not the core): streams
whose mutual TLS failed, inbound (no certificate, or one the cluster CA did not sign) and outbound.
``streams_refused`` is the shell's too: inbound streams closed for exceeding a bound (too many at once, in
total or from one address; the shared frame buffer full; no header in time). ``incarnations_refused`` counts
membership messages dropped for an implausible incarnation (see membership.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(slots=True)
class Counters:
    probes_sent: int = 0
    probes_failed: int = 0
    indirect_probes_sent: int = 0
    fallback_probes_sent: int = 0
    nacks_received: int = 0
    suspicions: int = 0
    refutations: int = 0
    deaths: int = 0
    leaves: int = 0
    packets_in: int = 0
    packets_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    malformed_packets: int = 0
    decrypt_failures: int = 0
    streams_in: int = 0
    streams_out: int = 0
    streams_failed: int = 0
    push_pulls: int = 0
    relays_dropped: int = 0
    incarnations_refused: int = 0


@dataclass(frozen=True, slots=True)
class MeshMetrics:
    members_alive: int
    members_suspect: int
    members_dead: int
    members_left: int
    health_score: int
    probes_sent: int
    probes_failed: int
    indirect_probes_sent: int
    fallback_probes_sent: int
    nacks_received: int
    suspicions: int
    refutations: int
    deaths: int
    leaves: int
    packets_in: int
    packets_out: int
    bytes_in: int
    bytes_out: int
    malformed_packets: int
    decrypt_failures: int
    streams_in: int
    streams_out: int
    streams_failed: int
    push_pulls: int
    relays_dropped: int
    incarnations_refused: int
    tls_handshake_failures: int = 0
    streams_refused: int = 0

    @classmethod
    def build(cls, counters: Counters, by_state: tuple[int, int, int, int], health_score: int) -> MeshMetrics:
        values = {f.name: getattr(counters, f.name) for f in fields(Counters)}
        alive, suspect, dead, left = by_state
        return cls(
            members_alive=alive,
            members_suspect=suspect,
            members_dead=dead,
            members_left=left,
            health_score=health_score,
            **values,
        )
