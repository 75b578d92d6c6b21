"""Building a task for a model: the one place that turns (model, task name, options) into a Task."""

from __future__ import annotations

from circuits.errors import InputError
from circuits.model import CircuitModel
from circuits.tasks import Task, make_task


def build_task(model: CircuitModel, name: str, *, n: int = 64, seed: int = 0, metric: str | None = None,
               **options) -> Task:
    """The task ``name`` tokenized for ``model`` and validated against its vocabulary and context."""
    tok = model.tokenizer
    kwargs = dict(options)
    if metric is not None:
        kwargs["metric"] = metric
    if tok is None:
        if name not in ("induction",):
            raise InputError(
                f"task {name!r} needs a tokenizer and the model {model.source} has none; "
                "use the induction task (works on any vocabulary) or a model directory with a tokenizer"
            )
        kwargs.setdefault("vocab_size", model.cfg.vocab_size)
    task = make_task(name, tokenizer=tok, n=n, seed=seed, **kwargs)
    return task.validate(model)


def resolve_source(source: str) -> str:
    """``zoo:RECIPE/seed-S`` -> that model's directory in the default zoo's cache; other sources unchanged."""
    if not str(source).startswith("zoo:"):
        return source
    from .zoo import ZOO_RECIPES, zoo_dir

    rel = str(source)[len("zoo:"):].strip("/")
    path = zoo_dir() / rel
    if rel.split("/")[0] not in ZOO_RECIPES or not (path / "model.safetensors").exists():
        raise InputError(f"{source}: no such model in the default zoo at {path}; sources look like "
                         f"zoo:{next(iter(ZOO_RECIPES))}/seed-0 (recipes: {', '.join(ZOO_RECIPES)}); build the zoo "
                         "first with `python -m pipelines.zoo` (about 10 minutes on 2 cores, cached)")
    return str(path)
