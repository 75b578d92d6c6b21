"""A verified run's two phases against exact patching on every prompt (not a test).

Phase 1 is EAP on all N prompts; phase 2 is exact patching on a uniformly random n of them (all edges, or the
top-m candidates plus a random r, circuitstat.circuits.verify.exact_subset), and the active design's phase 2 (exact
on a Poisson sample of (prompt, edge) cells, ``--budget`` expected per edge, π from phase 1's EAP:
circuitstat.stats.verified.active, circuitstat.circuits.verify.exact_cells); the reference is exact patching on
all N prompts, measured in the same run. One torch thread, CPU time of the process, each side timed
``--repeats`` times, interleaved, with its spread (min / median / max); the ratios are of medians, with the range
the spreads allow. --plan prices the same phases from shapes (docs/verified.md); this measures them.

    python bench/verified.py [--n-prompts 128] [--verify 16] [--budget 16] [--layers 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attribution import _interleaved, ratio, spread  # noqa: E402  (the attribution bench's timing helpers)

torch.set_num_threads(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-prompts", type=int, default=128, help="N, the prompts phase 1 scores")
    ap.add_argument("--verify", type=int, default=16, help="n, the prompts phase 2 patches exactly")
    ap.add_argument("--edges", type=str, default=None, help="TOP,RANDOM: verify only some edges")
    ap.add_argument("--budget", type=float, default=None,
                    help="the active design's expected exact cells per edge (default: --verify, the same cells as the "
                         "uniform design on every edge)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from circuitstat import attribute, build_task, load_model
    from circuitstat.circuits.verify import exact_cells, exact_subset
    from circuitstat.stats.verified.active import active_probabilities, active_sample

    model = load_model(f"random:gpt2?n_layer={args.layers}&n_head=4&n_embd=128&vocab_size=512&seed=1")
    task = build_task(model, "induction", n=args.n_prompts, seq_len=8)
    rows = np.sort(np.random.default_rng(0).choice(args.n_prompts, args.verify, replace=False))
    edges = None
    if args.edges:
        top, rand = (int(x) for x in args.edges.split(","))
        order = np.argsort(-np.abs(attribute(model, task, "eap", progress=False).mean()))
        rest = np.random.default_rng(1).choice(order[top:], rand, replace=False)
        edges = np.sort(np.concatenate([order[:top], rest]))
    budget = float(args.verify if args.budget is None else args.budget)
    cells = active_sample(active_probabilities(attribute(model, task, "eap", progress=False).scores, budget), 0)
    fns = {"phase 1 (EAP, all N)": lambda: attribute(model, task, "eap", progress=False),
           "phase 2 (exact, n rows)": lambda: exact_subset(model, task, rows=rows, edges=edges),
           "exact on all N": lambda: attribute(model, task, "exact", progress=False),
           "phase 2 active (cells)": lambda: exact_cells(model, task, cells)}
    times = _interleaved(fns, args.repeats)
    E = model.graph.n_edges
    print(f"verified run vs exact on all prompts: GPT-2-shaped random model, {args.layers} layers, {E} edges, "
          f"N = {args.n_prompts} induction prompts of {task.clean.shape[1]} tokens, n = {args.verify} verified"
          + (f", edges top {args.edges}" if args.edges else ", every edge") + "; one thread, CPU time")
    for name, ts in times.items():
        print(f"  {name:<26} {spread(ts)}")
    p1, p2, ref, act = times.values()
    both = [a + b for a, b in zip(p1, p2)]
    for name, num in (("phase 1 / exact on all N", p1), ("phase 2 / exact on all N", p2),
                      ("both phases / exact on all N", both), ("active phase 2 / exact on all N", act)):
        r, lo, hi = ratio(num, ref)
        print(f"  {name:<30} {r:.3f} (range {lo:.3f}-{hi:.3f})")
    print(f"  (n / N = {args.verify / args.n_prompts:.3f}: phase 2 runs whole batches holding the verified prompts)")
    held = int(cells.any(1).sum())
    print(f"  (active: budget {budget:g} cells per edge, {int(cells.sum()):,} cells drawn = "
          f"{cells.sum() / cells.size:.3f} of exact's; {held} of {args.n_prompts} prompts hold one, so their batches' "
          "forwards run)")


if __name__ == "__main__":
    main()
