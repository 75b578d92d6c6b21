"""Every decoder family against Hugging Face (the oracle), on tiny scrambled configs with GQA, windows
shorter than the prompts, soft-caps, q/k norms, sandwich and post-norms and scaled rotary schedules
(tests/families.py): logits, EAP against autograd on the HF model, exact against brute force, float64 rows (logits
and receiver gradients within 1e-12 of HF's float64 forward with its float32 casts removed), and the fields the
conversion refuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from families import CLASSIC, FAMILIES, VOCAB, KeepFloat64, batch, hf_model, hf_model_f64, hooked_last_logits

from circuitstat.circuits import Intervention
from circuitstat.circuits.ablation import last_index
from circuitstat.circuits.attribution import attribute
from circuitstat.circuits.convert import from_hf
from circuitstat.circuits.parity import brute_force_edge_effects, hf_branch_gradients, hf_node_eap, model_branch_gradients
from circuitstat.circuits.tasks import make_task


@pytest.fixture(scope="module", params=list(FAMILIES))
def pair(request):
    hf = hf_model(request.param, seed=2)
    return request.param, hf, from_hf(hf)


def _task(n: int = 3):
    # 7 tokens: longer than every window (3 or 4) in tests/families.py
    return make_task("induction", vocab_size=VOCAB, n=n, seed=0, seq_len=4)


def test_logits_equal_hf(pair):
    name, hf, m = pair
    ids, mask = batch()
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask).logits
        ours = m(ids, mask)
    real = mask.bool()
    assert (ref - ours).abs()[real].max() <= 1e-5, name
    assert ref[real].std() > 0.3  # activations large enough for norms and caps to bend


def _f64_logits(family: str, seed: int = 2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(HF float64 under KeepFloat64, HF float64 as it runs, circuitstat's float64 conversion, the real-token mask)."""
    hf = hf_model_f64(family, seed=seed)
    m = from_hf(hf)
    assert m.dtype == torch.float64 and m.W_E.dtype == torch.float64
    ids, mask = batch()
    # two padded tokens, not three: a padded query whose whole window is padding gets finfo(float64).min added to
    # every score, which overflows to -inf in HF's float64 eager attention and spreads NaN through 0 x NaN
    mask[1, -3] = 1
    with torch.no_grad():
        with KeepFloat64():
            ref = hf(ids, attention_mask=mask).logits
        plain = hf(ids, attention_mask=mask).logits
        ours = m(ids, mask)
    return ref, plain, ours, mask.bool()


def _relative(a: torch.Tensor, b: torch.Tensor, real: torch.Tensor) -> float:
    return float((a - b).abs()[real].max() / b[real].abs().max())


@pytest.mark.parametrize("family", list(FAMILIES) + list(CLASSIC))
def test_float64_logits_equal_hf_float64(family):
    """A float64 model is float64 end to end (norms, softmax, soft-caps, rotary angles, routers): its logits are
    within 1e-12 relative of HF's float64 forward with HF's own float32 casts removed (tests/families.py KeepFloat64).
    HF as it runs in float64 is ~1e-7 away for every family whose classes cast down (all but GPT-2)."""
    ref, plain, ours, real = _f64_logits(family)
    assert ours.dtype == torch.float64 and torch.isfinite(ref[real]).all(), family
    assert _relative(ours, ref, real) <= 1e-12, (family, _relative(ours, ref, real))
    assert ref[real].std() > 0.3, family  # activations large enough for norms and caps to bend
    if family == "gpt2":  # HF's GPT-2 classes never cast down: the mode changes nothing
        assert torch.equal(plain, ref)
    else:  # the oracle is float64 where HF is not
        assert _relative(plain, ref, real) > 1e-9, (family, _relative(plain, ref, real))


