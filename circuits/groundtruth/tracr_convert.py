"""Compile the ground-truth RASP programs with tracr and write circuitstat fixtures (needs the ``tracr`` extra).

``python -m circuitstat.circuits.groundtruth.tracr_convert --out tests/fixtures/groundtruth`` writes, per program of
circuitstat.circuits.groundtruth.programs, a directory with

* ``config.json`` + ``model.safetensors``: the compiled model as a CircuitModel (``CircuitModel.save``);
* ``truth.json``: vocabulary, output classes, residual labels, and the true edge sets in the EAP-IG /
  MIB edge names, derived from tracr's craft graph (below);
* ``reference.safetensors``: tracr's own outputs on fixed random inputs (logits on the output space,
  decoded outputs, final residual stream), so tests compare CircuitModel against tracr without jax.

Conversion (exact, nothing approximated): tracr's assembled model is a pre-norm-free transformer with
one-hot token and position embeddings (a constant ``one`` direction in every token's embedding), attention
logits q·k / sqrt(key_size) with a causal mask, ReLU MLPs, and an unembedding that projects the residual
onto the output space.  CircuitModel runs exactly this with ``norm="none"``, ``act="relu"``,
``positional="learned"``, ``d_head = key_size``.  The one thing it lacks is a separate output vocabulary:
ids ``[0, V_in)`` are tracr's input tokens (their logits carry a -1e4 bias, so a softmax over the
vocabulary is tracr's softmax over its outputs) and ids ``V_in + j`` are tracr's output classes, whose
unembedding columns are tracr's projection onto the output space.  A numerical program gets two output
ids, ``value`` (the output direction) and ``zero`` (a zero column), so logit_diff(value, zero) is the value.

True circuits, from tracr's graph: a sender (the embedding, a head, an MLP) writes the residual
directions of one RASP value (an SOp, or tokens/indices/one for the embedding); a receiver reads the
directions of its craft block's input spaces (a head's query: w_qk's left space, key: its right space,
value: w_ov's input space; an MLP: its first layer's input space; logits: the output space).

* ``structural``: every edge whose sender writes an SOp its receiver reads: the program's whole circuit;
* ``task``: the structural edges that carry the task's counterfactual to where it matters: a direction
  they carry differs between clean and corrupted prompts (on tracr's own forward pass over sampled task
  pairs) at a position the receiver needs, the receiving component's output differs there, a query or
  key edge's head changes its attention pattern there, and the receiver matters for the logits at the
  last position (task_edges; a value edge counts only where the clean pattern attends).  Positions, the
  constant ``one`` and BOS never vary, and a query whose
  token is the same in both prompts at the read-out varies nowhere that matters: such edges are
  structural but not task edges (their patching effect is exactly zero).

Rerunning writes byte-identical weights and references; only the numeric suffixes of tracr's SOp labels in
truth.json (``map_3``) depend on how many programs the process built before (tracr's global id counter).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from .programs import BOS, PROGRAMS, reference_output, sample_pairs

N_REFERENCE = 64  # random inputs whose tracr outputs the fixture records
N_RESIDUAL = 8  # of which the final residual stream is recorded too
N_TASK_PAIRS = 256  # task pairs on which SOp variation is measured
PAD = "compiler_pad"
_MASKED_LOGIT = -1e4


def _require_tracr():
    try:
        import tracr  # noqa: F401
    except ImportError:
        raise SystemExit("the tracr conversion needs the tracr extra: pip install -c constraints.txt -e '.[tracr]'")


def build_program(name: str):
    """(RASP program, vocabulary set) of program ``name`` (values typed as RASP needs them)."""
    from tracr.compiler import lib
    from tracr.rasp import rasp

    if name == "frac_prevs":
        return lib.make_frac_prevs(rasp.tokens == "x"), {"w", "x", "y", "z"}
    if name == "reverse":
        return lib.make_reverse(rasp.tokens), {"a", "b", "c", "d"}
    if name == "hist":
        return lib.make_hist(), {"a", "b", "c"}
    if name == "sort":
        return lib.make_sort_unique(rasp.tokens, rasp.tokens), set(range(1, 7))
    if name == "detect_abc":
        return lib.detect_pattern(rasp.tokens, "abc"), {"a", "b", "c"}
    if name == "dyck":
        return lib.make_shuffle_dyck(["()"]), {"(", ")"}
    raise KeyError(name)


def compile_program(name: str):
    """(assembled model, craft model, rasp graph, sink) of program ``name``, compiled causally.

    The steps of tracr's compile_rasp_to_model, kept apart so that the craft model (the blocks and
    their input/output spaces) is available for deriving the true circuit.
    """
    from tracr.compiler import (basis_inference, craft_graph_to_model, craft_model_to_transformer,
                                expr_to_craft_graph, rasp_to_graph)
    from tracr.craft import bases
    from tracr.rasp import rasp

    program, vocab = build_program(name)
    max_seq_len = PROGRAMS[name].max_seq_len
    extracted = rasp_to_graph.extract_rasp_graph(program)
    graph, sources, sink = extracted.graph, extracted.sources, extracted.sink
    basis_inference.infer_bases(graph, sink, vocab, max_seq_len)
    expr_to_craft_graph.add_craft_components_to_rasp_graph(
        graph, bos_dir=bases.BasisDirection(rasp.tokens.label, BOS), mlp_exactness=100)
    craft = craft_graph_to_model.craft_graph_to_model(graph, sources)
    assembled = craft_model_to_transformer.craft_model_to_transformer(
        craft_model=craft, graph=graph, sink=sink, max_seq_len=max_seq_len, causal=True,
        compiler_bos=BOS, compiler_pad=PAD)
    return assembled, craft, graph, sink


def vocabularies(assembled) -> tuple[list[str], list[str], bool]:
    """(input tokens in id order, output classes in output-space order, numerical output)."""
    enc = assembled.input_encoder.encoding_map
    inputs = [None] * len(enc)
    for tok, i in enc.items():
        inputs[i] = str(tok)
    out = assembled.output_encoder
    if getattr(out, "encoding_map", None) is None:  # numerical output: one direction
        return inputs, ["value", "zero"], True
    outputs = [None] * len(out.encoding_map)
    for val, i in out.encoding_map.items():
        outputs[i] = str(val)
    return inputs, outputs, False


def output_dims(assembled, craft_sink_basis) -> list[int]:
    """Residual indices of the output space, in the output space's basis order (tracr's unembedding)."""
    labels = assembled.residual_labels
    return [labels.index(str(d)) for d in craft_sink_basis]


def to_circuit_model(assembled, out_dims: list[int], n_in: int, n_out: int, numerical: bool):
    """The compiled model as a CircuitModel (float32), weights copied from tracr's parameters."""
    import torch

    from circuitstat.circuits.model import CircuitModel, ModelConfig

    cfg_t = assembled.model_config
    p = {k: {kk: np.asarray(vv, dtype=np.float32) for kk, vv in v.items()} for k, v in assembled.params.items()}
    D = p["token_embed"]["embeddings"].shape[1]
    H, E, L, F = cfg_t.num_heads, cfg_t.key_size, cfg_t.num_layers, cfg_t.mlp_hidden_size
    cfg = ModelConfig(n_layers=L, n_heads=H, d_model=D, d_head=E, d_mlp=F, vocab_size=n_in + n_out,
                      n_ctx=p["pos_embed"]["embeddings"].shape[0], norm="none", positional="learned",
                      mlp="standard", act="relu", arch="tracr")
    state = {k: v.clone() for k, v in CircuitModel(cfg).state_dict().items()}
    t = lambda a: torch.tensor(np.ascontiguousarray(a))  # noqa: E731  (a copy: jax arrays are read-only)
    W_E = np.zeros((n_in + n_out, D), np.float32)
    W_E[:n_in] = p["token_embed"]["embeddings"]
    state["W_E"], state["W_pos"] = t(W_E), t(p["pos_embed"]["embeddings"])
    for layer in range(L):
        a, m = f"transformer/layer_{layer}/attn", f"transformer/layer_{layer}/mlp"
        for ours, theirs in (("Q", "query"), ("K", "key"), ("V", "value")):
            w = p[f"{a}/{theirs}"]["w"].reshape(D, H, E).transpose(1, 0, 2)  # [H, D, E]
            state[f"blocks.{layer}.W_{ours}"] = t(w)
            state[f"blocks.{layer}.b_{ours}"] = t(p[f"{a}/{theirs}"]["b"].reshape(H, E))
        state[f"blocks.{layer}.W_O"] = t(p[f"{a}/linear"]["w"].reshape(H, E, D))
        state[f"blocks.{layer}.b_O"] = t(p[f"{a}/linear"]["b"])
        state[f"blocks.{layer}.W_in"], state[f"blocks.{layer}.b_in"] = t(p[f"{m}/linear_1"]["w"]), t(p[f"{m}/linear_1"]["b"])
        state[f"blocks.{layer}.W_out"], state[f"blocks.{layer}.b_out"] = t(p[f"{m}/linear_2"]["w"]), t(p[f"{m}/linear_2"]["b"])
    W_U = np.zeros((D, n_in + n_out), np.float32)
    b_U = np.zeros(n_in + n_out, np.float32)
    b_U[:n_in] = _MASKED_LOGIT  # input ids are not outputs of a tracr model
    for j, d in enumerate(out_dims):
        W_U[d, n_in + j] = 1.0  # tracr's unembedding is the projection onto the output space
    state["W_U"], state["b_U"] = t(W_U), t(b_U)
    model = CircuitModel.from_state_dict(cfg, state).eval().requires_grad_(False)
    return model


