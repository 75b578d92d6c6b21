"""Variance study: where the uncertainty of a circuit comes from.

After Méloux, Portet and Peyrard (ICML 2026, "Mechanistic Interpretability as Statistical
Estimation: A Variance Analysis"). One spec names a model (or several training seeds of it), a
task and the factors to vary; ``run_variance_study`` writes a resumable run directory with:

* ``intrinsic``: per-input variation of exact scores per edge: mean, SD, coefficient of variation,
  sign consistency, SNR (|mean| / SD), excess kurtosis and the share of the sum of squared
  deviations carried by the top 5 % of inputs, with its 99th percentile for Gaussian scores of the
  same N (``heavy_tailed`` = above it: a 1 %-level test of tail concentration).
* ``edge_stats`` / ``stability_vs_k`` / ``inclusion``: the audit's per-edge CIs and bootstrap
  circuit stability for every estimator (the *dataset sampling* factor, resampling examples).
* ``approximation`` / ``approximation_summary``: per-input error of each estimator against exact
  (bias, error SD, slope, R², rank agreement), as the audit writes them.
* ``variance_components``: per edge, the crossed random-effects decomposition
  examples × counterfactual draw × estimator (× training seed) from ``stats.variance_components``,
  with Satterthwaite CIs (normal theory, labelled so in ``interval``); ``variance_shares``: the
  shares pooled over the top edges
  (``stats.variance.pooled_shares``): a basic bootstrap over prompts for the terms with examples
  (robust to heavy-tailed effects), a normal-theory pivot for the terms without them
  (``interval_reliable`` False: they rest on the few levels of their factors).
* ``variance_stability``: for every factor and level, the Jaccard of that level's top-k circuit to
  the reference circuit (exact scores, mean aggregation, the full dataset, the task's own
  counterfactual, the first seed) as a function of k, with a data-level interval whose estimand
  is written in the ``estimand`` column (see below), and the old resampling spread of one dataset
  (``spread_low`` / ``spread_high``, labelled; never used for a verdict).
* ``faithfulness_vs_k`` / ``selection``: faithfulness of each estimator's circuits on a grid of k and
  the smallest k reaching the target faithfulness (selection at fixed faithfulness).
* ``variance_summary``: per factor, how much it moves the circuit at ``summary_k``, its interval,
  the spec's ``bar`` (a column) and the verdict drawn from the interval (``met`` when the interval
  lies above the bar, ``not met`` below, ``inconclusive`` across; ``meets_bar`` = met);
  ``summary``: the headline numbers with intervals and verdicts.

Factors
-------
* **dataset sampling**: bootstrap resamples of the examples (B >= 100) and ``dataset.n_fresh``
  fresh draws of the task (task seed + 1, + 2, ...: new random tokens or template fillings).
* **counterfactual choice**: ``counterfactual.n_draws`` corrupted inputs per clean input. Draw 0 is
  the task's own; for induction the others re-draw the corrupted tokens of the same clean prompts
  (``redraw``); for other tasks each clean prompt takes the corrupted prompt of another example of
  the same length and group (``shuffle``). The metric (answer vs the task's wrong answer) is held
  fixed, so only the patched-in activations change. Each draw is a copy of the task with its
  corrupted prompts replaced (``with_counterfactual``). With independent draws per example the
  counterfactual *main* effect (draw index) is near zero by design: the variance from the choice
  of counterfactual shows up in the examples:counterfactual interaction.
* **estimator**: exact patching, EAP, EAP-IG (inputs / activations, on a grid of steps),
  clean-corrupted.
* **aggregation**: mean (the reference), median, trimmed mean, mean |s| of the exact scores.
* **selection**: the k grid (the x axis of every stability table) and selection at fixed
  faithfulness.
* **training seed**: when the spec lists several ``models``. Edges are compared by name: heads are
  not matched across seeds (head stability across seeds is the heads audit's job), so this factor
  includes relabelling of equivalent heads.

Jaccard and intervals (computed in ``stats.factor_stability`` and ``stats.stability_data``):

* paired factors (counterfactual draw, estimator, aggregation, seed, selection): the same prompts
  scored two ways. Estimand: E over datasets of N prompts of J(level's top-k, reference's top-k),
  the level held fixed (for seeds: these trained models, not the distribution of seeds). Value:
  its bootstrap plug-in (mean over resamples); interval: double bootstrap + split extrapolation,
  bracketed (``stats.factor_stability.paired_jaccard``). ``jaccard_full_data`` is the full-data
  Jaccard (one draw of the quantity averaged).
* dataset, fresh draws: independent datasets. Estimand: E[J(top-k of D1, top-k of D2)] for two
  independent datasets of N prompts; interval: the data-level interval of the reference's
  ``stability_vs_k`` (``jaccard_data_ci``); the value of a draw is its observed Jaccard.
* dataset, bootstrap: E[J(top-k of a dataset of N prompts, top-k of the population)]
  (``jaccard_pop_ci``).

Below 32 examples (or with the clusters scheme) the values are computed but the intervals are
NaN with the reason in ``interval``; verdicts are then empty.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
from pydantic import Field, field_validator, model_validator

from circuits.errors import InputError

if TYPE_CHECKING:  # the result type; imported when the study returns
    from reports.run_tables import RunTables

from .build import load_source, resolve_source
from .spec import METHOD, BootstrapSpec, KGrid, TaskSpec, _RunOptions, _Strict, load_yaml, validate_spec

__all__ = [
    "AGGREGATIONS", "with_counterfactual", "VarianceSpec", "ModelScorer", "counterfactual_corruptions",
    "load_variance_spec", "parse_variance_spec", "resolve_source",
    "run_variance_study",
]

AGGREGATIONS = ("mean", "median", "trimmed_mean", "mean_abs")  # as stats.factor_stability.AGGREGATIONS
#: what the per-edge component intervals of variance_components are (the pooled shares are robust)
PER_EDGE_COMPONENT_INTERVAL = ("Satterthwaite chi-square interval of this edge's component (normal theory: "
                               "not robust to heavy-tailed scores; see variance_shares for robust pooled intervals)")
#: how the summary's verdicts combine intervals
MULTIPLICITY = "none: each verdict reads its own interval at the stated confidence level"


# ----- spec ---------------------------------------------------------------------------------
class EstimatorsSpec(_Strict):
    """Estimators compared with exact patching (the reference, always first)."""

    methods: list[METHOD] = Field(default_factory=lambda: ["exact", "eap", "eap-ig-inputs", "clean-corrupted"],
                                  min_length=2)
    ig_steps: list[int] = Field(default_factory=lambda: [5], min_length=1)

    @field_validator("methods")
    @classmethod
    def _exact_first(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("methods are listed more than once")
        if "exact" not in v:
            raise ValueError("methods must include 'exact' (the reference the others are compared with)")
        return ["exact"] + [m for m in v if m != "exact"]

    @field_validator("ig_steps")
    @classmethod
    def _steps(cls, v: list[int]) -> list[int]:
        if any(s < 1 for s in v):
            raise ValueError("every ig_steps value must be a positive integer")
        return sorted(set(v))


class CounterfactualSpec(_Strict):
    """Several corrupted inputs per clean input."""

    n_draws: int = Field(3, ge=1, le=64)
    scheme: Literal["auto", "redraw", "shuffle"] = "auto"


class DatasetSpec(_Strict):
    """Fresh draws of the whole dataset (task seeds seed+1 .. seed+n_fresh)."""

    n_fresh: int = Field(2, ge=0, le=64)


class SelectionSpec(_Strict):
    """Selection at fixed faithfulness: the smallest k whose circuit reaches ``target``."""

    enabled: bool = True
    target: float = Field(0.8, gt=0.0, le=1.0)
    ks: list[int] | None = None

    @field_validator("ks")
    @classmethod
    def _ks(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (not v or any(k < 1 for k in v)):
            raise ValueError("selection.ks must be a non-empty list of positive integers")
        return None if v is None else sorted(set(v))


class VarianceSpec(_RunOptions):
    """Everything one variance study runs; see the module docstring."""

    model: str | None = None
    models: list[str] | None = None
    task: TaskSpec = TaskSpec()
    level: Literal["edge", "node"] = "edge"
    estimators: EstimatorsSpec = EstimatorsSpec()
    counterfactual: CounterfactualSpec = CounterfactualSpec()
    dataset: DatasetSpec = DatasetSpec()
    aggregations: list[Literal["mean", "median", "trimmed_mean", "mean_abs"]] = Field(
        default_factory=lambda: list(AGGREGATIONS), min_length=1)
    trim: float = Field(0.1, ge=0.0, lt=0.5)
    bootstrap: BootstrapSpec = BootstrapSpec(n_resamples=200, ci_method="percentile")
    k: KGrid = Field(default_factory=lambda: [5, 10, 20], min_length=1)
    summary_k: int | None = None
    ranking: Literal["absolute", "signed"] = "absolute"
    selection: SelectionSpec = SelectionSpec()
    n_top: int = Field(50, ge=2, le=100_000)
    bar: float = Field(0.8, gt=0.0, le=1.0)

    @field_validator("aggregations")
    @classmethod
    def _mean_first(cls, v: list[str]) -> list[str]:
        return ["mean"] + [a for a in dict.fromkeys(v) if a != "mean"]

    @model_validator(mode="after")
    def _check(self) -> "VarianceSpec":
        if (self.model is None) == (self.models is None):
            raise ValueError("give exactly one of 'model' (one source) or 'models' (several seeds of one model)")
        if self.models is not None and len(self.models) == 0:
            raise ValueError("'models' is empty; list at least one model")
        if self.bootstrap.n_resamples < 100:
            raise ValueError("bootstrap.n_resamples must be at least 100 for the variance study")
        if self.bootstrap.scheme == "half-splits":
            raise ValueError("bootstrap.scheme 'half-splits' does not apply here; use 'examples' or 'clusters'")
        if self.summary_k is not None and self.summary_k not in self.k:
            raise ValueError(f"summary_k={self.summary_k} must be one of k {self.k}")
        return self

    @property
    def sources(self) -> list[str]:
        """Model sources (training seeds); the first is the reference."""
        return list(self.models) if self.models is not None else [self.model]

    @property
    def k_summary(self) -> int:
        """The k at which the summary states each factor's Jaccard (default: the middle of k)."""
        return self.summary_k if self.summary_k is not None else self.k[(len(self.k) - 1) // 2]

    def estimator_levels(self) -> list[tuple[str, str, int]]:
        """(label, method, ig_steps) of every estimator level, exact first."""
        out = []
        for m in self.estimators.methods:
            if m.startswith("eap-ig"):
                out += [(f"{m}@{s}", m, s) for s in self.estimators.ig_steps]
            else:
                out.append((m, m, 1))
        return out


def parse_variance_spec(data: Any, source: str = "<spec>") -> VarianceSpec:
    """A VarianceSpec from parsed YAML, or InputError naming each bad key."""
    return validate_spec(VarianceSpec, data, source, keys="model, task, estimators, ...")


def load_variance_spec(path: str | Path, *, allow_outside: bool = False) -> VarianceSpec:
    """The validated variance-study spec in a YAML file, local paths resolved relative to it."""
    from .spec import confine_paths

    return confine_paths(parse_variance_spec(load_yaml(path), str(path)), path, allow_outside=allow_outside)


def _view(spec: VarianceSpec, **over) -> SimpleNamespace:
    """The fields pipelines.audit's helpers read from an audit spec."""
    base = dict(level=spec.level, ablation="counterfactual", batch_size=spec.batch_size, ig_steps=1,
                seed=spec.seed, bootstrap=spec.bootstrap, ranking=spec.ranking)
    base.update(over)
    return SimpleNamespace(**base)


# ----- counterfactual draws -------------------------------------------------------------------
def with_counterfactual(task, corrupted):
    """A copy of ``task`` whose corrupted prompts are ``corrupted`` [N, P]; everything else (clean
    prompts, answers, the metric's wrong answer) is unchanged.

    The copy goes through attribution with the ordinary 'counterfactual' ablation, so every
    estimator sees this draw as *the* corrupted input: clean-corrupted takes its second gradient
    on the corrupted run itself. (An ablation object would give the same exact and EAP scores, but
    clean-corrupted would then take that gradient at the all-edges-patched point, where only the
    logits receiver has a nonzero gradient.)
    """
    import dataclasses

    import torch

    ids = torch.as_tensor(np.asarray(corrupted), dtype=torch.long)
    if ids.shape != task.clean.shape:
        raise InputError(f"counterfactual draw has shape {tuple(ids.shape)}, the task {tuple(task.clean.shape)}")
    return dataclasses.replace(task, corrupted=ids, corrupted_prompts=None,
                               meta={**task.meta, "counterfactual_draw": True})


def _redraw(task, rng: np.random.Generator, pool: np.ndarray):
    """Induction: new random tokens in the corrupted span of every prompt, clean prompts unchanged."""
    meta = task.meta
    s0, s1 = (int(x) for x in meta["first_repeat"])
    span = np.arange(s0, s1) if meta.get("corrupt", "all") == "all" else np.array([s1 - 1])
    clean = task.clean.numpy()
    new = task.corrupted.numpy().copy()
    for n in range(clean.shape[0]):
        cand = np.setdiff1d(pool, clean[n, s0:s1])  # as the task: corrupted tokens avoid A
        if cand.size < span.size:
            raise InputError(f"induction: {cand.size} tokens are too few to redraw {span.size} corrupted positions; "
                             "use counterfactual.scheme 'shuffle' or a larger vocabulary")
        new[n, span] = rng.choice(cand, size=span.size, replace=False)
    return new


def _shuffle(task, rng: np.random.Generator):
    """Each clean prompt takes the corrupted prompt of another example with its length (and group)."""
    from circuits.ablation import derangement

    lengths = task.attention_mask.sum(-1).numpy()
    groups = np.zeros_like(lengths) if task.group is None else task.group.numpy()
    new = task.corrupted.numpy().copy()
    src = task.corrupted.numpy()
    keys = np.stack([lengths, groups], 1)
    for key in np.unique(keys, axis=0):
        rows = np.flatnonzero((keys == key).all(1))
        if rows.size < 2:
            raise InputError(f"counterfactual shuffle: example {int(rows[0])} has no other example of its length "
                             f"{int(key[0])}{'' if task.group is None else ' and group'}; use more examples, "
                             "counterfactual.n_draws 1, or a task with equal-length prompts")
        perm = derangement(rows.size, int(rng.integers(2**31)))
        new[rows] = src[rows[perm]]
    return new


def counterfactual_corruptions(task, n_draws: int, scheme: str, seed, pool) -> list:
    """Corrupted-id arrays [N, P] for draws 0..n_draws-1 (draw 0 is the task's own corrupted prompts).

    ``pool``: the token ids a redraw may use (the induction task's candidates: the vocabulary
    without special tokens, or its ``token_ids``). Draw c's randomness is child c of ``seed``.
    """
    from stats import spawn_seeds

    pool = np.unique(np.asarray(pool, dtype=np.int64))

    if scheme == "auto":
        scheme = "redraw" if task.name == "induction" and "first_repeat" in task.meta else "shuffle"
    if scheme == "redraw" and not (task.name == "induction" and "first_repeat" in task.meta):
        raise InputError(f"counterfactual.scheme 'redraw' needs the induction task (got {task.name!r}); use 'shuffle'")
    out = [task.corrupted.numpy()]
    for ss in spawn_seeds(seed, n_draws)[1:]:
        rng = np.random.default_rng(ss)
        out.append(_redraw(task, rng, pool) if scheme == "redraw" else _shuffle(task, rng))
    return out


# ----- score sources ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Key:
    """One score matrix of the study: model seed, dataset draw, counterfactual draw, estimator level."""

    seed: int
    dataset: int
    draw: int
    estimator: str

    @property
    def name(self) -> str:
        return f"scores_s{self.seed}_d{self.dataset}_c{self.draw}_{self.estimator.replace('@', '-')}"


class Scorer(Protocol):
    """Where score matrices come from (ModelScorer; tests plug in generators with planted effects)."""

    names: list[str]
    index_table: Any

    def n_obs(self, dataset: int) -> int: ...
    def groups(self, dataset: int) -> np.ndarray | None: ...
    def params(self, key: Key) -> dict: ...
    def score_table(self, key: Key, n_jobs: int) -> Any: ...


class ModelScorer:
    """Score matrices from the spec's models and task (attribution in fixed chunks, any n_jobs)."""

    has_model = True

    def __init__(self, spec: VarianceSpec, seed_of, *, allow_pickle: bool = False, allow_large: bool = False) -> None:
        from circuits.scores import ScoreMatrix

        from .build import build_task

        self.spec, self._seed_of = spec, seed_of
        self._load = dict(device=spec.device, dtype=spec.dtype, allow_pickle=allow_pickle, allow_large=allow_large)
        self._models: dict[int, Any] = {0: load_source(spec.sources[0], **self._load)}
        m0 = self.model(0)
        t = spec.task
        self._opts = dict(t.options)
        self._build = lambda j: build_task(m0, t.name, n=t.n, seed=t.seed + j, metric=t.metric, **self._opts)
        self._tasks: dict[int, Any] = {0: self._build(0)}
        self._draws: list | None = None
        n_cols = m0.graph.n_edges if spec.level == "edge" else m0.graph.n_senders
        sm0 = ScoreMatrix(np.zeros((1, n_cols), np.float32), m0.graph, spec.level, "none", "counterfactual", "none")
        self.names = sm0.names
        self.index_table = sm0.tables()["edges" if spec.level == "edge" else "nodes"]
        self.provenance = {"model": m0.identity(), "task": self.task(0).describe()}

    def model(self, s: int):
        if s not in self._models:
            m = load_source(self.spec.sources[s], **self._load)
            if m.graph.edge_names != self._models[0].graph.edge_names:
                raise InputError(f"model {self.spec.sources[s]} has a different component graph from "
                                 f"{self.spec.sources[0]}; the seeds of a study must share one architecture")
            self.task(0).validate(m)
            self._models[s] = m
        return self._models[s]

    def task(self, j: int):
        if j not in self._tasks:
            self._tasks[j] = self._build(j)
        return self._tasks[j]

    def n_obs(self, dataset: int) -> int:
        return int(self.task(dataset).clean.shape[0])

    def groups(self, dataset: int):
        t = self.task(dataset)
        return None if t.group is None else t.group.numpy()

    def draws(self) -> list:
        if self._draws is None:
            m, t = self.model(0), self.task(0)
            tok, opts = m.tokenizer, self._opts
            if "token_pool" in t.meta:  # the induction task's own candidates
                pool = np.asarray(t.meta["token_pool"], dtype=np.int64)
            else:  # as induction_task: the vocabulary without special tokens
                special = [] if tok is None else [i for i in (tok.bos_id, tok.eos_id, getattr(tok, "pad_id", None))
                                                   if i is not None]
                vocab = int(opts.get("vocab_size") or (tok.vocab_size if tok is not None else m.cfg.vocab_size))
                pool = np.setdiff1d(np.arange(vocab), np.asarray(special, dtype=np.int64))
            self._draws = counterfactual_corruptions(t, self.spec.counterfactual.n_draws, self.spec.counterfactual.scheme,
                                                     self._seed_of("counterfactual"), pool)
        return self._draws

    def params(self, key: Key) -> dict:
        import hashlib

        spec = self.spec
        label, method, steps = next(x for x in spec.estimator_levels() if x[0] == key.estimator)
        p = {"model": spec.sources[key.seed], "weight_hash": self.model(key.seed).weight_hash(),
             "task": spec.task.model_dump(), "task_hash": self.task(key.dataset).content_hash, "dataset": key.dataset,
             "method": method, "ig_steps": steps, "level": spec.level, "batch_size": spec.batch_size,
             "seed": spec.seed, "draw": key.draw}
        if key.draw:
            p["counterfactual"] = {"scheme": spec.counterfactual.scheme,
                                   "ids_sha256": hashlib.sha256(np.ascontiguousarray(self.draws()[key.draw]).tobytes()).hexdigest()}
        return p

    def score_table(self, key: Key, n_jobs: int):
        from .audit import attribution_scores

        spec = self.spec
        label, method, steps = next(x for x in spec.estimator_levels() if x[0] == key.estimator)
        model, task = self.model(key.seed), self.task(key.dataset)
        if key.draw:
            task = with_counterfactual(task, self.draws()[key.draw])
        sm = attribution_scores(model, task, method, _view(spec, ig_steps=steps), n_jobs)
        sm.method = label
        return sm.tables({"task": task.describe(), "study": {"seed": key.seed, "dataset": key.dataset,
                                                             "draw": key.draw, "estimator": label}})["scores"]


# ----- the study --------------------------------------------------------------------------------
def run_variance_study(spec: VarianceSpec, out: str | Path, n_jobs: int | None = None, force: bool = False, *,
                       scorer: Scorer | None = None, allow_pickle: bool = False,
                       allow_large: bool = False) -> RunTables:
    """Run (or resume) the variance study of ``spec`` into run directory ``out``; return its tables as a
    result (reports.run_tables.RunTables, read lazily; main table ``variance_summary``).

    ``scorer`` replaces the models as the source of score matrices (a Scorer; used to validate the
    study on scores with planted variance components); the selection stage then needs
    ``scorer.model(0)`` / ``scorer.task(0)`` or is skipped. ``allow_pickle`` / ``allow_large``: as
    for ``load_model`` (pickled weights; models above the memory limit).
    """
    from reports.rundir import RunDir

    from .training import use_deterministic

    from .build import check_device, check_n_jobs

    out = Path(out)
    n_jobs = check_n_jobs(spec.n_jobs if n_jobs is None else n_jobs, "--n-jobs" if n_jobs is not None else "n_jobs")
    use_deterministic()  # CUBLAS_WORKSPACE_CONFIG too, before any model loads
    spec_doc = spec.model_dump()
    box: dict = {}
    if scorer is None:
        check_device(spec.device)
    sc = scorer if scorer is not None else ModelScorer(spec, lambda name: box["run"].stage_seed(name),
                                                       allow_pickle=allow_pickle, allow_large=allow_large)
    check_study(spec, sc)  # before the run directory exists
    with RunDir(out, spec=spec_doc, command=sys.argv, seed=spec.seed,
                provenance=getattr(sc, "provenance", {"scores": "user scorer"})) as run:
        box["run"] = run
        _Study(spec, run, sc, n_jobs, force).execute()
    from reports.run_tables import RunTables

    names = tuple(sorted(p.stem for p in out.glob("*.parquet") if not p.stem.startswith("scores_")))
    return RunTables(out, names, "variance_summary", {"study": "variance", "spec": spec_doc})


def check_study(spec: VarianceSpec, scorer) -> None:
    """None; InputError when k is not below the number of columns, when the clusters scheme meets a
    task without groups, or when the study's score matrices would exceed the memory limit."""
    from circuits.limits import check_bytes

    from .audit import check_scheme

    E = len(scorer.names)
    if spec.k[-1] >= E:
        raise InputError(f"k={spec.k[-1]} is not below the number of {spec.level}s ({E}); use smaller k")
    check_scheme(spec.bootstrap.scheme, scorer.groups(0), spec.task.name)
    n_matrices = len(spec.sources) * spec.counterfactual.n_draws * len(spec.estimator_levels()) + spec.dataset.n_fresh
    check_bytes(n_matrices * scorer.n_obs(0) * E * 4.0, f"the study's {n_matrices} score matrices")


class _Study:
    """The stages of one study over a RunDir (see the module docstring for the tables)."""

    def __init__(self, spec: VarianceSpec, run, scorer, n_jobs: int, force: bool) -> None:
        self.spec, self.run, self.sc, self.n_jobs, self.force = spec, run, scorer, n_jobs, force
        self.names = list(scorer.names)
        self.E = len(self.names)
        self.levels = [lab for lab, _, _ in spec.estimator_levels()]
        self.S_models = len(spec.sources)
        self.C = spec.counterfactual.n_draws
        self.ks = list(spec.k)
        self.K = self.ks[-1]
        self.cl = spec.bootstrap.confidence_level
        self._cache: dict[str, np.ndarray] = {}

    # -- scores --
    def keys(self) -> list[Key]:
        ks = [Key(s, 0, c, lab) for s in range(self.S_models) for c in range(self.C) for lab in self.levels]
        return ks + [Key(0, j, 0, "exact") for j in range(1, self.spec.dataset.n_fresh + 1)]

    def S(self, key: Key) -> np.ndarray:
        from reports.tables import table_to_matrix

        if key.name not in self._cache:
            self._cache[key.name] = np.asarray(table_to_matrix(self.run.table(key.name)), dtype=np.float32)
        return self._cache[key.name]

    def plan(self, dataset: int):
        from .audit import resampling_plan

        return resampling_plan(_view(self.spec), self.sc.n_obs(dataset), self.sc.groups(dataset),
                               self.run.stage_seed(f"resampling_d{dataset}"), for_intervals=True)

    def stage(self, name, fn, outputs, params, deps):
        from .audit import run_stage

        return run_stage(self.run, name, fn, outputs, params=params, depends_on=deps, force=self.force)

    def execute(self) -> None:
        spec = self.spec
        index = "edges" if spec.level == "edge" else "nodes"
        self.stage("index", lambda: {index: self.sc.index_table}, [index], {"names_sha": _names_hash(self.names)},
                   [])
        from tqdm.auto import tqdm

        keys = self.keys()
        for key in tqdm(keys, desc="variance study: score matrices", leave=False):
            self.stage(key.name, lambda key=key: {key.name: self.sc.score_table(key, self.n_jobs)}, [key.name],
                       self.sc.params(key), ["index"])
        self.deps = ["index"] + [k.name for k in keys]
        self.ref = Key(0, 0, 0, "exact")
        self.plan0 = self.plan(0)
        rs = {"bootstrap": spec.bootstrap.model_dump(), "k": self.ks, "ranking": spec.ranking, "trim": spec.trim,
              "aggregations": spec.aggregations, "n_top": spec.n_top, "summary_k": spec.k_summary, "bar": spec.bar,
              "intervals": "data-level v4"}  # interval methods: a change recomputes the statistics stages
        self.rs = rs
        self.stage("intrinsic", self.intrinsic_stage, ["intrinsic", "edge_stats"], rs, self.deps)
        self.stage("stability", self.stability_stage, ["stability_vs_k", "inclusion"], rs, self.deps)
        self.stage("approximation", self.approximation_stage, ["approximation", "approximation_summary"], rs,
                   self.deps)
        self.stage("variance", self.variance_stage, ["variance_components", "variance_anova", "variance_shares"], rs,
                   self.deps)
        self.stage("factors", self.factor_stage, ["variance_stability"], rs, self.deps + ["stability"])
        sel = spec.selection.enabled and spec.level == "edge" and getattr(self.sc, "has_model", False)
        if sel:
            self.stage("selection", self.selection_stage, ["faithfulness_vs_k", "selection"],
                       {**rs, "selection": spec.selection.model_dump()}, self.deps)
        summary_deps = ["intrinsic", "approximation", "variance", "factors"] + (["selection"] if sel else [])
        self.stage("summary", lambda: self.summary_stage(sel), ["variance_summary", "summary"],
                   {**rs, "selection": sel}, summary_deps)

    # -- intrinsic variation, per-edge CIs --
    def top_edges(self, n: int) -> np.ndarray:
        from stats.factor_stability import aggregate
        from stats.topk import topk

        mean = aggregate(self.S(self.ref), "mean", self.spec.trim)
        return topk(mean, min(n, self.E), ranking=self.spec.ranking, seed=self.run.stage_seed("top_edges")).indices

    def intrinsic_stage(self) -> dict:
        from .audit import _concat, edge_stats_table

        S = self.S(self.ref)
        stats_parts = [edge_stats_table(self.S(Key(0, 0, 0, lab)), self.names, lab, self.plan0, _view(self.spec),
                                        self.n_jobs) for lab in self.levels]
        from stats.intrinsic import intrinsic_table

        tab = intrinsic_table(S, self.names)
        tab["rank"] = np.empty(self.E, dtype=np.int64)
        tab["rank"][self.top_edges(self.E)] = np.arange(1, self.E + 1)
        return {"intrinsic": tab, "edge_stats": _concat(stats_parts)}

    # -- dataset sampling: bootstrap stability of each estimator's circuits --
    def stability_stage(self) -> dict:
        from .audit import _concat, stability_tables

        parts = [stability_tables(self.S(Key(0, 0, 0, lab)), self.names, lab, self.plan0, self.ks, _view(self.spec),
                                  self.n_jobs) for lab in self.levels]
        return {"stability_vs_k": _concat([p[0] for p in parts]), "inclusion": _concat([p[1] for p in parts])}

    # -- estimator: approximation error against exact --
    def approximation_stage(self) -> dict:
        from .audit import _concat, approximation_tables

        ex = self.S(self.ref)
        parts = [approximation_tables(ex, self.S(Key(0, 0, 0, lab)), self.names, lab, self.spec.k_summary,
                                      self.spec.ranking) for lab in self.levels[1:]]
        return {"approximation": _concat([p[0] for p in parts]),
                "approximation_summary": _concat([p[1] for p in parts])}

    # -- variance components of the crossed design --
    def design(self, edges: np.ndarray | slice = slice(None)) -> tuple[np.ndarray, list[str]]:
        """Y [N, (C), (M), (seeds), E'] and the factor names (factors with one level are dropped)."""
        S_, C, M = self.S_models, self.C, len(self.levels)
        N = self.sc.n_obs(0)
        first = self.S(self.ref)[:, edges]
        Y = np.empty((N, C, M, S_, first.shape[1]), dtype=np.float64)
        for s in range(S_):
            for c in range(C):
                for m, lab in enumerate(self.levels):
                    Y[:, c, m, s] = self.S(Key(s, 0, c, lab))[:, edges]
        factors = ["examples", "counterfactual", "estimator", "seed"]
        keep = [0] + [a for a in (1, 2, 3) if Y.shape[a] > 1]
        Y = Y.reshape(tuple(Y.shape[a] for a in keep) + (Y.shape[-1],)) if len(keep) < 4 else Y
        return Y, [factors[a] for a in keep]

    def variance_stage(self) -> dict:
        from stats import variance_components

        Y0, factors = self.design(slice(0, 1))
        if len(factors) < 2:
            raise InputError("the variance design needs a second factor besides examples: use counterfactual.n_draws "
                             ">= 2, two or more estimators, or several models")
        cells = int(np.prod(Y0.shape[:-1]))
        step = max(1, int(2**27 // (8 * cells)))
        comp_parts, anova_parts = [], []
        for s in range(0, self.E, step):
            sl = slice(s, min(self.E, s + step))
            Y, _ = self.design(sl)
            vc = variance_components(Y, factors, confidence_level=self.cl, edge_names=self.names[sl])
            tabs = vc._tables()
            main, anova = tabs["main"], tabs["anova"]
            comp_parts.append({"edge": main["edge"] + s, "name": list(main["edge_name"]), "source": list(main["component"]),
                               "variance": main["variance"], "share": main["share"], "se": main["standard_error"],
                               "ci_low": main["ci_low"], "ci_high": main["ci_high"],
                               "negative_estimate": np.asarray(main["negative_estimate"], dtype=bool),
                               "interval": [PER_EDGE_COMPONENT_INTERVAL] * len(main["edge"])})
            anova_parts.append({"edge": anova["edge"] + s, "term": list(anova["term"]), "df": anova["df"],
                                "mean_square": anova["mean_square"]})
        from .audit import _concat

        top = self.top_edges(self.spec.n_top)
        Yt, _ = self.design(top)
        from stats.variance import pooled_shares

        shares = pooled_shares(Yt, factors, confidence_level=self.cl, seed=self.run.stage_seed("variance_shares"))
        shares["factors"] = [" x ".join(factors)] * len(shares["source"])
        return {"variance_components": _concat(comp_parts), "variance_anova": _concat(anova_parts),
                "variance_shares": shares}

    # -- per-factor Jaccard to the reference circuit --
    def factor_levels(self) -> list[tuple[str, str, Any]]:
        """(factor, level, (key, aggregation, dataset)) for every compared level."""
        sp = self.spec
        out = []
        for j in range(1, sp.dataset.n_fresh + 1):
            out.append(("dataset: fresh draws", f"draw {j}", (Key(0, j, 0, "exact"), "mean", j)))
        for c in range(1, self.C):
            out.append(("counterfactual", f"draw {c}", (Key(0, 0, c, "exact"), "mean", 0)))
        for lab in self.levels[1:]:
            out.append(("estimator", lab, (Key(0, 0, 0, lab), "mean", 0)))
        for how in sp.aggregations[1:]:
            out.append(("aggregation", how, (self.ref, how, 0)))
        for s in range(1, self.S_models):
            out.append(("seed", f"seed {s}", (Key(s, 0, 0, "exact"), "mean", 0)))
        return out

    def _paired(self, levels: list, pairs: list, name: str, with_mean: bool):
        """stats.factor_stability.paired_jaccard on the reference dataset, or None with the reason."""
        from stats.factor_stability import paired_jaccard
        from stats.stability_data import MIN_OBS

        why = None
        if self.sc.n_obs(0) < MIN_OBS:
            why = f"no interval: a data-level interval needs at least {MIN_OBS} examples"
        elif self.plan0.kind != "bootstrap":
            why = f"no interval: the data-level interval needs the examples bootstrap, not {self.plan0.kind!r}"
        res = paired_jaccard(self.S(self.ref), levels, pairs, self.plan0.counts, ranking=self.spec.ranking,
                             trim=self.spec.trim, seed=self.run.stage_seed(name), confidence_level=self.cl,
                             with_mean=with_mean, intervals=why is None)
        return res, why or "paired double bootstrap + split extrapolation, bracketed (data level)"

    def factor_stage(self) -> dict:
        from stats import chance_jaccard
        from stats.factor_stability import PAIRED_ESTIMAND, SPREAD_LABEL, fresh_draw_jaccards
        from stats.stability_data import ESTIMANDS

        sp = self.spec
        pairs = [(k, k) for k in self.ks]
        nk = len(self.ks)
        nan = np.full(nk, np.nan)
        chance = np.asarray(chance_jaccard(self.E, self.ks), dtype=np.float64)
        cols = ("factor", "level", "k", "jaccard_mean", "ci_low", "ci_high", "estimand", "interval", "se", "bias",
                "split", "jaccard_full_data", "spread_low", "spread_high", "cutoff_ties", "chance", "n_resamples")
        rows: dict[str, list] = {c: [] for c in cols}

        def add(factor, level, j, lo, hi, estimand, interval, full, se=nan, bias=nan, split=nan, s_lo=nan,
                s_hi=nan, ties=None):
            ties = np.full(nk, -1) if ties is None else ties
            for i, k in enumerate(self.ks):
                for c, v in zip(cols, (factor, level, int(k), float(j[i]), float(lo[i]), float(hi[i]), estimand,
                                       interval, float(se[i]), float(bias[i]), float(split[i]), float(full[i]),
                                       float(s_lo[i]), float(s_hi[i]), int(ties[i]), float(chance[i]),
                                       int(self.plan0.n_resamples))):
                    rows[c].append(v)

        # independent datasets: the data-level intervals of stats.stability_data on the reference matrix
        st = self.run.table("stability_vs_k").to_pydict()
        ex = [i for i, m in enumerate(st["method"]) if m == "exact"]
        col = {c: np.asarray(st[c], dtype=np.float64)[ex] for c in ("jaccard_data", "jaccard_data_ci_low",
                                                                    "jaccard_data_ci_high", "jaccard_pop",
                                                                    "jaccard_pop_ci_low", "jaccard_pop_ci_high")}
        how_dl = "double bootstrap (stats.stability_data)" if np.isfinite(col["jaccard_pop_ci_low"]).any() else \
            "not computed (see stability_vs_k: data-level intervals need N >= 32 and the examples bootstrap)"
        add("dataset: bootstrap", "resamples", col["jaccard_pop"], col["jaccard_pop_ci_low"],
            col["jaccard_pop_ci_high"], ESTIMANDS["jaccard_pop_ci"], how_dl, nan)
        by_factor: dict[str, list] = {}
        for factor, level, spec_ in self.factor_levels():
            by_factor.setdefault(factor, []).append((level, spec_))
        fresh = by_factor.pop("dataset: fresh draws", [])
        fulls, mean_full = fresh_draw_jaccards(self.S(self.ref), [(self.S(key), how) for _, (key, how, _) in fresh],
                                               pairs, ranking=sp.ranking, trim=sp.trim,
                                               seed=self.run.stage_seed("fresh_draws"))
        for (level, _), full in zip(fresh, fulls):
            add("dataset: fresh draws", level, full, col["jaccard_data_ci_low"], col["jaccard_data_ci_high"],
                ESTIMANDS["jaccard_data_ci"], f"{how_dl}; the value is this draw's Jaccard to the reference", full)
        if len(fresh) > 1:
            add("dataset: fresh draws", "all levels (mean)", col["jaccard_data"], col["jaccard_data_ci_low"],
                col["jaccard_data_ci_high"], ESTIMANDS["jaccard_data_ci"],
                f"{how_dl}; value: its plug-in, full data: mean over the {len(fresh)} draws", mean_full)
        # paired factors: the same prompts scored two ways
        for factor, lv in by_factor.items():
            levels = [(self.S(key), how) for _, (key, how, _) in lv]
            res, how_iv = self._paired(levels, pairs, f"factor_{factor}", with_mean=len(lv) > 1)
            estimand = PAIRED_ESTIMAND + ("; for seeds: these trained models, not the distribution of training "
                                          "seeds" if factor == "seed" else "")
            names = [lvl for lvl, _ in lv] + (["all levels (mean)"] if len(lv) > 1 else [])
            for i, level in enumerate(names):
                add(factor, level, res.estimate[i], res.ci_low[i], res.ci_high[i], estimand, how_iv,
                    res.full_data[i], res.se[i], res.bias[i], res.split[i], res.spread_low[i], res.spread_high[i],
                    res.cutoff_ties[i])
        out = {c: (np.asarray(v, dtype=np.int64) if c in ("k", "n_resamples", "cutoff_ties") else v)
               for c, v in rows.items()}
        out["spread_label"] = [SPREAD_LABEL] * len(rows["k"])
        return {"variance_stability": out}

    # -- selection at fixed faithfulness --
    def selection_ks(self) -> list[int]:
        sp = self.spec
        if sp.selection.ks is not None:
            ks = [k for k in sp.selection.ks if k <= self.E]
        else:
            ks = np.unique(np.round(np.geomspace(1, self.E, 16)).astype(int)).tolist()
        return sorted(set(ks) | set(self.ks) | {self.E})

    def selection_stage(self) -> dict:
        from .audit import _concat, faithfulness_table

        sp = self.spec
        model, task = self.sc.model(0), self.sc.task(0)
        ks = self.selection_ks()
        parts, sel = [], {c: [] for c in ("method", "target", "k_star", "k_low", "k_high", "f_at_k_star", "reached")}
        for lab in self.levels:
            t = faithfulness_table(model, task, self.S(Key(0, 0, 0, lab)), lab, ks, self.plan0, _view(sp), seed=sp.seed)
            parts.append(t)
            k_arr, f, lo, hi = (np.asarray(t[c]) for c in ("k", "f_ratio", "f_ci_low", "f_ci_high"))
            first = lambda ok: int(k_arr[np.argmax(ok)]) if ok.any() else -1  # noqa: E731
            ks_, kl, kh = first(f >= sp.selection.target), first(hi >= sp.selection.target), first(lo >= sp.selection.target)
            for c, v in zip(sel, (lab, sp.selection.target, ks_, kl, kh,
                                  float(f[np.argmax(f >= sp.selection.target)]) if ks_ > 0 else np.nan, ks_ > 0)):
                sel[c].append(v)
        sel = {c: (np.asarray(v, dtype=np.int64) if c.startswith("k_") else v) for c, v in sel.items()}
        return {"faithfulness_vs_k": _concat(parts), "selection": sel}

    # -- summary --
    def summary_stage(self, sel: bool) -> dict:
        from stats.factor_stability import bar_verdict

        sp, run = self.spec, self.run
        k = sp.k_summary
        vs = run.table("variance_stability").to_pydict()
        cols = ("factor", "level", "jaccard_to_reference", "ci_low", "ci_high", "bar", "meets_bar", "verdict", "k",
                "jaccard_full_data", "n_levels", "estimand", "interval", "multiplicity")
        rows: dict[str, list] = {c: [] for c in cols}
        summ: dict[str, list] = {c: [] for c in ("item", "value", "ci_low", "ci_high", "verdict")}

        def item(name, v, lo=np.nan, hi=np.nan, verdict=""):  # estimands: variance_summary / variance_shares
            for c, x in zip(summ, (name, float(v), float(lo), float(hi), verdict)):
                summ[c].append(x)

        def vrow(factor, level, j, lo, hi, kk, jfull, n, estimand, interval) -> str:
            verdict = bar_verdict(lo, hi, sp.bar)
            for c, x in zip(rows, (factor, level, float(j), float(lo), float(hi), float(sp.bar), verdict == "met",
                                   verdict, int(kk), float(jfull), int(n), estimand, interval, MULTIPLICITY)):
                rows[c].append(x)
            return verdict

        fac = np.asarray(vs["factor"], dtype=object)
        lev = np.asarray(vs["level"], dtype=object)
        kk = np.asarray(vs["k"])
        item("examples (N)", self.sc.n_obs(0))
        item(f"bootstrap resamples (B), {sp.bootstrap.scheme}", self.plan0.n_resamples)
        for f in dict.fromkeys(fac.tolist()):
            sel_rows = np.flatnonzero((fac == f) & (kk == k))
            n_lv = self.plan0.n_resamples if f == "dataset: bootstrap" else len(sel_rows) - (len(sel_rows) > 1)
            agg = [i for i in sel_rows if lev[i] in ("all levels (mean)", "resamples")] or list(sel_rows)
            i = agg[0]
            j, lo, hi = vs["jaccard_mean"][i], vs["ci_low"][i], vs["ci_high"][i]
            verdict = vrow(f, str(lev[i]), j, lo, hi, k, vs["jaccard_full_data"][i], n_lv, vs["estimand"][i],
                           vs["interval"][i])
            item(f"Jaccard to reference at k={k}: {f}", j, lo, hi, verdict)
            for i in sel_rows:
                if i != agg[0]:
                    vrow(f"{f}: {lev[i]}", str(lev[i]), vs["jaccard_mean"][i], vs["ci_low"][i], vs["ci_high"][i], k,
                         vs["jaccard_full_data"][i], 1, vs["estimand"][i], vs["interval"][i])
        if sel:
            self._selection_rows(vrow, item)
        self._intrinsic_items(item, k)
        sh = run.table("variance_shares").to_pydict()
        for s, v, lo, hi, n in zip(sh["source"], sh["share"], sh["ci_low"], sh["ci_high"], sh["n_edges"]):
            item(f"variance share over top-{n} edges: {s}", v, lo, hi)
        ap = run.table("approximation_summary").to_pydict()
        for m, rho, r2, ov in zip(ap["method"], ap["spearman"], ap["r2"], ap["top_k_overlap"]):
            item(f"approximation {m}: Spearman of mean scores vs exact", rho)
            item(f"approximation {m}: per-input R² vs exact", r2)
            item(f"approximation {m}: top-{k} overlap with exact", ov)
        return {"variance_summary": {c: (np.asarray(v, dtype=np.int64) if c in ("k", "n_levels") else v)
                                     for c, v in rows.items()},
                "summary": summ}

    def _intrinsic_items(self, item, k: int) -> None:
        """Summary items: median CV, sign consistency and SNR over the top-k edges, heavy-tailed share."""
        from stats.intervals import intervals_from_distribution
        from stats.intrinsic import intrinsic_medians

        top = self.top_edges(max(k, 1))
        S0 = self.S(self.ref)
        full = intrinsic_medians(S0[:, top], np.ones((1, S0.shape[0]), dtype=np.int64))
        boot = intrinsic_medians(S0[:, top], self.plan0.counts)
        for name, label in (("cv", "median coefficient of variation"), ("sign_consistency", "median sign consistency"),
                            ("snr", "median SNR |mean|/SD")):
            ci = intervals_from_distribution(boot[name], full[name][0], method="percentile",
                                             confidence_level=self.cl)["percentile"]
            item(f"intrinsic: {label}, top-{k} edges (percentile bootstrap, edges fixed)", full[name][0], ci.low,
                 ci.high)
        it = self.run.table("intrinsic").to_pydict()
        heavy = np.asarray(it["heavy_tailed"], dtype=bool)[top]
        item(f"intrinsic: heavy-tailed edges among top-{k} (share)", heavy.mean())

    def _selection_rows(self, vrow, item) -> None:
        from stats.factor_stability import PAIRED_ESTIMAND, bar_verdict

        sp, run = self.spec, self.run
        sel = run.table("selection").to_pydict()
        ks = dict(zip(sel["method"], sel["k_star"]))
        for m, kst, lo, hi in zip(sel["method"], sel["k_star"], sel["k_low"], sel["k_high"]):
            reached = kst > 0
            item(f"selection: smallest k with faithfulness >= {sp.selection.target:g} ({m})",
                 kst if reached else np.nan, lo if lo > 0 else np.nan, hi if hi > 0 else np.nan,
                 "" if reached else "not reached")
        k_ref = ks.get("exact", -1)
        others = [(m, kk) for m, kk in ks.items() if m != "exact" and kk > 0]
        if k_ref <= 0 or not others:
            return
        levels = [(self.S(Key(0, 0, 0, m)), "mean") for m, _ in others]
        res, how = self._paired(levels, [[(kk, k_ref)] for _, kk in others], "factor_selection",
                                with_mean=len(others) > 1)
        for i, (m, kk) in enumerate(others):
            vrow(f"selection: {m}", m, res.estimate[i, 0], res.ci_low[i, 0], res.ci_high[i, 0], k_ref,
                 res.full_data[i, 0], 1, PAIRED_ESTIMAND,
                 f"{how}; k={kk} vs exact k={k_ref}, both held at the selected sizes (not re-selected per resample)")
        if len(others) > 1:
            j, lo, hi = res.estimate[-1, 0], res.ci_low[-1, 0], res.ci_high[-1, 0]
            vrow(f"selection (f >= {sp.selection.target:g})", "all estimators (mean)", j, lo, hi, k_ref,
                 res.full_data[-1, 0], len(others), PAIRED_ESTIMAND,
                 f"{how}; each estimator at its selected k, exact at k={k_ref} (sizes not re-selected per resample)")
            item(f"Jaccard to reference: selection at faithfulness >= {sp.selection.target:g} (estimators)", j, lo,
                 hi, bar_verdict(lo, hi, sp.bar))


def _names_hash(names: list[str]) -> str:
    import hashlib

    return hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]


# ----- command line -----------------------------------------------------------------------------


def summary_lines(out: Path) -> list[str]:
    """The per-factor Jaccard table of a finished study, as text lines (verdicts against the recorded bar)."""
    from reports.tables import read_table

    s = read_table(Path(out) / "variance_summary.parquet").to_pydict()
    k = s["k"][0] if s["k"] else "?"
    bar = f"{s['bar'][0]:g} bar" if s.get("bar") else "bar"
    lines = [f"{'factor (Jaccard to the reference circuit, k=' + str(k) + ')':<46} {'Jaccard':>8}  {'interval':<17} {bar}"]
    for f, j, lo, hi, v in zip(s["factor"], s["jaccard_to_reference"], s["ci_low"], s["ci_high"], s["verdict"]):
        lines.append(f"{f[:46]:<46} {j:>8.3f}  [{lo:.3f}, {hi:.3f}]  {v or 'no interval'}")
    return lines