@pytest.mark.parametrize("family", list(FAMILIES) + list(CLASSIC))
def test_float64_receiver_gradients_equal_hf_float64_autograd(family):
    """EAP's receiver gradients (norm VJPs, q/k-norm terms) of a float64 model: within 1e-12 relative of autograd on
    HF's float64 forward under KeepFloat64, per receiver group."""
    hf = hf_model_f64(family, seed=2)
    m = from_hf(hf)
    ids, mask = batch(1)
    mask[1, -3] = 1  # two padded tokens (see _f64_logits)
    last, ar = last_index(mask), torch.arange(ids.shape[0])

    def metric(logits):
        return (logits[ar, last, 5] - logits[ar, last, 7]).sum()

    with KeepFloat64():
        ref = hf_branch_gradients(hf, ids, mask, metric)
    ours = model_branch_gradients(m, ids, mask, metric)
    real = mask.bool()
    for i, (a, b) in enumerate(zip(ref, ours)):
        assert b.dtype == torch.float64 and a[real].abs().max() > 1e-3, (family, i)
        assert _relative(b, a, real) <= 1e-12, (family, i, _relative(b, a, real))


@pytest.mark.parametrize("family, module", [("llama3", "norms"), ("llama3", "attention"), ("llama3", "rotary"),
                                            ("gpt2", "norms"), ("gpt2", "attention"),
                                            ("mixtral", "moe")])
def test_float64_row_fails_with_any_float32_step(family, module, monkeypatch):
    """Negative control: one engine module computing in float32 (as apply_norm did) breaks the 1e-12 bound."""
    import importlib

    mod = importlib.import_module(f"circuitstat.circuits.engine.{module}")
    monkeypatch.setattr(mod, "compute_dtype", lambda dtype: torch.float32)
    ref, _, ours, real = _f64_logits(family)
    assert _relative(ours, ref, real) > 1e-9, (family, module, _relative(ours, ref, real))


def test_receiver_gradients_sum_to_hf_autograd(pair):
    """Each receiver group's gradients (a layer's q/k/v inputs summed over heads, its MLP input, the logits
    input) equal autograd on the HF model at the input of the module that reads that branch."""
    name, hf, m = pair
    ids, mask = batch(1)
    last = last_index(mask)
    ar = torch.arange(ids.shape[0])

    def metric(logits):
        return (logits[ar, last, 5] - logits[ar, last, 7]).sum()

    ref = hf_branch_gradients(hf, ids, mask, metric)
    ours = model_branch_gradients(m, ids, mask, metric)
    assert len(ref) == len(ours) == 2 * m.cfg.n_layers + 1
    real = mask.bool()
    for i, (a, b) in enumerate(zip(ref, ours)):
        assert (a - b)[real].abs().max() <= 1e-5 * max(1.0, float(a[real].abs().max())), (name, i)
        assert a[real].abs().max() > 1e-3, (name, i)


def test_node_eap_equals_hf_autograd(pair):
    name, hf, m = pair
    task = _task()
    ref = hf_node_eap(hf, task)
    got = attribute(m, task, "eap", level="node", progress=False).scores
    assert got.shape == ref.shape
    scale = np.abs(ref).max()
    assert scale > 1e-2, name
    assert np.abs(got - ref).max() <= 1e-5 * max(1.0, scale), name


def test_exact_equals_brute_force(pair):
    name, _, m = pair
    task = _task()
    with torch.no_grad():
        cf = m.run(task.corrupted, task.attention_mask, keep_senders=True).senders
    ref = brute_force_edge_effects(m, task, cf)
    got = attribute(m, task, "exact", batch_size=2, max_rows=13, progress=False).scores
    scale = np.abs(ref).max()
    assert scale > 1e-2, name
    assert np.abs(got - ref).max() <= 1e-5 * max(1.0, scale), name


def test_all_edges_give_corrupted_run_and_out_edges_give_node_patch(pair):
    """The edge definition is complete: every edge patched is the corrupted run, a head's out-edges are
    the head patched everywhere (also where its write goes through a post-norm)."""
    name, _, m = pair
    ids, mask = batch(0)
    corrupt, _ = batch(1)
    g = m.graph
    with torch.no_grad():
        cf = m.run(corrupt, mask, keep_senders=True).senders
        all_edges = m.run(ids, mask, intervention=Intervention.edges(torch.ones(g.n_edges), cf)).logits
        corrupted = m(corrupt, mask)
        tol = 1e-5 * max(1.0, float(corrupted.abs().max()))  # float32 rounding of logits of size ~8
        assert (all_edges - corrupted).abs()[mask.bool()].max() <= tol, name
        u = g.head_sender(0, 1)
        em = torch.zeros(g.n_edges)
        em[torch.as_tensor(g.sender_out_edges(u))] = 1
        sm = torch.zeros(g.n_senders)
        sm[u] = 1
        by_edges = m.run(ids, mask, intervention=Intervention.edges(em, cf)).logits
        by_node = m.run(ids, mask, intervention=Intervention.nodes(sm, cf)).logits
    assert (by_edges - by_node).abs().max() <= tol, name
    assert (by_node - m(ids, mask)).abs().max() > 1e-3


