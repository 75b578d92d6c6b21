"""The default model zoo: small models trained on the standard-library corpus, cached by content.

``default_zoo()`` returns the directories of 10 models: 5 seeds of a 2-layer attention-only model
and 5 seeds of a 2-layer model with MLPs (d_model 64, 4 heads, 64-token context, a 300-token BPE).
They are trained once (about 12 minutes on 2 otherwise idle CPU cores)
and cached per recipe under ``$CIRCUITSTAT_CACHE/zoo/<recipe>-<key>`` (default
``~/.cache/circuitstat``), where the key hashes the recipe, the corpus' content hash and everything
else that decides the weights (:func:`weight_environment`: the version of the training code path, the
torch, numpy and tokenizers versions, the CPU's kernel level and the device), so a new Python version
(a different standard library), a changed recipe, a changed training path or library, another CPU
kernel level or a GPU trains new models and an unchanged one is reused. ``circuitstat zoo list``
shows each model's weight hash, so two builds can be compared digit for digit. ``zoo:RECIPE/seed-S`` names such a model wherever a model source goes.

:func:`induction_metrics` measures what the zoo is for: on repeated random tokens, the loss on the
second repeat against the first, and every head's induction score (the attention from each token
of the second repeat to the token after its earlier occurrence) and previous-token score.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from circuitstat.core.errors import InputError
from circuitstat.pipelines.training import TrainRecipe, cache_dir, prepare_data, train_models

__all__ = [
    "ZOO_RECIPES",
    "ZOO_SEEDS",
    "recipe_key",
    "recipe_dir",
    "weight_environment",
    "model_weight_hash",
    "TRAINING_PATH_VERSION",
    "default_zoo",
    "induction_metrics",
    "frequent_tokens",
    "zoo_report",
]

# Sized for 2 CPU cores. Plain training at this size shows no induction heads after 5000 steps;
# four choices make them form within the budget: weights initialised at 1/sqrt(d_model) (0.125)
# instead of GPT-2's 0.02, a constant learning rate of 1e-2 after warmup, repeat_fraction=1.0
# (every training sequence has one span of its own corpus text copied later in it; see
# circuitstat.pipelines.training.data._repeat_spans), and 64-token sequences in batches of 32 rather than 128 in
# batches of 16 (same tokens per step, cheaper attention, and in trials the induction score passed
# 0.6 after 1500 steps instead of 2500). Induction forms at a seed-dependent step (one trial seed
# was at 0.47 after 2000 steps), so both recipes train well past it. The MLP model uses ReLU and
# d_mlp = 2 d_model, cheaper on CPU.
_BASE = TrainRecipe(
    n_layers=2, n_heads=4, d_model=64, n_ctx=64, vocab_size=300, tokenizer="bpe", corpus="stdlib",
    optimizer="adamw", lr=1e-2, min_lr_ratio=1.0, weight_decay=0.01, warmup_steps=50, batch_size=32,
    steps=3500, eval_every=500, eval_batches=8, checkpoint_every=500, threads=1, repeat_fraction=1.0,
    init_std=0.125,
)
ZOO_RECIPES: dict[str, TrainRecipe] = {
    "attn-only-2l": _BASE.replace(attn_only=True),
    "mlp-2l": _BASE.replace(attn_only=False, d_mlp=128, act="relu", steps=3000),
}
ZOO_SEEDS: tuple[int, ...] = (0, 1, 2, 3, 4)

# The version of the training code path (initialisation, the fused forward, loss, optimizer, data order, tokenizer
# training): bump it with any change that changes trained weights. tests/pipelines/test_zoo_key.py trains a few
# steps and compares the weights' fingerprint with the one recorded for this version (within a tolerance that CPU
# kernel levels stay inside), so such a change fails there until it is bumped. Checked unchanged (bit-identical weights after 40 steps of mlp-2l seed 1, identical
# tokenizer, token streams and induction prompts) from the recipe's commit 3b352a7 to this one.
TRAINING_PATH_VERSION = 1


def weight_environment(device: str = "cpu") -> dict:
    """Return what besides the recipe and the corpus decides a zoo model's weights: the training path's version,
    the torch, numpy and tokenizers versions, torch's CPU kernel level (AVX2, AVX512...: matmuls round
    differently, and 3,000 steps amplify it) and the device type."""
    import tokenizers
    import torch

    return {"training_path": TRAINING_PATH_VERSION, "torch": torch.__version__, "numpy": np.__version__,
            "tokenizers": tokenizers.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "device": str(device).split(":", 1)[0]}


def recipe_key(recipe: TrainRecipe, corpus_hash: str | None = None, device: str = "cpu") -> str:
    """Content key of one recipe's models: the recipe, the corpus' content hash and :func:`weight_environment`."""
    from circuitstat.circuits.corpus import load_corpus

    if corpus_hash is None:
        corpus_hash = load_corpus(recipe.corpus).content_hash
    doc = {"recipe": recipe.to_dict(), "corpus": corpus_hash, "version": 3, "environment": weight_environment(device)}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def recipe_dir(name: str, recipe: TrainRecipe | None = None, cache: str | os.PathLike | None = None,
               device: str = "cpu") -> Path:
    """Where the zoo keeps recipe ``name``'s models trained on ``device``: ``<cache>/zoo/<name>-<recipe_key>``."""
    if recipe is None:
        if name not in ZOO_RECIPES:
            raise InputError(f"no zoo recipe {name!r}; recipes: {', '.join(ZOO_RECIPES)}")
        recipe = ZOO_RECIPES[name]
    return (Path(cache) if cache else cache_dir()) / "zoo" / f"{name}-{recipe_key(recipe, device=device)}"


