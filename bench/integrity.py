"""What the integrity checks of state circuitstat reads back cost on GPT-2 small (docs/integrity.md).

A random GPT-2-small-shaped model (124 M parameters, 0.5 GB of float32 weights) is saved as a local
Hugging Face directory and as a circuitstat model directory (bench/process.py's model). Timed, each
the median of ``--repeats`` rounds in this process, wall and CPU seconds:

* loading the HF directory from its cached conversion: the seal's fast path (every file keeps the
  identity recorded at write time: nothing re-hashed) and its slow path (the same bytes under a new
  identity, as after a restored backup: the 0.5 GB entry is hashed again and re-sealed);
* loading the circuitstat directory with its weight-hash memo (bound to the files' identity: the
  recorded weight hash is compared with the memo's) and without one (the weights are hashed);
* the pieces: hashing the weights (``CircuitModel.weight_hash``), a file digest of the 0.5 GB
  ``model.safetensors``, reading one sealed attribution-checkpoint chunk (16 examples x 32,491 edges).

Run it with the code before the checks (``PYTHONPATH=<checkout of the base commit>``) to compare: the
pieces that do not exist there are skipped and said so.

    python bench/integrity.py [--repeats 3] [--models DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from process import cached_models  # noqa: E402 - the same model as bench/process.py


def timed(fn, repeats: int, before=None) -> tuple[float, float]:
    """Median (wall, CPU) seconds of ``fn()`` over ``repeats`` rounds, ``before()`` run untimed first each time."""
    walls, cpus = [], []
    for _ in range(repeats):
        if before is not None:
            before()
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus)


def new_identity(entry: Path) -> None:
    """Rewrite every file of ``entry`` with the same bytes (new inode and ctime), as a restored copy."""
    for f in entry.iterdir():
        if f.name.startswith("SEAL"):
            continue
        tmp = f.with_name(f.name + ".copy")
        shutil.copyfile(f, tmp)
        os.replace(tmp, f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--models", type=Path, default=Path.home() / ".cache" / "circuitstat-bench" / "gpt2-small-random")
    args = ap.parse_args()
    import circuitstat.circuits as circuits
    import torch

    torch.set_num_threads(1)
    cache = Path(tempfile.mkdtemp(prefix="bench-integrity-"))
    os.environ["CIRCUITSTAT_CACHE"] = str(cache)
    os.environ["CIRCUITSTAT_CONVERSION_CACHE"] = "1"
    from circuitstat.circuits import load_model

    print(f"code: {Path(circuits.__file__).resolve().parent.parent}; cache {cache}")
    models = cached_models(args.models)  # fills this run's conversion cache
    hf_dir, own_dir = models["HF directory"], models["circuitstat directory"]
    load_model(str(hf_dir)).weight_hash()  # the memo of the HF files
    load_model(str(own_dir)).weight_hash()  # the memo of the circuitstat files
    rows = []

    def row(name: str, fn, before=None) -> None:
        w, c = timed(fn, args.repeats, before)
        rows.append((name, w, c))
        print(f"{name:<62} {w:7.3f} s wall {c:7.3f} s CPU", flush=True)

    row("HF dir from the conversion cache, memo, identity unchanged", lambda: load_model(str(hf_dir)))
    (entry,) = [p for p in (cache / "converted").iterdir() if not p.name.startswith(".")]
    row("HF dir from the conversion cache, files with a new identity",
        lambda: load_model(str(hf_dir)), before=lambda: new_identity(entry))
    row("circuitstat dir with its memo", lambda: load_model(str(own_dir)))
    memos = cache / "weight-hashes"
    row("circuitstat dir without a memo (weights hashed)", lambda: load_model(str(own_dir)).weight_hash(),
        before=lambda: shutil.rmtree(memos, ignore_errors=True))
    m = load_model(str(own_dir))
    row("weight hash of the loaded weights (CircuitModel._hash_weights)",
        lambda: m._hash_weights(sorted(m.state_dict().items())))
    try:
        from circuitstat.core.integrity import digest_file
    except ImportError:
        print("file digest, sealed chunk: not in this code (before the checks)")
    else:
        row("sha256 of model.safetensors (circuitstat.core.integrity.digest_file)",
            lambda: digest_file(own_dir / "model.safetensors"))
        import numpy as np

        from circuitstat.pipelines.checkpoint import AttributionJob, CheckpointStore, chunk_bounds

        job = AttributionJob("w" * 64, "t" * 64, "logit_diff", "eap", "edge", "counterfactual", 16, 32491, 0, {})
        store = CheckpointStore(cache / "run", job, chunk_bounds(16, 16))
        store.start([])
        store.write(0, 16, np.ones((16, 32491), np.float32))
        row("read one sealed checkpoint chunk (16 x 32,491 float32)", lambda: store.read(0, 16))
    shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
