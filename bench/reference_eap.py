"""circuitstat's EAP against the EAP-IG reference algorithm on TransformerLens hooks (not a test).

The EAP-IG library (github.com/hannamw/EAP-IG) is not a package, so its EAP is re-implemented
here as it stands in src/eap/attribute.py (``get_scores_eap``, patching) and src/eap/utils.py
(``make_hooks_and_matrices``), on a TransformerLens 3.9 HookedTransformer set up as its notebooks
do (``use_split_qkv_input``, ``use_attn_result``, ``use_hook_mlp_in``; no LayerNorm folding or
centring). It needs the optional extra: ``pip install -c constraints.txt -e ".[reference]"``.

1. Correctness: the reference's score of every edge against the mean over examples of
   ``attribute(model, task, "eap")``, on a small random GPT-2 and on the bench model.
2. In-process: CPU time of the two attributions alone, one thread, best of 3 (models loaded).
3. Whole process: a fresh process per side that loads the cached model, attributes and writes the
   scores (circuitstat: ``circuitstat attribute``, as bench/process.py times it; the reference: this
   script's ``--child``, which loads the HF directory, converts it to a HookedTransformer, runs the
   hooks and ``torch.save``s the score matrix). Rounds interleaved, medians printed.

Both sides attribute the same induction prompts (GPT-2-small shape, random weights, 24 prompts).
On a CPU most of the reference's time goes to TransformerLens 3.9's ``use_attn_result`` (a
broadcast product per head, see HEAD_OUTPUTS); ``--head-outputs z`` times the same algorithm with
each head's output computed from ``hook_z`` instead, a faster reference than EAP-IG's own hooks.

    python bench/reference_eap.py [--n 24] [--repeats 3] [--head-outputs result|z] [--cache DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
from functools import partial
from pathlib import Path

import torch

INSTALL = 'pip install -c constraints.txt -e ".[reference]"'


# -- the reference ------------------------------------------------------------------------------

HEAD_OUTPUTS = {
    # what EAP-IG does: TransformerLens's use_attn_result, whose per-head W_O product TransformerLens
    # 3.9 computes as a broadcast [batch, pos, head, d_head, d_model] product summed over d_head
    "result": "EAP-IG's hooks (use_attn_result)",
    # the same scores with the per-head outputs z_h W_O[h] computed in a hook on hook_z (one einsum)
    "z": "head outputs from hook_z",
}


def hooked_from_hf(hf, head_outputs: str = "result"):
    """A HookedTransformer with ``hf``'s GPT-2 weights, hooked as EAP-IG needs (fp32, unfolded);
    ``head_outputs="z"`` leaves use_attn_result off (see HEAD_OUTPUTS)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights

    c = hf.config
    # TransformerLens's own GPT2LMHeadModel config (loading_from_pretrained.convert_hf_model_config);
    # its local-directory path reads ``n_ctx``, which transformers 5's GPT2Config no longer has.
    cfg = HookedTransformerConfig(
        d_model=c.n_embd, d_head=c.n_embd // c.n_head, n_heads=c.n_head, d_mlp=c.n_inner or 4 * c.n_embd,
        n_layers=c.n_layer, n_ctx=c.n_positions, eps=c.layer_norm_epsilon, d_vocab=c.vocab_size,
        act_fn=c.activation_function, use_attn_scale=c.scale_attn_weights, use_local_attn=False,
        scale_attn_by_inverse_layer_idx=c.scale_attn_by_inverse_layer_idx, normalization_type="LN",
        original_architecture="GPT2LMHeadModel", device="cpu", dtype=torch.float32)
    model = HookedTransformer(cfg, tokenizer=None, move_to_device=False)
    # As the EAP-IG notebooks load models: no folding or centring, so hooks see the HF activations.
    model.load_and_process_state_dict(convert_gpt2_weights(hf, cfg), fold_ln=False, center_writing_weights=False,
                                      center_unembed=False)
    model.cfg.use_split_qkv_input = True
    model.cfg.use_attn_result = head_outputs == "result"
    model.cfg.use_hook_mlp_in = True
    return model.eval()


