"""Information flow routes (circuitstat.circuits.flow_routes) against an independent oracle: HF transformers' GPT-2
run with hooks gives every receiver's input (the residual stream before its norm) and every sender's output (a head's
output from its slice of c_proj, an MLP's output, the embeddings), and a literal loop over examples, edges (by name)
and real positions applies the EAP-IG library's formula (hannamw/EAP-IG, get_scores_information_flow_routes)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from families import hf_model  # noqa: E402

from circuitstat.circuits.attribution import attribute  # noqa: E402
from circuitstat.circuits.convert import from_hf  # noqa: E402
from circuitstat.circuits.tasks.construct import task_from_token_lists  # noqa: E402
from circuitstat.core.errors import InputError  # noqa: E402

LENGTHS = (7, 4, 6)  # two right-padded rows


@pytest.fixture(scope="module")
def setup():
    hf = hf_model("gpt2", 0)
    rng = np.random.default_rng(0)
    clean = [rng.integers(3, 90, n).tolist() for n in LENGTHS]
    corrupted = [rng.integers(3, 90, n).tolist() for n in LENGTHS]
    task = task_from_token_lists("t", clean, corrupted, [5, 6, 7], [8, 9, 10])
    return hf, from_hf(hf), task


def hf_activations(hf, ids: torch.Tensor, mask: torch.Tensor) -> tuple[dict, dict]:
    """({sender name: [B, P, D]}, {receiver input name: [B, P, D]}) read from the HF model with hooks."""
    cfg, blocks = hf.config, hf.transformer.h
    H, D = cfg.n_head, cfg.n_embd
    dh = D // H
    seen: dict = {}
    hooks = [hf.transformer.ln_f.register_forward_pre_hook(lambda m, a: seen.__setitem__("final", a[0]))]
    for i, blk in enumerate(blocks):
        hooks.append(blk.attn.c_proj.register_forward_pre_hook(lambda m, a, i=i: seen.__setitem__(f"merged{i}", a[0])))
        hooks.append(blk.ln_2.register_forward_pre_hook(lambda m, a, i=i: seen.__setitem__(f"mid{i}", a[0])))
        hooks.append(blk.mlp.register_forward_hook(lambda m, a, o, i=i: seen.__setitem__(f"m{i}", o)))
    with torch.no_grad():
        out = hf(ids, attention_mask=mask, output_hidden_states=True)
    for h in hooks:
        h.remove()
    senders = {"input": out.hidden_states[0]}
    receivers = {}
    for i, blk in enumerate(blocks):
        W = blk.attn.c_proj.weight  # Conv1D: [in, out]
        for h in range(H):  # a head's output: its slice of the merged heads through its rows of c_proj (no bias)
            senders[f"a{i}.h{h}"] = seen[f"merged{i}"][..., h * dh:(h + 1) * dh] @ W[h * dh:(h + 1) * dh]
        senders[f"m{i}"] = seen[f"m{i}"]
        receivers[f"a{i}"] = out.hidden_states[i]  # block input, before ln_1
        receivers[f"m{i}"] = seen[f"mid{i}"]
    receivers["logits"] = seen["final"]
    return ({k: v.detach().double().numpy() for k, v in senders.items()},
            {k: v.detach().double().numpy() for k, v in receivers.items()})


def oracle(hf, task, mask_padding: bool = True) -> np.ndarray:
    """[N, E] scores by the library's formula, looping over examples, edges and positions."""
    g = from_hf(hf).graph
    senders, receivers = hf_activations(hf, task.clean, task.attention_mask)
    mask = task.attention_mask.numpy().astype(bool)
    upstream: dict[str, list[str]] = {}
    for name in g.edge_names:
        s, r = name.split("->")
        upstream.setdefault(r, []).append(s)
    out = np.zeros((mask.shape[0], len(g.edge_names)))
    index = {name: i for i, name in enumerate(g.edge_names)}
    for n in range(mask.shape[0]):
        positions = [p for p in range(mask.shape[1]) if mask[n, p] or not mask_padding]
        for r, ups in upstream.items():
            x = receivers[r.split(".")[0]]  # a head's q/k/v read its block's input; m{i} and logits their own
            for p in positions:
                xp = x[n, p]
                prox = {u: max(0.0, np.abs(xp).sum() - np.abs(xp - senders[u][n, p]).sum()) for u in ups}
                total = sum(prox.values())
                for u in ups:
                    out[n, index[f"{u}->{r}"]] += (prox[u] / total if total > 0 else 0.0) / len(positions)
    return out


