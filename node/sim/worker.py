"""Serving the simulated engine: ``SimWorker`` (an async context manager) and ``run_sim_worker``.

Start-up order: load the model folder, bind the port, build the engine (it names itself by the bound
address), register the services, start. Shutdown runs in reverse: health goes NOT_SERVING, the engine
aborts in-flight generations (their streams end with finish reason "abort"), then the server stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import grpc
from tokenizers import Tokenizer

from node.models.parses import TokenizerParses
from node.pipeline.parsers.detect import ParserChoice, detect_folder
from node.sim.answers import FamilyAnswers
from node.sim.config import SimWorkerConfig
from node.sim.engine import SimEngine
from node.sim.errors import ModelFolderError, SimError
from node.sim.faults import fault_generate, register_with_fault
from node.sim.grpc_server import NativeGrpcServer, server_ssl_context
from node.sim.health import HealthService
from node.sim.model_folder import ModelFolder, load_model_folder
from node.sim.servicer import SimEngineServicer
from node.sim.vocabulary import TextVocabulary, vocabulary_from_tokenizer

logger = logging.getLogger(__name__)

SERVICE_NAME = "vllm.grpc.engine.VllmEngine"
# In-flight RPCs get this long to finish after the engine aborted them (streams end within a loop turn).
SHUTDOWN_GRACE_S = 2.0
_SERVER_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    # As the reference server: tolerate client keepalive pings every 10 s during long non-streamed calls.
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # Fail on a port another process holds instead of silently sharing it.
    ("grpc.so_reuseport", 0),
]


class PortBindError(SimError):
    """The gRPC port could not be bound."""


class TlsFileError(SimError):
    """A TLS file could not be read."""


def _server_credentials(config: SimWorkerConfig) -> grpc.ServerCredentials | None:
    """TLS credentials when ``tls_cert_file`` is set (client certificates required with a client CA).

    Raises TlsFileError naming an unreadable file.
    """
    if not config.tls_cert_file:
        return None

    def read(name: str, path: str) -> bytes:
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise TlsFileError(f"{name} {path}: {exc.strerror or exc}") from None

    pair = (read("tls_key_file", config.tls_key_file), read("tls_cert_file", config.tls_cert_file))
    client_ca = read("tls_client_ca_file", config.tls_client_ca_file) if config.tls_client_ca_file else None
    return grpc.ssl_server_credentials([pair], root_certificates=client_ca, require_client_auth=client_ca is not None)


def _server_ssl(config: SimWorkerConfig) -> ssl.SSLContext | None:
    """`_server_credentials` for the native server: the same files, the same rules.

    Raises TlsFileError naming an unreadable or unusable file.
    """
    if _server_credentials(config) is None:  # reads every file: an unreadable one is named there
        return None
    try:
        return server_ssl_context(config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file or None)
    except (OSError, ssl.SSLError) as exc:
        raise TlsFileError(f"tls_cert_file/tls_key_file/tls_client_ca_file: {exc}") from None


@dataclass(frozen=True, slots=True)
class SimModel:
    """A loaded model folder, its tokenizer and the tokens the engine writes with (load once, share)."""

    folder: ModelFolder
    tokenizer: Tokenizer
    vocabulary: TextVocabulary
    answers: FamilyAnswers | None = None


def load_sim_model(config: SimWorkerConfig, parses: TokenizerParses | None = None) -> SimModel:
    """Read ``config.model_path`` (blocking: about a second for a 128k vocabulary; ``parses``: tokenizer.json
    parses shared with other loaders in the process).

    Raises:
        ModelFolderError: the folder or its tokenizer cannot be read.
    """
    folder, tokenizer = load_model_folder(config.model_path, config.served_model_name, parses)
    try:
        added = [token.content for token in tokenizer.get_added_tokens_decoder().values()]
        family = detect_folder(folder.path, added_tokens=added)
    except (OSError, ValueError):  # no tokenizer_config.json: no chat template, so no family markup
        family = ParserChoice(None, None)
    answers = FamilyAnswers(tokenizer, tool_parser=family.tool_parser, thinks=family.reasoning_parser is not None)
    return SimModel(folder, tokenizer, _vocabulary(tokenizer), answers)


def _vocabulary(tokenizer: Tokenizer) -> TextVocabulary:
    try:
        return vocabulary_from_tokenizer(tokenizer)
    except ValueError as exc:
        raise ModelFolderError(f"the tokenizer has no plain word tokens to write with: {exc}") from exc


class SimWorker:
    """``async with SimWorker(config) as worker:`` serves until the block exits; ``worker.port`` is bound."""

    def __init__(self, config: SimWorkerConfig, model: SimModel | None = None) -> None:
        self._config = config
        self._model = model
        self._server: grpc.aio.Server | NativeGrpcServer | None = None
        self._started = False
        self._engine: SimEngine | None = None
        self._health: HealthService | None = None
        self._port = 0

    @property
    def config(self) -> SimWorkerConfig:
        return self._config

    @property
    def port(self) -> int:
        return self._port

    @property
    def address(self) -> str:
        return f"{self._config.host}:{self._port}"

    @property
    def engine(self) -> SimEngine:
        if self._engine is None:
            raise RuntimeError("the worker is not running")
        return self._engine

    def bind(self) -> int:
        """Listen on the configured port now and return it, before the model is loaded: gRPC accepts
        connections from the bind on, and a call made before the worker starts waits in the backlog and is
        answered once it does. So a node can be given this worker's address and start while the model
        loads (the demo). Call from the event loop; entering the worker serves on this port.

        Raises:
            PortBindError: the port cannot be bound.
            TlsFileError: a TLS file cannot be read.
        """
        if self._server is not None:
            return self._port
        config = self._config
        address = f"{config.host}:{config.port}"
        server: grpc.aio.Server | NativeGrpcServer
        try:
            if config.server == "native":
                server = NativeGrpcServer()
                tls = _server_ssl(config)
                port = server.add_insecure_port(address) if tls is None else server.add_secure_port(address, tls)
            else:
                server = grpc.aio.server(options=_SERVER_OPTIONS)
                credentials = _server_credentials(config)
                if credentials is None:
                    port = server.add_insecure_port(address)
                else:
                    port = server.add_secure_port(address, credentials)
        except RuntimeError as exc:
            raise PortBindError(f"cannot bind {self._config.host}:{self._config.port}: {exc}") from exc
        if port == 0:
            raise PortBindError(f"cannot bind {self._config.host}:{self._config.port}")
        self._server, self._port = server, port
        return port

    async def __aenter__(self) -> SimWorker:
        return await self.start()

    async def start(self, model: SimModel | None = None) -> SimWorker:
        """Serve: load the model (unless given here or to the constructor), bind (unless `bind` did) and
        start. On a failure nothing is left listening. Stop with `aclose` (or leave the ``async with``).

        Raises:
            ModelFolderError: the model folder cannot be read.
            PortBindError, TlsFileError: as `bind`.
        """
        try:
            return await self._start(model or self._model)
        except BaseException:
            await self.aclose()
            raise

    async def _start(self, model: SimModel | None) -> SimWorker:
        if model is None:
            model = await asyncio.to_thread(load_sim_model, self._config)
        port = self.bind()
        server = self._server
        assert server is not None
        engine = SimEngine(
            self._config, model.folder, model.vocabulary, endpoint=(self._config.host, port), answers=model.answers
        )
        self._engine = engine
        servicer = SimEngineServicer(engine)
        if self._config.fault == "none":
            servicer.register(server)
        else:
            generate = fault_generate(
                self._config.fault,
                vocab_size=model.folder.vocab_size,
                after_tokens=self._config.fault_after_tokens,
                chunk_tokens=self._config.fault_chunk_tokens,
            )
            register_with_fault(servicer, server, generate)
        health_servicer = HealthService((SERVICE_NAME,))
        health_servicer.register(server)
        self._health = health_servicer
        await server.start()
        self._started = True
        logger.debug("simulated engine for %s serving on %s", model.folder.served_model_name, self.address)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop serving (or, bound but never started, stop listening). Safe to call more than once."""
        server, engine, health_servicer = self._server, self._engine, self._health
        self._server = self._health = None
        if health_servicer is not None:
            health_servicer.shut_down()
        if engine is not None:
            engine.close()
        if server is not None:
            if not self._started:
                # grpc.aio keeps a bound server's socket open until it has been started: start it to stop it.
                with contextlib.suppress(Exception):
                    await server.start()
            await server.stop(SHUTDOWN_GRACE_S if self._started else None)
        self._started = False


async def run_sim_worker(config: SimWorkerConfig) -> None:
    """Serve ``config`` until cancelled.

    Raises:
        ModelFolderError: the model folder cannot be read.
        PortBindError: the port cannot be bound.
    """
    async with SimWorker(config) as worker:
        folder = worker.engine.model
        logger.info(
            "simulated vLLM engine serving %s (%s role) on %s",
            folder.served_model_name,
            config.role,
            worker.address,
        )
        await asyncio.Event().wait()