def reference_eap(model, clean, corrupted, mask, answer, wrong, batch_size: int) -> torch.Tensor:
    """EAP-IG's ``get_scores_eap`` (patching): the [n_forward, n_backward] mean score matrix (head
    outputs from hook_result, or from hook_z when the model has use_attn_result off)."""
    from einops import einsum

    L, H, D = model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_model
    n_forward, n_backward = 1 + L * (H + 1), L * (3 * H + 1) + 1  # Graph._n_forward / _n_backward
    scores = torch.zeros(n_forward, n_backward, dtype=model.cfg.dtype)
    for start in range(0, len(clean), batch_size):
        b = slice(start, start + batch_size)
        tokens, attention_mask = clean[b], mask[b]
        input_lengths = attention_mask.sum(1)
        diff = torch.zeros(len(tokens), tokens.shape[1], n_forward, D, dtype=model.cfg.dtype)

        def activation_hook(index, activations, hook, add=True, w_o=None):  # utils.make_hooks_and_matrices
            acts = activations.detach()
            if w_o is not None:  # hook_z: each head's output, as hook_result would hold it (no b_O)
                acts = einsum(acts, w_o.detach(), "batch pos head d_head, head d_head d_model -> batch pos head d_model")
            if add:
                diff[:, :, index] += acts
            else:
                diff[:, :, index] -= acts

        def gradient_hook(prev_index, bwd_index, gradients, hook):
            grads = gradients.detach()
            if grads.ndim == 3:
                grads = grads.unsqueeze(2)
            s = einsum(diff[:, :, :prev_index], grads, "batch pos forward hidden, batch pos backward hidden -> forward backward")
            scores[:prev_index, bwd_index] += s.squeeze(1)

        # (out hook, forward index) of every sender; (in hook, prev index, backward index) of every receiver
        senders, receivers = [("hook_embed", 0, None)], []
        for layer in range(L):
            i = 1 + layer * (H + 1)
            heads = (f"blocks.{layer}.attn.hook_result", slice(i, i + H), None) if model.cfg.use_attn_result else \
                (f"blocks.{layer}.attn.hook_z", slice(i, i + H), model.blocks[layer].attn.W_O)
            senders += [heads, (f"blocks.{layer}.hook_mlp_out", i + H, None)]
            j = layer * (3 * H + 1)
            receivers += [(f"blocks.{layer}.hook_{x}_input", i, slice(j + k * H, j + (k + 1) * H)) for k, x in enumerate("qkv")]
            receivers.append((f"blocks.{layer}.hook_mlp_in", i + H, j + 3 * H))  # sequential attn -> mlp
        receivers.append((f"blocks.{L - 1}.hook_resid_post", n_forward, -1))  # the logits node
        fwd_corrupted = [(name, partial(activation_hook, idx, w_o=w)) for name, idx, w in senders]
        fwd_clean = [(name, partial(activation_hook, idx, add=False, w_o=w)) for name, idx, w in senders]
        bwd = [(name, partial(gradient_hook, prev, idx)) for name, prev, idx in receivers]

        with torch.inference_mode():
            with model.hooks(fwd_corrupted):
                model(corrupted[b], attention_mask=attention_mask)
        with model.hooks(fwd_hooks=fwd_clean, bwd_hooks=bwd):
            logits = model(tokens, attention_mask=attention_mask)
            # logit difference at the last real token, summed over the batch: scores / N is then the
            # mean per-example score (the notebooks' metric takes the batch mean, then divide by N too)
            last = logits[torch.arange(len(tokens)), input_lengths - 1]
            metric = (last.gather(1, answer[b, None]) - last.gather(1, wrong[b, None])).sum()
            metric.backward()
    return scores / len(clean)


