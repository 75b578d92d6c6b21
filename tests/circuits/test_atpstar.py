"""AtP* (QK fix, GradDrop) against their definitions (Kramár et al. 2024, arXiv:2403.00745), with an
independent brute-force oracle: a plain-torch forward written here from the weights, with per-edge patch
coefficients, one head's pattern replaceable by a leaf tensor, and one layer's writes detached."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from circuitstat.circuits import load_model
from circuitstat.circuits.attribution import attribute
from circuitstat.circuits.engine.config import ACTIVATIONS, ModelConfig
from circuitstat.circuits.model import CircuitModel
from circuitstat.circuits.tasks import make_task
from circuitstat.core.errors import InputError

V = 23


def _sharpen(model: CircuitModel, factor: float) -> CircuitModel:
    """Scale queries and keys so that patterns saturate (where AtP's linearised softmax fails)."""
    with torch.no_grad():
        for blk in model.blocks:
            blk.W_Q.mul_(factor)
            blk.W_K.mul_(factor)
    return model


@pytest.fixture(scope="module", params=["gpt2", "attn-only"])
def model(request):
    if request.param == "gpt2":
        m = load_model(f"random:gpt2?n_layer=3&n_head=2&n_embd=16&vocab_size={V}&n_positions=32&seed=4")
    else:
        cfg = ModelConfig(n_layers=3, n_heads=2, d_model=16, d_head=8, d_mlp=0, mlp="none", vocab_size=V, n_ctx=32)
        m = CircuitModel(cfg).init_weights(5).eval()
    return _sharpen(m, 40.0).double()


def _task(n=3):
    return make_task("induction", vocab_size=V, n=n, seed=1, seq_len=4)


class Reference:
    """One example's forward from the weights alone (GPT-2 style: pre-LayerNorm, learned positions)."""

    def __init__(self, model, ids):
        self.m, self.cfg, self.g, self.ids = model, model.cfg, model.graph, ids
        self.P = ids.shape[0]

    def run(self, eps=None, dz=None, drop=None, override=None, keep=None):
        """Logits at the last position; eps [E] scales each edge's Δz (dz: [U] list of [P, D]) into its
        receiver; ``drop``: layer whose writes are detached; ``override``: ((layer, head), pattern)."""
        cfg, g, P = self.cfg, self.g, self.P
        ln = lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b, cfg.norm_eps)  # noqa: E731
        resid = self.m.W_E[self.ids] + self.m.W_pos[torch.arange(P)]
        senders = [resid]
        causal = torch.tril(torch.ones(P, P, dtype=torch.bool))

        def into(receiver, x, U):
            if eps is None:
                return x
            off = int(g.edge_offset[receiver])
            return x + sum(eps[off + u] * dz[u] for u in range(U))

        for layer, blk in enumerate(self.m.blocks):
            U = g.upstream_of_attention(layer)
            outs = []
            for h in range(cfg.n_heads):
                qkv = []
                for i, kind in enumerate("qkv"):
                    x = ln(into(g.attention_receiver(layer, kind, h), resid, U), blk.ln1_w, blk.ln1_b)
                    W, b = ((blk.W_Q, blk.b_Q), (blk.W_K, blk.b_K), (blk.W_V, blk.b_V))[i]
                    qkv.append(x @ W[h] + b[h])
                q, k, v = qkv
                A = ((q @ k.T) / cfg.d_head ** 0.5).masked_fill(~causal, float("-inf")).softmax(-1)
                if override is not None and override[0] == (layer, h):
                    A = override[1]
                if keep is not None:
                    keep[(layer, h)] = A
                outs.append((A @ v) @ blk.W_O[h])
            attn = sum(outs) + blk.b_O
            resid = resid + (attn.detach() if drop == layer else attn)
            senders += outs
            if cfg.has_mlp:
                x = ln(into(g.mlp_receiver(layer), resid, g.upstream_of_mlp(layer)), blk.ln2_w, blk.ln2_b)
                out = ACTIVATIONS[cfg.act](x @ blk.W_in + blk.b_in) @ blk.W_out + blk.b_out
                resid = resid + (out.detach() if drop == layer else out)
                senders.append(out)
        final = into(g.logits_receiver, resid, g.n_senders)
        logits = ln(final, self.m.lnf_w, self.m.lnf_b)[-1] @ self.m.unembed + self.m.b_U
        return logits, senders


