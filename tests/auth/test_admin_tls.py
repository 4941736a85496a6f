"""HTTPS on the admin API's own listener (--admin-bind): the main listener's certificate by default, or its
own (--admin-tls-cert-file), reloaded on SIGHUP in a real process like the main one."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import socket
import ssl
from pathlib import Path

import httpx2 as httpx
import pytest

from node.app import run_node
from node.auth.config import AuthConfig
from node.auth.keys import new_key
from node.config import HttpConfig
from node.sim.worker import SimWorker
from tests.http.conftest import fast_sim, node_config
from tests.mesh.tls_certs import CertAuthority, TlsFiles
from tests.procs import SMG_NODE, free_port, process, wait_until


def _served_cert(port: int, ca: Path) -> bytes:
    context = ssl.create_default_context(cafile=str(ca))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        return der


def _der(path: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(path.read_text())


async def test_the_admin_listener_serves_the_main_certificate_by_default(
    llama3_model_dir: Path, tmp_path: Path
) -> None:
    ca = CertAuthority(tmp_path, "adm")
    files = ca.issue("node", hosts=["127.0.0.1"])
    admin, _ = new_key()
    admin_port = free_port()
    async with contextlib.AsyncExitStack() as stack:
        sim = await stack.enter_async_context(SimWorker(fast_sim(llama3_model_dir)))
        base = node_config(llama3_model_dir, [sim.port])
        http = HttpConfig(port=0, tls_cert_file=str(files.cert), tls_key_file=str(files.key))
        auth = AuthConfig(auth_bootstrap_key=admin, admin_bind=f"127.0.0.1:{admin_port}")
        node = await stack.enter_async_context(run_node(dataclasses.replace(base, http=http, auth=auth)))
        assert node.admin_url == f"https://127.0.0.1:{admin_port}" and node.admin_tls is node.tls
        assert await asyncio.to_thread(_served_cert, admin_port, files.ca) == _der(files.cert)
        headers = {"Authorization": f"Bearer {admin}"}
        async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(files.ca))) as client:
            assert (await client.get(node.admin_url + "/admin/keys", headers=headers)).status_code == 200
            assert (await client.get(node.admin_url + "/admin/keys")).status_code == 401
        async with httpx.AsyncClient() as plain:  # no plain-HTTP admin port beside it
            with pytest.raises(httpx.HTTPError):
                await plain.get(f"http://127.0.0.1:{admin_port}/admin/keys", headers=headers)


def test_sighup_reloads_the_admin_listeners_own_certificate(llama3_model_dir: Path, tmp_path: Path) -> None:
    ca = CertAuthority(tmp_path, "admhup")
    main, own = ca.issue("node", hosts=["127.0.0.1"]), ca.issue("admin", hosts=["127.0.0.1"])
    admin, _ = new_key()
    port, admin_port = free_port(), free_port()
    args = [*SMG_NODE, "serve", "--processes", "1", "--port", str(port), "--model-path", str(llama3_model_dir)]
    args += ["--tls-cert-file", str(main.cert), "--tls-key-file", str(main.key)]
    args += ["--admin-bind", f"127.0.0.1:{admin_port}"]
    args += ["--admin-tls-cert-file", str(own.cert), "--admin-tls-key-file", str(own.key)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SMG_NODE_")}
    env["SMG_NODE_AUTH_BOOTSTRAP_KEY"] = admin
    with process(args, log=tmp_path / "node.log", env=env) as proc:

        def serves(port_: int, files: TlsFiles) -> bool:
            try:
                return _served_cert(port_, files.ca) == _der(files.cert)
            except OSError:
                return False

        wait_until(lambda: serves(admin_port, own) and serves(port, main), timeout_s=60, what="both listeners")
        renewed = ca.issue("admin-renewed", hosts=["127.0.0.1"])
        os.replace(renewed.cert, own.cert)
        os.replace(renewed.key, own.key)
        os.kill(proc.pid, signal.SIGHUP)
        wait_until(lambda: serves(admin_port, own), timeout_s=10, what="the renewed admin certificate")
        assert serves(port, main) and proc.poll() is None
