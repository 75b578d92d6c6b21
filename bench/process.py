"""Whole-process against in-process time of `circuitstat attribute` on a cached model.

In-process: attribute() alone (model loaded and task built beforehand, one thread, as the command
computes). Whole process: a fresh `circuitstat attribute` run of the same work writing a new run
directory, wall time. Their difference is what start-up, imports, loading, conversion, hashing and
writing cost; `python -c "import torch"` is printed beside it, since no command that computes can
start without it. Wall and CPU seconds are both printed: on a shared machine CPU time is the steadier
measure. Two cached forms of the same random GPT-2-small-shaped model are timed: a Hugging
Face directory (its conversion cached by the first load, as circuitstat.circuits.cache does for every user)
and a circuitstat model directory. This process keeps freed memory for reuse as the command line
does (circuitstat.circuits.allocator), so both sides run under the same allocator. Rounds are interleaved;
medians are printed.

    python bench/process.py [--repeats 3] [--n 24] [--cache DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SOURCE = "random:gpt2?n_layer=12&n_head=12&n_embd=768&vocab_size=50257&seed=0"


def cached_models(cache: Path) -> dict[str, Path]:
    """{form: directory} of the bench model, written once into ``cache``."""
    hf_dir, own_dir = cache / "hf", cache / "circuitstat"
    if not (hf_dir / "config.json").exists() or not (own_dir / "config.json").exists():
        from circuitstat.circuits import load_model
        from circuitstat.circuits.loading import random_hf_model

        random_hf_model(SOURCE).save_pretrained(hf_dir)
        load_model(SOURCE).save(own_dir)
    from circuitstat.circuits import load_model

    load_model(str(hf_dir))  # fills the conversion cache (a no-op when it is filled or turned off)
    return {"HF directory": hf_dir, "circuitstat directory": own_dir}


def in_process(model_dir: Path, n: int, batch_size: int) -> tuple[float, float]:
    """(wall, CPU) seconds of attribute() alone on the loaded model (one thread)."""
    from circuitstat.circuits import load_model
    from circuitstat.circuits.attribution import attribute
    from circuitstat.pipelines.build import build_task
    from circuitstat.pipelines.parallel import single_threaded

    model = load_model(str(model_dir))
    task = build_task(model, "induction", n=n, seed=0)
    with single_threaded():
        t0, c0 = time.perf_counter(), time.process_time()
        attribute(model, task, "eap", batch_size=batch_size, progress=False)
        return time.perf_counter() - t0, time.process_time() - c0


def wall(cmd: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds one fresh process takes (it must succeed); CPU time (user + system) is
    less disturbed than wall time by other work on a shared machine."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter() - t0, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--n", type=int, default=24)
    ap.add_argument("--batch-size", type=int, default=24)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "circuitstat-bench" / "gpt2-small-random")
    args = ap.parse_args()
    from circuitstat.circuits.allocator import reuse_freed_memory

    reuse_freed_memory()
    models = cached_models(args.cache)
    inside = {k: [] for k in models}
    whole = {k: [] for k in models}
    torch_s = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):  # interleaved, so drift of a shared machine hits every form alike
            torch_s.append(wall([sys.executable, "-c", "import torch"]))
            for form, d in models.items():
                out = Path(tmp) / f"run-{r}-{form.split()[0]}"
                whole[form].append(wall([sys.executable, "-m", "circuitstat.pipelines.cli", "attribute", "--model", str(d),
                                         "--method", "eap", "--n", str(args.n), "--batch-size", str(args.batch_size),
                                         "--out", str(out)]))
                inside[form].append(in_process(d, args.n, args.batch_size))
    med = lambda xs, i: statistics.median(x[i] for x in xs)  # noqa: E731
    print(f"EAP, {args.n} induction examples, batch {args.batch_size}, one thread, GPT-2-small shape; "
          f"median of {args.repeats} interleaved rounds; wall seconds (CPU seconds)")
    print(f"python -c 'import torch': {med(torch_s, 0):.2f} ({med(torch_s, 1):.2f})")
    print(f"{'cached as':<22} {'in-process':>14} {'whole process':>14} {'difference':>14} {'diff - import torch':>20}")
    for form in models:
        a, b = inside[form], whole[form]
        cells = [(med(a, i), med(b, i), med(b, i) - med(a, i), med(b, i) - med(a, i) - med(torch_s, i)) for i in (0, 1)]
        print(f"{form:<22} " + " ".join(f"{w:>7.2f} ({c:>5.2f})".rjust(14 if k < 3 else 20)
                                        for k, (w, c) in enumerate(zip(cells[0], cells[1]))))


if __name__ == "__main__":
    main()
