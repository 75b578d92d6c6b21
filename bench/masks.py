"""Mask learning and the ensemble against attribution: seconds and ratios to EAP on the same model and prompts.

Per model (ground-truth models and a random GPT-2-shaped one) and N prompts, single-threaded, the fastest of
``--repeats``: EAP (the reference: two forwards and one backward), the ensemble (EAP + EAP-IG-inputs +
EAP-IG-activations, circuitstat.circuits.attribution.ENSEMBLE_MEMBERS), one edge-pruning fit of ``--steps``
Adam steps (circuitstat.circuits.edge_pruning, full batch), and edge pruning's cost per step; then one UGS fit of
as many steps with ``--n-samples`` mask draws per prompt (circuitstat.circuits.ugs) and its cost per step.  A
study's stability needs 1 + refits fits per dataset for a mask method against one attribution pass on the
population for the others, so the ``x (1+refits)`` columns multiply the fit by (1 + refits).

    python bench/masks.py [--n 64] [--steps 50] [--repeats 2] [--refits 5] [--n-samples 4]
"""

from __future__ import annotations

import argparse
import time

from circuitstat.circuits import load_model
from circuitstat.circuits.attribution import attribute
from circuitstat.circuits.edge_pruning import fit_edge_pruning
from circuitstat.circuits.groundtruth import load_groundtruth
from circuitstat.circuits.tasks import make_task
from circuitstat.circuits.ugs import fit_ugs
from circuitstat.pipelines.parallel import single_threaded

MODELS = ["tracr:reverse", "tracr:dyck", "planted:induction?background=1",
          "random:gpt2?n_layer=4&n_head=4&n_embd=64&vocab_size=97&n_positions=64&seed=1"]


def _best(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _model_and_task(source: str, n: int):
    if source.startswith("random:"):
        return load_model(source), make_task("induction", vocab_size=97, n=n, seed=0, seq_len=8)
    gt = load_groundtruth(source)
    return gt.model, gt.task(n, 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--refits", type=int, default=5)
    ap.add_argument("--n-samples", type=int, default=4)
    args = ap.parse_args()
    print(f"N = {args.n} prompts, {args.steps} edge-pruning steps, one thread, best of {args.repeats}")
    print(f"{'model':<34} {'edges':>6} {'eap s':>8} {'ensemble/eap':>13} {'prune fit/eap':>14} "
          f"{'step/eap':>9} {'fit x (1+refits)/eap':>21}")
    rows = []
    with single_threaded():
        for source in MODELS:
            model, task = _model_and_task(source, args.n)
            kw = {"progress": False, "batch_size": args.n}
            eap = _best(lambda: attribute(model, task, "eap", **kw), args.repeats)
            ens = _best(lambda: attribute(model, task, "ensemble", **kw), args.repeats)
            fit = _best(lambda: fit_edge_pruning(model, task, steps=args.steps, batch_size=args.n), args.repeats)
            ugs = _best(lambda: fit_ugs(model, task, steps=args.steps, n_samples=args.n_samples, batch_size=args.n),
                        args.repeats)
            rows.append((source, ugs / eap, ugs / args.steps / eap, ugs * (1 + args.refits) / eap))
            print(f"{source[:34]:<34} {model.graph.n_edges:>6} {eap:8.3f} {ens / eap:13.1f} {fit / eap:14.1f} "
                  f"{fit / args.steps / eap:9.2f} {fit * (1 + args.refits) / eap:21.0f}")
    print(f"\nUGS, {args.n_samples} mask draws per prompt and step:")
    print(f"{'model':<34} {'ugs fit/eap':>12} {'step/eap':>9} {'fit x (1+refits)/eap':>21}")
    for source, fit_r, step_r, all_r in rows:
        print(f"{source[:34]:<34} {fit_r:12.1f} {step_r:9.2f} {all_r:21.0f}")


if __name__ == "__main__":
    main()