def test_projected_receiver_grads_equal_input_probes(pair):
    """Probes on q/k/v mapped back (through per-head or whole-projection q/k norms) = probes on the inputs."""
    import copy

    name, _, m = pair
    # in float64: the two modes' forwards differ by rounding, which an MoE router's softmax amplifies into the
    # gradients by an amount that depends on the CPU's kernels (Mixtral: 1.2e-5 relative with AVX-512, 2.2e-5 with
    # ATen's default level and MKL at SSE4.2); the identity tested is exact, so float64 bounds it tightly anywhere
    m = copy.deepcopy(m).to(torch.float64)
    ids, mask = batch()
    last = last_index(mask)
    grads = []
    for mode in (True, "projected"):
        out = m.run(ids, mask, receiver_grads=mode, logits_at=last, keep_senders=True)
        metric = out.logits[:, 3].sum() - out.logits[:, 5].pow(2).sum()
        grads.append(m.receiver_input_grads(out, torch.autograd.grad(metric, out.grad_inputs)))
    rel = 1e-9
    for a, b in zip(*grads):
        assert (a - b).abs().max() <= rel * max(1.0, float(a.abs().max())), name


def test_sliding_window_matters():
    """A window of 3 on 9-token prompts: the same weights without it give other logits, in HF and here."""
    hf = hf_model("gemma2", seed=3)
    wide = hf_model("gemma2", seed=3, sliding_window=64)
    wide.load_state_dict(hf.state_dict())
    ids, mask = batch()
    real = mask.bool()
    with torch.no_grad():
        a, b = hf(ids, attention_mask=mask).logits, wide(ids, attention_mask=mask).logits
        ours_a, ours_b = from_hf(hf)(ids, mask), from_hf(wide)(ids, mask)
    assert (a - b)[real].abs().max() > 0.1  # the window changes the model
    assert (a - ours_a)[real].abs().max() <= 1e-5 and (b - ours_b)[real].abs().max() <= 1e-5
    # positions inside the first window see the same keys either way
    assert (a - b)[:, :3].abs().max() <= 1e-5


