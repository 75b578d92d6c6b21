"""A trained model's directory: its name, whether it is complete, writing the finished model and its log."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from circuitstat.core.errors import InputError

from .checkpoint import CHECKPOINT
from .data import save_npy_atomic
from .recipe import DataSpec, TrainRecipe

__all__ = ["LOG_TABLE", "model_dir_name", "is_complete", "check_out_dir"]

LOG_TABLE = "train_log.parquet"


def write_training_log(out: Path, rows: list[dict], provenance: dict) -> None:
    """Write the training log rows (step, losses, lr, tokens, time) to ``out`` as Parquet with ``provenance``."""
    import pyarrow as pa

    cols = ["step", "train_loss", "val_loss", "lr", "tokens", "elapsed_s"]
    table = pa.table({c: [r[c] for r in rows] for c in cols},
                     schema=pa.schema([("step", pa.int64()), ("train_loss", pa.float64()), ("val_loss", pa.float64()),
                                       ("lr", pa.float64()), ("tokens", pa.int64()), ("elapsed_s", pa.float64())]))
    from circuitstat.core.tables import write_table

    write_table(table, out / LOG_TABLE, provenance=provenance)


def model_dir_name(seed: int) -> str:
    return f"seed-{int(seed)}"


def is_complete(directory: str | os.PathLike, recipe: TrainRecipe | None = None, seed: int | None = None,
                data_hash: str | None = None) -> bool:
    """Whether ``directory`` holds a finished model (of this recipe/seed/data, when given).

    A model trained before TrainRecipe gained fields still counts as this recipe's when every
    field it stored equals the recipe's and every field it lacks is at its default (the default
    reproduces the older behaviour), so caches survive new recipe options.
    """
    cfg = Path(directory) / "config.json"
    if not cfg.exists() or not (Path(directory) / "model.safetensors").exists():
        return False
    try:
        meta = json.loads(cfg.read_text()).get("meta", {})
    except (ValueError, OSError):
        return False
    t = meta.get("training", {})
    if not t.get("complete"):
        return False
    if recipe is not None and t.get("recipe_hash") != recipe.content_hash:
        stored, now, base = t.get("recipe") or {}, recipe.to_dict(), TrainRecipe().to_dict()
        if not (stored and all(now.get(k) == v for k, v in stored.items())
                and all(now[k] == base[k] for k in now if k not in stored)):
            return False
    if seed is not None and t.get("seed") != int(seed):
        return False
    if data_hash is not None and t.get("data_hash") != data_hash:
        return False
    return True


def finish_model_dir(model: Any, out: Path, recipe: TrainRecipe, seed: int, data: DataSpec, log: list[dict], device: str,
            keep_checkpoint: bool, *, train_seconds: float, cpu_seconds: float) -> None:
    """Save the trained model with its training record (and token counts); drop the checkpoint."""
    import torch

    meta = {
        "training": {
            "complete": True, "seed": seed, "recipe": recipe.to_dict(), "recipe_hash": recipe.content_hash,
            "data_hash": data.content_hash, "corpus": data.corpus_name, "corpus_hash": data.corpus_hash,
            "tokenizer_hash": data.tokenizer_hash, "steps": recipe.steps,
            "tokens": recipe.steps * recipe.batch_size * recipe.n_ctx,
            "optimizer": {"name": recipe.optimizer, "lr": recipe.lr, "weight_decay": recipe.weight_decay,
                          "betas": list(recipe.betas), "warmup_steps": recipe.warmup_steps,
                          "schedule": "linear warmup, cosine decay", "min_lr_ratio": recipe.min_lr_ratio,
                          "grad_clip": recipe.grad_clip},
            "final_val_loss": log[-1]["val_loss"] if log else None,
            "train_seconds": round(train_seconds, 3),
            "cpu_seconds": round(cpu_seconds, 3),
            "threads": recipe.threads, "device": str(device),
            "torch": torch.__version__, "deterministic": True,
            "forward": "sdpa" if model.has_fused_forward else "circuitmodel",
        }
    }
    model.save(out, meta=meta)
    if data.token_counts and Path(data.token_counts).exists():
        # which tokens the model saw how often (e.g. to draw induction tokens it was trained on)
        save_npy_atomic(out / "token_counts.npy", np.load(data.token_counts, allow_pickle=False))
    ck = out / CHECKPOINT
    if not keep_checkpoint and ck.exists():
        ck.unlink()


def check_out_dir(out: str | os.PathLike) -> Path:
    """``out`` as a Path; InputError when it (or a parent) exists and is not a directory."""
    p = Path(out).expanduser()
    for q in (p, *p.parents):
        if q.exists():
            if not q.is_dir():
                raise InputError(f"--out {out}: {q} exists and is not a directory; choose another --out")
            break
    return p
