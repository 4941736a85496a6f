"""node/auth: the key format, hashing and the authenticator's verdicts (pure cores, a real ClusterState)."""

from __future__ import annotations

import hmac
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mesh.state import ClusterState
from node.auth.access import allowed_roles
from node.auth.authenticator import ApiKeyAuthenticator, AuthFailure
from node.auth.config import AuthConfig, AuthConfigError
from node.auth.identity import Identity, Limits
from node.auth.keys import KeyFormatError, key_digest, new_key, parse_key
from node.cluster.api_keys import ApiKeyTable


def _table(now: list[float]) -> ApiKeyTable:
    return ApiKeyTable(ClusterState("n1"), clock=lambda: now[0])


def test_a_new_key_has_its_id_visible_and_only_its_hash_is_stored() -> None:
    now = [1000.0]
    table = _table(now)
    text, record = table.create(tenant="acme", role="user", name="ci", limits=Limits(requests_per_minute=5))
    assert text.startswith(f"smg-{record.key_id}-") and len(text) == 4 + 8 + 1 + 43
    stored = repr(record.to_json()) + repr(table.records())
    assert text.split("-", 2)[2] not in stored  # the secret is nowhere in what the cluster holds
    assert record.digest == key_digest(record.key_id, parse_key(text).secret)
    assert "digest" not in record.public_json()


def test_authenticator_verdicts() -> None:
    now = [1000.0]
    table = _table(now)
    auth = ApiKeyAuthenticator(table.get, clock=lambda: now[0])
    text, record = table.create(tenant="acme", role="user", expires_at=2000.0)
    identity = auth.authenticate(text)
    assert isinstance(identity, Identity) and (identity.tenant, identity.role) == ("acme", "user")
    assert auth.authenticate(None) == AuthFailure("missing")
    assert auth.authenticate("sk-not-ours") == AuthFailure("malformed")
    wrong_secret = text[:-1] + ("A" if text[-1] != "A" else "B")
    assert auth.authenticate(wrong_secret) == AuthFailure("unknown", record.key_id)
    other, _ = new_key()
    assert isinstance(auth.authenticate(other), AuthFailure)
    now[0] = 2000.0
    assert auth.authenticate(text) == AuthFailure("expired", record.key_id)
    now[0] = 1500.0
    table.revoke(record.key_id)
    assert auth.authenticate(text) == AuthFailure("revoked", record.key_id)
    # Revoking twice keeps the first time.
    first = table.get(record.key_id)
    now[0] = 1600.0
    assert table.revoke(record.key_id) == first


def test_bootstrap_key_is_an_admin_and_its_wrong_secret_is_refused() -> None:
    text, _ = new_key()
    auth = ApiKeyAuthenticator(lambda _id: None, bootstrap_key=text, clock=time.time)
    identity = auth.authenticate(text)
    assert isinstance(identity, Identity) and identity.role == "admin"
    assert isinstance(auth.authenticate(text[:-1] + ("x" if text[-1] != "x" else "y")), AuthFailure)
    with pytest.raises(KeyFormatError):
        ApiKeyAuthenticator(lambda _id: None, bootstrap_key="hunter2", clock=time.time)


@given(st.text(max_size=300))
def test_parse_key_refuses_everything_but_our_format(text: str) -> None:
    try:
        parsed = parse_key(text)
    except KeyFormatError as exc:
        assert str(exc).startswith("not an smg-node API key (")  # a fixed text: never echoes the input
        return
    assert text == f"smg-{parsed.key_id}-{parsed.secret}"


