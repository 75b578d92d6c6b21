"""Training wrapper overhead: steps/s of circuitstat.pipelines.training.train_model vs a plain PyTorch loop.

Same model (the default zoo's attention-only shape), same data, same optimizer, same gradient
clipping (part of the recipe's algorithm, not bookkeeping), one thread, both with deterministic
algorithms on. The wrapper adds: the LR schedule, validation and a checkpoint at the recipe's
cadence (every 500 steps for the zoo), the Parquet log, the progress bar, saving the model. The
plain loop does the forward, loss, backward, clipping and optimizer step only.

    python bench/training.py [--steps 1000] [--recipe attn-only-2l|mlp-2l]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from circuitstat.circuits.model import CircuitModel
from circuitstat.pipelines.training import prepare_data, train_model
from circuitstat.pipelines.training.data import Batches
from circuitstat.pipelines.training.loop import _init
from circuitstat.pipelines.zoo import ZOO_RECIPES


def plain_loop(recipe, data, steps: int, seed: int = 0, fused: bool = True) -> float:
    """Forward, loss, backward, AdamW step; nothing else. ``fused``: the same SDPA forward the
    wrapper uses (``CircuitModel.fused_logits``), else CircuitModel's own forward (``model(ids)``)."""
    torch.set_num_threads(recipe.threads)
    torch.use_deterministic_algorithms(True)
    model = CircuitModel(recipe.model_config(data.vocab_size))
    _init(model, seed, recipe.init_std)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=recipe.betas,
                            weight_decay=recipe.weight_decay, foreach=False)
    batches = Batches(np.load(data.train_tokens, mmap_mode="r"), recipe.n_ctx + 1, recipe.batch_size, seed)
    fwd = model.fused_logits if fused else model
    t0 = time.perf_counter()
    for step in range(steps):
        b = batches.batch(step, recipe.repeat_fraction)
        logits = fwd(b[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), b[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if recipe.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip, foreach=False)
        opt.step()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--recipe", default="attn-only-2l", choices=sorted(ZOO_RECIPES))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    recipe = ZOO_RECIPES[args.recipe].replace(steps=args.steps)  # the zoo's own validation/checkpoint cadence
    data = prepare_data(recipe)
    plain_loop(recipe, data, 5)  # warm-up
    # Steps/s on this shared machine drift by ~10% over minutes, so each repeat times the three
    # loops back to back and the ratios are taken within a repeat (median and range reported).
    plain, unfused, wrapped = [], [], []
    for _ in range(args.repeats):
        plain.append(plain_loop(recipe, data, args.steps))
        unfused.append(plain_loop(recipe, data, args.steps, fused=False))
        tmp = Path(tempfile.mkdtemp(prefix="cs-bench-"))
        try:
            t0 = time.perf_counter()
            train_model(recipe, 0, tmp / "m", data=data, progress=False)
            wrapped.append(time.perf_counter() - t0)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    p, u, w = (float(np.median(x)) for x in (plain, unfused, wrapped))
    r_pw = np.array(plain) / np.array(wrapped)
    r_uw = np.array(unfused) / np.array(wrapped)
    cfg = recipe.model_config(data.vocab_size)
    print(f"model        {args.recipe}: {cfg.n_layers} layers, {cfg.n_heads} heads, d_model {cfg.d_model}, "
          f"vocab {cfg.vocab_size}, batch {recipe.batch_size}x{recipe.n_ctx}, threads {recipe.threads}; "
          f"{args.steps} steps, median of {args.repeats} repeats")
    print(f"plain loop, model(ids)      {args.steps / u:7.2f} steps/s  ({u:.2f}s)")
    print(f"plain loop, fused_logits    {args.steps / p:7.2f} steps/s  ({p:.2f}s)")
    print(f"train_model                 {args.steps / w:7.2f} steps/s  ({w:.2f}s incl. "
          f"{args.steps // recipe.eval_every} validation, {(args.steps - 1) // recipe.checkpoint_every} "
          "checkpoint, log, save)")
    print(f"ratio wrapper / plain loop (same forward)    {np.median(r_pw):.3f}  (range {r_pw.min():.3f}-"
          f"{r_pw.max():.3f}; 1.0 = no overhead)")
    print(f"ratio wrapper / plain loop with model(ids)   {np.median(r_uw):.3f}  (range {r_uw.min():.3f}-"
          f"{r_uw.max():.3f}; >1: the fused training forward pays)")


if __name__ == "__main__":
    main()
