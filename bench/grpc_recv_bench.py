"""The cost of receiving one streamed Generate message, by client-side read path.

    .venv/bin/python -m bench.grpc_recv_bench                   # 16 streams x 200 tokens, every variant
    .venv/bin/python -m bench.grpc_recv_bench --streams 1 --tokens 200 --rounds 20

One zero-latency `smg-node sim-worker` (one token per message, as gateway_bench runs it) in its own process;
this process is the client. Per variant: ``--rounds`` rounds of ``--streams`` concurrent Generate streams of
``--tokens`` tokens each, on one channel; reported is this process's CPU (every thread: gRPC's C++ threads
included) per received message, and wall time per round. Variants:

- ``aio-for``: ``async for`` over the grpc.aio call (what node.workers.vllm_grpc did);
- ``aio-read``: ``await call.read()`` until EOF;
- ``h2-raw``: bench/h2_proto.py, a bare asyncio HTTP/2 reader (a measuring prototype: no HPACK decoding,
  no grpc-status check); each wake-up takes every message that arrived, as a coalescing gateway would;
- ``client``: node.workers.vllm_grpc.VllmGrpcClient.generate (conversion to WorkerOutput included; its own
  channel options, not ``--channel-option``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import grpc
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from bench import h2_proto, launch
from node.workers.types import SamplingParams, WorkerRequest
from node.workers.vllm_grpc import VllmGrpcClient

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_OUT_DIR = BENCH_DIR / "out" / "grpc_recv"
PROMPT_IDS = tuple(range(1000, 1200))
EOF: object = grpc.aio.EOF  # type: ignore[attr-defined]  # grpc-stubs lacks it


def _request(rid: str, tokens: int) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=rid,
        tokenized=pb.TokenizedInput(input_ids=PROMPT_IDS),
        sampling_params=pb.SamplingParams(max_tokens=tokens, ignore_eos=True, n=1, top_p=1.0),
        stream=True,
    )


Stream = Callable[[str, int], Awaitable[int]]


def variants(
    target: str, url: str, options: Sequence[tuple[str, int | str]] = ()
) -> dict[str, tuple[Stream, Callable[[], Awaitable[None]]]]:
    channel = grpc.aio.insecure_channel(target, options=list(options))
    stub = pb_grpc.VllmEngineStub(channel)
    client = VllmGrpcClient(url)

    async def aio_for(rid: str, tokens: int) -> int:
        count = 0
        async for resp in stub.Generate(_request(rid, tokens)):
            count += len(resp.chunk.token_ids) if resp.HasField("chunk") else 0
        return count

    async def aio_read(rid: str, tokens: int) -> int:
        count = 0
        call = stub.Generate(_request(rid, tokens))
        while True:
            resp = await call.read()
            if resp is EOF:
                return count
            count += len(resp.chunk.token_ids) if resp.HasField("chunk") else 0

    async def via_client(rid: str, tokens: int) -> int:
        count = 0
        request = WorkerRequest(rid, PROMPT_IDS, SamplingParams(max_tokens=tokens, ignore_eos=True), stream=True)
        async for out in client.generate(request):
            count += len(out.token_ids) if out.finish_reason is None else 0
        return count

    host, _, port = target.rpartition(":")
    raw: list[h2_proto.H2GrpcConnection] = []
    connecting = asyncio.Lock()

    async def h2_raw(rid: str, tokens: int) -> int:
        async with connecting:
            if not raw:
                raw.append(await h2_proto.connect(host, int(port)))
        conn = raw[0]
        stream = conn.open("/vllm.grpc.engine.VllmEngine/Generate", _request(rid, tokens).SerializeToString())
        count = 0
        async for batch in conn.messages_of(stream):
            for data in batch:
                resp = pb.GenerateResponse.FromString(data)
                count += len(resp.chunk.token_ids) if resp.HasField("chunk") else 0
        return count

    async def close() -> None:
        await channel.close(grace=None)
        await client.close()
        if raw:
            print(f"h2-raw: {raw[0].messages / max(raw[0].wakeups, 1):.2f} messages per reader wake-up")
            raw[0].close()

    return {
        "aio-for": (aio_for, close),
        "aio-read": (aio_read, close),
        "client": (via_client, close),
        "h2-raw": (h2_raw, close),
    }


async def run(
    target: str,
    url: str,
    streams: int,
    tokens: int,
    rounds: int,
    names: Sequence[str],
    options: Sequence[tuple[str, int | str]] = (),
) -> None:
    table = variants(target, url, options)
    close = next(iter(table.values()))[1]
    number = 0
    print(f"{streams} streams x {tokens} tokens, {rounds} rounds per variant, channel options {list(options)}")
    print("| variant | CPU µs / message (median of rounds) | wall ms / round |")
    print("|---|---|---|")
    for name in names:
        fn = table[name][0]
        for _ in range(2):  # warm-up
            number += 1
            await asyncio.gather(*(fn(f"w{number}-{k}", tokens) for k in range(streams)))
        per_msg: list[float] = []
        walls: list[float] = []
        for _ in range(rounds):
            number += 1
            cpu0, wall0 = time.process_time(), time.perf_counter()
            counts = await asyncio.gather(*(fn(f"r{number}-{k}", tokens) for k in range(streams)))
            cpu1, wall1 = time.process_time(), time.perf_counter()
            assert all(c == tokens for c in counts), counts
            per_msg.append(1e6 * (cpu1 - cpu0) / (streams * (tokens + 1)))
            walls.append(1e3 * (wall1 - wall0))
        print(f"| {name} | {statistics.median(per_msg):.1f} | {statistics.median(walls):.1f} |")
    await close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.grpc_recv_bench", description=__doc__)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--variants", default="aio-for,aio-read,client,h2-raw")
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    parser.add_argument(
        "--channel-option", action="append", default=[], help="name=value for the aio-* variants' channel"
    )
    args = parser.parse_args(argv)
    options = [
        (name, int(value) if value.lstrip("-").isdigit() else value)
        for name, _, value in (opt.partition("=") for opt in args.channel_option)
    ]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    model_dir = launch.prepare_model(args.out_dir / "models")
    port = launch.free_port()
    with launch.running("sim-worker", launch.sim_worker_command(port, model_dir), args.out_dir / "sim.log") as w:
        launch.wait_port(w, port, 60)
        import uvloop

        uvloop.run(
            run(f"127.0.0.1:{port}", f"grpc://127.0.0.1:{port}", args.streams, args.tokens, args.rounds,
                args.variants.split(","), options)
        )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
