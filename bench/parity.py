"""Measured parity of every decoder family with Hugging Face, as docs/families.md records it (not a test).

On the tests' tiny scrambled configs (tests/families.py: GQA, windows shorter than the prompts, soft-caps,
q/k norms, sandwich and post-norms, scaled rotary schedules), in float32, eager attention on the HF side:

* logits: max |HF - CircuitModel| over the real positions of 3 padded prompts of 9 tokens;
* EAP: node-level EAP (circuitstat, sums of its edge scores) against the same quantity by autograd on the
  HF model alone (circuitstat.circuits.parity.hf_node_eap), max |difference| relative to the largest score; and the
  receiver-group gradients against HF autograd (circuitstat.circuits.parity.hf_branch_gradients), relative;
* exact: exact per-edge effects against brute force (one full run per edge, every edge), max |difference|
  relative to the largest effect (the effects are metric differences of order 1).

Prints a markdown table.  ``python bench/parity.py [FIXTURE ...]``
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import numpy as np  # noqa: E402
import torch  # noqa: E402

from circuitstat.circuits.parity import brute_force_edge_effects  # noqa: E402

torch.set_num_threads(1)


def measure(family: str) -> dict:
    """The parity numbers of one family's fixture."""
    from families import batch, hf_model

    from circuitstat.circuits.ablation import last_index
    from circuitstat.circuits.attribution import attribute
    from circuitstat.circuits.convert import from_hf
    from circuitstat.circuits.parity import hf_branch_gradients, hf_node_eap, model_branch_gradients
    from circuitstat.circuits.tasks import make_task

    hf = hf_model(family, seed=2)
    m = from_hf(hf)
    ids, mask = batch()
    real = mask.bool()
    with torch.no_grad():
        logits = float((hf(ids, attention_mask=mask).logits - m(ids, mask)).abs()[real].max())
    last, ar = last_index(mask), torch.arange(ids.shape[0])

    def metric(lo):
        return (lo[ar, last, 5] - lo[ar, last, 7]).sum()

    ref_g = hf_branch_gradients(hf, ids, mask, metric)
    ours_g = model_branch_gradients(m, ids, mask, metric)
    scale_g = max(float(r[real].abs().max()) for r in ref_g)
    grads = max(float((a - b)[real].abs().max()) for a, b in zip(ref_g, ours_g)) / scale_g
    task = make_task("induction", vocab_size=97, n=3, seed=0, seq_len=4)
    ref = hf_node_eap(hf, task)
    got = attribute(m, task, "eap", level="node", progress=False).scores
    eap = float(np.abs(got - ref).max() / np.abs(ref).max())
    with torch.no_grad():
        cf = m.run(task.corrupted, task.attention_mask, keep_senders=True).senders
    bf = brute_force_edge_effects(m, task, cf)
    exact = attribute(m, task, "exact", progress=False).scores
    ex = float(np.abs(exact - bf).max() / np.abs(bf).max())
    return {"family": family, "edges": m.graph.n_edges, "logits": logits, "eap": eap, "grads": grads, "exact": ex}


def main() -> None:
    """Print the table (of the fixtures named on the command line, or all)."""
    from families import FAMILIES

    names = sys.argv[1:] or list(FAMILIES)
    print("| fixture | edges | max abs logit diff | EAP vs HF autograd (rel) | receiver grads vs HF (rel) "
          "| exact vs brute force (rel) |")
    print("|---|---|---|---|---|---|")
    for family in names:
        r = measure(family)
        print(f"| {r['family']} | {r['edges']} | {r['logits']:.1e} | {r['eap']:.1e} | {r['grads']:.1e} | "
              f"{r['exact']:.1e} |", flush=True)


if __name__ == "__main__":
    main()