def _oracle(model, task):
    """{method: [N, E]} AtP-qkfix, AtP-GradDrop, AtP* by brute force, and plain EAP."""
    g, L = model.graph, model.cfg.n_layers
    qk = [(layer, h, int(g.edge_offset[g.attention_receiver(layer, kind, h)]), g.upstream_of_attention(layer))
          for layer in range(L) for h in range(model.cfg.n_heads) for kind in "qk"]
    res = {k: np.zeros((task.n, g.n_edges)) for k in ("eap", "atp-qkfix", "atp-graddrop", "atpstar")}
    for n in range(task.n):
        ref = Reference(model, task.clean[n])
        with torch.no_grad():
            clean_logits, clean_s = ref.run()
            _, cf_s = Reference(model, task.corrupted[n]).run()
            dz = [c - s for c, s in zip(cf_s, clean_s)]
        score = lambda lo: task.score(lo[None], indices=torch.tensor([n]), clean_logits=clean_logits[None])[0]  # noqa: E731
        assert torch.allclose(clean_logits, model.run(task.clean[n:n + 1]).logits[0, -1], atol=1e-8)
        per_drop = {}
        for drop in [None, *range(L)]:
            eps = torch.zeros(g.n_edges, dtype=torch.float64, requires_grad=True)
            lin = torch.autograd.grad(score(ref.run(eps, dz, drop=drop)[0]), eps)[0].numpy().copy()
            fixed = lin.copy()
            for layer, h, off, U in qk:
                keep = {}
                with torch.no_grad():
                    ref.run(keep=keep)
                A0 = keep[(layer, h)].clone().requires_grad_(True)
                out = score(ref.run(drop=drop, override=((layer, h), A0))[0])
                # the pattern's layer dropped: no gradient reaches it
                GA = torch.autograd.grad(out, A0, allow_unused=True)[0] if out.requires_grad else None
                GA = torch.zeros_like(A0) if GA is None else GA
                for u in range(U):
                    one = torch.zeros(g.n_edges, dtype=torch.float64)
                    one[off + u] = 1.0
                    keep = {}
                    with torch.no_grad():
                        ref.run(one, dz, keep=keep)
                    fixed[off + u] = float(((keep[(layer, h)] - A0.detach()) * GA).sum())
            per_drop[drop] = (lin, fixed)
        res["eap"][n] = per_drop[None][0]
        res["atp-qkfix"][n] = per_drop[None][1]
        norm = max(L - 1, 1)
        res["atp-graddrop"][n] = sum(np.abs(per_drop[d][0]) for d in range(L)) / norm
        res["atpstar"][n] = sum(np.abs(per_drop[d][1]) for d in range(L)) / norm
    return res


def test_atpstar_methods_equal_brute_force_oracle(model):
    task = _task()
    ref = _oracle(model, task)
    g = model.graph
    qk_cols = np.array([r.endswith(("<q>", "<k>")) for r in np.array(g.receivers)[g.edge_receiver]])
    eap = attribute(model, task, "eap", progress=False).scores
    assert np.abs(eap - ref["eap"]).max() <= 1e-4 * np.abs(ref["eap"]).max()  # the oracle is EAP's too
    for method in ("atp-qkfix", "atp-graddrop", "atpstar"):
        got = attribute(model, task, method, batch_size=2, progress=False).scores
        scale = np.abs(ref[method]).max()
        assert np.abs(got - ref[method]).max() <= 1e-4 * scale, method
    # not vacuous: saturated patterns make the QK fix differ from EAP on q/k edges (and only there)
    fix = attribute(model, task, "atp-qkfix", progress=False).scores
    assert np.abs(fix - eap)[:, qk_cols].max() > 0.05 * np.abs(eap).max()
    assert np.array_equal(fix[:, ~qk_cols], eap[:, ~qk_cols])
    # GradDrop differs from |EAP| on edges whose gradient passes through later layers
    gd = attribute(model, task, "atp-graddrop", progress=False).scores
    assert np.abs(gd - np.abs(eap)).max() > 0.05 * np.abs(eap).max() and (gd >= 0).all()


