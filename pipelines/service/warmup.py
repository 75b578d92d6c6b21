"""Warm the local pool's forkserver: importing this module runs one tiny audit, once, single-threaded.

The first job in a fresh process pays for everything loaded lazily on first use (transformers' model
classes, torch's kernels, the report's code): about ten times the job itself. The forkserver imports
this module before it forks any worker (circuitstat.pipelines.service.pools.PRELOAD), so every worker starts warm.
Nothing of the warm-up is kept but the loaded code; a failure is logged and otherwise ignored.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

WARMUP_MODEL = "random:gpt2?n_layer=1&n_head=2&n_embd=8&vocab_size=32&n_positions=32&seed=0"
WARMUP_SPEC = {"model": WARMUP_MODEL, "task": {"name": "induction", "n": 4, "options": {"seq_len": 3}},
               "methods": ["exact", "eap"], "bootstrap": {"n_resamples": 40}, "k": [2, 3]}


def warm_up() -> dict:
    """Run the tiny audit in a temporary directory (deleted afterwards); its outcome."""
    import torch

    from .runner import execute

    torch.set_num_threads(1)  # no thread pool exists when the workers fork
    folder = Path(tempfile.mkdtemp(prefix="circuitstat-warmup-"))
    try:
        return execute({"job_id": "0" * 32, "kind": "audit", "spec": WARMUP_SPEC, "job_dir": str(folder),
                        "max_work_flops": 1e12})
    finally:
        shutil.rmtree(folder, ignore_errors=True)


try:
    OUTCOME = warm_up()
except Exception as exc:  # noqa: BLE001 - a warm-up must never stop the workers from starting
    OUTCOME = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
if OUTCOME.get("status") != "completed":
    print(f"circuitstat: the workers' warm-up did not complete ({OUTCOME.get('error')}); jobs still run, the first "
          "ones slower", file=sys.stderr)