def tracr_forward(assembled, ids: np.ndarray) -> dict[str, np.ndarray]:
    """tracr's own forward pass on token ids [B, T]: final residual, attention logits per layer, decoded."""
    import jax.numpy as jnp

    out = assembled.forward(assembled.params, jnp.asarray(ids))
    to = out.transformer_output
    return {"final": np.asarray(to.output, dtype=np.float32),
            "attn_logits": [np.asarray(x, dtype=np.float32) for x in to.attn_logits],
            "decoded": np.asarray(out.unembedded_output)}


# ---- the true circuit, from tracr's craft graph ------------------------------------------------
def _names(space) -> set[str]:
    """Residual directions of a craft vector space, as tracr labels them (``tokens:a``, ``map_3``, ``one``)."""
    return {str(d) for d in space.basis}


def block_layers(craft) -> list[tuple[int, str]]:
    """(layer, 'attn' | 'mlp') of every craft block, as tracr's assembler places them."""
    from tracr.compiler import assemble

    # tracr 1.0.0's own placement (a private helper; the extra pins the version it comes from)
    _, module_names = assemble._get_model_config_and_module_names(craft)
    return [(int(n.split("_")[1].split("/")[0]), n.rsplit("/", 1)[1]) for n in module_names]


def component_spaces(craft, sink_names: set[str], residual_labels: list[str]
                     ) -> tuple[dict[str, set[str]], dict[str, set[str]], dict[str, str]]:
    """(directions each sender writes, directions each receiver reads, the node each receiver belongs to).

    Senders and receivers are circuitstat graph names (``input``, ``a1.h0``, ``m0``; ``a1.h0<q>``,
    ``m0``, ``logits``).
    """
    from tracr.craft import transformers

    writes = {"input": {lab for lab in residual_labels if lab.split(":", 1)[0] in ("tokens", "indices", "one")}}
    reads: dict[str, set[str]] = {"logits": set(sink_names)}
    node_of = {"logits": "logits"}
    for (layer, kind), block in zip(block_layers(craft), craft.blocks):
        if isinstance(block, transformers.MLP):
            writes[f"m{layer}"] = _names(block.snd.output_space)
            reads[f"m{layer}"] = _names(block.fst.input_space)
            node_of[f"m{layer}"] = f"m{layer}"
            continue
        for h, head in enumerate(block.as_multi().heads()):
            node = f"a{layer}.h{h}"
            writes[node] = _names(head.w_ov.output_space)
            for r, space in (("q", head.w_qk.left_space), ("k", head.w_qk.right_space), ("v", head.w_ov.input_space)):
                reads[f"{node}<{r}>"] = _names(space)
                node_of[f"{node}<{r}>"] = node
    return writes, reads, node_of


