"""Building a task for a model: the one place that turns (model, task name, options) into a Task."""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

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
            raise InputError(no_tokenizer_message(name, str(model.source)))
        kwargs.setdefault("vocab_size", model.cfg.vocab_size)
    from circuitstat.circuits.tasks import make_task

    task = make_task(name, tokenizer=tok, n=n, seed=seed, **kwargs)
    return task.validate(model)


def no_tokenizer_message(task: str, source: str) -> str:
    """The error for task ``task`` (text prompts) on the model of ``source``, which has no tokenizer: the fix
    that applies to that kind of source."""
    from circuitstat.circuits.model_source import Memory, Random, parse_source

    head = f"task {task!r} has text prompts, which need a tokenizer, and the model {source} has none; "
    kind = parse_source(source)
    if isinstance(kind, Memory):
        fix = ("pass its tokenizer: circuits.load_model(hf_model, tokenizer=tok) (a transformers tokenizer or a "
               "circuitstat one), or set model.tokenizer = circuitstat.circuits.inmemory.as_tokenizer(tok)")
    elif isinstance(kind, Random):
        fix = ("add vocab_size=50257 to the random: spec, which attaches the bundled GPT-2 tokenizer "
               "(e.g. random:gpt2?n_layer=2&n_head=4&n_embd=64&vocab_size=50257), or use a model directory with "
               "a tokenizer")
    else:
        fix = "put the model's tokenizer.json (or its Hugging Face tokenizer files) in the model directory"
    return head + fix + "; the induction task works on any vocabulary"


def precheck_task(source: str, name: str, *, n: int = 64, seed: int = 0, metric: str | None = None,
                  public: str | None = None, **options) -> None:
    """None, after checking task ``name`` against the tokenizer ``source`` (resolved; ``public``: as the user named
    it, for messages) brings, without building its
    model: a missing tokenizer, or a task file's every bad row and column (the file is built with the tokenizer),
    is an InputError in seconds where the model would take minutes. The checks against the model (vocabulary,
    context) stay in :func:`build_task`; other tasks are built there only, once."""
    from circuitstat.circuits.loading import source_tokenizer
    from circuitstat.circuits.tasks import file_task, make_task
    from circuitstat.circuits.tasks.files import read_task_frame, row_problems
    from circuitstat.circuits.tasks.registry import task_builder

    if name == "induction":
        return
    is_file = task_builder(name)[0] is file_task
    if is_file:
        problems = row_problems(read_task_frame(name, n))  # no tokenizer needed: named even when there is none
        if problems:
            raise InputError(f"task file {name}: " + "; ".join(problems) + "; fill or drop these rows")
    tok = source_tokenizer(source)
    if tok is None:
        raise InputError(no_tokenizer_message(name, str(public or source)))
    if is_file:
        kwargs = dict(options) if metric is None else {**options, "metric": metric}
        make_task(name, tokenizer=tok, n=n, seed=seed, **kwargs)


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
        if key in out:  # the last value would silently win
            raise InputError(f"--task-option {key} is given more than once; give it once")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        if not option_matches(value, types[key]) and option_matches(raw, types[key]):
            value = raw
        out[key] = value
    return out


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


def attribution_flops(cfg, spec, method: str, n: int, *, ig_steps: int, level: str = "edge") -> float:
    """FLOPs of attributing ``n`` examples of ``spec``'s task with ``method`` on a model of config ``cfg``
    (circuitstat.circuits.plan: the ``--plan`` arithmetic; needs no weights)."""
    from circuitstat.circuits.plan import method_cost

    moe_nodes = getattr(spec, "moe_nodes", "block")
    if moe_nodes != "block":  # experts as nodes: the costs count that graph (circuitstat.circuits.moe_nodes.graph_of)
        import copy

        from circuitstat.circuits.moe_nodes import check_moe_nodes

        check_moe_nodes(cfg, moe_nodes)
        cfg = copy.copy(cfg)
        cfg.moe_nodes = moe_nodes
    task = spec.task if not isinstance(spec.task, str) else None
    name, options = (task.name, task.options) if task is not None else (spec.task, getattr(spec, "task_options", {}))
    positions = task_positions(name, options or {}) or min(int(cfg.n_ctx), 64)
    return method_cost(cfg, method, n=n, positions=positions, level=level, batch_size=spec.batch_size,
                       ig_steps=ig_steps).flops


def load_with_graph(inputs, source: str, moe_nodes: str, *, device: str, dtype, allow_pickle: bool = False,
                    allow_large: bool = False):
    """Return ``source`` loaded by ``inputs`` with the ``moe_nodes`` graph (circuitstat.circuits.moe_nodes); for
    'experts', InputError on a model without mixture-of-experts layers, from its config before a weight is read."""
    from circuitstat.circuits.moe_nodes import check_moe_nodes, set_moe_nodes

    if moe_nodes != "block":
        check_moe_nodes(inputs.skeleton(source, allow_pickle=allow_pickle, allow_large=allow_large).cfg, moe_nodes)
    model = inputs.load(source, device=device, dtype=dtype, allow_pickle=allow_pickle, allow_large=allow_large)
    return set_moe_nodes(model, moe_nodes) if moe_nodes != "block" else model
