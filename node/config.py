"""The gateway node's component configs. Every default is defined once, on its field.

Each dataclass is one component's typed config; `node.configload` turns fields into CLI flags, SMG_NODE_* env
vars and YAML keys. Validation happens in ``__post_init__`` and names the offending key.

Layering: this module sits below the components, which import it; it never imports node.http or
node.pipeline. The configs defined elsewhere live in config leaves beside their component
(node/cluster/config.py, over mesh's public API only; node/routing/config.py; storage/config.py) or, for now,
in node/workers/deadlines.py and retry.py (retry.py imports the worker client's error types).
``NodeConfig``'s fields are the one list of components.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, Literal
from urllib.parse import urlsplit

from node.auth.config import AuthConfig
from node.cluster.config import ClusterConfig
from node.discovery.config import DiscoveryConfig
from node.routing.config import RoutingConfig
from node.workers.deadlines import DeadlineConfig
from node.workers.retry import RetryConfig
from node.workers.worker_url import NetworkPolicy, parse_networks, parse_target
from storage.config import StorageConfig

LogFormat = Literal["text", "json"]
#: How Generate streams are read: "h2" = our own HTTP/2 reader (node/workers/h2_generate.py), "grpc" = grpc.aio.
GenerateTransport = Literal["h2", "grpc"]
DEFAULT_GENERATE_TRANSPORT: GenerateTransport = "h2"
#: The header a trusted proxy names the tenant in (ApiConfig.trust_tenant_header).
TENANT_HEADER: Final = "X-SMG-Tenant"
_MIB: Final = 1024 * 1024


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
    # Connection bounds (node/http/connections.py). Idle 75 s outlasts the 60 s keep-alive of common proxies and
    # load balancers in front of us (they, not we, should close a pooled connection); a request head takes
    # milliseconds, so 20 s only ever cuts slow or stalled senders.
    max_connections: int = field(
        default=0,
        metadata={
            "help": "open client connections at most; 0 = derived from the open-file limit (RLIMIT_NOFILE minus "
            "512 fds for workers, mesh and storage; at most 16384). Past it a new connection replaces the one "
            "that waited longest without a request, or gets a 503 when all are busy"
        },
    )
    idle_timeout_s: float = field(
        default=75.0, metadata={"help": "a kept-alive connection with no new request for this long is closed"}
    )
    header_timeout_s: float = field(
        default=20.0,
        metadata={
            "help": "a request's headers must arrive within this long of the connection (or of the request's "
            "first byte on a kept-alive connection), else the connection is closed"
        },
    )
    body_timeout_s: float = field(
        default=60.0, metadata={"help": "a request body must arrive within this long of its headers"}
    )
    write_timeout_s: float = field(
        default=30.0,
        metadata={
            "help": "a client that takes none of its response for this long while 64 KiB wait for it is "
            "disconnected (its generation is aborted)"
        },
    )
    # Per-address connection rate (node/http/connection_rate.py). Clients and load balancers reuse connections,
    # so 200/s sustained (a burst of 1,000) is far above them; an L7 proxy that opens one upstream connection
    # per request goes in connection_rate_exempt (loopback is there: sidecars and local probes connect from it,
    # and no remote client can send from it).
    connection_rate_per_s: float = field(
        default=200.0,
        metadata={
            "help": "new connections per second one client address (IPv6: one /64) may open, sustained; past "
            "it (and the burst) a connection is answered 429 and closed (0 = no limit)"
        },
    )
    connection_rate_burst: int = field(
        default=1000, metadata={"help": "connections one client address may open at once above the rate"}
    )
    connection_rate_exempt: tuple[str, ...] = field(
        default=("127.0.0.0/8", "::1/128"),
        metadata={
            "help": "CIDRs whose connections are never rate limited, e.g. a proxy in front that opens a "
            "connection per request (default: loopback)",
            "metavar": "CIDR",
        },
    )

    tls_cert_file: str = field(
        default="",
        metadata={"help": "PEM certificate (chain) to serve HTTPS with (and --tls-key-file); re-read on SIGHUP"},
    )
    tls_key_file: str = field(default="", metadata={"help": "unencrypted PEM private key of --tls-cert-file"})
    tls_client_ca_file: str = field(
        default="", metadata={"help": "PEM CA: clients must present a certificate it signed (mutual TLS)"}
    )

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        _positive("max_body_bytes", self.max_body_bytes)
        if not 0 <= self.drain_timeout_s < float("inf"):
            raise ValueError(f"drain_timeout_s must be >= 0 and finite, got {self.drain_timeout_s}")
        if self.max_connections < 0:
            raise ValueError(f"max_connections must be >= 0, got {self.max_connections}")
        for name in ("idle_timeout_s", "header_timeout_s", "body_timeout_s", "write_timeout_s"):
            _positive(name, getattr(self, name))
        if not 0 <= self.connection_rate_per_s < float("inf"):
            raise ValueError(f"connection_rate_per_s must be >= 0 and finite, got {self.connection_rate_per_s}")
        _positive("connection_rate_burst", self.connection_rate_burst)
        parse_networks(self.connection_rate_exempt, "connection_rate_exempt")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("tls_cert_file and tls_key_file go together")
        if self.tls_client_ca_file and not self.tls_cert_file:
            raise ValueError("tls_client_ca_file needs tls_cert_file and tls_key_file (HTTPS)")
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
    tool_call_parser: str = field(
        default="auto",
        metadata={
            "help": "tool-call parser of every model, by vLLM's name (hermes, llama3_json, deepseek_v3, ...); "
            "auto: detected from the model folder; none: tool calls stay text"
        },
    )
    reasoning_parser: str = field(
        default="auto",
        metadata={
            "help": "reasoning parser of every model, by vLLM's name (qwen3, deepseek_r1, ...); auto: detected "
            "from the model folder; none: reasoning stays text"
        },
    )
    model_tool_call_parser: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "MODEL=NAME: the tool-call parser of one model (its served name, folder name or path), "
            "overriding --tool-call-parser; repeat per model",
            "metavar": "MODEL=NAME",
        },
    )
    model_reasoning_parser: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "MODEL=NAME: the reasoning parser of one model, overriding --reasoning-parser; repeat per model",
            "metavar": "MODEL=NAME",
        },
    )

    def parsers_for(self, names: frozenset[str]) -> tuple[str, str]:
        """The (tool-call, reasoning) parser names of the model known by ``names`` (served name, folder
        name, path): its MODEL=NAME override, else the fleet-wide setting."""
        tool = next((v for k, v in _pairs(self.model_tool_call_parser) if k in names), self.tool_call_parser)
        reasoning = next((v for k, v in _pairs(self.model_reasoning_parser) if k in names), self.reasoning_parser)
        return tool, reasoning

    def __post_init__(self) -> None:
        given: object = self.model_path
        if isinstance(given, str):  # one folder given as a plain string (code, YAML scalar)
            object.__setattr__(self, "model_path", (given,) if given else ())
        if not self.model_path:
            raise ValueError("model_path is required (--model-path DIR)")
        if len(set(self.model_path)) != len(self.model_path):
            raise ValueError("model_path: a folder is given twice")
        for key in ("model_tool_call_parser", "model_reasoning_parser"):
            given = getattr(self, key)
            if isinstance(given, str):
                object.__setattr__(self, key, (given,) if given else ())
            models = [m for m, _ in _pairs(getattr(self, key), key=key)]
            if len(set(models)) != len(models):
                raise ValueError(f"{key}: a model is given twice")


def _pairs(values: tuple[str, ...], *, key: str = "") -> list[tuple[str, str]]:
    """MODEL=NAME values as pairs. Raises ValueError (naming ``key``) for a value without both sides."""
    out = []
    for value in values:
        model, sep, name = value.rpartition("=")
        if not sep or not model or not name:
            raise ValueError(f"{key}: expected MODEL=NAME, got {value!r}")
        out.append((model, name))
    return out


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
    health_idle_every: int = field(
        default=8,
        metadata={
            "help": "a worker in rotation that got no request from this node since its last check, whose engine "
            "reports nothing running or waiting, is checked only every this many intervals (1: always every "
            "interval); traffic, a failed check or a busy engine bring back every interval"
        },
    )
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

    worker_ping_after_s: float = field(
        default=5.0,
        metadata={
            "help": "a Generate connection (h2) silent this long while calls are open sends a PING (then after 2x "
            "and 4x as long; none more until data arrives, as gRPC servers' ping limits require)"
        },
    )
    worker_ping_timeout_s: float = field(
        default=5.0,
        metadata={"help": "a PING unanswered this long: the connection is dead and its calls fail (both transports)"},
    )
    worker_keepalive_s: float = field(
        default=10.0,
        metadata={"help": "grpc.aio's keepalive_time: it PINGs this often (workers refuse more often than they allow)"},
    )
    worker_idle_timeout_s: float = field(
        default=300.0, metadata={"help": "a worker connection without calls this long is closed (reopened on use)"}
    )
    worker_tls_ca_file: str = field(
        default="",
        metadata={"help": "PEM CA certificate(s) grpcs:// workers' certificates must chain to (default: system)"},
    )
    worker_tls_cert_file: str = field(
        default="", metadata={"help": "PEM client certificate presented to grpcs:// workers (mutual TLS)"}
    )
    worker_tls_key_file: str = field(default="", metadata={"help": "unencrypted PEM key of worker_tls_cert_file"})
    worker_tls_server_name: str = field(
        default="", metadata={"help": "name grpcs:// workers' certificates must carry (default: the URL's host)"}
    )
    max_workers: int = field(
        default=256,
        metadata={
            "help": "most workers the cluster registry may hold (each costs every node two connections, a health "
            "check per interval and a KV-event stream)"
        },
    )
    worker_allowed_networks: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "CIDRs worker IP addresses, and every address a worker's name resolves to, must lie in "
            "(default: anywhere but link-local/metadata ranges, which only a network listed here inside them opens)",
            "metavar": "CIDR",
        },
    )

    @property
    def network_policy(self) -> NetworkPolicy:
        return NetworkPolicy(allowed=parse_networks(self.worker_allowed_networks, "worker_allowed_networks"))

    def __post_init__(self) -> None:
        policy = self.network_policy
        urls = (*self.workers, *self.prefill_workers, *self.decode_workers)
        for url in urls:
            policy.check(url, parse_target(url))
        _positive("max_workers", self.max_workers)
        for name in ("worker_ping_after_s", "worker_ping_timeout_s", "worker_keepalive_s", "worker_idle_timeout_s"):
            _positive(name, getattr(self, name))
        if bool(self.worker_tls_cert_file) != bool(self.worker_tls_key_file):
            raise ValueError("worker_tls_cert_file, worker_tls_key_file: set both (mutual TLS) or neither")
        if len(set(urls)) > self.max_workers:
            raise ValueError(f"workers: {len(set(urls))} given, more than max_workers ({self.max_workers})")
        _positive("health_interval_s", self.health_interval_s)
        _positive("health_timeout_s", self.health_timeout_s)
        _positive("health_publish_interval_s", self.health_publish_interval_s)
        _positive("health_failures_to_unhealthy", self.health_failures_to_unhealthy)
        _positive("health_idle_every", self.health_idle_every)


@dataclass(frozen=True, slots=True)
class TokenizerCacheConfig:
    """Tokenizer cache settings; one instance may serve every model's tokenizer."""

    l0_enabled: bool = field(default=True, metadata={"help": "Cache whole prompts: identical text returns cached ids."})
    l0_max_bytes: int = field(
        default=64 * _MIB, metadata={"help": "Memory bound of the exact-match cache (text + ids), bytes."}
    )
    l1_enabled: bool = field(
        default=True,
        metadata={
            "help": "Cache prompt prefixes ending at special tokens (chat turns), so a shared "
            "system prompt or earlier turns are not tokenized again."
        },
    )
    l1_max_bytes: int = field(default=128 * _MIB, metadata={"help": "Memory bound of the prefix cache (ids), bytes."})
    # Chat templates put several added tokens in every turn; hashing and storing a prefix at each costs
    # more than it saves. A hit re-encodes at most this much already-seen text (512: ~120 tokens, ~0.1 ms).
    l1_spacing_chars: int = field(
        default=512,
        metadata={
            "help": "Prefix-cache entries are kept at most every this many characters (plus one at the "
            "last special token of each prompt); 1 keeps one after every special token."
        },
    )

    # Below ~2,048 characters (~500 tokens, ~0.2 ms with tiktoken) hashing and lookups cost about as much
    # as encoding the whole prompt again.
    l1_min_prompt_chars: int = field(
        default=2048,
        metadata={"help": "Prompts shorter than this many characters bypass the prefix cache."},
    )

    def __post_init__(self) -> None:
        if self.l1_min_prompt_chars < 0:
            raise ValueError(f"l1_min_prompt_chars must be >= 0, got {self.l1_min_prompt_chars}")
        if self.l1_spacing_chars < 1:
            raise ValueError(f"l1_spacing_chars must be >= 1, got {self.l1_spacing_chars}")
        for name in ("l0_max_bytes", "l1_max_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class ApiConfig:
    trust_tenant_header: bool = field(
        default=False,
        metadata={
            "help": f"take the Responses/Conversations tenant from the {TENANT_HEADER} header; set only when a "
            "trusted proxy in front of the node sets it (otherwise every request is tenant 'default')"
        },
    )


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """Per-request bounds. Defaults admit what OpenAI documents and what vLLM clients commonly send."""

    max_n: int = field(default=128, metadata={"help": "largest 'n' (choices per request); OpenAI's documented maximum"})
    max_output_tokens_total: int = field(
        default=1 << 20,
        metadata={
            "help": "largest n x max_tokens (x prompts, for /v1/completions) one request may ask for; an omitted "
            "max_tokens defaults to at most this / choices. 1M tokens: any n at a 4k budget, n=8 at 128k"
        },
    )
    max_logprob_tokens_total: int = field(
        default=1 << 17,
        metadata={
            "help": "the same bound when logprobs are requested (each token then carries up to 21 entries "
            "held until the answer is sent); 128k: one full 128k-context answer"
        },
    )
    max_top_logprobs: int = field(
        default=20, metadata={"help": "largest top_logprobs (chat) / logprobs (completions); OpenAI's maximum"}
    )
    max_stop_strings: int = field(
        default=64,
        metadata={"help": "most stop strings per request (OpenAI allows 4, vLLM any number; matched per token)"},
    )
    max_stop_chars: int = field(
        default=1024,
        metadata={"help": "longest stop string in characters (its text is held back and searched every token)"},
    )
    max_stop_chars_total: int = field(default=8192, metadata={"help": "total characters of a request's stop strings"})
    max_messages: int = field(
        default=4096,
        metadata={
            "help": "most chat messages / Responses input items per request (OpenAI: 2048 messages); each is "
            "one pass of the chat template"
        },
    )
    max_content_parts: int = field(
        default=512,
        metadata={"help": "most content parts in one message (OpenAI accepts up to 500 images per request)"},
    )
    max_tools: int = field(default=128, metadata={"help": "most tools per request; OpenAI's documented maximum"})
    max_tools_bytes: int = field(
        default=1 << 20,
        metadata={"help": "total JSON size of a request's tools; all of it is rendered into the prompt"},
    )
    max_prompts: int = field(default=64, metadata={"help": "most prompts in one /v1/completions batch"})
    max_json_depth: int = field(
        default=64,
        metadata={
            "help": "deepest nesting of free-form JSON (tool schemas, chat_template_kwargs, items); deeper "
            "values overflow recursive consumers (templates, storage encoders)"
        },
    )
    max_request_line_bytes: int = field(
        default=8190, metadata={"help": "longest HTTP request line (method, path, version); aiohttp's default"}
    )
    max_header_bytes: int = field(default=8190, metadata={"help": "longest HTTP header (name and value)"})
    max_headers: int = field(default=128, metadata={"help": "most HTTP headers per request"})

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value < 1:
                raise ValueError(f"{f.name} must be >= 1, got {value}")

    def output_cap(self, choices: int, *, logprobs: bool) -> int:
        """The largest max_tokens each of ``choices`` choices may have (an omitted one defaults to at most this)."""
        total = self.max_logprob_tokens_total if logprobs else self.max_output_tokens_total
        return max(1, total // max(1, choices))


#: Tenants named in the metrics' tenant label; later new ones count as OTHER_TENANT (node/metrics.py).
DEFAULT_METRICS_MAX_TENANTS: Final = 100
MAX_METRICS_TENANTS: Final = 10_000


@dataclass(frozen=True, slots=True)
class TelemetryConfig:
    """Traces, the access log, and how sibling processes (``--processes``) share one /metrics."""

    trace_sample_ratio: float = field(
        default=0.0,
        metadata={
            "help": "fraction of requests traced (0 = tracing off; a client's sampled traceparent is "
            "followed whenever tracing is on)"
        },
    )
    otlp_traces_endpoint: str = field(
        default="",
        metadata={"help": "OTLP/HTTP endpoint spans are exported to, e.g. http://collector:4318/v1/traces"},
    )
    trace_service_name: str = field(default="smg-node", metadata={"help": "service.name of exported spans"})
    access_log: bool = field(
        default=True, metadata={"help": "log one line per HTTP request (logger node.access, level info)"}
    )
    metrics_max_tenants: int = field(
        default=DEFAULT_METRICS_MAX_TENANTS,
        metadata={
            "help": "tenants named in the tenant label of smg_node_tenant_requests / _tokens: the first this many "
            "distinct tenants a process sees keep their name, later ones count as ':other' (a name no tenant can "
            f"have); bounds the series a client can make. 0: no tenant metrics. At most {MAX_METRICS_TENANTS}"
        },
    )
    metrics_dir: str = field(
        default="",
        metadata={
            "help": "directory the sibling processes of --processes share their metrics in (set by the "
            "supervisor, which also sets PROMETHEUS_MULTIPROC_DIR)",
            "cli": False,
        },
    )

    def __post_init__(self) -> None:
        if not 0 <= self.metrics_max_tenants <= MAX_METRICS_TENANTS:
            raise ValueError(f"metrics_max_tenants must be in 0..{MAX_METRICS_TENANTS}, got {self.metrics_max_tenants}")
        if not 0.0 <= self.trace_sample_ratio <= 1.0:
            raise ValueError(f"trace_sample_ratio must be in [0, 1], got {self.trace_sample_ratio}")
        if self.otlp_traces_endpoint and urlsplit(self.otlp_traces_endpoint).scheme not in ("http", "https"):
            raise ValueError(f"otlp_traces_endpoint must be an http(s) URL, got {self.otlp_traces_endpoint!r}")

    @property
    def tracing(self) -> bool:
        return self.trace_sample_ratio > 0.0


@dataclass(frozen=True, slots=True)
class LogConfig:
    log_level: Literal["debug", "info", "warning", "error"] = field(default="info", metadata={"help": "log level"})
    log_format: LogFormat = field(default="text", metadata={"help": "log line format"})


def parse_worker_url(url: str) -> str:
    """Return the gRPC target ``host:port`` of ``grpc[s]://host:port``; raises ValueError naming the URL."""
    return parse_target(url).authority


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """Everything `smg-node serve` needs, one typed config per component.

    The list of components is written here once: each field is a component, its name the component's YAML
    section (``http: {port: 8000}``) and its type the component's config class (NODE_SECTIONS). Fields are
    in the order ``serve --help`` shows their flag groups, each under its ``title``: what the options are for, in
    an operator's words (never the class name).
    """

    http: HttpConfig = field(metadata={"title": "Listening, connections and TLS"})
    model: ModelConfig = field(metadata={"title": "Models and output parsers"})
    workers: WorkerPoolConfig = field(metadata={"title": "Workers: connections and health"})
    routing: RoutingConfig = field(
        default_factory=RoutingConfig, metadata={"title": "Routing: which worker serves a request"}
    )
    tokenizer_cache: TokenizerCacheConfig = field(
        default_factory=TokenizerCacheConfig, metadata={"title": "Tokenizer caches"}
    )
    cluster: ClusterConfig = field(default_factory=ClusterConfig, metadata={"title": "Mesh: the cluster of nodes"})
    storage: StorageConfig = field(
        default_factory=StorageConfig, metadata={"title": "History storage (Responses API, conversations)"}
    )
    api: ApiConfig = field(default_factory=ApiConfig, metadata={"title": "Tenants"})
    auth: AuthConfig = field(default_factory=AuthConfig, metadata={"title": "Authentication: API keys and JWT"})
    deadlines: DeadlineConfig = field(default_factory=DeadlineConfig, metadata={"title": "Deadlines"})
    retry: RetryConfig = field(default_factory=RetryConfig, metadata={"title": "Retries"})
    limits: RequestLimits = field(default_factory=RequestLimits, metadata={"title": "Limits on requests"})
    discovery: DiscoveryConfig = field(
        default_factory=DiscoveryConfig, metadata={"title": "Worker discovery (DNS, Kubernetes)"}
    )
    telemetry: TelemetryConfig = field(
        default_factory=TelemetryConfig, metadata={"title": "Observability: traces and access log"}
    )
    log: LogConfig = field(default_factory=LogConfig, metadata={"title": "Logging"})

    def __post_init__(self) -> None:
        """Raises AuthConfigError (a ValueError) for an open node on a non-loopback address (see AuthConfig)."""
        self.auth.enforced(self.http.host)
        admin = self.auth.admin_addr
        if admin is not None:
            self.auth.enforced(admin[0])
        if self.auth.client_cert_identity and not (self.http.tls_client_ca_file or self.auth.admin_tls_client_ca_file):
            raise ValueError(
                "client_cert_identity needs mutual TLS: --tls-client-ca-file or --admin-tls-client-ca-file"
            )
        if self.auth.keys_file and self.storage.backend != "memory":
            raise ValueError(
                f"keys_file: the API keys are kept in the {self.storage.backend} history backend; "
                "--keys-file is for the memory backend"
            )


def _sections(config: type[object]) -> Mapping[str, type[object]]:
    hints = typing.get_type_hints(config)
    return MappingProxyType({f.name: hints[f.name] for f in dataclasses.fields(config)})  # type: ignore[arg-type]


#: YAML section name -> component config class, derived from NodeConfig's fields.
NODE_SECTIONS: Final[Mapping[str, type[object]]] = _sections(NodeConfig)
#: YAML section name -> the title of its group of flags in ``serve --help``.
NODE_SECTION_TITLES: Final[Mapping[str, str]] = MappingProxyType(
    {f.name: str(f.metadata["title"]) for f in dataclasses.fields(NodeConfig)}
)
