"""Training many models: jobs (recipe, seed, directory, data) run in one joblib pool, and the seeds
of the ``train`` command (the command is in pipelines/cli)."""

from __future__ import annotations

import json
import os
import numbers
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from circuitstat.core.errors import InputError

from .checkpoint import CHECKPOINT, read_checkpoint_info
from .data import prepare_data
from .loop import train_model
from .model_dir import check_out_dir, is_complete, model_dir_name
from .recipe import DataSpec, TrainRecipe

__all__ = ["TrainJob", "run_train_jobs", "train_models", "MAX_SEEDS", "parse_seeds"]


def _train_worker(recipe_dict: dict, seed: int, out: str, data: DataSpec, device: str, progress: bool,
                  allow_large: bool = False) -> str:
    return str(train_model(TrainRecipe.from_dict(recipe_dict), seed, out, data=data, device=device, progress=progress,
                           allow_large=allow_large))


@dataclass(frozen=True)
class TrainJob:
    """One model to train: recipe, seed, output directory and its prepared data."""

    recipe: TrainRecipe
    seed: int
    out: Path
    data: DataSpec

    def cost(self) -> float:
        """Relative training cost for scheduling: steps x depth x (1 + MLP share, measured on CPU)."""
        r = self.recipe
        return r.steps * r.n_layers * (1.0 if r.attn_only else 1.25)


def run_train_jobs(jobs: Sequence[TrainJob], n_jobs: int = 1, device: str = "cpu", progress: bool = False,
                   allow_large: bool = False) -> list[Path]:
    """Train the jobs not yet complete (one joblib pool, longest first); return every job's directory.

    The one training job runner (zoo, head study, ``train``): each worker uses its recipe's
    threads, so the models do not depend on ``n_jobs``; finished models are kept and
    interrupted ones resume from their checkpoints.
    """
    todo = [j for j in jobs if not is_complete(j.out, j.recipe, j.seed, j.data.content_hash)]
    todo.sort(key=lambda j: -j.cost())  # longest first: the workers finish together
    n_jobs = max(1, min(int(n_jobs), len(todo)))
    if todo and n_jobs == 1:
        for j in todo:
            train_model(j.recipe, j.seed, j.out, data=j.data, device=device, progress=progress,
                        allow_large=allow_large)
    elif todo:
        from joblib import Parallel, delayed

        Parallel(n_jobs=n_jobs, backend="loky")(
            delayed(_train_worker)(j.recipe.to_dict(), j.seed, str(j.out), j.data, device, progress, allow_large)
            for j in todo)
    return [Path(j.out) for j in jobs]


def train_models(
    recipe: TrainRecipe,
    seeds: Sequence[int],
    out_dir: str | os.PathLike,
    n_jobs: int = 1,
    corpus=None,
    device: str = "cpu",
    progress: bool = True,
    cache: str | os.PathLike | None = None,
    allow_large: bool = False,
) -> list[Path]:
    """Train one model per seed into ``out_dir/seed-{s}``, seeds in parallel with joblib.

    Each worker uses ``recipe.threads`` threads, so results do not depend on ``n_jobs``.
    Finished models are kept; interrupted ones resume from their checkpoints. The recipe and the
    output folder are checked before anything is written (``allow_large`` lifts the memory limit).
    """
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise InputError("no seeds given; pass e.g. --seeds 0-4")
    if len(set(seeds)) != len(seeds):
        raise InputError(f"duplicate seeds in {seeds}")
    out = check_out_dir(out_dir)
    recipe.validate(allow_large=allow_large)  # before the (slow) data preparation
    data = prepare_data(recipe, corpus=corpus, cache=cache)
    recipe.validate(data.vocab_size, allow_large=allow_large)
    for s in seeds:  # a foreign file under a checkpoint's name is refused before anything is written
        if (out / model_dir_name(s) / CHECKPOINT).exists():
            read_checkpoint_info(out / model_dir_name(s) / CHECKPOINT)
    jobs = [TrainJob(recipe, s, out / model_dir_name(s), data) for s in seeds]
    new_out, new_record = not out.exists(), not (out / "recipe.json").exists()
    new_dirs = [j for j in jobs if not j.out.exists()]
    out.mkdir(parents=True, exist_ok=True)
    (out / "recipe.json").write_text(json.dumps({"recipe": recipe.to_dict(), "seeds": seeds,
                                                 "data": asdict(data)}, indent=2))
    try:
        return run_train_jobs(jobs, n_jobs, device=device, progress=progress, allow_large=allow_large)
    except Exception:  # a failed run (diverged, bad data, full disk) leaves nothing; Ctrl-C keeps its checkpoints
        _remove_unfinished(out, new_dirs, remove_record=new_record, remove_out=new_out)
        raise


def _remove_unfinished(out: Path, jobs: list[TrainJob], *, remove_record: bool, remove_out: bool) -> None:
    """Undo a failed ``train_models``: remove the model directories it created that hold no finished model,
    then the recipe.json and the output folder it created when no model directory is left in them."""
    import shutil

    for j in jobs:
        if not is_complete(j.out, j.recipe, j.seed, j.data.content_hash):
            shutil.rmtree(j.out, ignore_errors=True)
    if any(p.is_dir() for p in out.iterdir()):
        return  # finished models (of this call or an earlier one) keep their record
    if remove_record:
        (out / "recipe.json").unlink(missing_ok=True)
    if remove_out and not any(out.iterdir()):
        out.rmdir()


MAX_SEEDS = 1000
"""Most seeds one ``train`` may ask for unless ``--allow-large`` lifts the limit."""


def parse_seeds(spec: str | int | Sequence[int], *, allow_large: bool = False) -> list[int]:
    """``"0-4"`` -> [0..4]; ``"0,2,7"``; ``"3"``; combinations like ``"0-2,10"``.

    The count is checked against :data:`MAX_SEEDS` before any list is built (``allow_large`` lifts it).
    """
    from circuitstat.circuits.limits import check_count

    from circuitstat.core.params import SEED

    if not isinstance(spec, str):
        return [SEED.check(s, "seed") for s in ([spec] if isinstance(spec, numbers.Integral) else spec)]
    ranges: list[tuple[int, int]] = []
    try:
        for part in spec.replace(" ", "").split(","):
            if not part:
                continue
            if "-" in part[1:]:
                a, b = part.split("-", 1) if not part.startswith("-") else (part, "")
                lo, hi = int(a), int(b)
                if hi < lo:
                    raise ValueError
                ranges.append((lo, hi))
            else:
                ranges.append((int(part), int(part)))
    except ValueError:
        raise InputError(f"malformed seeds {spec!r}; use e.g. '0-4', '0,2,5' or '3'") from None
    for lo, hi in ranges:  # before any list is built: a negative seed reaches numpy's SeedSequence as a traceback
        SEED.check(lo, f"a seed in {spec!r}")
        SEED.check(hi, f"a seed in {spec!r}")
    check_count(sum(hi - lo + 1 for lo, hi in ranges), MAX_SEEDS, f"the number of seeds in {spec!r}",
                allow_large=allow_large)
    out = [s for lo, hi in ranges for s in range(lo, hi + 1)]
    if not out:
        raise InputError(f"no seeds in {spec!r}; use e.g. '0-4'")
    if len(set(out)) != len(out):
        raise InputError(f"duplicate seeds in {spec!r}")
    return out