def reference_index(names: list[str], n_layers: int, n_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(forward, backward) indices into the reference score matrix of each ``sender->receiver`` name,
    by EAP-IG's Graph._forward_index / _backward_index."""
    H = n_heads

    def fwd(node: str) -> int:
        if node == "input":
            return 0
        if node[0] == "m":
            return 1 + int(node[1:]) * (H + 1) + H
        layer, head = node.split(".")
        return 1 + int(layer[1:]) * (H + 1) + int(head[1:])

    def bwd(node: str) -> int:
        if node == "logits":
            return n_layers * (3 * H + 1)
        if node[0] == "m":
            return int(node[1:]) * (3 * H + 1) + 3 * H
        layer, head = node[:-3].split(".")
        return int(layer[1:]) * (3 * H + 1) + "qkv".index(node[-2]) * H + int(head[1:])

    pairs = [name.split("->") for name in names]
    return torch.tensor([fwd(u) for u, _ in pairs]), torch.tensor([bwd(v) for _, v in pairs])


def compare(model, hooked, task, batch_size: int) -> dict:
    """Pearson, max |diff| / max |reference| and edge count of circuitstat's mean EAP scores against
    the reference's, edge for edge."""
    from circuitstat.circuits.attribution import attribute

    ours = torch.as_tensor(attribute(model, task, "eap", batch_size=batch_size, progress=False).scores).double().mean(0)
    ref_matrix = reference_eap(hooked, task.clean, task.corrupted, task.attention_mask, task.answer,
                               task.wrong_answer, batch_size)
    f, b = reference_index(model.graph.edge_names, model.cfg.n_layers, model.cfg.n_heads)
    ref = ref_matrix[f, b].double()
    pearson = float(torch.corrcoef(torch.stack([ours, ref]))[0, 1])
    return {"edges": len(ref), "pearson": pearson, "max_rel_diff": float((ours - ref).abs().max() / ref.abs().max()),
            "max_abs_diff": float((ours - ref).abs().max())}


# -- the two whole processes --------------------------------------------------------------------

def child(hf_dir: str, task_file: str, out: str, batch_size: int, head_outputs: str) -> None:
    """The reference as a user runs it: load the HF directory, convert, attribute, save the scores."""
    import transformers

    torch.set_num_threads(1)
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation="eager").eval()
    hooked = hooked_from_hf(hf, head_outputs)
    del hf
    t = torch.load(task_file)
    torch.save(reference_eap(hooked, t["clean"], t["corrupted"], t["mask"], t["answer"], t["wrong"], batch_size), out)


def time_in_process(model, hooked, task, batch_size: int) -> tuple[float, float]:
    """Best-of-3 CPU seconds of (circuitstat's EAP, the reference's) on the loaded models."""
    from attribution import _best  # bench/attribution.py; it sets the thread count on import

    from circuitstat.circuits.attribution import attribute

    torch.set_num_threads(1)
    ours = _best(lambda: attribute(model, task, "eap", batch_size=batch_size, progress=False))
    ref = _best(lambda: reference_eap(hooked, task.clean, task.corrupted, task.attention_mask, task.answer,
                                      task.wrong_answer, batch_size))
    return ours, ref


def _med(xs: list, i: int) -> float:
    return statistics.median(x[i] for x in xs)


def _correctness_line(what: str, c: dict) -> str:
    return (f"correctness, {what}: {c['edges']} edges, Pearson {c['pearson']:.12f} (1 - r = {1 - c['pearson']:.1e}), "
            f"max |diff| / max |ref| {c['max_rel_diff']:.1e} (max |diff| {c['max_abs_diff']:.1e})")