class _Scaled:
    """Counterfactual senders = clean + eps (corrupted − clean): Δz shrinks linearly with eps."""

    kind = "scaled"

    def __init__(self, model, task, eps):
        self.model, self.task, self.eps = model, task, eps

    @torch.no_grad()
    def senders(self, index):
        t, m = self.task, self.model
        clean = m.run(t.clean[index], t.attention_mask[index], keep_senders=True).senders
        cf = m.run(t.corrupted[index], t.attention_mask[index], keep_senders=True).senders
        return clean + self.eps * (cf - clean)


def test_qk_fix_tends_to_eap_for_small_perturbations(model):
    task = _task()
    errors = []
    for eps in (1.0, 1e-2, 5e-3):
        abl = _Scaled(model, task, eps)
        fix = attribute(model, task, "atp-qkfix", ablation=abl, progress=False).scores
        eap = attribute(model, task, "eap", ablation=abl, progress=False).scores
        errors.append(np.abs(fix - eap).max() / np.abs(eap).max())
    assert errors[0] > 0.05  # a real perturbation: the softmax is far from linear
    assert errors[1] < 0.05 and errors[2] < 0.6 * errors[1]  # the gap is second order: O(eps) relative


def test_atp_methods_refuse_node_level(model):
    with pytest.raises(InputError, match="scores edges only"):
        attribute(model, _task(n=1), "atpstar", level="node", progress=False)


def test_atp_run_counts(model, monkeypatch):
    """Forwards and backwards AtP* uses, counted (circuitstat.circuits.plan prices the same counts)."""
    from circuitstat.circuits.plan import method_cost

    task = _task(n=4)
    calls = {"run": 0, "grad": 0}
    run, grad = type(model).run, torch.autograd.grad

    def counting_run(self, *a, **k):
        calls["run"] += 1
        return run(self, *a, **k)

    def counting_grad(*a, **k):
        calls["grad"] += 1
        return grad(*a, **k)

    monkeypatch.setattr(type(model), "run", counting_run)
    monkeypatch.setattr(torch.autograd, "grad", counting_grad)
    L = model.cfg.n_layers
    for method, backwards in (("atp-qkfix", 1), ("atp-graddrop", L), ("atpstar", L)):
        calls.update(run=0, grad=0)
        attribute(model, task, method, batch_size=2, progress=False)
        cost = method_cost(model.cfg, method, n=4, positions=task.clean.shape[1], batch_size=2)
        # per batch of 2: the counterfactual forward and one clean forward with probes; backwards through it
        assert calls == {"run": 2 * 2, "grad": 2 * backwards}
        assert (cost.forwards, cost.backwards) == (4 * 2, 4 * backwards)


@pytest.mark.parametrize("family", ["llama3", "qwen2", "qwen3", "gemma2", "gemma3", "olmo2", "mixtral", "gpt_oss",
                                    "phi", "cohere"])  # + LayerNorm q/k norms with biases, each head's own; interleaved rotary
def test_qk_fix_tends_to_eap_on_every_family(family):
    """Rotary, grouped K/V, q/k norms (per head, whole projection), soft-caps and post-norm writes go through
    the QK fix's recomputed projections: for a small Δz it agrees with EAP to second order."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from families import FAMILIES, VOCAB, hf_model

    from circuitstat.circuits.convert import from_hf

    if family not in FAMILIES:
        pytest.skip(f"{family} not among tests/families.py")
    model = from_hf(hf_model(family, seed=2)).double()
    task = make_task("induction", vocab_size=VOCAB, n=3, seed=0, seq_len=4)
    errors = []
    for eps in (1e-2, 1e-3):
        abl = _Scaled(model, task, eps)
        fix = attribute(model, task, "atp-qkfix", ablation=abl, progress=False).scores
        eap = attribute(model, task, "eap", ablation=abl, progress=False).scores
        errors.append(np.abs(fix - eap).max() / np.abs(eap).max())
    full = attribute(model, task, "atp-qkfix", progress=False).scores
    eap = attribute(model, task, "eap", progress=False).scores
    assert np.abs(full - eap).max() > 1e-3 * np.abs(eap).max()  # a real Δz: the fix changes something
    assert errors[0] < 0.1 and errors[1] < 0.2 * errors[0], errors  # O(eps): a tenth of eps, a tenth of the gap
