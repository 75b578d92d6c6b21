"""The training loop of one model: initialisation, optimizer, learning-rate schedule, losses, and
:func:`train_model` (resumable from its checkpoint to exactly the weights of an uninterrupted run)."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import numpy as np

from circuitstat.core.errors import InputError

from .checkpoint import CHECKPOINT, restore_checkpoint, resume_state, save_checkpoint
from .data import Batches, chunk_tokens, load_tokens, prepare_data
from .determinism import deterministic
from .model_dir import finish_model_dir, write_training_log, check_out_dir, is_complete
from .recipe import DataSpec, TrainRecipe

__all__ = ["GPT2_INIT_STD", "train_model"]


GPT2_INIT_STD = 0.02


def _init(model, seed: int, init_std: float | None) -> None:
    """``model.init_weights(seed)`` (GPT-2 style, std 0.02 and 0.02/sqrt(2 n_layers) for output
    projections); with ``init_std`` every weight matrix is then scaled by init_std / 0.02.

    GPT-2's 0.02 suits d_model ~ 768; for a 64-wide model the attention scores start so close to
    uniform that attention heads take thousands of steps to specialise. 1/sqrt(d_model) (0.125
    at 64) keeps the same shape of initialisation at a width-appropriate scale.
    """
    import torch

    model.init_weights(seed)
    if init_std is None:
        return
    factor = float(init_std) / GPT2_INIT_STD
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.rsplit(".", 1)[-1].startswith("W_"):
                p.mul_(factor)


def _lr_at(recipe: TrainRecipe, step: int) -> float:
    if step < recipe.warmup_steps:
        return recipe.lr * (step + 1) / recipe.warmup_steps
    span = max(1, recipe.steps - recipe.warmup_steps)
    frac = min(1.0, (step - recipe.warmup_steps) / span)
    cos = 0.5 * (1 + math.cos(math.pi * frac))
    return recipe.lr * (recipe.min_lr_ratio + (1 - recipe.min_lr_ratio) * cos)


def _make_optimizer(recipe: TrainRecipe, model):
    import torch

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        (no_decay if leaf.startswith("b_") or leaf.startswith(("ln", "lnf")) else decay).append(p)
    groups = [{"params": decay, "weight_decay": recipe.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if recipe.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=recipe.lr, betas=recipe.betas, foreach=False)
    # Adam with L2 regularisation (weight decay added to the gradient), as torch.optim.Adam does
    return torch.optim.Adam(groups, lr=recipe.lr, betas=recipe.betas, foreach=False)


def _loss(model, batch):
    import torch.nn.functional as F

    logits = model.fused_logits(batch[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), batch[:, 1:].reshape(-1))


def _eval_loss(model, val: np.ndarray, recipe: TrainRecipe, device) -> float:
    import torch

    seqs = chunk_tokens(val, recipe.n_ctx + 1)
    n = min(len(seqs), recipe.eval_batches * recipe.batch_size)
    if n == 0:
        return float("nan")
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for s in range(0, n, recipe.batch_size):
            b = torch.from_numpy(np.asarray(seqs[s:min(n, s + recipe.batch_size)], dtype=np.int64)).to(device)
            total += float(_loss(model, b)) * b.shape[0]
            count += b.shape[0]
    model.train(was_training)
    return total / count


class _Run:
    """One model's training in progress: model, optimizer, the counters a checkpoint carries, its log."""

    def __init__(self, recipe: TrainRecipe, seed: int, out: Path, data: DataSpec, device: str, model, opt,
                 t_start: float, c_start: float) -> None:
        self.recipe, self.seed, self.out, self.data, self.device = recipe, int(seed), out, data, device
        self.model, self.opt = model, opt
        self.ck = out / CHECKPOINT
        self.t_start, self.c_start = t_start, c_start
        self.step, self.log, self.elapsed0, self.run_loss, self.run_n, self.cpu0 = 0, [], 0.0, 0.0, 0, 0.0
        self.prov = {
            "model": {"name": out.name, "seed": int(seed)},
            "data": {"corpus": data.corpus_name, "corpus_hash": data.corpus_hash,
                     "tokenizer_hash": data.tokenizer_hash},
            "params": recipe.to_dict(), "seed": int(seed), "method": "train",
        }

    def restore(self, doc: dict) -> None:
        """Load the checked checkpoint ``doc`` of this run into the model, optimizer, RNGs and counters."""
        c = restore_checkpoint(self.ck, doc, self.model, self.opt, self.recipe, self.device)
        self.step, self.log, self.elapsed0, self.run_loss, self.run_n, self.cpu0 = (
            c[k] for k in ("step", "log", "elapsed_s", "run_loss", "run_n", "cpu_s"))

    def elapsed(self) -> float:
        """Wall-clock seconds of training so far, earlier sessions of a resumed run included."""
        return self.elapsed0 + time.time() - self.t_start

    def cpu(self) -> float:
        """CPU seconds of training so far, earlier sessions of a resumed run included."""
        return self.cpu0 + time.process_time() - self.c_start

    def checkpoint(self) -> None:
        """Write the checkpoint of the current step."""
        save_checkpoint(self.ck, self.model, self.opt, {
            "step": self.step, "log": self.log, "elapsed_s": self.elapsed(),
            "run_loss": self.run_loss, "run_n": self.run_n, "recipe_hash": self.recipe.content_hash,
            "seed": self.seed, "cpu_s": self.cpu(), "data_hash": self.data.content_hash,
        })

    def train_step(self, batches: Batches) -> float:
        """One optimizer step on the batch of the current step; return its learning rate."""
        import torch

        recipe = self.recipe
        lr = _lr_at(recipe, self.step)
        for g in self.opt.param_groups:
            g["lr"] = lr
        batch = batches.batch(self.step, recipe.repeat_fraction).to(self.device)
        loss = _loss(self.model, batch)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if recipe.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), recipe.grad_clip, foreach=False)
        self.opt.step()
        self.step += 1
        lv = float(loss.detach())
        if not math.isfinite(lv):
            raise InputError(f"training diverged at step {self.step} (loss {lv}); lower --lr (now {recipe.lr:g})")
        self.run_loss += lv
        self.run_n += 1
        return lr

    def evaluate(self, val_tokens: np.ndarray, lr: float) -> float:
        """Validation loss now; appended to the log (with the running train loss) and the log written."""
        recipe, step = self.recipe, self.step
        val = _eval_loss(self.model, val_tokens, recipe, self.device)
        self.log.append({"step": step, "train_loss": self.run_loss / max(self.run_n, 1), "val_loss": val, "lr": lr,
                         "tokens": step * recipe.batch_size * recipe.n_ctx, "elapsed_s": self.elapsed()})
        self.run_loss, self.run_n = 0.0, 0
        write_training_log(self.out, self.log, self.prov)
        return val

    def loop(self, batches: Batches, val_tokens: np.ndarray, progress: bool, stop_after: int | None) -> bool:
        """Train to the recipe's last step (True), or checkpoint and stop at ``stop_after`` (False)."""
        from tqdm.auto import tqdm

        recipe = self.recipe
        # closed however the loop ends: an error is then printed on its own line, not after the bar
        with tqdm(total=recipe.steps, initial=self.step, desc=f"train seed {self.seed}", disable=not progress,
                  mininterval=1.0, leave=False, dynamic_ncols=True) as bar:
            while self.step < recipe.steps:
                lr = self.train_step(batches)
                bar.update(1)
                step = self.step
                if step % recipe.eval_every == 0 or step == recipe.steps:
                    bar.set_postfix(val_loss=f"{self.evaluate(val_tokens, lr):.3f}")
                if step % recipe.checkpoint_every == 0 and step < recipe.steps:
                    self.checkpoint()
                if stop_after is not None and step >= stop_after and step < recipe.steps:
                    self.checkpoint()
                    return False
        return True


