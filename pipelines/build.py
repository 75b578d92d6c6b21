"""Building a task for a model: the one place that turns (model, task name, options) into a Task."""

from __future__ import annotations

import contextlib
import os
import re
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Iterator

from circuitstat.core.errors import InputError
from circuitstat.circuits.limits import check_bytes, check_count

if TYPE_CHECKING:  # torch loads only when a model is built: `check`, `query`, `report`, `--help` stay fast
    from circuitstat.circuits.model import CircuitModel
    import torch
    from circuitstat.circuits.tasks import Task


def check_int(where: str, value: Any, **kw: Any) -> int:
    """``value`` as an int, or InputError naming ``where`` (circuitstat.circuits.tasks.check_int, imported lazily)."""
    from circuitstat.circuits.tasks import check_int as check

    return check(where, value, **kw)


def check_token_ids(where: str, value: Any) -> list[int]:
    """``value`` as a list of token ids, or InputError (circuitstat.circuits.tasks.check_token_ids, imported lazily)."""
    from circuitstat.circuits.tasks import check_token_ids as check

    return check(where, value)

MAX_EXAMPLES = 1_000_000
"""Most examples one task may have unless ``--allow-large`` lifts the limit (as TaskSpec's bound)."""


def build_task(model: CircuitModel, name: str, *, n: int = 64, seed: int = 0, metric: str | None = None,
               **options) -> Task:
    """The task ``name`` tokenized for ``model`` and validated against its vocabulary and context.

    Induction tokens (``token_ids``): a list of ids, or ``"frequent[:MIN_COUNT]"`` for the tokens a
    circuitstat-trained model saw at least MIN_COUNT (default 1000) times in training
    (``circuitstat.pipelines.zoo.frequent_tokens``). Unset, a circuitstat-trained model gets ``"frequent"``
    and any other model its whole vocabulary: a small byte-level BPE holds bytes that never occur
    in the corpus, whose untrained embeddings would make the prompts off-distribution.
    """
    from circuitstat.circuits.inmemory import require_circuit_model

    require_circuit_model(model, "build_task")
    tok = model.tokenizer
    kwargs = dict(options)
    if metric is not None:  # unset: the task's own default (logit_diff; prob_diff for greater-than)
        kwargs["metric"] = metric
    if name == "induction":
        seq_len = check_int("task.options.seq_len", kwargs.get("seq_len", 20), minimum=2)
        need = 2 * seq_len if kwargs.get("corrupt", "all") == "all" else seq_len + 1  # as induction_task
        kwargs["token_ids"] = _induction_pool(model, kwargs.get("token_ids"), need)
    if tok is None:
        if name not in ("induction",):
            raise InputError(
                f"task {name!r} needs a tokenizer and the model {model.source} has none; "
                "use the induction task (works on any vocabulary) or a model directory with a tokenizer"
            )
        kwargs.setdefault("vocab_size", model.cfg.vocab_size)
    from circuitstat.circuits.tasks import make_task

    task = make_task(name, tokenizer=tok, n=n, seed=seed, **kwargs)
    return task.validate(model)


ZOO_MODEL = re.compile(r"seed-(0|[1-9][0-9]{0,8})")
"""The model part of a ``zoo:RECIPE/seed-S`` source: a seed, never a path."""


def parse_task_options(task: str, pairs: "list[str] | tuple[str, ...]") -> dict[str, Any]:
    """``--task-option KEY=VALUE`` pairs as typed options of task ``task``'s builder; InputError naming the
    pair when it is malformed, unknown to the builder or of the wrong type.

    A value is read as YAML (``10`` an int, ``false`` a bool, ``[1, 2]`` a list) unless the builder
    declares a string there and the YAML reading is not one (``corrupt_yy=01`` stays "01")."""
    import yaml

    from circuitstat.circuits.tasks import option_matches, task_builder, task_option_types

    from .spec import RESERVED_TASK_OPTIONS

    builder, exclude = task_builder(task)
    types = task_option_types(builder, exclude)
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = str(pair).partition("=")
        key = key.strip()
        if not sep or not key:
            raise InputError(f"--task-option {pair!r} is not KEY=VALUE; e.g. --task-option seq_len=10")
        if key in RESERVED_TASK_OPTIONS:
            how = "the model brings its tokenizer" if key == "tokenizer" else f"set it with --{key}"
            raise InputError(f"--task-option {key} is not a task option: {how}")
        if key not in types:
            raise InputError(f"--task-option {key}: task {task!r} has no option {key!r}; its options are "
                             f"{', '.join(sorted(types)) or 'none'}")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        if not option_matches(value, types[key]) and option_matches(raw, types[key]):
            value = raw
        out[key] = value
    return out


