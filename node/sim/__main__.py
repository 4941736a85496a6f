"""``python -m node.sim --model-path DIR [--port 0] ...``: run one simulated engine until SIGINT/SIGTERM.

A stop-gap front end (the smg-node CLI supersedes it): one flag per ``SimWorkerConfig`` field.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import signal
import sys
from collections.abc import Sequence

from node.sim.config import SIM_FAULTS, SIM_ROLES, SimWorkerConfig
from node.sim.errors import SimError
from node.sim.worker import run_sim_worker


def parse_config(argv: Sequence[str] | None = None) -> SimWorkerConfig:
    parser = argparse.ArgumentParser(prog="python -m node.sim", description=__doc__)
    for item in dataclasses.fields(SimWorkerConfig):
        flag = "--" + item.name.replace("_", "-")
        help_text = str(item.metadata.get("help", ""))
        default = item.default
        if item.name == "role":
            parser.add_argument(flag, choices=SIM_ROLES, default=default, help=help_text)
        elif item.name == "fault":
            parser.add_argument(flag, choices=SIM_FAULTS, default=default, help=help_text)
        else:
            parser.add_argument(flag, type=type(default), default=default, help=help_text)
    namespace = parser.parse_args(argv)
    try:
        return SimWorkerConfig(**vars(namespace))
    except ValueError as exc:
        parser.error(str(exc))


async def _serve(config: SimWorkerConfig) -> None:
    task = asyncio.create_task(run_sim_worker(config))
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await task


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_config(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(_serve(config))
    except SimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