def whole_process(hf_dir: Path, own_dir: Path, task, args) -> dict[str, list]:
    """{side: [(wall, CPU) seconds per round]} of the two commands and the reference's process."""
    from process import wall

    ref_side = f"reference ({args.head_outputs}), HF directory"
    whole = {"circuitstat, HF directory": [], "circuitstat, circuitstat directory": [], ref_side: []}
    with tempfile.TemporaryDirectory() as tmp:
        task_file = Path(tmp) / "task.pt"
        torch.save({"clean": task.clean, "corrupted": task.corrupted, "mask": task.attention_mask,
                    "answer": task.answer, "wrong": task.wrong_answer}, task_file)
        for r in range(args.repeats):  # interleaved, so drift of a shared machine hits every side alike
            for form, d in (("HF directory", hf_dir), ("circuitstat directory", own_dir)):
                whole[f"circuitstat, {form}"].append(wall([
                    sys.executable, "-m", "circuitstat.pipelines.cli", "attribute", "--model", str(d), "--method", "eap",
                    "--n", str(args.n), "--batch-size", str(args.batch_size), "--out", str(Path(tmp) / f"run-{r}-{form[:2]}")]))
            whole[ref_side].append(wall([sys.executable, __file__, "--child", str(hf_dir), str(task_file),
                                         str(Path(tmp) / f"ref-{r}.pt"), str(args.batch_size), args.head_outputs]))
    return whole


def main(argv: list[str] | None = None) -> None:
    """Print the correctness, in-process and whole-process lines (or one line saying they are skipped)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=24)
    ap.add_argument("--batch-size", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--head-outputs", choices=sorted(HEAD_OUTPUTS), default="result",
                    help="how the timed reference gets each head's output (see HEAD_OUTPUTS)")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "circuitstat-bench" / "gpt2-small-random")
    args = ap.parse_args(argv)
    if importlib.util.find_spec("transformer_lens") is None:
        print(f"EAP-IG reference comparison skipped: TransformerLens is not installed ({INSTALL})")
        return
    import transformers
    from process import cached_models

    from circuitstat.circuits import load_model
    from circuitstat.circuits.loading import random_hf_model
    from circuitstat.pipelines.build import build_task

    torch.set_num_threads(1)
    small = "random:gpt2?n_layer=4&n_head=4&n_embd=64&vocab_size=512&n_positions=64&seed=1"
    hf, model = random_hf_model(small), load_model(small)
    for mode in HEAD_OUTPUTS:
        c = compare(model, hooked_from_hf(hf, mode), build_task(model, "induction", n=10, seed=1, seq_len=8), batch_size=4)
        print(_correctness_line(f"{small}, 10 prompts in batches of 4, reference with {HEAD_OUTPUTS[mode]}", c))

    models = cached_models(args.cache)
    hf_dir, own_dir = models["HF directory"], models["circuitstat directory"]
    model = load_model(str(own_dir))
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation="eager").eval()
    hooked = hooked_from_hf(hf, args.head_outputs)
    del hf
    task = build_task(model, "induction", n=args.n, seed=0)
    label = f"reference with {HEAD_OUTPUTS[args.head_outputs]}"
    print(_correctness_line(f"GPT-2-small shape, {args.n} prompts in one batch of {args.batch_size}, {label}",
                            compare(model, hooked, task, args.batch_size)))

    t_ours, t_ref = time_in_process(model, hooked, task, args.batch_size)
    del hooked  # its weights are not needed by the whole-process rounds
    print(f"in-process EAP, GPT-2-small shape ({model.graph.n_edges} edges), {args.n} induction prompts, one thread, "
          f"best of 3 CPU s: circuitstat {t_ours:.2f} s, {label} {t_ref:.2f} s = {t_ref / t_ours:.1f}x faster")

    whole = whole_process(hf_dir, own_dir, task, args)
    ref = whole[f"reference ({args.head_outputs}), HF directory"]
    print(f"whole process (load the cached model, attribute, write the scores), one thread, median of "
          f"{args.repeats} interleaved rounds, wall s (CPU s):")
    for side, xs in whole.items():
        ratio = "" if side.startswith("reference") else \
            f"   reference / this: {_med(ref, 0) / _med(xs, 0):.1f}x wall, {_med(ref, 1) / _med(xs, 1):.1f}x CPU"
        print(f"  {side:<36} {_med(xs, 0):6.2f} ({_med(xs, 1):6.2f}){ratio}")
    print("[aim >= 10x in-process, >= 5x whole process]")


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6])
        sys.exit(0)
    main()