def _hf_edge_effect(hf, task, head: int, receiver: str) -> np.ndarray:
    """The effect of edge a0.h{head} -> ``receiver`` built in HF alone, on the definition of
    circuitstat.circuits.engine.run: the receiver's input gains N0(S0 with head's o_proj input slice from the
    corrupted run) − N0(S0), N0 layer 0's post_attention_layernorm; nothing else changes."""
    base, E = hf.model, hf.config.head_dim if getattr(hf.config, "head_dim", None) else None
    E = E or hf.config.hidden_size // hf.config.num_attention_heads
    l0, l1 = base.layers[0], base.layers[1]
    ar = torch.arange(task.clean.shape[0])
    got = {}

    def grab(key):
        def hook(module, args, kwargs):
            got[key] = (args[0] if args else kwargs["hidden_states"]).detach()
        return hook

    def run(ids, hooks):
        return hooked_last_logits(hf, task, ids, hooks)

    run(task.corrupted, [(l0.self_attn.o_proj, grab("cf"), True)])
    clean = run(task.clean, [(l0.self_attn.o_proj, grab("mix"), True), (l1, grab("x1"), True)])
    mixed = got["mix"].clone()
    mixed[..., head * E : (head + 1) * E] = got["cf"][..., head * E : (head + 1) * E]
    additive = hf.config.model_type in ("granite", "olmo")  # Llama-style layers: no post-norm
    scale = getattr(hf.config, "residual_multiplier", 1.0)
    with torch.no_grad():  # Granite: the write is residual_multiplier * o_proj(...); OLMo 1: o_proj(...)
        post = (lambda y: y * scale) if additive else l0.post_attention_layernorm
        dw = post(l0.self_attn.o_proj(mixed)) - post(l0.self_attn.o_proj(got["mix"]))

    def add(module, args, kwargs):  # the receiver's input + Δw
        if args:
            return (args[0] + dw, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": kwargs["hidden_states"] + dw}

    mlp_in = lambda layer: (layer.post_attention_layernorm if additive  # noqa: E731 - Llama-style: the MLP's pre-norm
                            else getattr(layer, "pre_feedforward_layernorm", None) or layer.mlp)
    if receiver in ("m0", "m1", "logits"):
        module = {"m0": mlp_in(l0), "m1": mlp_in(l1), "logits": base.norm}[receiver]
        hooks = [(module, add, True)]
    else:  # a1.h{k}<kind>: only head k's q, k or v is recomputed from the patched input
        k, kind = int(receiver[4]), receiver[-2]
        attn = l1.self_attn
        proj = {"q": attn.q_proj, "k": attn.k_proj, "v": attn.v_proj}[kind]
        norm = getattr(attn, f"{kind}_norm", None) if hf.config.model_type == "olmo2" else None
        pre = getattr(l1, "input_layernorm", None)
        with torch.no_grad():
            x = got["x1"] + dw
            new = proj(pre(x) if pre is not None else x)
            new = norm(new) if norm is not None else new
        target = norm if norm is not None else proj

        def swap(module, args, output):
            out = output.clone()
            out[..., k * E : (k + 1) * E] = new[..., k * E : (k + 1) * E]
            return out
        hooks = [(target, swap, False)]
    patched = run(task.clean, hooks)
    return (task.score(patched, indices=ar, clean_logits=clean) - task.score(clean, indices=ar, clean_logits=clean)).numpy()


@pytest.mark.parametrize("family", ["olmo2", "gemma2", "granite", "olmo"])
def test_post_norm_edge_definition_holds_in_hf(family):
    """Edges out of a head whose layer normalises its summed attention output (OLMo 2: also q/k norms over
    the whole projection) score exactly what the HF model gives when only that receiver's input gains the
    head's post-normed write difference (one K/V head per query head, so HF can isolate a k/v receiver).
    Granite: the receiver's input gains residual_multiplier times the head's o_proj difference (the fold that
    keeps its writes additive). OLMo 1: HF clamps the recomputed q, k or v (clip_qkv) itself, as the receiver does."""
    hf = hf_model(family, seed=4, num_key_value_heads=4)
    m = from_hf(hf)
    task = _task()
    scores = attribute(m, task, "exact", progress=False).scores
    g = m.graph
    receivers = ["a1.h2<q>", "a1.h0<k>", "a1.h3<v>", "m0", "m1", "logits"]
    seen = 0.0
    for r in receivers:
        ref = _hf_edge_effect(hf, task, 1, r)
        got = scores[:, g.edge_index(f"a0.h1->{r}")]
        assert np.abs(got - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max()), (family, r, got, ref)
        seen = max(seen, np.abs(ref).max())
    assert seen > 1e-2


def _hf_shared_norm_mlp_edges(hf, task, edges: list[tuple[str, int]]) -> list[np.ndarray]:
    """Effects of edges (sender, MLP layer) built in HF alone: the MLP of that layer reads norm(x + Δz_u) with x
    the layer's input and Δz_u the sender's corrupted-minus-clean write; attention keeps reading norm(x)."""
    from circuitstat.circuits.parity import _DEFAULT_LAYOUT, _LAYOUT, _decoder, _shared_norm

    names = _LAYOUT.get(hf.config.model_type, _DEFAULT_LAYOUT)
    base = _decoder(hf)
    layers = getattr(base, names[0])
    ar = torch.arange(task.clean.shape[0])

    def run(ids, hooks):
        return hooked_last_logits(hf, task, ids, hooks)

    def capture(store):
        keep = lambda key: lambda mod, args, kwargs=None, out=None: store.__setitem__(  # noqa: E731
            key, (args[0] if args else kwargs["hidden_states"]).clone())
        hooks = [(getattr(base, names[3]), lambda mod, args, out: store.__setitem__("input", out.clone()), False)]
        for i, layer in enumerate(layers):
            proj = getattr(getattr(layer, names[1]), names[2])
            hooks += [(layer, keep(f"x{i}"), True), (proj, keep(f"o{i}"), True),
                      (layer.mlp, lambda mod, args, out, i=i: store.__setitem__(f"m{i}", out.clone()), False)]
        return hooks

    cf, cl = {}, {}
    run(task.corrupted, capture(cf))
    clean = run(task.clean, capture(cl))
    E = hf.config.hidden_size // hf.config.num_attention_heads
    out = []
    for sender, layer in edges:
        if sender.startswith("a"):  # a{l}.h{h}: its slice of the output projection's input, projected
            lyr, h = int(sender[1]), int(sender[4])
            W = getattr(getattr(layers[lyr], names[1]), names[2]).weight[:, h * E : (h + 1) * E]
            delta = (cf[f"o{lyr}"] - cl[f"o{lyr}"])[..., h * E : (h + 1) * E] @ W.T
        else:
            delta = cf[sender] - cl[sender]
        norm = _shared_norm(hf, layers[layer])
        x = norm(cl[f"x{layer}"] + delta).detach()
        patched = run(task.clean, [(layers[layer].mlp, lambda mod, args, kwargs, x=x: ((x, *args[1:]), kwargs), True)])
        out.append((task.score(patched, indices=ar, clean_logits=clean)
                    - task.score(clean, indices=ar, clean_logits=clean)).numpy())
    return out


@pytest.mark.parametrize("family", ["phi", "gptj", "cohere"])
def test_shared_norm_mlp_receiver_edges_hold_in_hf(family):
    """Where attention and MLP read one norm, an edge into the MLP receiver changes the MLP's input only: its
    exact score equals HF's logits with only the MLP fed norm(layer input + Δz_u) (input, a head, an earlier MLP)."""
    hf = hf_model(family, seed=4)
    m = from_hf(hf)
    task = _task()
    scores = attribute(m, task, "exact", progress=False).scores
    edges = [("input", 0), ("input", 1), ("a0.h1", 1), ("m0", 1)]
    refs = _hf_shared_norm_mlp_edges(hf, task, edges)
    for (sender, layer), ref in zip(edges, refs):
        got = scores[:, m.graph.edge_index(f"{sender}->m{layer}")]
        assert np.abs(got - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max()), (family, sender, layer, got, ref)
    assert max(np.abs(r).max() for r in refs) > 1e-2


LAYOUTS = {  # the dense families' other layouts (the fixtures have one each)
    "falcon-7b": ("falcon", dict(new_decoder_architecture=False, multi_query=True, parallel_attn=True)),
    "falcon-per-head": ("falcon", dict(new_decoder_architecture=False, multi_query=False, num_kv_heads=4,
                                       parallel_attn=False)),
    "falcon-one-norm": ("falcon", dict(num_ln_in_parallel_attn=1)),
    "stablelm-sequential": ("stablelm", dict(use_parallel_residual=False)),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_dense_family_layouts_equal_hf(layout):
    """Falcon's multi-query [q.. | k | v], per-head [q | k | v] (sequential block) and one-norm parallel layouts,
    StableLM's sequential block: logits, receiver gradients against HF autograd, exact suffixes against full runs."""
    from circuitstat.circuits.parity import check_parity

    family, overrides = LAYOUTS[layout]
    hf = hf_model(family, seed=5, **overrides)
    m = from_hf(hf)
    assert m.cfg.parallel == (layout != "falcon-per-head" and layout != "stablelm-sequential")
    p = check_parity(hf, m, n_inputs=3, length=8, n_edges=12)
    assert p.logits <= 1e-5 and p.gradients <= 1e-5 and p.exact <= 1e-5, (layout, p)


_PROPORTIONAL = {"rope_parameters": {"rope_type": "proportional", "rope_theta": 10000.0}}
REFUSED = {
    "llama3": (_PROPORTIONAL, "rope_parameters.rope_type='proportional'"),
    "qwen2": ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [1, 1, 2]}},
              "rope_parameters.mrope_section"),
    "qwen3": (_PROPORTIONAL, "rope_parameters.rope_type='proportional'"),
    "mistral": (_PROPORTIONAL, "rope_parameters.rope_type='proportional'"),
    "gemma2": ({"use_bidirectional_attention": True}, "use_bidirectional_attention=True"),
    "gemma3": ({"attn_logit_softcapping": 20.0}, "attn_logit_softcapping=20.0"),
    "phi3": ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "partial_rotary_factor": 0.5,
                                  "short_factor": [1.0, 1.0], "long_factor": [1.0, 1.0], "mscale": 2.0}},
             "rope_parameters.mscale"),
    "olmo2": (_PROPORTIONAL, "rope_parameters.rope_type='proportional'"),
    "gemma": ({"use_bidirectional_attention": True}, "use_bidirectional_attention=True"),
    "granite": ({"mlp_bias": True}, "mlp_bias=True"),
    "smollm3": ({"mlp_bias": True}, "mlp_bias=True"),
    "olmo": (_PROPORTIONAL, "rope_parameters.rope_type='proportional'"),
    "starcoder2": (_PROPORTIONAL, "rope_parameters.rope_type='proportional'"),
    "phi": ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5,
                                 "mrope_section": [1, 1]}}, "rope_parameters.mrope_section"),
    "gptj": ({"rotary_dim": 12}, "rotary_dim=12"),  # wider than a head (8)
    "cohere": ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
               "rope_parameters.partial_rotary_factor=0.5"),
    "stablelm": (_PROPORTIONAL, "rope_parameters.rope_type='proportional'"),
    "falcon": ({"alibi": True}, "alibi=True"),
    "mixtral": (_PROPORTIONAL, "rope_parameters.rope_type='proportional'"),
    "qwen2_moe": (_PROPORTIONAL, "rope_parameters.rope_type='proportional'"),
    "qwen3_moe": (_PROPORTIONAL, "rope_parameters.rope_type='proportional'"),
    "olmoe": ({"clip_qkv": 4.0}, "clip_qkv=4.0"),  # OlmoeAttention clamps q, k and v: not reproduced
    "gpt_oss": (_PROPORTIONAL, "rope_parameters.rope_type='proportional'"),
}


