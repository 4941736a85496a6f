"""The per-address token buckets: burst then rate, per address (IPv6 per /64), exempt networks, a bounded table."""

from __future__ import annotations

import ipaddress

import pytest

from node.config import HttpConfig
from node.http.connection_rate import ConnectionRate


def test_a_burst_then_the_rate_per_address() -> None:
    rate = ConnectionRate(rate_per_s=2.0, burst=3)
    assert [rate.allow("10.0.0.1", 0.0) for _ in range(4)] == [True, True, True, False]
    assert rate.allow("10.0.0.2", 0.0)  # its own bucket
    assert not rate.allow("10.0.0.1", 0.25)  # half a token
    assert rate.allow("10.0.0.1", 0.5)
    assert [rate.allow("10.0.0.1", 100.0) for _ in range(4)] == [True, True, True, False]  # full, not more


def test_ipv6_is_counted_per_64_and_mapped_ipv4_as_ipv4() -> None:
    rate = ConnectionRate(rate_per_s=1.0, burst=1)
    assert rate.allow("2001:db8:1:2::1", 0.0)
    assert not rate.allow("2001:db8:1:2:ffff::9", 0.0)  # same /64
    assert rate.allow("2001:db8:1:3::1", 0.0)
    assert rate.allow("192.0.2.7", 0.0)
    assert not rate.allow("::ffff:192.0.2.7", 0.0)


def test_exempt_networks_and_non_ip_peers_are_not_limited_and_the_table_is_bounded() -> None:
    rate = ConnectionRate(1.0, 1, [ipaddress.ip_network("127.0.0.0/8")], max_addresses=100)
    assert all(rate.allow("127.0.0.5", 0.0) for _ in range(10))
    assert all(rate.allow("", 0.0) for _ in range(10))
    for k in range(1000):
        rate.allow(f"10.0.{k // 256}.{k % 256}", 0.0)
    assert len(rate) == 100
    assert not rate.allow("10.0.3.231", 0.0)  # the most recent ones are remembered


def test_connection_rate_defaults_leave_loopback_and_keep_alive_clients_alone() -> None:
    http = HttpConfig()
    assert (http.connection_rate_per_s, http.connection_rate_burst) == (200.0, 1000)
    assert http.connection_rate_exempt == ("127.0.0.0/8", "::1/128")
    with pytest.raises(ValueError, match="connection_rate_exempt"):
        HttpConfig(connection_rate_exempt=("10.0.0.0/33",))