def test_a_wrong_secret_costs_the_same_whatever_it_shares_with_the_right_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A presented secret reaches exactly one comparison, ``hmac.compare_digest`` of its sha256 digest with
    the stored one (a dummy for an unknown id), and the verdict is that comparison's: so the work does not
    depend on how much of the secret is right, and a non-constant comparison could only leak a prefix of a
    digest, which no attacker can steer. Checked by watching the comparison, not by a stopwatch: a median of
    wall-clock samples flaked under load, and the difference a plain ``==`` makes (nanoseconds) is lost in the
    authenticator's microseconds anyway, so a timing assertion could not catch that regression."""
    now = [1000.0]
    table = _table(now)
    bootstrap, _ = new_key()
    auth = ApiKeyAuthenticator(table.get, bootstrap_key=bootstrap, clock=lambda: now[0])
    text, record = table.create(tenant="t", role="user")
    head, secret = text[:13], text[13:]
    near = head + secret[:-1] + _flip(secret[-1])  # all but the last character right
    far = head + _flip(secret[0]) + secret[1:]  # the first character wrong
    boot_near = bootstrap[:-1] + _flip(bootstrap[-1])
    unknown_id, _ = new_key()

    calls: list[tuple[str, str]] = []
    real = hmac.compare_digest

    def spy(a: str, b: str) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    stored_digest = {record.key_id: record.digest, parse_key(bootstrap).key_id: key_digest(*_parts(bootstrap))}
    for candidate in (near, far, boot_near):
        calls.clear()
        assert auth.authenticate(candidate) == AuthFailure("unknown", parse_key(candidate).key_id)
        expected = (key_digest(*_parts(candidate)), stored_digest[parse_key(candidate).key_id])
        assert calls == [expected], "one compare_digest of the digests, and no other look at the secret"
    calls.clear()
    assert auth.authenticate(unknown_id) == AuthFailure("unknown", parse_key(unknown_id).key_id)
    assert len(calls) == 1 and calls[0][0] == key_digest(*_parts(unknown_id)) and len(calls[0][1]) == 64

    # The verdict is the comparison's alone: told "equal", a wrong secret passes; told "different", the
    # right key fails. (No other check of the secret decides, before or after it.)
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: True)
    assert isinstance(auth.authenticate(near), Identity) and isinstance(auth.authenticate(boot_near), Identity)
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: False)
    assert auth.authenticate(text) == AuthFailure("unknown", record.key_id)
    assert auth.authenticate(bootstrap) == AuthFailure("unknown", parse_key(bootstrap).key_id)


def _flip(c: str) -> str:
    return "A" if c != "A" else "B"


def _parts(text: str) -> tuple[str, str]:
    parsed = parse_key(text)
    return parsed.key_id, parsed.secret


def test_routes_need_the_right_role() -> None:
    assert allowed_roles("GET", "/health") is None
    for method, path in (("POST", "/workers"), ("DELETE", "/workers/w-1"), ("POST", "/mesh/join")):
        assert allowed_roles(method, path) == {"admin"}
    for method, path in (("GET", "/admin/keys"), ("POST", "/admin/keys"), ("DELETE", "/admin/keys/x")):
        assert allowed_roles(method, path) == {"admin"}
    assert allowed_roles("GET", "/metrics") == {"admin", "reader"}
    assert allowed_roles("GET", "/workers") == {"admin", "reader"}
    assert allowed_roles("POST", "/v1/chat/completions") == {"admin", "user"}
    assert allowed_roles("GET", "/healthz") == {"admin", "user", "reader"}  # not /health: needs an identity
    # The status page's HTML is open (it asks for a key); its data is not, nor any path under the page's.
    assert allowed_roles("GET", "/") is None and allowed_roles("GET", "/status") is None
    assert allowed_roles("GET", "/status.json") == {"admin", "reader"}
    assert allowed_roles("POST", "/") == {"admin", "user", "reader"}
    assert allowed_roles("GET", "/status/x") == {"admin", "user", "reader"}


def test_safe_default_refuses_an_open_node_on_a_public_address() -> None:
    assert AuthConfig().enforced("127.0.0.1") is False
    assert AuthConfig().enforced("::1") is False
    with pytest.raises(AuthConfigError, match="--auth none"):
        AuthConfig().enforced("0.0.0.0")
    assert AuthConfig(auth="none").enforced("0.0.0.0") is False
    key, _ = new_key()
    assert AuthConfig(auth_bootstrap_key=key).enforced("0.0.0.0") is True
    assert key not in repr(AuthConfig(auth_bootstrap_key=key))
    with pytest.raises(ValueError, match="auth_bootstrap_key"):
        AuthConfig(auth_bootstrap_key="hunter2")
