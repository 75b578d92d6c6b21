"""Run time of the token-contribution and attention-sink estimator on the zoo's models.

For each zoo model: the read-out stage (token weights, gradient x input, every ablation forward,
sink read-outs) and the statistics stage (every bootstrap interval), each as wall seconds and as
a multiple of one clean forward pass over the same prompts (the floor of any read-out). Timings
are medians of ``--repeats`` runs on one thread; on a shared machine compare the ratios.

    python bench/contributions.py [--recipe attn-only-2l] [--seeds 0,1,2,3,4] [--n 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time


def _timed(fn, repeats: int) -> tuple[float, object]:
    """Median wall seconds of ``fn()`` over ``repeats`` runs, and its last value."""
    times, value = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), value


def main() -> None:
    import torch

    from circuitstat.pipelines.runs.tokens.run import TokenContributions
    from circuitstat.pipelines.sources import LOCAL

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="attn-only-2l")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--n-resamples", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"recipe {args.recipe}, n={args.n} induction prompts, B={args.n_resamples}, 1 thread, "
          f"median of {args.repeats}")
    for seed in [int(s) for s in args.seeds.split(",")]:
        model = LOCAL.load(f"zoo:{args.recipe}/seed-{seed}")
        est = TokenContributions(n=args.n, n_resamples=args.n_resamples)
        task = est.build_task(model)

        def forward():
            with torch.no_grad():
                return model(task.clean, task.attention_mask)

        t_fwd, _ = _timed(forward, args.repeats)
        t_read, readouts = _timed(lambda: est.readouts(model, task), args.repeats)
        tables = readouts.tables()
        t_stats, _ = _timed(lambda: est.analyse(tables), args.repeats)
        print(f"seed-{seed}: forward {t_fwd:.3f} s | read-outs {t_read:.2f} s (x{t_read / t_fwd:.0f} forward) | "
              f"statistics {t_stats:.2f} s | total {t_read + t_stats:.2f} s")


if __name__ == "__main__":
    main()
