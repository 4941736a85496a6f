"""Workers by Kubernetes labels (``--worker-k8s-selector app=vllm``): the API server's pod list and watch.

Every pod matching the selector that is Running, Ready, has an IP and is not being deleted is a worker at
``grpc://<pod IP>:<port>``; its served model is the pod's ``--worker-k8s-model-key`` label or annotation
(SMG's convention: the model id rides on the pod), its role the ``smg.ai/role`` label (regular by default).
The watch resumes from the last resourceVersion; when the server says it is too old (410 Gone) or the stream
breaks, the pods are listed again and the registry made equal to the list. A failed list changes nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

from node.cluster.registry import WorkerRegistry, WorkerRole, WorkerSpec
from node.discovery.config import DiscoveryConfig
from node.discovery.registry_sync import sync_owned

log = logging.getLogger(__name__)

#: One watch event (a pod object) may be this large; a longer line ends the watch and we list again.
MAX_EVENT_BYTES = 4 * 1024 * 1024
#: A watch the server keeps open longer is ended by it; we ask for this much and then watch again.
WATCH_TIMEOUT_S = 300
#: Pause after a failed list or a broken watch, doubling up to the cap.
RETRY_MIN_S, RETRY_MAX_S = 0.5, 30.0
ROLE_KEY = "smg.ai/role"
_ROLES: dict[str, WorkerRole] = {"regular": "regular", "prefill": "prefill", "decode": "decode"}


class ApiError(Exception):
    """The API server could not be asked or answered with an error."""


class Gone(ApiError):
    """The watch's resourceVersion is too old: list again."""


@dataclass(frozen=True, slots=True)
class K8sTarget:
    api_url: str
    namespace: str
    selector: str
    port: int
    model_key: str
    token: str = ""
    ssl_context: ssl.SSLContext | None = None


def k8s_target(config: DiscoveryConfig) -> K8sTarget:
    """The API server and credentials: the service account's files where mounted (in a pod). Raises OSError
    when an https API server is configured and the token or CA cannot be read."""
    sa = Path(config.worker_k8s_service_account_dir)
    namespace = config.worker_k8s_namespace
    if not namespace:
        namespace = (sa / "namespace").read_text(encoding="utf-8").strip()
    token, context = "", None
    if config.worker_k8s_api_url.startswith("https:"):
        token = (sa / "token").read_text(encoding="utf-8").strip()
        context = ssl.create_default_context(cafile=str(sa / "ca.crt"))
    return K8sTarget(
        api_url=config.worker_k8s_api_url,
        namespace=namespace,
        selector=config.worker_k8s_selector,
        port=config.worker_k8s_port,
        model_key=config.worker_k8s_model_key,
        token=token,
        ssl_context=context,
    )


def _meta(pod: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = pod.get("metadata", {}).get(key) or {}
    return value if isinstance(value, dict) else {}


def pod_worker(pod: Mapping[str, Any], port: int, model_key: str) -> WorkerSpec | None:
    """The worker a pod is, or None while it is not one (not running, not ready, no IP, being deleted)."""
    status = pod.get("status") or {}
    ip = status.get("podIP")
    if not ip or status.get("phase") != "Running" or pod.get("metadata", {}).get("deletionTimestamp"):
        return None
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())
    if not ready:
        return None
    labels, annotations = _meta(pod, "labels"), _meta(pod, "annotations")
    model = str(labels.get(model_key) or annotations.get(model_key) or "")
    role = _ROLES.get(str(labels.get(ROLE_KEY) or "regular"), "regular")
    host = f"[{ip}]" if ":" in ip else ip
    try:
        return WorkerSpec(url=f"grpc://{host}:{port}", model=model, role=role)
    except ValueError as exc:
        log.warning("pod %s is no usable worker: %s", pod.get("metadata", {}).get("name"), exc)
        return None


