"""The gateway node's component configs. Every default is defined here, once, on the field.

Each dataclass is one component's typed config; `node.configload` turns fields into CLI flags, SMG_NODE_* env
vars and YAML keys. Validation happens in ``__post_init__`` and names the offending key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from node.cluster import ClusterConfig
from node.http.tenancy import ApiConfig
from node.pipeline.token_cache import TokenizerCacheConfig
from node.routing.config import RoutingConfig
from node.workers.deadlines import DeadlineConfig
from node.workers.retry import RetryConfig
from storage.config import StorageConfig

LogFormat = Literal["text", "json"]
#: How Generate streams are read: "h2" = our own HTTP/2 reader (node/workers/h2_generate.py), "grpc" = grpc.aio.
GenerateTransport = Literal["h2", "grpc"]
DEFAULT_GENERATE_TRANSPORT: GenerateTransport = "h2"


def _positive(name: str, value: float) -> None:
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")


@dataclass(frozen=True, slots=True)
class HttpConfig:
    host: str = field(default="127.0.0.1", metadata={"help": "address the HTTP API binds"})
    port: int = field(default=8000, metadata={"help": "HTTP API port (0 picks a free port)"})
    max_body_bytes: int = field(
        default=16 * 1024 * 1024, metadata={"help": "largest accepted request body; larger is a 413"}
    )
    drain_timeout_s: float = field(
        default=30.0,
        metadata={
            "help": "after SIGTERM (readiness 503, mesh left, listener closed), how long in-flight requests and "
            "streams may run before they are cut"
        },
    )
    processes: int = field(
        default=0,
        metadata={"help": "node processes sharing the HTTP port (SO_REUSEPORT); 0 = one per CPU core"},
    )
    reuse_port: bool = field(
        default=False, metadata={"help": "bind the HTTP port with SO_REUSEPORT (set for each of --processes)"}
    )

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        _positive("max_body_bytes", self.max_body_bytes)
        if not 0 <= self.drain_timeout_s < float("inf"):
            raise ValueError(f"drain_timeout_s must be >= 0 and finite, got {self.drain_timeout_s}")
        if self.processes < 0:
            raise ValueError(f"processes must be >= 0, got {self.processes}")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    model_path: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "Hugging Face-style model folder (tokenizer.json, tokenizer_config.json, ...); repeat it to "
            "serve several models, each by the workers whose GetModelInfo (or registered model) names it",
            "metavar": "DIR",
        },
    )
    served_model_name: str = field(
        default="",
        metadata={
            "help": "model name clients send (of the first --model-path); default: what the workers' "
            "GetModelInfo reports, or the folder name when several models are served"
        },
    )
    chat_template: str = field(
        default="", metadata={"help": "file with a Jinja chat template overriding tokenizer_config.json's"}
    )

    def __post_init__(self) -> None:
        given: object = self.model_path
        if isinstance(given, str):  # one folder given as a plain string (code, YAML scalar)
            object.__setattr__(self, "model_path", (given,) if given else ())
        if not self.model_path:
            raise ValueError("model_path is required (--model-path DIR)")
        if len(set(self.model_path)) != len(self.model_path):
            raise ValueError("model_path: a folder is given twice")


@dataclass(frozen=True, slots=True)
class WorkerPoolConfig:
    workers: tuple[str, ...] = field(
        default=(),
        metadata={"help": "gRPC worker URL, grpc://host:port", "flag": "--worker", "metavar": "URL"},
    )
    prefill_workers: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "prefill worker of a disaggregated pool (kv_producer), grpc://host:port",
            "flag": "--prefill-worker",
            "metavar": "URL",
        },
    )
    decode_workers: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "decode worker of a disaggregated pool (kv_consumer), grpc://host:port",
            "flag": "--decode-worker",
            "metavar": "URL",
        },
    )
    health_interval_s: float = field(default=2.0, metadata={"help": "seconds between worker health checks"})
    health_timeout_s: float = field(default=2.0, metadata={"help": "a health check slower than this fails"})
    health_failures_to_unhealthy: int = field(
        default=2, metadata={"help": "consecutive failed checks before a worker leaves rotation"}
    )
    health_publish_interval_s: float = field(
        default=5.0,
        metadata={"help": "load observations are shared with the cluster at most this often (verdict flips at once)"},
    )
    startup_wait_s: float = field(
        default=10.0, metadata={"help": "how long serve waits for a first worker's GetModelInfo at start"}
    )
    abort_timeout_s: float = field(default=2.0, metadata={"help": "deadline of an Abort RPC to a worker"})
    generate_transport: GenerateTransport = field(
        default=DEFAULT_GENERATE_TRANSPORT,
        metadata={
            "help": "how Generate streams are read: h2 (our HTTP/2 reader, less CPU per token) or grpc (grpc.aio); "
            "every other RPC uses grpc.aio"
        },
    )

    def __post_init__(self) -> None:
        for url in (*self.workers, *self.prefill_workers, *self.decode_workers):
            parse_worker_url(url)
        _positive("health_interval_s", self.health_interval_s)
        _positive("health_timeout_s", self.health_timeout_s)
        _positive("health_publish_interval_s", self.health_publish_interval_s)
        _positive("health_failures_to_unhealthy", self.health_failures_to_unhealthy)


@dataclass(frozen=True, slots=True)
class LogConfig:
    log_level: Literal["debug", "info", "warning", "error"] = field(default="info", metadata={"help": "log level"})
    log_format: LogFormat = field(default="text", metadata={"help": "log line format"})


def parse_worker_url(url: str) -> str:
    """Return the gRPC target ``host:port`` of ``grpc://host:port``; raises ValueError naming the URL."""
    parts = urlsplit(url)
    if parts.scheme != "grpc" or not parts.hostname or parts.port is None:
        raise ValueError(f"worker URL {url!r} must look like grpc://host:port")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{parts.port}"


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """Everything `smg-node serve` needs, one typed config per component."""

    http: HttpConfig
    model: ModelConfig
    workers: WorkerPoolConfig
    log: LogConfig
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    tokenizer_cache: TokenizerCacheConfig = field(default_factory=TokenizerCacheConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    api: ApiConfig = field(default_factory=ApiConfig)
    deadlines: DeadlineConfig = field(default_factory=DeadlineConfig)
    retry: RetryConfig = field(default_factory=RetryConfig)


NODE_COMPONENTS: tuple[type, ...] = (
    HttpConfig,
    ModelConfig,
    WorkerPoolConfig,
    RoutingConfig,
    TokenizerCacheConfig,
    ClusterConfig,
    StorageConfig,
    ApiConfig,
    DeadlineConfig,
    RetryConfig,
    LogConfig,
)
