"""Everything that connects the node to the mesh, in one place; the rest of `node` knows only these modules.

| module | what |
|---|---|
| `config.py` | `ClusterConfig` and what it means for the mesh: the MeshConfig profile, seeds, this node's metadata |
| `member.py` | this node's member: start, join the seeds in the background, leave gracefully |
| `seeds.py` | seeds by DNS name (all its addresses but ours, re-resolved each round); a wildcard bind's address |
| `keys.py` | key rotation without downtime (SIGHUP re-reads --mesh-key-file) |
| `state.py` | the node's share of the replicated state: channels, `SharedState`, the ticker |
| `registry.py` | the worker registry (a replicated registry table) |
| `health.py` | the health board: each node's observations, the cluster's verdicts (replicated rows) |
| `hint_snapshot.py` | recent routing hints handed to a joining node in the join push-pull |

Only `mesh`'s public API is imported here (`mesh` and `mesh.state`). Kept free of imports so `node.config`
can read `node.cluster.config` without loading the mesh runtime.
"""
