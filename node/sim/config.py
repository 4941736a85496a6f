"""Typed configuration of the simulated GPU worker.

One frozen dataclass; every field has a default and a ``help`` string so the generic loader can turn it
into ``--field-name`` flags, ``SMG_SIM_*`` environment variables and YAML keys (not ``SMG_NODE_*``: a worker
and a node started from one environment, as in a container image, must not read each other's host or port).
Defaults look like a small real GPU but are fast; every latency at 0 gives the zero-latency engine that
benchmarks use to measure the gateway's own overhead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal, get_args

SimRole = Literal["regular", "prefill", "decode"]
SIM_ROLES: tuple[str, ...] = get_args(SimRole)
#: A Generate that misbehaves on purpose (node/sim/faults.py); "none" is the real simulated engine.
SimFault = Literal[
    "none", "hang", "hang_after", "endless", "oversized", "out_of_vocab", "huge_cached", "garbage", "wrong_message"
]
SIM_FAULTS: tuple[str, ...] = get_args(SimFault)
#: Which gRPC server carries the services: our own HTTP/2 on asyncio (node/sim/grpc_server.py, a few µs per
#: streamed message) or grpcio's grpc.aio (~55 µs per message on these machines, the reference server's).
SimServer = Literal["native", "grpcio"]
SIM_SERVERS: tuple[str, ...] = get_args(SimServer)

# vLLM's GetServerInfo.kv_role vocabulary for each role (empty when no KV transfer is configured).
KV_ROLE_BY_ROLE: dict[str, str] = {"regular": "", "prefill": "kv_producer", "decode": "kv_consumer"}

_MAX_PORT = 65535


@dataclass(frozen=True, slots=True)
class SimWorkerConfig:
    """Settings of one simulated engine serving ``vllm.grpc.engine.VllmEngine``."""

    ENV_PREFIX: ClassVar[str] = "SMG_SIM_"

    host: str = field(default="127.0.0.1", metadata={"help": "Address the gRPC server binds."})
    port: int = field(default=50051, metadata={"help": "gRPC port; 0 binds a free port."})
    model_path: str = field(
        default="",
        metadata={
            "help": "Hugging Face-style model folder (tokenizer.json, tokenizer_config.json, config.json, "
            "generation_config.json). Required."
        },
    )
    served_model_name: str = field(
        default="", metadata={"help": "Model name reported by GetModelInfo; empty uses the folder name."}
    )
    ttft_base_ms: float = field(
        default=5.0, metadata={"help": "Fixed part of the time to first token, in milliseconds."}
    )
    ttft_per_uncached_token_ms: float = field(
        default=0.02,
        metadata={"help": "Prefill cost of each prompt token not served from the prefix cache, in ms."},
    )
    tpot_ms: float = field(default=2.0, metadata={"help": "Time per output token of a lone request, in ms."})
    tpot_per_running_ms: float = field(
        default=0.02,
        metadata={"help": "Extra time per output token for each running sequence (the batch term), in ms."},
    )
    max_running_requests: int = field(
        default=256,
        metadata={"help": "Sequences decoded at once (vLLM max_num_seqs); later ones wait in FIFO order."},
    )
    block_size: int = field(default=16, metadata={"help": "Tokens per KV block of the prefix cache."})
    cache_capacity_blocks: int = field(
        default=8192, metadata={"help": "Prefix-cache capacity in blocks (LRU eviction); 0 disables it."}
    )
    eos_after_tokens: int = field(
        default=64,
        metadata={
            "help": "Mean answer length: each answer emits EOS after a deterministic length drawn from "
            "[mean/2, 3*mean/2] text tokens, unless ignore_eos."
        },
    )
    tokens_per_chunk: int = field(
        default=1, metadata={"help": "Token ids sent per streamed chunk (the last chunk may be shorter)."}
    )
    role: SimRole = field(
        default="regular",
        metadata={"help": "Disaggregation role: regular, prefill (kv_producer) or decode (kv_consumer)."},
    )
    seed: int = field(
        default=0, metadata={"help": "Engine seed mixed into every answer; two engines differ when it does."}
    )
    kv_events: bool = field(
        default=True,
        metadata={
            "help": "Publish prefix-cache stores and evictions on SubscribeKvEvents; off, the RPC answers "
            "UNIMPLEMENTED, as an engine without a KV-event publisher does."
        },
    )
    fault: SimFault = field(
        default="none",
        metadata={
            "help": "Make every Generate misbehave, for fault tests and chaos demos (other RPCs stay healthy): "
            + ", ".join(SIM_FAULTS)
        },
    )
    fault_after_tokens: int = field(default=3, metadata={"help": "hang_after: tokens streamed before the hang."})
    fault_chunk_tokens: int = field(
        default=3_000_000, metadata={"help": "oversized: token ids in the one chunk (~3 bytes each on the wire)."}
    )

    server: SimServer = field(
        default="native",
        metadata={
            "help": "gRPC server implementation: native (HTTP/2 on asyncio, cheap per streamed token, so the "
            "simulated engine does not cap a benchmark) or grpcio (grpc.aio, as vLLM's own server)."
        },
    )

    tls_cert_file: str = field(
        default="",
        metadata={"help": "PEM certificate (chain): serve gRPC over TLS (grpcs://) with it. Empty: plaintext."},
    )
    tls_key_file: str = field(default="", metadata={"help": "Unencrypted PEM private key of tls_cert_file."})
    tls_client_ca_file: str = field(
        default="",
        metadata={"help": "PEM CA certificate(s): with TLS, require client certificates signed by it (mutual TLS)."},
    )

    def __post_init__(self) -> None:
        _require(
            bool(self.tls_cert_file) == bool(self.tls_key_file),
            "tls_cert_file",
            "and tls_key_file: set both or neither",
        )
        _require(not self.tls_client_ca_file or bool(self.tls_cert_file), "tls_client_ca_file", "needs tls_cert_file")
        _require(0 <= self.port <= _MAX_PORT, "port", f"must be in [0, {_MAX_PORT}], got {self.port}")
        for name in ("ttft_base_ms", "ttft_per_uncached_token_ms", "tpot_ms", "tpot_per_running_ms"):
            value = getattr(self, name)
            _require(value >= 0, name, f"must be >= 0, got {value}")
        _require(self.max_running_requests >= 1, "max_running_requests", "must be >= 1")
        _require(self.block_size >= 1, "block_size", "must be >= 1")
        _require(self.cache_capacity_blocks >= 0, "cache_capacity_blocks", "must be >= 0")
        _require(self.eos_after_tokens >= 0, "eos_after_tokens", "must be >= 0")
        _require(self.tokens_per_chunk >= 1, "tokens_per_chunk", "must be >= 1")
        _require(self.role in SIM_ROLES, "role", f"must be one of {', '.join(SIM_ROLES)}, got {self.role!r}")
        _require(self.server in SIM_SERVERS, "server", f"must be one of {', '.join(SIM_SERVERS)}, got {self.server!r}")
        _require(self.fault in SIM_FAULTS, "fault", f"must be one of {', '.join(SIM_FAULTS)}, got {self.fault!r}")
        _require(self.fault_after_tokens >= 0, "fault_after_tokens", "must be >= 0")
        _require(self.fault_chunk_tokens >= 1, "fault_chunk_tokens", "must be >= 1")

    @property
    def kv_role(self) -> str:
        """The role in vLLM's ``kv_role`` vocabulary, as GetServerInfo reports it."""
        return KV_ROLE_BY_ROLE[self.role]


def _require(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{name}: {message}")
