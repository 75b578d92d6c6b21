"""Print docs/verified.md's table of a verified run's cost against exact on all N, by depth and edges (FLOPs).

The same pricing as ``circuitstat attribute --plan --verify n`` (circuitstat.circuits.plan: method_cost, verify_cost)
on config-only GPT-2-shaped models (no weights are built). Run from the repository root (seconds):
    PYTHONPATH=. python docs/make_verified_cost.py
"""

from __future__ import annotations

from circuitstat.circuits.plan import method_cost, verify_cost
from circuitstat.pipelines.sources import LOCAL

N, BATCH = 512, 16
#: (layers, heads, d_model, vocabulary, positions): the zoo's and the tails fixtures' shapes (vocabulary 300,
#: induction with seq_len 10: 21 positions), the same with GPT-2's vocabulary, and GPT-2-like widths
SHAPES = [(2, 4, 64, 300, 21), (3, 4, 64, 300, 21), (4, 4, 64, 300, 21), (2, 4, 64, 50257, 21),
          (4, 12, 768, 50257, 40), (6, 12, 768, 50257, 40), (12, 12, 768, 50257, 40), (24, 16, 1024, 50257, 40)]


def main() -> None:
    print(f"| layers | heads | d_model | vocabulary | positions | edges | EAP / exact (phase 1) | n = 16: phase 2 / exact | both / exact | "
          f"n = 32: both / exact | n = 51: both / exact |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for L, H, d, V, P in SHAPES:
        src = f"random:gpt2?n_layer={L}&n_head={H}&n_embd={d}&vocab_size={V}&n_positions=1024"
        cfg = LOCAL.skeleton(src).cfg
        eap = method_cost(cfg, "eap", n=N, positions=P, batch_size=BATCH)
        exact = method_cost(cfg, "exact", n=N, positions=P, batch_size=BATCH)
        share = {n: verify_cost(cfg, n=n, N=N, positions=P, batch_size=BATCH).flops / exact.flops for n in (16, 32, 51)}
        p1 = eap.flops / exact.flops
        print(f"| {L} | {H} | {d} | {V:,} | {P} | {exact.columns:,} | {p1:.1%} | {share[16]:.1%} | {p1 + share[16]:.1%} | "
              f"{p1 + share[32]:.1%} | {p1 + share[51]:.1%} |", flush=True)
    print(f"\nN = {N} prompts, batch size {BATCH}, FLOPs; "
          "phase 2 runs the clean and counterfactual forwards of every whole batch holding a drawn prompt.")


if __name__ == "__main__":
    main()