def structural_edges(graph, writes: dict[str, set[str]], reads: dict[str, set[str]]) -> dict[str, list[str]]:
    """{edge name: residual directions it carries} for every graph edge whose sender writes what its receiver reads."""
    out = {}
    for name in graph.edge_names:
        u, v = name.split("->")
        carried = writes.get(u, set()) & reads.get(v, set())
        if carried:
            out[name] = sorted(carried)
    return out


def _patterns(logits: np.ndarray, T: int) -> np.ndarray:
    """Causal softmax attention patterns from tracr's attention logits [B, H, T, T]."""
    causal = np.tril(np.ones((T, T), dtype=bool))
    x = np.where(causal, logits.astype(np.float64), -np.inf)
    x = np.exp(x - x.max(-1, keepdims=True))
    return x / x.sum(-1, keepdims=True)


def variation(assembled, name: str, tokens_of: dict[str, int]) -> dict[str, Any]:
    """What the task's counterfactual changes on tracr's forward pass over N_TASK_PAIRS sampled pairs.

    ``diff`` [B, T, D]: where each residual direction differs between clean and corrupted prompts (per
    pair and position); ``head_pos``: query positions where each head's attention pattern differs;
    ``attends`` [B, T, T] per head: where the clean pattern puts weight (> 1e-3); ``T``: prompt length.
    """
    pairs = sample_pairs(name, N_TASK_PAIRS, seed=12345)
    enc = lambda toks: [tokens_of[BOS]] + [tokens_of[t] for t in toks]  # noqa: E731
    clean = np.asarray([enc(c) for c, _, _, _ in pairs])
    corr = np.asarray([enc(x) for _, x, _, _ in pairs])
    a, b = tracr_forward(assembled, clean), tracr_forward(assembled, corr)
    T = clean.shape[1]
    out: dict[str, Any] = {"diff": np.abs(a["final"] - b["final"]) > 1e-4, "head_pos": {}, "attends": {}, "T": T,
                           "labels": list(assembled.residual_labels)}
    for layer, (la, lb) in enumerate(zip(a["attn_logits"], b["attn_logits"])):
        pa, pb = _patterns(la, T), _patterns(lb, T)
        d = np.abs(pa - pb).max(axis=(0, 3))  # [H, query position]
        for h in range(d.shape[0]):
            out["head_pos"][f"a{layer}.h{h}"] = set(np.flatnonzero(d[h] > 1e-4).tolist())
            out["attends"][f"a{layer}.h{h}"] = pa[:, h] > 1e-3
    return out