class K8sDiscovery:
    """Keeps the registry's Kubernetes-found workers equal to the matching pods."""

    def __init__(self, target: K8sTarget, registry: WorkerRegistry, *, max_workers: int) -> None:
        self._t = target
        self._registry = registry
        self._max_workers = max_workers
        self._source = f"k8s:{target.namespace}"[:128]
        self._pods: dict[str, WorkerSpec] = {}  # pod uid -> worker

    def _url(self, watch: bool, resource_version: str = "") -> str:
        base = f"{self._t.api_url.rstrip('/')}/api/v1/namespaces/{quote(self._t.namespace)}/pods"
        query = f"labelSelector={quote(self._t.selector)}"
        if watch:
            query += f"&watch=1&allowWatchBookmarks=true&timeoutSeconds={WATCH_TIMEOUT_S}"
            query += f"&resourceVersion={quote(resource_version)}"
        return f"{base}?{query}"

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._t.token}"} if self._t.token else {}

    def _apply(self) -> None:
        found: dict[str, WorkerSpec] = {}
        for spec in self._pods.values():
            if len(found) >= self._max_workers:
                break
            found[spec.url] = spec
        sync_owned(self._registry, self._source, found, f"a ready pod matching {self._t.selector}")

    def _note(self, pod: Mapping[str, Any], deleted: bool = False) -> None:
        uid = str(pod.get("metadata", {}).get("uid") or pod.get("metadata", {}).get("name") or "")
        spec = None if deleted else pod_worker(pod, self._t.port, self._t.model_key)
        if spec is None:
            self._pods.pop(uid, None)
        else:
            self._pods[uid] = spec

    async def list_once(self, session: aiohttp.ClientSession) -> str:
        """List the pods, make the registry match; returns the list's resourceVersion. Raises ApiError."""
        try:
            async with session.get(self._url(False), headers=self._headers(), ssl=self._t.ssl_context or True) as r:
                if r.status != 200:
                    raise ApiError(f"listing pods: HTTP {r.status}")
                body = await r.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise ApiError(f"listing pods: {exc}") from exc
        self._pods.clear()
        for pod in body.get("items") or ():
            self._note(pod)
        self._apply()
        return str(body.get("metadata", {}).get("resourceVersion") or "")

    async def watch(self, session: aiohttp.ClientSession, resource_version: str) -> str:
        """Follow changes until the server ends the watch; returns the last resourceVersion. Raises ApiError,
        Gone."""
        try:
            async with session.get(
                self._url(True, resource_version),
                headers=self._headers(),
                ssl=self._t.ssl_context or True,
                timeout=aiohttp.ClientTimeout(total=None, sock_read=WATCH_TIMEOUT_S + 30),
            ) as r:
                if r.status == 410:
                    raise Gone("resourceVersion too old")
                if r.status != 200:
                    raise ApiError(f"watching pods: HTTP {r.status}")
                async for event in _lines(r.content):
                    resource_version = self._event(event, resource_version)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ApiError(f"watching pods: {exc}") from exc
        return resource_version

    def _event(self, line: bytes, resource_version: str) -> str:
        try:
            event = json.loads(line)
        except ValueError as exc:
            raise ApiError(f"unparsable watch event: {exc}") from exc
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone(str(obj.get("message", "")))
            raise ApiError(f"watch error: {obj.get('message', obj)}")
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self._note(obj, deleted=kind == "DELETED")
            self._apply()
        return str(obj.get("metadata", {}).get("resourceVersion") or resource_version)

    async def run(self) -> None:
        pause = RETRY_MIN_S
        async with aiohttp.ClientSession() as session:
            version = ""
            while True:
                try:
                    if not version:
                        version = await self.list_once(session)
                    version = await self.watch(session, version)
                    pause = RETRY_MIN_S
                except Gone:
                    version = ""  # list again, at once
                except ApiError as exc:
                    log.warning("worker discovery (%s): %s; retrying in %.1f s", self._t.selector, exc, pause)
                    version = ""
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, RETRY_MAX_S)


async def _lines(stream: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """Newline-separated events, each at most MAX_EVENT_BYTES. Raises ApiError past it."""
    buf = bytearray()
    async for chunk in stream.iter_any():
        buf += chunk
        while (end := buf.find(b"\n")) >= 0:
            line = bytes(buf[:end])
            del buf[: end + 1]
            if line.strip():
                yield line
        if len(buf) > MAX_EVENT_BYTES:
            raise ApiError(f"a watch event longer than {MAX_EVENT_BYTES} bytes")