def default_zoo(n_jobs: int = 2, cache: str | os.PathLike | None = None, progress: bool = True,
                recipes: dict[str, TrainRecipe] | None = None, seeds: Sequence[int] = ZOO_SEEDS,
                device: str = "cpu") -> list[Path]:
    """Directories of the zoo's models, training the missing ones (cached by content after).

    Order: for each recipe (default ``attn-only-2l``, then ``mlp-2l``), seeds 0..4. Each recipe
    is cached on its own (``recipe_dir``), so asking for one recipe trains only that one. Each
    model loads with ``circuits.load_model``. An interrupted build resumes where it stopped.
    """
    from circuitstat.pipelines.training import TrainJob, run_train_jobs

    recipes = recipes or ZOO_RECIPES
    roots = {name: recipe_dir(name, r, cache, device) for name, r in recipes.items()}
    paths = [roots[name] / f"seed-{s}" for name in recipes for s in seeds]
    if all((p / "model.safetensors").exists() for p in paths):
        return paths
    t0 = time.time()
    data = {name: prepare_data(r, cache=cache) for name, r in recipes.items()}
    # One pool over all (recipe, seed) jobs, so the workers stay busy across recipes.
    run_train_jobs([TrainJob(recipes[name], s, roots[name] / f"seed-{s}", data[name]) for name in recipes
                    for s in seeds], n_jobs, device=device, progress=progress)
    seconds = round(time.time() - t0, 1)
    for name, r in recipes.items():  # writes recipe.json per recipe (models are complete: no training)
        train_models(r, seeds, roots[name], n_jobs=1, progress=False, cache=cache)
        (roots[name] / "zoo.json").write_text(json.dumps({
            "recipe": name, "key": roots[name].name, "environment": weight_environment(device),
            "weight_hashes": {f"seed-{s}": model_weight_hash(roots[name] / f"seed-{s}") for s in seeds},
            "seeds": list(seeds), "build_seconds_all_recipes": seconds,
            "recipes_built_together": sorted(recipes), "n_jobs": n_jobs}, indent=2))
    return paths


def model_weight_hash(path: str | os.PathLike) -> str | None:
    """Return the sha256 of a zoo model's weights as `CircuitModel.weight_hash` records it in every run's
    provenance (None when the model is not trained)."""
    if not (Path(path) / "model.safetensors").exists():
        return None
    from circuitstat.circuits import load_model

    return load_model(Path(path)).weight_hash()


def frequent_tokens(model, min_count: int = 1000, at_least: int = 0) -> np.ndarray | None:
    """Token ids seen at least ``min_count`` times in the model's training data (from the
    ``token_counts.npy`` its training wrote), without special tokens -- or the ``at_least`` most
    frequent ones if fewer pass; None if unknown."""
    # the directory it was loaded from: its source is the name the user gave it (zoo:..., served:...)
    where = getattr(model, "directory", None)
    p = Path(where) / "token_counts.npy" if where else None
    if p is None or not p.exists():
        return None
    counts = np.load(p, allow_pickle=False).astype(np.int64)
    tok = getattr(model, "tokenizer", None)
    for i in (getattr(tok, "bos_id", None), getattr(tok, "eos_id", None)):
        if i is not None and i < len(counts):
            counts[i] = -1
    ids = np.flatnonzero(counts >= min_count)
    if len(ids) < at_least:
        ids = np.sort(np.argsort(-counts, kind="stable")[:at_least])
    return ids.astype(np.int64)