def _receiver_order(node: str) -> tuple[int, int]:
    """Sort key putting later components first: logits, then per layer (descending) the MLP, then heads."""
    if node == "logits":
        return (1 << 30, 0)
    if node.startswith("m"):
        return (int(node[1:]), 1)
    return (int(node[1:].split(".")[0]), 0)


def _varies_at(var: dict[str, Any], directions: list[str], positions: set[int]) -> bool:
    """Whether any of ``directions`` differs between the prompts of some pair at one of ``positions``."""
    cols = [var["labels"].index(d) for d in directions]
    rows = sorted(positions)
    return bool(rows) and bool(var["diff"][:, rows][:, :, cols].any())


def _attended(var: dict[str, Any], node: str, where: set[int], directions: list[str]) -> tuple[bool, set[int]]:
    """(whether some pair's directions differ at a key its clean pattern attends from a query in ``where``,
    the key positions attended from there)."""
    att = var["attends"][node][:, sorted(where)].any(axis=1)  # [B, key position]
    cols = [var["labels"].index(d) for d in directions]
    hit = (att & var["diff"][:, :, cols].any(axis=2)).any()
    return bool(hit), set(np.flatnonzero(att.any(axis=0)).tolist())


def task_edges(structural: dict[str, list[str]], writes: dict[str, set[str]], node_of: dict[str, str],
               var: dict[str, Any]) -> list[str]:
    """The structural edges that carry the task's counterfactual to where it matters (see the module docstring).

    Backwards from the logits (read at the last position): a component matters at a set of positions; an
    edge into it is a task edge when a direction it carries varies where its receiver needs it and the
    component's own output varies where it matters.  A query or MLP input is needed where the component
    matters (a query edge also needs the head's pattern to change there); a key input at every position up
    to the last of those (the pattern must change too); a value input at the keys the clean pattern attends
    from there, in the same pair.  The sender then matters at those positions.
    """
    T = var["T"]
    relevant: dict[str, set[int]] = {"logits": {T - 1}}
    into: dict[str, list[tuple[str, str, str]]] = {}
    for name in structural:
        u, v = name.split("->")
        into.setdefault(node_of[v], []).append((name, u, v))
    found = []
    for node in sorted(into, key=_receiver_order, reverse=True):
        where = relevant.get(node, set())
        if not where or (node != "logits" and not _varies_at(var, sorted(writes[node]), where)):
            continue  # nothing downstream reads this component where the task changes it
        for name, u, v in into[node]:
            carried = structural[name]
            if v.endswith("<v>"):
                hit, need = _attended(var, node, where, carried)
            else:
                need = set(range(max(where) + 1)) if v.endswith("<k>") else where
                hit = _varies_at(var, carried, need)
                if v.endswith(("<q>", "<k>")):
                    hit = hit and bool(var["head_pos"].get(node, set()) & where)
            if hit:
                found.append(name)
                relevant.setdefault(u, set()).update(need)
    return sorted(found)