_SERVED: "ContextVar[dict[str, str] | None]" = ContextVar("circuitstat_served_models", default=None)


@contextlib.contextmanager
def served_sources(models: dict[str, str]) -> Iterator[None]:
    """Within: a circuitstat server's job. ``served:NAME`` loads the operator's model NAME (``models``: name ->
    path), every model records the name it was asked by as its source, and errors name no server path."""
    from circuitstat.core.source_names import public_source_names

    token = _SERVED.set(dict(models))
    try:
        with public_source_names():
            yield
    finally:
        _SERVED.reset(token)


def resolve_source(source: str) -> str:
    """``zoo:RECIPE/seed-S`` -> that model's directory in the zoo's cache; ``served:NAME`` (inside
    :func:`served_sources`) -> the operator's model NAME; other sources unchanged.

    RECIPE must be a zoo recipe and S a seed number: nothing else (no path segment, no '..') can
    follow ``zoo:``, and the directory must lie inside the recipe's (no link leading out of the zoo).
    """
    from circuitstat.core.source_names import hiding_paths, register_source_name

    if str(source).startswith("served:"):
        models, name = _SERVED.get(), str(source)[len("served:"):]
        if models is None or name not in models:
            raise InputError(f"{source}: 'served:' names a model of a circuitstat server, inside one of its jobs "
                             "only; give a model directory, a hub id, random:ARCH?... or zoo:RECIPE/seed-S")
        register_source_name(models[name], str(source))
        return models[name]
    if not str(source).startswith("zoo:"):
        return source
    from circuitstat.core.confine import inside

    from .zoo import ZOO_RECIPES, recipe_dir

    name, _, model = str(source)[len("zoo:"):].partition("/")
    shape = f"sources look like zoo:RECIPE/seed-S (recipes: {', '.join(ZOO_RECIPES)}; S a seed number)"
    if name not in ZOO_RECIPES:
        raise InputError(f"not a zoo recipe: {shape}")
    if not ZOO_MODEL.fullmatch(model):
        raise InputError(f"zoo:{name}/...: not a zoo model: {shape} (nothing else may follow the recipe)")
    root = recipe_dir(name)
    path = root / model
    where = "in this server's zoo cache" if hiding_paths() else f"at {path}"
    if not (path / "model.safetensors").exists():
        seed = model.removeprefix("seed-")
        raise InputError(f"{source}: not trained yet (no model {where}); train just this one with "
                         f"`circuitstat zoo build {name} --seed {seed}` (about 2.5 minutes on one core, cached), "
                         "or the whole zoo with `python -m circuitstat.pipelines.zoo` (10 models, about 12 minutes on 2 cores)")
    if not inside(path, root):
        raise InputError(f"zoo:{name}/{model}: the model {where} is a symbolic link out of the zoo's cache; remove "
                         "it and build the zoo again")
    register_source_name(path, str(source))
    return str(path)


def load_source(source: "str | os.PathLike", device: str = "cpu", dtype: "str | torch.dtype | None" = None, *,
                allow_pickle: bool = False, allow_large: bool = False) -> "CircuitModel":
    """Return a CircuitModel from any source a command accepts: a model directory, a cached hub id
    ``org/name[@revision]``, ``random:ARCH?...`` or ``zoo:RECIPE/seed-S`` (the one way to load one)."""
    from circuitstat.circuits.loading import load_model

    if isinstance(dtype, str):
        import torch

        dtype = getattr(torch, dtype)
    return load_model(resolve_source(str(source)), device=device, dtype=dtype, allow_pickle=allow_pickle,
                      allow_large=allow_large)


