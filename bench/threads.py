"""Torch threads against work size: each call's time at 1, 2, ... threads as ratios to one thread, in one run.

Why: torch starts with a thread per physical core, and on a loaded machine small calls slowed down by
tens of times (issue 23: one ``faithfulness(...)`` call took 28 s with the default threads on a loaded
2-core machine, 0.6 s with OMP_NUM_THREADS=1). circuitstat.circuits.threads picks threads from the forward-pass FLOPs
of one batch; this prints, per case, the FLOPs, the one-thread time, each thread count's time as a
multiple of it (< 1: faster), and the count the rule picks. Rounds interleave the thread counts, and each
entry is the fastest of ``--rounds``, so load that comes and goes disturbs every count alike.

    python bench/threads.py [--rounds 3] [--quick] [--threads 1,2,4]
"""

from __future__ import annotations

import argparse
import os
import time

CASES = [  # (label, source, call, n examples, batch size, induction seq_len)
    ("tiny 2L d32: faithfulness, 10 circuits", "random:gpt2?n_layer=2&n_head=2&n_embd=32&vocab_size=128&n_positions=64&seed=1",
     "faithfulness", 16, 16, 10),
    ("zoo-sized 2L d64: faithfulness, 10 circuits", "random:gpt2?n_layer=2&n_head=4&n_embd=64&vocab_size=512&n_positions=64"
     "&seed=0", "faithfulness", 64, 16, 10),
    ("6L d128: EAP", "random:gpt2?n_layer=6&n_head=4&n_embd=128&vocab_size=512&n_positions=128&seed=0", "eap", 16, 16, 20),
    ("6L d384: EAP", "random:gpt2?n_layer=6&n_head=6&n_embd=384&vocab_size=512&n_positions=128&seed=0", "eap", 16, 16,
     20),
    ("GPT-2-small shape: EAP", "random:gpt2?n_layer=12&n_head=12&n_embd=768&vocab_size=50257&seed=0", "eap", 8, 8, 20),
]


def _call(kind: str, model, task, batch_size: int):
    """A function running the case's call once."""
    import numpy as np

    from circuitstat.circuits.attribution import attribute
    from circuitstat.circuits.faithfulness import faithfulness

    if kind == "eap":
        return lambda: attribute(model, task, "eap", batch_size=batch_size, progress=False)
    rng = np.random.default_rng(0)
    masks = rng.random((10, model.graph.n_edges)) < 0.3
    return lambda: faithfulness(model, task, masks, batch_size=batch_size, progress=False)


def _fastest(fn, counts: list[int], rounds: int) -> dict[int, float]:
    """{threads: fastest of ``rounds`` timings}, the counts interleaved in every round (after a warm-up)."""
    from circuitstat.circuits.threads import ENV

    best = {t: float("inf") for t in counts}
    for r in range(rounds + 1):
        for t in counts:
            os.environ[ENV] = str(t)  # forces the count, also when it equals torch's default
            t0 = time.perf_counter()
            fn()
            if r:  # round 0 warms up every count
                best[t] = min(best[t], time.perf_counter() - t0)
    os.environ.pop(ENV, None)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="skip the GPT-2-small-shaped case")
    ap.add_argument("--threads", default=None, help="thread counts to compare (default: 1, 2, ... the cores)")
    args = ap.parse_args()
    os.environ.pop("CIRCUITSTAT_THREADS", None)
    import torch

    from circuitstat.circuits import load_model
    from circuitstat.circuits.threads import available_cores, batch_flops, threads_for
    from circuitstat.pipelines.build import build_task

    cores = available_cores()
    counts = ([int(t) for t in args.threads.split(",")] if args.threads else
              sorted({1, 2, cores} | ({4} if cores >= 4 else set())))
    load = os.getloadavg()
    print(f"torch {torch.__version__}; {os.cpu_count()} CPUs, torch default threads {cores}; load average "
          f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}; fastest of {args.rounds} interleaved rounds")
    print(f"{'case':<44} {'FLOPs/batch':>11} {'1 thread':>9} " + " ".join(f"{f'x{t}':>6}" for t in counts[1:])
          + "   rule")
    for label, source, kind, n, batch, seq_len in CASES[:-1] if args.quick else CASES:
        model = load_model(source)
        task = build_task(model, "induction", n=n, seed=0, seq_len=seq_len)
        flops = batch_flops(model, task, batch)
        times = _fastest(_call(kind, model, task, batch), counts, args.rounds)
        pick = threads_for(flops)
        ratios = " ".join(f"{times[t] / times[1]:6.2f}" for t in counts[1:])
        print(f"{label:<44} {flops:11.3g} {times[1]:8.3g}s {ratios}   {pick} thread{'s' if pick > 1 else ''}",
              flush=True)


if __name__ == "__main__":
    main()