def induction_metrics(model, n: int = 64, seq_len: int | None = None, seed: int = 0, batch_size: int = 32,
                      token_ids=None, min_count: int = 1000) -> dict:
    """Induction behaviour on ``[BOS] A A`` with A = ``seq_len`` distinct random tokens (default:
    50, or as many as the model's context holds).

    Tokens are drawn from ``token_ids``; by default from the tokens the model saw at least
    ``min_count`` times in training (a byte-level BPE's alphabet holds bytes that never occur in
    the corpus, whose embeddings are untrained noise), else from the whole vocabulary.

    Returns ``loss_first`` / ``loss_second`` (mean next-token loss predicting tokens 2..L of the
    first / second repeat), ``induction_scores`` ``[layers, heads]`` (mean attention from each
    second-repeat token to the token after its earlier occurrence) and ``prev_token_scores``
    (attention to the previous token, over the same positions).
    """
    import torch

    from circuitstat.circuits.tasks import induction_task

    tok = getattr(model, "tokenizer", None)
    if seq_len is None:
        seq_len = min(50, (model.cfg.n_ctx - 1) // 2)
    if token_ids is None:
        token_ids = frequent_tokens(model, min_count, at_least=seq_len + 1)
    task = induction_task(tok, n=n, seed=seed, seq_len=seq_len, token_ids=token_ids, corrupt="answer",
                          vocab_size=None if tok is not None else model.cfg.vocab_size)
    # the task's clean prompt is [BOS] A A[:-1]; append A[-1] to get the full second repeat
    ids = torch.cat([task.clean, task.answer[:, None]], dim=1)
    off = int(task.meta["first_repeat"][0])  # 1 with BOS
    L = seq_len
    cfg = model.cfg
    ind = torch.zeros(cfg.n_layers, cfg.n_heads, dtype=torch.float64)
    prev = torch.zeros_like(ind)
    l1, l2 = 0.0, 0.0
    model_dev = model.device
    with torch.no_grad():
        for s in range(0, n, batch_size):
            b = ids[s:s + batch_size].to(model_dev)
            out = model.run(b, keep_patterns=True)
            logp = torch.log_softmax(out.logits.float(), -1)
            nll = -logp[:, :-1].gather(-1, b[:, 1:, None]).squeeze(-1)  # [B, P-1]: predicting token t+1
            # first repeat: predict A[1..L-1] (targets at positions off+1..off+L-1)
            l1 += float(nll[:, off:off + L - 1].sum())
            l2 += float(nll[:, off + L:off + 2 * L - 1].sum())
            q = torch.arange(off + L + 1, off + 2 * L, device=model_dev)  # second-repeat tokens A[1..L-1]
            for layer, pat in enumerate(out.patterns):
                pat = pat.double()
                ind[layer] += pat[:, :, q, q - L + 1].sum((0, 2)).cpu()
                prev[layer] += pat[:, :, q, q - 1].sum((0, 2)).cpu()
    count = n * (L - 1)
    ind, prev = ind / count, prev / count
    return {
        "loss_first": l1 / count,
        "loss_second": l2 / count,
        "induction_scores": ind.numpy(),
        "prev_token_scores": prev.numpy(),
        "max_induction_layer1": float(ind[1].max()) if cfg.n_layers > 1 else float("nan"),
        "n": n,
        "seq_len": seq_len,
        "pool_size": int(task.meta["pool_size"]),
    }


def zoo_report(paths: Sequence[str | os.PathLike], n: int = 64, seq_len: int | None = None, seed: int = 0):
    """One row per model: repeat losses, best layer-1 induction head, validation loss, train time."""
    import pandas as pd

    from circuitstat.circuits import load_model

    rows = []
    for p in paths:
        m = load_model(p)
        r = induction_metrics(m, n=n, seq_len=seq_len, seed=seed)
        t = m.meta.get("training", {})
        ind = r["induction_scores"]
        best = np.unravel_index(np.argmax(ind[-1]), ind[-1].shape)
        rows.append({
            "model": str(Path(p).parent.name) + "/" + Path(p).name,
            "seed": t.get("seed"),
            "val_loss": t.get("final_val_loss"),
            "train_seconds": t.get("train_seconds"),
            "loss_first_repeat": r["loss_first"],
            "loss_second_repeat": r["loss_second"],
            "best_layer1_head": f"a{len(ind) - 1}.h{int(best[0])}",
            "layer1_induction_score": float(ind[-1].max()),
            "layer0_prev_token_score": float(r["prev_token_scores"][0].max()),
        })
    return pd.DataFrame(rows)


if __name__ == "__main__":  # python -m circuitstat.pipelines.zoo : build (or reuse) the zoo and print its report
    print(f"the default zoo: {len(ZOO_RECIPES) * len(ZOO_SEEDS)} models ({', '.join(ZOO_RECIPES)} x seeds "
          f"{ZOO_SEEDS[0]}-{ZOO_SEEDS[-1]}); those not cached are trained (all of them: about 12 minutes on 2 cores; "
          "one: `circuitstat zoo build RECIPE --seed S`)", flush=True)
    t0 = time.time()
    ps = default_zoo()
    print(f"zoo ready in {time.time() - t0:.0f}s at {ps[0].parent.parent}")
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(zoo_report(ps).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