def _induction_pool(model: CircuitModel, token_ids, need: int) -> list[int] | None:
    """The induction task's token pool: ``token_ids`` resolved (see :func:`build_task`); unset, at
    least ``need`` tokens (the most frequent ones when fewer pass the bar)."""
    from .zoo import frequent_tokens

    if token_ids is not None and not isinstance(token_ids, str):
        return check_token_ids("task.options.token_ids", token_ids)
    if token_ids is None:
        pool = frequent_tokens(model, at_least=need)
        return None if pool is None else [int(i) for i in pool]
    name, _, count = token_ids.partition(":")
    if name != "frequent" or (count and not count.isdigit()):
        raise InputError(f"task.options.token_ids: {token_ids!r} is not a list of ids or 'frequent[:MIN_COUNT]'")
    ids = frequent_tokens(model, int(count or 1000))
    if ids is None or len(ids) < 2:
        raise InputError(f"task.options.token_ids: 'frequent' needs a model trained by circuitstat (its "
                         f"token_counts.npy); {model.source} has none: list the ids instead")
    return [int(i) for i in ids]


def check_device(device: str) -> str:
    """``device`` normalised (``cpu``, ``cuda``, ``cuda:N``, ``mps``); InputError when it is unknown or absent here."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise InputError(f"unknown device {device!r}; use cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"device {device!r}: CUDA is not available on this machine; use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise InputError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s); "
                             "use cuda:0 .. cuda:N-1")
    elif dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise InputError(f"device {device!r}: MPS is not available on this machine; use --device cpu")
    elif dev.type != "cpu":
        raise InputError(f"device {device!r} is not supported; use cpu, cuda, cuda:N or mps")
    return str(dev)


def max_jobs() -> int:
    """The most parallel workers a run may ask for: this machine's CPU count."""
    return max(1, os.cpu_count() or 1)


def check_n_jobs(n_jobs: int, where: str = "--n-jobs") -> int:
    """``n_jobs`` when it lies in [1, this machine's CPU count]; InputError otherwise (never clipped)."""
    n_jobs = check_int(where, n_jobs)
    if not 1 <= n_jobs <= max_jobs():
        raise InputError(f"{where} is {n_jobs}; use 1 to {max_jobs()} (this machine's CPU count)")
    return n_jobs


def n_columns(model: CircuitModel, level: str) -> int:
    """Score columns of ``model`` at ``level``: its edges, or its senders (nodes)."""
    return model.graph.n_edges if level == "edge" else model.graph.n_senders


def check_work(model: CircuitModel, n: int, *, level: str, n_matrices: int = 1, positions: int | None = None,
               n_resamples: int = 0, allow_large: bool = False) -> None:
    """None; InputError (lifted by ``--allow-large``) when ``n`` examples would need more than the
    limits allow: their prompts, ``n_matrices`` float32 score matrices [n, columns] and the
    resampling weights [n_resamples, n] (int32 counts and a float64 copy)."""
    check_count(n, MAX_EXAMPLES, "the number of examples", allow_large=allow_large)
    cols = n_columns(model, level)
    P = positions if positions is not None else min(int(model.cfg.n_ctx), 64)
    nbytes = n * P * 8 * 3 + n_matrices * n * cols * 4 + n_resamples * n * 12
    check_bytes(nbytes, f"{n:,} examples x {cols:,} {level}s ({n_matrices} score matrices, "
                        f"{n_resamples:,} resamples)", allow_large=allow_large)


def task_positions(name: str, options: dict) -> int | None:
    """Prompt length of a built-in task before it is built (induction: BOS + 2 seq_len - 1), or None."""
    if name != "induction":
        return None
    return 2 * check_int("task.options.seq_len", options.get("seq_len", 20), minimum=2)
