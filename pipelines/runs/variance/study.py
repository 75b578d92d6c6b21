"""Running a variance study: the run directory's stages over the score matrices (see the package docstring)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from circuitstat.core.errors import InputError
from circuitstat.pipelines.kinds import RunKind
from circuitstat.pipelines.sources import LOCAL, RunInputs

from circuitstat.pipelines.runs.variance.factors import FactorStages
from circuitstat.pipelines.runs.variance.scorer import Key, ModelScorer, Scorer
from circuitstat.pipelines.runs.variance.spec import KIND_NAME, VarianceSpec, spec_view
from circuitstat.pipelines.runs.variance.summary import SummaryStages

if TYPE_CHECKING:  # the result type; imported when the study returns
    from circuitstat.core.run_tables import RunTables

__all__ = ["PER_EDGE_COMPONENT_INTERVAL", "run_variance_study", "check_study"]

#: what the per-edge component intervals of variance_components are (the pooled shares are robust)
PER_EDGE_COMPONENT_INTERVAL = ("Satterthwaite chi-square interval of this edge's component (normal theory: "
                               "not robust to heavy-tailed scores; see variance_shares for robust pooled intervals)")


def run_variance_study(spec: VarianceSpec, out: str | Path, n_jobs: int | None = None, force: bool = False, *,
                       scorer: Scorer | None = None, allow_pickle: bool = False,
                       allow_large: bool = False, inputs: RunInputs = LOCAL) -> RunTables:
    """Run (or resume) the variance study of ``spec`` into run directory ``out``; return its tables as a
    result (circuitstat.core.run_tables.RunTables, read lazily; main table ``variance_summary``).

    ``scorer`` replaces the models as the source of score matrices (a Scorer; used to validate the
    study on scores with planted variance components); the selection stage then needs
    ``scorer.model(0)`` / ``scorer.task(0)`` or is skipped. ``allow_pickle`` / ``allow_large``: as
    for ``load_model`` (pickled weights; models above the memory limit); ``inputs`` resolves the sources.
    """
    from circuitstat.core.rundir import RunDir

    from circuitstat.pipelines.training import use_deterministic

    from circuitstat.pipelines.build import check_device, check_n_jobs

    out = Path(out)
    n_jobs = check_n_jobs(spec.n_jobs if n_jobs is None else n_jobs, "--n-jobs" if n_jobs is not None else "n_jobs")
    use_deterministic()  # CUBLAS_WORKSPACE_CONFIG too, before any model loads
    spec_doc = spec.model_dump()
    box: dict = {}
    if scorer is None:
        check_device(spec.device)
    sc = scorer if scorer is not None else ModelScorer(spec, lambda name: box["run"].stage_seed(name),
                                                       allow_pickle=allow_pickle, allow_large=allow_large,
                                                       inputs=inputs)
    check_study(spec, sc)  # before the run directory exists
    if scorer is None:  # priced as the service prices it (the --plan arithmetic), before any attribution
        from circuitstat.pipelines.work import check_run_work

        check_run_work("study variance", spec, sc.model(0).cfg, allow_large=allow_large,
                       shrink="sources, counterfactual.n_draws, estimators, task.n or dataset.n_fresh")
    with RunDir(out, spec=spec_doc, command=sys.argv, seed=spec.seed, kind="study variance",
                provenance=getattr(sc, "provenance", {"scores": "user scorer"})) as run:
        box["run"] = run
        _Study(spec, run, sc, n_jobs, force).execute()
    from circuitstat.core.run_tables import RunTables

    names = tuple(sorted(p.stem for p in out.glob("*.parquet") if not p.stem.startswith("scores_")))
    return RunTables(out, names, "variance_summary", {"study": "variance", "spec": spec_doc,
                                                      "confidence_level": spec.bootstrap.confidence_level})


def check_study(spec: VarianceSpec, scorer) -> None:
    """None; InputError when k is not below the number of columns, when the clusters scheme meets a
    task without groups, or when the study's score matrices would exceed the memory limit."""
    from circuitstat.circuits.limits import check_bytes

    from circuitstat.pipelines.runs.audit.run import check_scheme

    E = len(scorer.names)
    if spec.k[-1] >= E:
        raise InputError(f"k={spec.k[-1]} is not below the number of {spec.level}s ({E}); use smaller k")
    check_scheme(spec.bootstrap.scheme, scorer.groups(0), spec.task.name)
    n_matrices = len(spec.sources) * spec.counterfactual.n_draws * len(spec.estimator_levels()) + spec.dataset.n_fresh
    check_bytes(n_matrices * scorer.n_obs(0) * E * 4.0, f"the study's {n_matrices} score matrices")



