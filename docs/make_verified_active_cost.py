"""Print docs/verified.md's table of the active design's phase 2 against exact on all N, by depth and edges (FLOPs).

The same pricing as ``circuitstat attribute --plan --verify-design active --verify-budget B``
(circuitstat.circuits.plan.active_verify_cost, priced at the upper bound of the forwarded batches, beside the
uniform design's circuitstat.circuits.plan.verify_cost at n = B) on config-only GPT-2-shaped models (no weights).
Run from the repository root (seconds):
    PYTHONPATH=. python docs/make_verified_active_cost.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_verified_cost import BATCH, N, SHAPES  # noqa: E402  (the uniform table's shapes)

from circuitstat.circuits.plan import active_verify_cost, method_cost, verify_cost  # noqa: E402
from circuitstat.pipelines.sources import LOCAL  # noqa: E402
from circuitstat.stats.verified.active import ACTIVE_MIX  # noqa: E402


def main() -> None:
    budget = 51  # a tenth of N = 512: the cells of uniform n = 51 on every edge
    print(f"| layers | edges | cells / exact's | active phase 2 / exact (forwards between) | uniform n = {budget}: "
          "phase 2 / exact |")
    print("|---|---|---|---|---|")
    for L, H, d, V, P in SHAPES:
        cfg = LOCAL.skeleton(f"random:gpt2?n_layer={L}&n_head={H}&n_embd={d}&vocab_size={V}&n_positions=1024").cfg
        exact = method_cost(cfg, "exact", n=N, positions=P, batch_size=BATCH)
        act, (low, high) = active_verify_cost(cfg, budget=budget, N=N, positions=P, mix=ACTIVE_MIX, batch_size=BATCH)
        uni = verify_cost(cfg, n=budget, N=N, positions=P, batch_size=BATCH)
        print(f"| {L} (d {d}, V {V:,}) | {exact.columns:,} | {act.suffix_rows / exact.suffix_rows:.1%} | "
              f"{act.flops / exact.flops:.1%} ({low:.0f}-{high:.0f} of {N} prompts) | {uni.flops / exact.flops:.1%} |")
    print(f"\nN = {N} prompts, budget {budget} expected cells per edge, batch size {BATCH}, FLOPs; the active design's "
          "forwards priced at their upper bound (every batch here).")


if __name__ == "__main__":
    main()