@pytest.mark.parametrize("family", list(REFUSED))
def test_model_command_refuses_unreproduced_field_by_name(family, tmp_path):
    from typer.testing import CliRunner

    from circuitstat.pipelines.cli import app

    overrides, words = REFUSED[family]
    hf_model(family, **overrides).save_pretrained(tmp_path / "m")
    res = CliRunner().invoke(app, ["model", str(tmp_path / "m")])
    assert res.exit_code == 2, res.output
    errors = [line for line in res.stderr.splitlines() if line.startswith("error")]  # transformers may warn too
    assert len(errors) == 1 and words in errors[0], res.stderr


def test_token_ablation_removes_the_scaled_embedding():
    """Gemma's input sender is √d · W_E[token]: zero token ablation leaves exactly zero there."""
    from circuitstat.circuits.contributions import ablated_inputs

    m = from_hf(hf_model("gemma2"))
    ids, mask = batch()
    which = torch.zeros_like(ids, dtype=torch.bool)
    which[0, 2] = True
    x = ablated_inputs(m, ids, mask, which, "zero")
    assert torch.equal(x[0, 2], torch.zeros_like(x[0, 2]))
    assert torch.equal(x[0, 1], m.embed(ids, m.positions(mask))[0, 1]) and x[0, 1].abs().max() > 0


