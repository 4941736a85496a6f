"""A serving process's collector: start-up's objects frozen out of full collections, young collections rarer."""

from __future__ import annotations

import subprocess
import sys


def test_tuning_freezes_what_start_up_left_and_raises_the_young_threshold() -> None:
    code = (
        "import gc\n"
        "from node.gc_tuning import YOUNG_THRESHOLD, tune_for_serving\n"
        "kept = [[i] for i in range(10_000)]\n"  # start-up state: lives on
        "cycle = []; cycle.append(cycle); del cycle\n"  # start-up garbage: collected, not frozen
        "before = gc.get_threshold()\n"
        "tune_for_serving()\n"
        "assert gc.get_freeze_count() >= len(kept), gc.get_freeze_count()\n"
        "assert gc.get_threshold() == (YOUNG_THRESHOLD, before[1], before[2]), gc.get_threshold()\n"
        "assert len(gc.get_objects()) < len(kept), 'frozen objects are left out of collections'\n"
        "later = []; later.append(later); del later\n"  # a request's cycle is still found
        "assert gc.collect() >= 1\n"
    )
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
