"""The simulated GPU engine: serves the real ``vllm.grpc.engine.VllmEngine`` gRPC service without a GPU.

For load tests and CI: deterministic, readable answers from a real tokenizer's vocabulary, a latency model
(time to first token, time per output token with a batch term, FIFO admission), a real prefix cache over
token blocks whose stores and evictions stream on SubscribeKvEvents, and Abort.
"""

from node.sim.config import SimWorkerConfig
from node.sim.worker import SimModel, SimWorker, load_sim_model, run_sim_worker

__all__ = ["SimModel", "SimWorker", "SimWorkerConfig", "load_sim_model", "run_sim_worker"]
