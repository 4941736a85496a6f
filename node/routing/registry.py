"""Policies by name: the one place a ``--policy`` value becomes a policy object."""

from __future__ import annotations

import random
from typing import get_args

from node.routing.affinity import AffinityHints
from node.routing.bucket import Bucket
from node.routing.cache_aware import CacheAware
from node.routing.config import PolicyName, RoutingConfig
from node.routing.consistent_hashing import ConsistentHashing
from node.routing.kv_index import KvIndex
from node.routing.least_load import LeastLoad
from node.routing.manual import Manual
from node.routing.policy import RoutingPolicy
from node.routing.power_of_two import PowerOfTwo
from node.routing.prefix_hash import PrefixHash
from node.routing.random_choice import RandomChoice
from node.routing.round_robin import RoundRobin

POLICY_NAMES: tuple[str, ...] = get_args(PolicyName)


def make_policy(
    name: str,
    config: RoutingConfig,
    *,
    rng: random.Random | None = None,
    kv_index: KvIndex | None = None,
    hints: AffinityHints | None = None,
) -> RoutingPolicy:
    """The policy called ``name``, configured by ``config``.

    ``rng`` defaults to one seeded with ``config.seed``. ``kv_index`` (cache_aware only) is the model's
    KV-event index, fed by the KV-event subscriber; without it cache_aware guesses from its own decisions and,
    with ``hints``, from the other nodes' (shared over the mesh).
    Raises ValueError for an unknown name.
    """
    rng = rng if rng is not None else random.Random(config.seed)
    stale = config.load_stale_after_s
    if name == "round_robin":
        return RoundRobin()
    if name == "random":
        return RandomChoice(rng)
    if name == "power_of_two":
        return PowerOfTwo(rng, load_stale_after_s=stale)
    if name == "least_load":
        return LeastLoad(
            kv_pressure_weight_s=config.kv_pressure_weight_s,
            default_throughput_tps=config.default_throughput_tps,
            mean_prefill_tokens=config.mean_prefill_tokens,
            mean_decode_tokens=config.mean_decode_tokens,
            load_stale_after_s=stale,
        )
    if name == "consistent_hashing":
        return ConsistentHashing(rng, virtual_nodes=config.virtual_nodes)
    if name == "prefix_hash":
        return PrefixHash(
            prefix_tokens=config.prefix_hash_tokens,
            load_factor=config.load_factor,
            balance_abs_threshold=config.prefix_hash_balance_abs_threshold,
            virtual_nodes=config.virtual_nodes,
            load_stale_after_s=stale,
        )
    if name == "cache_aware":
        return CacheAware(
            cache_threshold=config.cache_threshold,
            balance_abs_threshold=config.balance_abs_threshold,
            balance_rel_threshold=config.balance_rel_threshold,
            page_size_tokens=config.page_size_tokens,
            tree_max_pages=config.tree_max_pages,
            load_stale_after_s=stale,
            kv_index=kv_index,
            hints=hints,
        )
    if name == "manual":
        return Manual(rng, ttl_s=config.manual_ttl_s, max_entries=config.manual_max_entries, load_stale_after_s=stale)
    if name == "bucket":
        return Bucket(
            boundaries_tokens=config.bucket_boundaries_tokens,
            balance_abs_threshold=config.balance_abs_threshold,
            balance_rel_threshold=config.balance_rel_threshold,
            load_stale_after_s=stale,
        )
    raise ValueError(f"policy: {name!r} is not one of {', '.join(POLICY_NAMES)}")