# ---- checks and fixtures ---------------------------------------------------------------------
def _same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    try:
        return abs(float(a) - float(b)) < 1e-5
    except ValueError:
        return str(a) == str(b)


def check_readout(name: str, program, assembled, tokens_of: dict[str, int], outputs: list[str]) -> int:
    """Number of task prompts checked: the pure-Python read-out equals tracr's causal RASP evaluation and
    the compiled model's decoded output at the last position (SystemExit naming the first mismatch)."""
    from tracr.rasp import causal_eval

    spec = PROGRAMS[name]
    typed = (lambda t: int(t)) if name == "sort" else (lambda t: t)  # noqa: E731
    prompts = [toks for clean, corrupted, _, _ in sample_pairs(name, 64, seed=7) for toks in (clean, corrupted)]
    decoded = tracr_forward(assembled, np.asarray([[tokens_of[BOS]] + [tokens_of[t] for t in toks]
                                                   for toks in prompts]))["decoded"][:, -1]
    for toks, got in zip(prompts, decoded):
        want = reference_output(name, toks)
        rasp_out = causal_eval.evaluate(program, [typed(t) for t in toks])[-1]
        if not _same(want, rasp_out):
            raise SystemExit(f"{name}: read-out {want!r} but tracr's causal RASP gives {rasp_out!r} on {toks}")
        if want is not None:
            got = float(got) if spec.numerical else outputs[int(got)]
            if not _same(want, got):
                raise SystemExit(f"{name}: read-out {want!r} but the compiled model decodes {got!r} on {toks}")
    n = len(prompts)
    return n


def reference_io(assembled, out_dims: list[int], numerical: bool, tokens_of: dict[str, int], vocab: tuple[str, ...],
                 T: int, seed: int = 0) -> dict[str, np.ndarray]:
    """tracr's outputs on N_REFERENCE uniformly random prompts ([BOS] + T tokens of the vocabulary)."""
    rng = np.random.default_rng(seed)
    ids = np.asarray([[tokens_of[BOS]] + [tokens_of[str(t)] for t in rng.choice(list(vocab), size=T)]
                      for _ in range(N_REFERENCE)], dtype=np.int64)
    out = tracr_forward(assembled, ids)
    logits = out["final"][..., out_dims]
    if numerical:
        logits = np.concatenate([logits, np.zeros_like(logits)], axis=-1)  # value, zero
    return {"input_ids": ids, "logits": logits.astype(np.float32),
            "decoded": out["decoded"].astype(np.float32), "final_resid": out["final"][:N_RESIDUAL]}


