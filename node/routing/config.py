"""Routing configuration: which policy, and every policy's knobs, with defaults defined only here.

Where SMG (lightseekorg/smg, ``smg`` 1.13 ``RouterArgs``) has the same knob, the default is SMG's so a
deployment behaves alike behind either gateway. Exceptions are noted on the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Final, Literal, get_args

#: The header a request names its routing key in (consistent_hashing, manual), unless --routing-key-header
#: says otherwise. Defined here only; the HTTP layer's defaults refer to it.
DEFAULT_ROUTING_KEY_HEADER: Final = "x-smg-routing-key"

PolicyName = Literal[
    "round_robin",
    "random",
    "power_of_two",
    "least_load",
    "consistent_hashing",
    "prefix_hash",
    "cache_aware",
    "manual",
    "bucket",
]


def _check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{key}: {message}")


@dataclass(frozen=True, slots=True)
class RoutingConfig:
    policy: PolicyName = field(default="round_robin", metadata={"help": "how a worker is chosen per request"})
    prefill_policy: str = field(
        default="", metadata={"help": "policy of the prefill pool in PD disaggregation (empty: --policy)"}
    )
    decode_policy: str = field(
        default="", metadata={"help": "policy of the decode pool in PD disaggregation (empty: --policy)"}
    )
    model_policies: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "MODEL=POLICY: the policy of one served model's (regular) pool, repeatable (others: --policy)",
            "flag": "--model-policy",
            "metavar": "MODEL=POLICY",
        },
    )
    seed: int | None = field(
        default=None,
        metadata={"help": "seed of the routing random generator (random, power_of_two, ties); empty: OS entropy"},
    )
    routing_key_header: str = field(
        default=DEFAULT_ROUTING_KEY_HEADER,
        metadata={"help": "request header whose value is the routing key (consistent_hashing, manual)"},
    )
    load_stale_after_s: float = field(
        default=30.0,
        metadata={
            "help": "an engine load report older than this is ignored and the gateway's in-flight count used "
            "instead (SMG: three load polls)"
        },
    )
    circuit_failures_to_open: int = field(
        default=10,
        metadata={
            "help": "requests to a worker that fail in a row (connect errors, worker errors, broken streams) before "
            "its circuit opens: out of rotation for --circuit-open-s, then one trial request (SMG "
            "cb_failure_threshold)"
        },
    )
    circuit_open_s: float = field(
        default=60.0,
        metadata={
            "help": "seconds an open circuit keeps its worker out of rotation before a trial request; the trial's "
            "success closes it, its failure opens it again (SMG cb_timeout_duration_secs)"
        },
    )
    # cache_aware
    cache_threshold: float = field(
        default=0.3,
        metadata={
            "help": "cache_aware: minimum fraction of the prompt a worker must already hold to be chosen for it; "
            "below it the worker holding the least is chosen"
        },
    )
    balance_abs_threshold: int = field(
        default=64,
        metadata={
            "help": "cache_aware, bucket: the pool is imbalanced when max - min load exceeds this many requests "
            "(and the relative threshold); then the least-loaded worker is chosen"
        },
    )
    balance_rel_threshold: float = field(
        default=1.5,
        metadata={"help": "cache_aware, bucket: ... and the max load exceeds this multiple of the min load"},
    )
    page_size_tokens: int = field(
        default=16,
        metadata={"help": "cache_aware: tokens per page of the approximate prefix tree (SMG block_size)"},
    )
    tree_max_pages: int = field(
        default=1 << 20,
        metadata={
            "help": "cache_aware: pages the approximate prefix tree holds, all workers together; least recently "
            "used leaves are evicted beyond it (SMG bounds 2^26 tokens; at ~115 B/page 2^20 pages is ~120 MB)"
        },
    )
    affinity_hint_ttl_s: float = field(
        default=600.0,
        metadata={"help": "cache_aware in a mesh: other nodes' routing hints are trusted this long (seconds)"},
    )
    affinity_hint_max_entries: int = field(
        default=200_000,
        metadata={"help": "cache_aware in a mesh: hints held (about 100 B each); the oldest are dropped beyond it"},
    )
    kv_index_max_blocks: int = field(
        default=1 << 22,
        metadata={
            "help": "KV-event index (one per served model): blocks held, all of the model's workers together; the "
            "largest worker's oldest blocks are dropped beyond it (normally the engines' own Removed events keep "
            "it far below)"
        },
    )
    # prefix_hash
    prefix_hash_tokens: int = field(
        default=256,
        metadata={"help": "prefix_hash: leading prompt tokens hashed onto the ring (size past shared system prompts)"},
    )
    load_factor: float = field(
        default=1.25,
        metadata={
            "help": "prefix_hash: a worker whose load exceeds this multiple of the mean is passed over for the "
            "next one on the ring"
        },
    )
    prefix_hash_balance_abs_threshold: int = field(
        default=10,
        metadata={
            "help": "prefix_hash: ... and only when its load also exceeds the mean by this many requests "
            "(keeps low-load noise from breaking affinity)"
        },
    )
    virtual_nodes: int = field(
        default=150,
        metadata={"help": "consistent_hashing, prefix_hash: ring positions per worker"},
    )
    # least_load
    kv_pressure_weight_s: float = field(
        default=0.15,
        metadata={"help": "least_load: seconds of expected wait a full KV cache is worth, as w * k / (1 - k)"},
    )
    default_throughput_tps: float = field(
        default=2000.0,
        metadata={"help": "least_load: tokens/s assumed for a worker that reports no generation rate"},
    )
    mean_prefill_tokens: int = field(
        default=1024,
        metadata={"help": "least_load: prompt tokens assumed per request whose size is not known"},
    )
    mean_decode_tokens: int = field(
        default=256,
        metadata={
            "help": "least_load: output tokens assumed per request (engines report no lengths); a running "
            "request is counted with half of them still to generate"
        },
    )
    # manual
    manual_ttl_s: float = field(
        default=4 * 3600.0,
        metadata={"help": "manual: a routing key unused this long is forgotten"},
    )
    manual_max_entries: int = field(
        default=1 << 18,
        metadata={"help": "manual: routing keys remembered; the least recently used is forgotten beyond it"},
    )
    # bucket
    bucket_boundaries_tokens: tuple[int, ...] = field(
        default=(),
        metadata={
            "help": "bucket: ascending prompt lengths splitting requests into len+1 buckets, spread over the "
            "workers in URL order; empty: one bucket per worker over 0..4096 tokens",
            "metavar": "TOKENS",
        },
    )

    def policies_by_model(self) -> dict[str, str]:
        """The --model-policy entries as model -> policy name."""
        return dict(entry.rsplit("=", 1) for entry in self.model_policies)

    def policy_for(self, role: str) -> str:
        """The policy name of the pool of ``role`` (regular, prefill, decode)."""
        chosen = {"prefill": self.prefill_policy, "decode": self.decode_policy}.get(role, "")
        return chosen or self.policy

    def __post_init__(self) -> None:
        for entry in self.model_policies:
            model, sep, policy = entry.rpartition("=")
            _check(bool(sep and model), "model_policies", f"expected MODEL=POLICY, got {entry!r}")
            _check(policy in get_args(PolicyName), "model_policies", f"unknown policy {policy!r} in {entry!r}")
        for name in ("prefill_policy", "decode_policy"):
            value = getattr(self, name)
            _check(
                not value or value in get_args(PolicyName),
                name,
                f"must be empty or one of {', '.join(get_args(PolicyName))}",
            )
        _check(bool(self.routing_key_header.strip()), "routing_key_header", "must not be empty")
        _check(self.load_stale_after_s > 0, "load_stale_after_s", "must be > 0")
        _check(self.circuit_failures_to_open >= 1, "circuit_failures_to_open", "must be >= 1")
        _check(
            math.isfinite(self.circuit_open_s) and self.circuit_open_s > 0,
            "circuit_open_s",
            "must be a finite number > 0",
        )
        _check(0.0 <= self.cache_threshold <= 1.0, "cache_threshold", "must be within [0, 1]")
        _check(self.balance_abs_threshold >= 0, "balance_abs_threshold", "must be >= 0")
        _check(self.balance_rel_threshold >= 1.0, "balance_rel_threshold", "must be >= 1")
        _check(self.page_size_tokens >= 1, "page_size_tokens", "must be >= 1")
        _check(self.tree_max_pages >= 1, "tree_max_pages", "must be >= 1")
        _check(self.affinity_hint_ttl_s > 0, "affinity_hint_ttl_s", "must be > 0")
        _check(self.affinity_hint_max_entries >= 1, "affinity_hint_max_entries", "must be >= 1")
        _check(self.kv_index_max_blocks >= 1, "kv_index_max_blocks", "must be >= 1")
        _check(self.prefix_hash_tokens >= 1, "prefix_hash_tokens", "must be >= 1")
        _check(self.load_factor >= 1.0, "load_factor", "must be >= 1")
        _check(self.prefix_hash_balance_abs_threshold >= 0, "prefix_hash_balance_abs_threshold", "must be >= 0")
        _check(self.virtual_nodes >= 1, "virtual_nodes", "must be >= 1")
        _check(
            math.isfinite(self.kv_pressure_weight_s) and self.kv_pressure_weight_s >= 0,
            "kv_pressure_weight_s",
            "must be a finite number >= 0",
        )
        _check(
            math.isfinite(self.default_throughput_tps) and self.default_throughput_tps > 0,
            "default_throughput_tps",
            "must be a finite number > 0",
        )
        _check(self.mean_prefill_tokens >= 1, "mean_prefill_tokens", "must be >= 1")
        _check(self.mean_decode_tokens >= 0, "mean_decode_tokens", "must be >= 0")
        _check(self.manual_ttl_s > 0, "manual_ttl_s", "must be > 0")
        _check(self.manual_max_entries >= 1, "manual_max_entries", "must be >= 1")
        bounds = self.bucket_boundaries_tokens
        _check(all(b > 0 for b in bounds), "bucket_boundaries_tokens", "lengths must be > 0")
        _check(
            all(a < b for a, b in pairwise(bounds)),
            "bucket_boundaries_tokens",
            "must be strictly ascending",
        )