def train_model(
    recipe: TrainRecipe,
    seed: int,
    out_dir: str | os.PathLike,
    data: DataSpec | None = None,
    device: str = "cpu",
    progress: bool = True,
    keep_checkpoint: bool = False,
    stop_after: int | None = None,
    cache: str | os.PathLike | None = None,
    allow_large: bool = False,
) -> Path:
    """Train one model into ``out_dir`` (resuming from its checkpoint if one is there); return ``out_dir``.

    ``stop_after`` stops (after checkpointing) once that many steps are done, as a kill would; a
    later call resumes. A finished model of the same recipe, seed and data is returned untouched.
    """
    from circuitstat.circuits.model import CircuitModel
    from circuitstat.circuits.tokenizers import load_tokenizer

    out = check_out_dir(out_dir)
    recipe.validate(allow_large=allow_large)
    data = data or prepare_data(recipe, cache=cache)
    if is_complete(out, recipe, seed, data.content_hash):
        return out
    recipe.validate(data.vocab_size, allow_large=allow_large)
    out.mkdir(parents=True, exist_ok=True)
    tok = load_tokenizer(data.tokenizer_dir)
    train_tokens = load_tokens(data.train_tokens, data.vocab_size)
    val_tokens = np.asarray(load_tokens(data.val_tokens, data.vocab_size))
    t_start = time.time()
    c_start = time.process_time()

    with deterministic(recipe.threads):
        model = CircuitModel(recipe.model_config(data.vocab_size))
        _init(model, int(seed), recipe.init_std)
        model.to(device).train()
        opt = _make_optimizer(recipe, model)
        batches = Batches(train_tokens, recipe.n_ctx + 1, recipe.batch_size, seed)
        run = _Run(recipe, seed, out, data, device, model, opt, t_start, c_start)
        resume = resume_state(run.ck, recipe, seed, data.content_hash)
        if resume is not None:
            run.restore(resume)
        if not run.loop(batches, val_tokens, progress, stop_after):
            return out
        model.eval()
        model.tokenizer = tok
        finish_model_dir(model, out, recipe, int(seed), data, run.log, device, keep_checkpoint,
                train_seconds=run.elapsed(), cpu_seconds=run.cpu())
    return out