@pytest.mark.parametrize("arch", ["qwen3", "mistral", "gemma2", "gemma3_text", "phi3", "olmo2", "gemma", "granite",
                                  "smollm3", "olmo", "starcoder2", "mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss"])
def test_random_specs_have_small_defaults_and_parity(arch):
    """``random:ARCH`` builds a small model of each new family offline (transformers' own config class)."""
    from circuitstat.circuits import load_hf
    from circuitstat.circuits.parity import check_parity

    hf = load_hf(f"random:{arch}?num_hidden_layers=1&vocab_size=128&seed=3")
    m = from_hf(hf)
    assert m.cfg.arch == arch and m.cfg.d_model == 256 and m.cfg.n_layers == 1
    assert check_parity(hf, m, n_inputs=2, length=6, gradients=False).logits <= 1e-5


@pytest.mark.parametrize("arch", ["phi", "gptj", "cohere", "stablelm", "falcon"])
def test_random_specs_of_dense_families_have_parity(arch):
    """``random:ARCH`` for the families of circuitstat.circuits.convert_dense: small defaults (width 256), parity."""
    from circuitstat.circuits import load_hf
    from circuitstat.circuits.parity import check_parity

    hf = load_hf(f"random:{arch}?vocab_size=128&seed=3")
    m = from_hf(hf)
    assert m.cfg.arch == arch and m.cfg.d_model == 256 and m.cfg.n_layers == 4 and m.cfg.parallel != (arch == "stablelm")
    assert check_parity(hf, m, n_inputs=2, length=6, gradients=False).logits <= 1e-5