def test_scores_equal_the_librarys_formula_on_hf_activations(setup):
    hf, model, task = setup
    s = attribute(model, task, "information-flow-routes", batch_size=2, progress=False)
    ref = oracle(hf, task)
    assert s.scores.shape == ref.shape and s.ablation == "none" and s.method == "information-flow-routes"
    np.testing.assert_allclose(s.scores, ref, atol=2e-5)
    assert ref.std() > 0.05  # the shares vary: the comparison is not between constants
    # negative control: averaging over the padding positions too (the library's mask left out) changes the padded rows
    unmasked = oracle(hf, task, mask_padding=False)
    assert np.abs(unmasked[1:] - s.scores[1:]).max() > 1e-3
    np.testing.assert_allclose(unmasked[0], s.scores[0], atol=2e-5)  # the unpadded row is unchanged


def test_analytic_limits(setup):
    """A receiver with one upstream sender takes all of it (layer 0's q/k/v read the input only); a receiver's
    in-edges share 1 wherever some sender is proximate; every score lies in [0, 1]."""
    _, model, task = setup
    g = model.graph
    s = attribute(model, task, "information-flow-routes", progress=False).scores
    first = [i for i, name in enumerate(g.edge_names) if name.startswith("input->a0.")]
    assert len(first) == 3 * model.cfg.n_heads and np.allclose(s[:, first], 1.0)
    for r in range(g.n_receivers):
        o, U = int(g.edge_offset[r]), int(g.n_upstream[r])
        assert np.all(s[:, o:o + U].sum(1) <= 1 + 1e-5)
    assert s.min() >= 0 and s.max() <= 1 + 1e-6


def test_no_counterfactual_is_computed_and_unsupported_options_are_refused(setup, monkeypatch):
    from circuitstat.circuits.ablation import Ablation

    _, model, task = setup
    calls = []
    real = Ablation.senders
    monkeypatch.setattr(Ablation, "senders", lambda self, index: calls.append(1) or real(self, index))
    one = attribute(model, task, "information-flow-routes", progress=False)
    assert calls == []
    rows = attribute(model, task, "information-flow-routes", progress=False, rows=np.array([2]), batch_size=1)
    np.testing.assert_array_equal(rows.scores[0], one.scores[2])  # a row's scores do not depend on its batch
    with pytest.raises(InputError, match="scores edges only"):
        attribute(model, task, "information-flow-routes", level="node", progress=False)
    with pytest.raises(InputError, match="needs ablation 'counterfactual'"):
        attribute(model, task, "information-flow-routes", ablation="zero", progress=False)


def test_post_norm_models_are_refused():
    gemma = from_hf(hf_model("gemma2", 0))
    task = task_from_token_lists("t", [[3, 4, 5, 6]], [[4, 5, 6, 7]], [5], [8])
    with pytest.raises(InputError, match="post-norm"):
        attribute(gemma, task, "information-flow-routes", progress=False)


@pytest.mark.parametrize("kind, doc", [
    ("audit", {"model": "random:gpt2", "methods": ["exact", "{m}"]}),
    ("study variance", {"model": "random:gpt2", "estimators": {"methods": ["exact", "{m}"]}}),
    ("study calibration", {"model": "random:gpt2", "method": "{m}"}),
])
def test_runs_whose_intervals_cover_effects_refuse_it(kind, doc):
    """Its scores are proximity shares, not effects: an audit's or a study's intervals (each labelled as covering an
    edge's mean effect) and verdict would mislabel them, so those specs refuse it, naming attribute; an effect
    method in its place is accepted (negative control)."""
    import json

    from circuitstat.core.errors import InputError
    from circuitstat.pipelines.kinds import kind as run_kind

    parse = run_kind(kind).parse
    with pytest.raises(InputError, match="do not estimate edges' effects.*circuitstat attribute"):
        parse(json.loads(json.dumps(doc).replace("{m}", "information-flow-routes")), "spec.yaml")
    parse(json.loads(json.dumps(doc).replace("{m}", "eap")), "spec.yaml")