class _Study(FactorStages, SummaryStages):
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
        from circuitstat.core.tables import table_to_matrix

        if key.name not in self._cache:
            self._cache[key.name] = np.asarray(table_to_matrix(self.run.table(key.name)), dtype=np.float32)
        return self._cache[key.name]

    def plan(self, dataset: int):
        from circuitstat.pipelines.runs.audit.run import resampling_plan

        return resampling_plan(spec_view(self.spec), self.sc.n_obs(dataset), self.sc.groups(dataset),
                               self.run.stage_seed(f"resampling_d{dataset}"), for_intervals=True)

    def stage(self, name, fn, outputs, params, deps):
        from circuitstat.pipelines.runs.audit.run import run_stage

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
        from circuitstat.stats.factor_stability import aggregate
        from circuitstat.core.topk import topk

        mean = aggregate(self.S(self.ref), "mean", self.spec.trim)
        return topk(mean, min(n, self.E), ranking=self.spec.ranking, seed=self.run.stage_seed("top_edges")).indices

    def intrinsic_stage(self) -> dict:
        from circuitstat.pipelines.runs.audit.tables import concat_parts, edge_stats_table

        S = self.S(self.ref)
        stats_parts = [edge_stats_table(self.S(Key(0, 0, 0, lab)), self.names, lab, self.plan0, spec_view(self.spec),
                                        self.n_jobs) for lab in self.levels]
        from circuitstat.stats.intrinsic import intrinsic_table

        tab = intrinsic_table(S, self.names)
        tab["rank"] = np.empty(self.E, dtype=np.int64)
        tab["rank"][self.top_edges(self.E)] = np.arange(1, self.E + 1)
        return {"intrinsic": tab, "edge_stats": concat_parts(stats_parts)}

    # -- dataset sampling: bootstrap stability of each estimator's circuits --
    def stability_stage(self) -> dict:
        from circuitstat.pipelines.runs.audit.tables import concat_parts, stability_tables

        parts = [stability_tables(self.S(Key(0, 0, 0, lab)), self.names, lab, self.plan0, self.ks, spec_view(self.spec),
                                  self.n_jobs) for lab in self.levels]
        return {"stability_vs_k": concat_parts([p[0] for p in parts]), "inclusion": concat_parts([p[1] for p in parts])}

    # -- estimator: approximation error against exact --
    def approximation_stage(self) -> dict:
        from circuitstat.pipelines.runs.audit.tables import concat_parts, approximation_tables

        ex = self.S(self.ref)
        parts = [approximation_tables(ex, self.S(Key(0, 0, 0, lab)), self.names, lab, self.spec.k_summary,
                                      self.spec.ranking) for lab in self.levels[1:]]
        return {"approximation": concat_parts([p[0] for p in parts]),
                "approximation_summary": concat_parts([p[1] for p in parts])}

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
        from circuitstat.stats import variance_components

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
            main, anova = tabs["variance_estimates"], tabs["variance_anova"]
            comp_parts.append({"edge": main["edge"] + s, "name": list(main["edge_name"]), "source": list(main["component"]),
                               "variance": main["variance"], "share": main["share"], "se": main["standard_error"],
                               "ci_low": main["ci_low"], "ci_high": main["ci_high"],
                               "negative_estimate": np.asarray(main["negative_estimate"], dtype=bool),
                               "interval": [PER_EDGE_COMPONENT_INTERVAL] * len(main["edge"])})
            anova_parts.append({"edge": anova["edge"] + s, "term": list(anova["term"]), "df": anova["df"],
                                "mean_square": anova["mean_square"]})
        from circuitstat.pipelines.runs.audit.tables import concat_parts

        top = self.top_edges(self.spec.n_top)
        Yt, _ = self.design(top)
        from circuitstat.stats.variance import pooled_shares

        shares = pooled_shares(Yt, factors, confidence_level=self.cl, seed=self.run.stage_seed("variance_shares"))
        shares["factors"] = [" x ".join(factors)] * len(shares["source"])
        return {"variance_components": concat_parts(comp_parts), "variance_anova": concat_parts(anova_parts),
                "variance_shares": shares}



def _names_hash(names: list[str]) -> str:
    import hashlib

    return hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]


def variance_stages(spec: VarianceSpec) -> list[str]:
    """The RunDir stages :func:`run_variance_study` writes for ``spec``, in order."""
    levels = [lab for lab, _, _ in spec.estimator_levels()]
    keys = [Key(s, 0, c, lab) for s in range(len(spec.sources)) for c in range(spec.counterfactual.n_draws)
            for lab in levels] + [Key(0, j, 0, "exact") for j in range(1, spec.dataset.n_fresh + 1)]
    selection = spec.selection.enabled and spec.level == "edge"
    return (["index", *(k.name for k in keys), "intrinsic", "stability", "approximation", "variance", "factors"]
            + (["selection"] if selection else []) + ["summary"])


def variance_flops(spec: VarianceSpec, cfg) -> float:
    """The attribution FLOPs of every draw of ``spec`` on a model of config ``cfg``."""
    from circuitstat.pipelines.build import attribution_flops

    per_draw = sum(attribution_flops(cfg, spec, m, spec.task.n, ig_steps=steps, level=spec.level)
                   for _, m, steps in spec.estimator_levels())
    fresh = spec.dataset.n_fresh * attribution_flops(cfg, spec, "exact", spec.task.n, ig_steps=1, level=spec.level)
    return len(spec.sources) * spec.counterfactual.n_draws * per_draw + fresh


def _parse(data, source: str) -> VarianceSpec:
    from circuitstat.pipelines.runs.variance.spec import parse_variance_spec

    return parse_variance_spec(data, source)


KIND = RunKind(KIND_NAME, "the share of each source of variation in the scores (crossed random effects)",
               parse=_parse, run=run_variance_study, stages=variance_stages, flops=variance_flops, report=True)