def test_fused_training_forward_falls_back_where_it_does_not_reproduce_the_family():
    for family in ("gemma2", "olmo2", "qwen3", "mistral", "phi3", "granite", "smollm3", "olmo", "starcoder2"):
        m = from_hf(hf_model(family))
        assert not m.has_fused_forward, family
        ids, _ = batch()
        with torch.no_grad():
            assert torch.equal(m.fused_logits(ids), m(ids))


def test_model_description_names_the_new_families_features():
    """``circuitstat model`` states Granite's multipliers, OLMo 1's clamp and SmolLM3's NoPE layers."""
    from circuitstat.circuits.describe import feature_lines

    text = {f: "\n".join(feature_lines(from_hf(hf_model(f)).cfg)) for f in ("granite", "olmo", "smollm3")}
    assert "attention_multiplier 0.6" in text["granite"] and "embeddings x 3" in text["granite"]
    assert "logits / 2" in text["granite"]
    assert "clamped to ±1.5" in text["olmo"]
    assert "NoPE) on layers [1]" in text["smollm3"] and "sliding window 3 on layers [1]" in text["smollm3"]


def test_model_config_refuses_inconsistent_new_fields():
    """A clamp under a whole-projection q/k norm (whose gradient mapping does not pass it), NoPE flags that do not
    match the layers, and non-positive multipliers are refused by name."""
    from circuitstat.circuits.engine.config import ModelConfig
    from circuitstat.core.errors import InputError

    base = dict(n_layers=2, n_heads=4, d_model=32, d_head=8, d_mlp=64, vocab_size=97, positional="rotary")
    ModelConfig(**base, clip_qkv=1.0, rope_layers=[True, False], attn_multiplier=0.5)  # valid
    with pytest.raises(InputError, match="clip_qkv"):
        ModelConfig(**base, qk_norm="full", clip_qkv=1.0)
    with pytest.raises(InputError, match="rope_layers"):
        ModelConfig(**base, rope_layers=[True])
    with pytest.raises(InputError, match="rope_layers"):
        ModelConfig(**{**base, "positional": "learned"}, rope_layers=[True, False])
    for name in ("attn_multiplier", "embed_multiplier", "logits_scaling", "clip_qkv"):
        with pytest.raises(InputError, match=name):
            ModelConfig(**base, **{name: 0.0})


@pytest.mark.parametrize("family", ["gpt2", "llama3"])
def test_float64_mean_ablation_sums_in_float64(family):
    """Mean ablation's sender means of a float64 model are float64 sums (a float32 sum is ~1e-8 away)."""
    from circuitstat.circuits.ablation import sender_means

    m = from_hf(hf_model_f64(family, seed=2))
    task = _task(n=5)
    means = sender_means(m, task, positional=False, batch_size=2)
    with torch.no_grad():
        z = m.run(task.clean, task.attention_mask, keep_senders=True).senders
    assert means.dtype == z.dtype == torch.float64
    w = task.attention_mask.double()[:, None, :, None]
    ref = (z * w).sum((0, 2)) / w.sum()
    scale = float(ref.abs().max())
    assert float((means[0, :, 0] - ref).abs().max()) <= 1e-14 * scale
    rounded = (z.float() * w.float()).sum((0, 2)) / w.float().sum()  # the float32 sum it replaced
    assert float((rounded.double() - ref).abs().max()) > 1e-10 * scale
