"""Building a task for a model: the one place that turns (model, task name, options) into a Task."""

from __future__ import annotations

from circuits.errors import InputError
from circuits.model import CircuitModel
from circuits.tasks import Task, make_task


def build_task(model: CircuitModel, name: str, *, n: int = 64, seed: int = 0, metric: str | None = None,
               **options) -> Task:
    """The task ``name`` tokenized for ``model`` and validated against its vocabulary and context.

    Induction tokens (``token_ids``): a list of ids, or ``"frequent[:MIN_COUNT]"`` for the tokens a
    circuitstat-trained model saw at least MIN_COUNT (default 1000) times in training
    (``pipelines.zoo.frequent_tokens``). Unset, a circuitstat-trained model gets ``"frequent"``
    and any other model its whole vocabulary: a small byte-level BPE holds bytes that never occur
    in the corpus, whose untrained embeddings would make the prompts off-distribution.
    """
    tok = model.tokenizer
    kwargs = dict(options)
    if name == "induction":
        seq_len = int(kwargs.get("seq_len", 20))
        need = 2 * seq_len if kwargs.get("corrupt", "all") == "all" else seq_len + 1  # as induction_task
        kwargs["token_ids"] = _induction_pool(model, kwargs.get("token_ids"), need)
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
    """``zoo:RECIPE/seed-S`` -> that model's directory in the zoo's cache; other sources unchanged."""
    if not str(source).startswith("zoo:"):
        return source
    from .zoo import ZOO_RECIPES, recipe_dir

    name, _, model = str(source)[len("zoo:"):].strip("/").partition("/")
    if name not in ZOO_RECIPES or not model:
        raise InputError(f"{source}: not a zoo model; sources look like zoo:{next(iter(ZOO_RECIPES))}/seed-0 "
                         f"(recipes: {', '.join(ZOO_RECIPES)})")
    path = recipe_dir(name) / model
    if not (path / "model.safetensors").exists():
        raise InputError(f"{source}: not trained yet (no model at {path}); build the zoo first with "
                         "`python -m pipelines.zoo` (about 12 minutes on 2 cores, cached) or `make demo` "
                         f"(trains {next(iter(ZOO_RECIPES))} only)")
    return str(path)


def _induction_pool(model: CircuitModel, token_ids, need: int) -> list[int] | None:
    """The induction task's token pool: ``token_ids`` resolved (see :func:`build_task`); unset, at
    least ``need`` tokens (the most frequent ones when fewer pass the bar)."""
    from .zoo import frequent_tokens

    if token_ids is not None and not isinstance(token_ids, str):
        return [int(i) for i in token_ids]
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
