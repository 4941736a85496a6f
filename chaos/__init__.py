"""Fault tests of the mesh with real `smg-node serve` processes: kill -9, SIGSTOP, SIGTERM, restart, partitions.

`cluster.py` starts and observes nodes (also used by `bench/mesh_real.py`); `netns.py` builds two network
namespaces joined by a veth pair for real partitions; `partition.py` is the helper run under `unshare -rn`.
"""
