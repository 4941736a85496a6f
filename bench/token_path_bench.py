"""CPU per streamed token of the node's own Python path, without I/O: the part py-spy cannot separate cleanly.

    .venv/bin/python -m bench.token_path_bench

Per token: parse one GenerateResponse (one id, as the sim worker and vLLM stream), convert it to a
WorkerOutput (node.workers.vllm_grpc._output), the pipeline's Output stage (OutputProcessor.feed:
terminators, detokenization, events),
and build the SSE chunk (ChunkFrames.chat_content). Llama-3 tokenizer, 200-token answers of English text;
median of 7 rounds of 50 answers. The gRPC receive and the socket write are not included (see
bench/grpc_recv_bench.py and bench/stream_profile.py).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from smg_grpc_proto.generated import vllm_engine_pb2 as pb

from bench import launch
from node.http.sse import ChunkFrames
from node.pipeline.events import ContentDelta
from node.pipeline.output import OutputProcessor
from node.pipeline.spec import GenerateSpec
from node.pipeline.tokenizer import Tokenizer
from node.workers.types import SamplingParams
from node.workers.vllm_grpc import _output

BENCH_DIR = Path(__file__).resolve().parent
TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away into the forest. " * 20
ANSWER_TOKENS = 200


def main() -> int:
    model_dir = launch.prepare_model(BENCH_DIR / "out" / "models")
    tokenizer = Tokenizer.from_file(model_dir)
    ids = tokenizer.encode(TEXT, add_special_tokens=False)[:ANSWER_TOKENS]
    messages = [
        pb.GenerateResponse(
            chunk=pb.GenerateStreamChunk(token_ids=[t], prompt_tokens=200, completion_tokens=k + 1)
        ).SerializeToString()
        for k, t in enumerate(ids)
    ]
    messages.append(
        pb.GenerateResponse(
            complete=pb.GenerateComplete(
                output_ids=[ids[-1]], finish_reason="length", prompt_tokens=200, completion_tokens=len(ids)
            )
        ).SerializeToString()
    )
    frames = ChunkFrames(
        response_id="chatcmpl-x", obj="chat.completion.chunk", created=1, model="llama3", include_usage=True
    )
    spec = GenerateSpec(
        request_id="r",
        prompt_ids=list(range(100, 300)),
        params=SamplingParams(max_tokens=len(ids), ignore_eos=True),
        terminators=frozenset({128001, 128009}),
    )

    def answer() -> None:
        output = OutputProcessor(spec, tokenizer)
        for data in messages:
            for event in output.feed((_output(pb.GenerateResponse.FromString(data)),)):
                if type(event) is ContentDelta:
                    frames.chat_content(event.index, event.text)

    for _ in range(20):
        answer()
    rounds = []
    for _ in range(7):
        start = time.process_time()
        for _ in range(50):
            answer()
        rounds.append(1e6 * (time.process_time() - start) / (50 * len(messages)))
    print(f"{statistics.median(rounds):.2f} µs per token (parse + WorkerOutput + Output stage + SSE chunk)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