def write_fixture(name: str, out: Path) -> dict:
    """Compile program ``name``, convert it, derive its truth and write its fixture directory; returns truth."""
    import torch
    from safetensors.numpy import save_file
    from tracr.craft import bases

    _require_tracr()
    spec = PROGRAMS[name]
    assembled, craft, rgraph, sink = compile_program(name)
    from tracr.compiler import nodes

    inputs, outputs, numerical = vocabularies(assembled)
    if numerical != spec.numerical:
        raise SystemExit(f"{name}: tracr says numerical={numerical}, programs.py says {spec.numerical}")
    tokens_of = {t: i for i, t in enumerate(inputs)}
    out_space = bases.VectorSpaceWithBasis(sink[nodes.OUTPUT_BASIS])
    out_dims = output_dims(assembled, out_space.basis)
    model = to_circuit_model(assembled, out_dims, len(inputs), len(outputs), numerical)
    ref = reference_io(assembled, out_dims, numerical, tokens_of, spec.vocab, spec.max_seq_len)
    with torch.no_grad():
        ours = model(torch.as_tensor(ref["input_ids"]))[..., len(inputs):].numpy()
    err = float(np.abs(ours - ref["logits"]).max())
    if err > 1e-4:
        raise SystemExit(f"{name}: converted logits differ from tracr's by {err:.3g}")
    program = build_program(name)[0]
    n_checked = check_readout(name, program, assembled, tokens_of, outputs)
    writes, reads, node_of = component_spaces(craft, _names(out_space), list(assembled.residual_labels))
    structural = structural_edges(model.graph, writes, reads)
    var = variation(assembled, name, tokens_of)
    task = task_edges(structural, writes, node_of, var)
    truth = {
        "program": name, "describe": spec.describe, "max_seq_len": spec.max_seq_len, "numerical": numerical,
        "input_tokens": inputs, "output_classes": outputs, "bos": BOS, "pad": PAD,
        "residual_labels": list(assembled.residual_labels),
        "writes": {k: sorted(v) for k, v in writes.items()}, "reads": {k: sorted(v) for k, v in reads.items()},
        "structural": structural, "task": task,
        "varying": {d: np.flatnonzero(var["diff"][:, :, i].any(0)).tolist() for i, d in enumerate(var["labels"])
                    if var["diff"][:, :, i].any()},
        "varying_heads": {h: sorted(p) for h, p in var["head_pos"].items() if p},
        "checks": {"max_logit_error_vs_tracr": err, "readout_prompts_checked": n_checked},
        "tracr": "tracr-pypi 1.0.0, causal=True, mlp_exactness=100",
    }
    d = out / name
    model.save(d, meta={"groundtruth": "tracr", "program": name})
    (d / "truth.json").write_text(json.dumps(truth, indent=1, sort_keys=True) + "\n")
    save_file({k: np.ascontiguousarray(v) for k, v in ref.items()}, str(d / "reference.safetensors"))
    return truth


def main(argv: list[str] | None = None) -> None:
    """Write the fixtures of the programs named on the command line (default: all)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--out", type=Path, default=Path("tests/fixtures/groundtruth"))
    ap.add_argument("programs", nargs="*", default=sorted(PROGRAMS))
    args = ap.parse_args(argv)
    _require_tracr()
    for name in args.programs:
        t = write_fixture(name, args.out)
        print(f"{name}: {len(t['structural'])} structural edges, {len(t['task'])} task edges, "
              f"max |logit - tracr| = {t['checks']['max_logit_error_vs_tracr']:.2e}")


if __name__ == "__main__":
    main()
