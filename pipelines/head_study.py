"""The head-stability study: do the claims of Bali et al. (2026) hold on small models trained here?

A grid of {2, 4, 8} layers × {Adam, AdamW with weight decay 0.1} × 5 seeds of small GPT-style
models is trained on the standard-library corpus with :mod:`pipelines.training` (cached: a rerun
trains nothing), :class:`pipelines.heads.HeadStability` is fitted per condition with the paper's
metric (max matching, anchor refit), and ``summary.parquet`` tests each claim from bootstrap
intervals, never from point estimates:

1. the least stable layers are in the middle: mean stability of the first and last layer minus
   that of the middle layers > 0 (conditions with >= 3 layers);
2. the gap (max − min layer stability) grows with depth: gap(deepest) − gap(shallowest) > 0;
3. less stable deep heads are more important: correlation of stability and importance over the
   heads of the second half of the layers < 0 (pooled Fisher z over conditions with >= 4 layers);
4. AdamW raises stability: mean head stability, AdamW − Adam > 0;
5. the residual stream is more stable than the heads: mean linear CKA (after attention) − mean
   head stability > 0.

Verdict per row: "supported" when the interval lies on the claimed side of 0, "contradicted"
when it lies on the other side, "inconclusive" otherwise. Bootstrap replicates are paired across
conditions: replicate r of every condition draws the same probe prompts and the same seeds (a
seed fixes the initialisation, for a given depth, and the data order), so differences between
conditions are bootstrapped replicate by replicate.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from pipelines.training import TrainRecipe, cache_dir

__all__ = ["StudyPlan", "full_plan", "quick_plan", "run_head_study", "study_heads_command", "claims_summary"]

SUMMARY_COLUMNS = ("item", "value", "ci_low", "ci_high", "verdict")


@dataclass(frozen=True)
class StudyPlan:
    """What the study trains and how it analyses it."""

    base: TrainRecipe
    depths: tuple[int, ...] = (2, 4, 8)
    optimizers: tuple[tuple[str, float], ...] = (("adam", 0.0), ("adamw", 0.1))
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    n_probe: int = 100
    probe_len: int = 64
    n_boot: int = 200
    n_boot_cka: int = 100
    n_null: int = 50
    n_perm: int = 2000
    random_state: int = 0
    name: str = "full"

    def conditions(self) -> list[tuple[str, TrainRecipe]]:
        out = []
        for d in self.depths:
            for opt, wd in self.optimizers:
                out.append((condition_name(d, opt, wd), self.base.replace(n_layers=d, optimizer=opt, weight_decay=wd)))
        return out

    def to_dict(self) -> dict:
        return {"base": self.base.to_dict(), "depths": list(self.depths),
                "optimizers": [list(o) for o in self.optimizers], "seeds": list(self.seeds),
                "n_probe": self.n_probe, "probe_len": self.probe_len, "n_boot": self.n_boot,
                "n_boot_cka": self.n_boot_cka, "n_null": self.n_null, "n_perm": self.n_perm,
                "random_state": self.random_state, "name": self.name}

    @property
    def key(self) -> str:
        """Cache key: the recipes' non-default fields and the seeds (stable when TrainRecipe gains fields)."""
        doc = {"recipes": {n: _non_default(r) for n, r in self.conditions()}, "seeds": list(self.seeds), "version": 2}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def _non_default(recipe: TrainRecipe) -> dict:
    d, base = recipe.to_dict(), TrainRecipe().to_dict()
    return {k: v for k, v in d.items() if base.get(k, object()) != v}


def condition_name(depth: int, optimizer: str, weight_decay: float) -> str:
    return f"L{depth}-{optimizer}" + (f"-wd{weight_decay:g}" if weight_decay else "")


def full_plan() -> StudyPlan:
    """The study as run for the README: sized to fit 60 minutes on 2 cores (see the README)."""
    base = TrainRecipe(n_layers=2, n_heads=4, d_model=64, d_mlp=256, n_ctx=64, vocab_size=2048, tokenizer="bpe",
                       corpus="stdlib", optimizer="adamw", lr=2e-3, weight_decay=0.1, warmup_steps=60,
                       batch_size=16, steps=1200, eval_every=200, eval_batches=8, checkpoint_every=200, threads=1)
    return StudyPlan(base=base, name="full")


def quick_plan() -> StudyPlan:
    """A tiny study for the tests: 1/2/4 layers, 3 seeds, a few steps (runs in seconds)."""
    base = TrainRecipe(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=16, vocab_size=300, tokenizer="bpe",
                       corpus="stdlib", optimizer="adamw", lr=5e-3, weight_decay=0.1, warmup_steps=2,
                       batch_size=4, steps=12, eval_every=12, eval_batches=1, checkpoint_every=12, threads=1)
    return StudyPlan(base=base, depths=(1, 2, 4), seeds=(0, 1, 2), n_probe=12, probe_len=12, n_boot=30,
                     n_boot_cka=10, n_null=5, n_perm=99, name="quick")


# =============================================================================================
# Training
# =============================================================================================
def train_grid(plan: StudyPlan, n_jobs: int = 2, cache: str | os.PathLike | None = None, corpus=None,
               device: str = "cpu", progress: bool = False) -> dict[str, list[Path]]:
    """Model directories per condition (trained the first time, one joblib pool over every job)."""
    from joblib import Parallel, delayed

    from pipelines.training import _train_worker, is_complete, prepare_data

    root = (Path(cache) if cache else cache_dir()) / "head-study" / plan.key
    conds = plan.conditions()
    data = prepare_data(conds[0][1], corpus=corpus, cache=cache)  # tokenizer/data do not depend on depth/optimizer
    jobs = [(name, r, s) for name, r in conds for s in plan.seeds
            if not is_complete(root / name / f"seed-{s}", r, s, data.content_hash)]
    jobs.sort(key=lambda j: -j[1].n_layers)  # longest first: the pool stays busy to the end
    if jobs:
        Parallel(n_jobs=max(1, min(int(n_jobs), len(jobs))), backend="loky")(
            delayed(_train_worker)(r.to_dict(), s, str(root / name / f"seed-{s}"), data, device, progress)
            for name, r, s in jobs)
    out = {}
    for name, r in conds:
        d = root / name
        (d / "recipe.json").write_text(json.dumps({"recipe": r.to_dict(), "seeds": list(plan.seeds),
                                                   "data_hash": data.content_hash}, indent=2))
        out[name] = [d / f"seed-{s}" for s in plan.seeds]
        missing = [p for p, s in zip(out[name], plan.seeds) if not is_complete(p, r, s, data.content_hash)]
        if missing:
            raise RuntimeError(f"training did not finish for {missing}")
    return out


# =============================================================================================
# Analysis
# =============================================================================================
def _estimator(plan: StudyPlan, corpus) -> Any:
    from pipelines.heads import HeadStability

    return HeadStability(match="max", pairs="anchor", anchor=0, null="prompts", n_null=plan.n_null,
                         n_boot=plan.n_boot, n_boot_cka=plan.n_boot_cka, ci_over="both", importance=True,
                         corr_refits="all", residual=True, hooks=("pre", "post"), n_perm=plan.n_perm,
                         n_probe=plan.n_probe, probe_len=plan.probe_len, bos=True, corpus=corpus,
                         random_state=plan.random_state, n_jobs=1)


def _fit_condition(plan: StudyPlan, paths: Sequence[str], corpus) -> Any:
    return _estimator(plan, corpus).fit([str(p) for p in paths]).result_


def _replicate_table(res) -> dict:
    rep = res.replicates
    rows = {"statistic": [], "replicate": [], "value": []}

    def put(name, arr):
        arr = np.asarray(arr, dtype=float).ravel()
        rows["statistic"] += [name] * arr.size
        rows["replicate"] += list(range(arr.size))
        rows["value"] += arr.tolist()

    for k in ("mean", "gap", "gap_excess", "argmin", "argmin_rel", "ends_minus_middle"):
        if k in rep:
            put(k, rep[k])
    for k, v in rep.items():
        if k.startswith("resid:"):
            put(k, v)
    for layer in range(rep["layer"].shape[1]):
        put(f"layer{layer}", rep["layer"][:, layer])
    return {"statistic": np.array(rows["statistic"]), "replicate": np.array(rows["replicate"], dtype=np.int64),
            "value": np.array(rows["value"])}


def _reps(table) -> dict[str, np.ndarray]:
    d = table.to_pydict() if hasattr(table, "to_pydict") else table
    out: dict[str, list] = {}
    for s, r, v in zip(d["statistic"], d["replicate"], d["value"]):
        out.setdefault(s, []).append((r, v))
    return {k: np.array([v for _, v in sorted(x)]) for k, x in out.items()}


def _verdict(lo: float, hi: float, direction: int) -> str:
    """'supported' if the interval is on the claimed side of 0 (direction +1: above, −1: below)."""
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "inconclusive"
    if direction > 0:
        return "supported" if lo > 0 else ("contradicted" if hi < 0 else "inconclusive")
    return "supported" if hi < 0 else ("contradicted" if lo > 0 else "inconclusive")


def _ci(x: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    if not x.size:
        return (math.nan, math.nan)
    a = (1 - level) / 2
    lo, hi = np.quantile(x, [a, 1 - a])
    return float(lo), float(hi)


def claims_summary(plan: StudyPlan, reps: dict[str, dict[str, np.ndarray]], points: dict[str, dict[str, float]],
                   corr: dict[str, dict[str, float]]) -> dict[str, np.ndarray]:
    """The summary table testing the five claims.

    ``reps[cond][statistic]``: bootstrap replicates (paired across conditions); ``points[cond]``:
    point estimates of the same statistics; ``corr[cond]``: the deep-layer correlation (r, n_eff).
    """
    rows: list[tuple] = []
    conds = {name: r for name, r in plan.conditions()}

    def add(item, value, reps_arr, direction=None, lohi=None):
        lo, hi = lohi if lohi is not None else _ci(reps_arr)
        rows.append((item, float(value), lo, hi, _verdict(lo, hi, direction) if direction else ""))

    def pooled(item, names, stat_fn, direction):
        if not names:
            rows.append((item, math.nan, math.nan, math.nan, "inconclusive"))
            return
        vals = [stat_fn(n) for n in names]
        v0 = float(np.mean([v[0] for v in vals]))
        m = min(len(v[1]) for v in vals)
        rr = np.mean([v[1][:m] for v in vals], axis=0)
        add(item, v0, rr, direction)

    opt_names = [o for o, _ in plan.optimizers]
    # (1) middle layers least stable
    deep_enough = [n for n, r in conds.items() if r.n_layers >= 3]
    for n in deep_enough:
        add(f"1. ends minus middle layer stability [{n}]", points[n]["ends_minus_middle"], reps[n]["ends_minus_middle"], +1)
    pooled("1. least stable layers are in the middle (ends minus middle, mean over conditions)", deep_enough,
           lambda n: (points[n]["ends_minus_middle"], reps[n]["ends_minus_middle"]), +1)
    # (2) gap grows with depth
    dmin, dmax = min(plan.depths), max(plan.depths)
    gap_pairs = []
    for opt, wd in plan.optimizers:
        a, b = condition_name(dmax, opt, wd), condition_name(dmin, opt, wd)
        for d in plan.depths:
            n = condition_name(d, opt, wd)
            add(f"2. gap [{n}]", points[n]["gap"], reps[n]["gap"])
        m = min(len(reps[a]["gap"]), len(reps[b]["gap"]))
        add(f"2. gap L{dmax} minus gap L{dmin} [{opt}]", points[a]["gap"] - points[b]["gap"],
            reps[a]["gap"][:m] - reps[b]["gap"][:m], +1)
        gap_pairs.append((a, b))
    pooled_vals = [(points[a]["gap"] - points[b]["gap"], reps[a]["gap"] - reps[b]["gap"]) for a, b in gap_pairs]
    add(f"2. the gap grows with depth (gap L{dmax} minus L{dmin}, mean over optimizers)",
        np.mean([v[0] for v in pooled_vals]), np.mean([v[1] for v in pooled_vals], axis=0), +1)
    # robustness: a max - min over more layers grows with L by itself; the excess gap removes that
    if all("gap_excess" in reps[n] and "gap_excess" in points[n] for p in gap_pairs for n in p):
        ex = [(points[a]["gap_excess"] - points[b]["gap_excess"], reps[a]["gap_excess"] - reps[b]["gap_excess"])
              for a, b in gap_pairs]
        add(f"2b. robustness: excess gap over layer-shuffled heads, L{dmax} minus L{dmin}, mean over optimizers",
            np.mean([v[0] for v in ex]), np.mean([v[1] for v in ex], axis=0), +1)
    # (3) less stable deep heads are more important: negative correlation, Fisher-z pooled
    deep_conds = [n for n, r in conds.items() if r.n_layers >= 4] or list(conds)
    zs, ws = [], []
    from pipelines.heads import fisher_interval

    for n in deep_conds:
        c = corr[n]
        lo, hi = fisher_interval(c["r"], c["n_eff"])
        rows.append((f"3. correlation of stability and importance, deep layers [{n}]", float(c["r"]), lo, hi,
                     _verdict(lo, hi, -1)))
        if np.isfinite(c["r"]) and c["n_eff"] > 3:
            zs.append(math.atanh(float(np.clip(c["r"], -1 + 1e-12, 1 - 1e-12))))
            ws.append(c["n_eff"] - 3)
    if zs:
        from scipy.stats import norm

        zbar = float(np.dot(zs, ws) / np.sum(ws))
        q = norm.ppf(0.975) / math.sqrt(np.sum(ws))
        lo, hi = math.tanh(zbar - q), math.tanh(zbar + q)
        rows.append(("3. less stable deep heads are more important (pooled Fisher z over conditions)",
                     math.tanh(zbar), lo, hi, _verdict(lo, hi, -1)))
    else:
        rows.append(("3. less stable deep heads are more important (pooled Fisher z over conditions)",
                     math.nan, math.nan, math.nan, "inconclusive"))
    # (4) AdamW raises stability
    diffs = []
    if "adam" in opt_names and "adamw" in opt_names:
        wd = dict(plan.optimizers)
        for d in plan.depths:
            a, b = condition_name(d, "adamw", wd["adamw"]), condition_name(d, "adam", wd["adam"])
            add(f"4. mean stability AdamW minus Adam [L{d}]", points[a]["mean"] - points[b]["mean"],
                reps[a]["mean"] - reps[b]["mean"], +1)
            diffs.append((points[a]["mean"] - points[b]["mean"], reps[a]["mean"] - reps[b]["mean"]))
        add("4. AdamW raises stability (AdamW minus Adam, mean over depths)", np.mean([v[0] for v in diffs]),
            np.mean([v[1] for v in diffs], axis=0), +1)
    # (5) residual stream more stable than heads
    key = "resid:linear:post"
    for n in conds:
        m = len(reps[n][key])
        add(f"5. residual linear CKA (post) minus head stability [{n}]", points[n][key] - points[n]["mean"],
            reps[n][key] - reps[n]["mean"][:m], +1)
    pooled("5. the residual stream is more stable than the heads (mean over conditions)", list(conds),
           lambda n: (points[n][key] - points[n]["mean"], reps[n][key] - reps[n]["mean"][:len(reps[n][key])]), +1)
    return {"item": np.array([r[0] for r in rows]), "value": np.array([r[1] for r in rows], dtype=float),
            "ci_low": np.array([r[2] for r in rows], dtype=float), "ci_high": np.array([r[3] for r in rows], dtype=float),
            "verdict": np.array([r[4] for r in rows])}


def _points(res) -> dict[str, float]:
    s = res.layer_stability
    L = s.size
    out = {"mean": float(np.nanmean(s)), "gap": float(np.nanmax(s) - np.nanmin(s)),
           "argmin": float(np.nanargmin(s)), "argmin_rel": float(np.nanargmin(s)) / (L - 1) if L > 1 else math.nan,
           "ends_minus_middle": float((s[0] + s[-1]) / 2 - np.mean(s[1:-1])) if L >= 3 else math.nan}
    r = res.residual
    for kind in set(r["kind"]):
        for hook in set(r["hook"]):
            m = (r["kind"] == kind) & (r["hook"] == hook)
            out[f"resid:{kind}:{hook}"] = float(np.mean(r["cka"][m]))
    return out


def _points_from_tables(layers, residual) -> dict[str, float]:
    class _R:
        pass

    o = _R()
    ld = layers.to_pydict()
    order = np.argsort(ld["layer"])
    o.layer_stability = np.asarray(ld["stability"], dtype=float)[order]
    rd = residual.to_pydict()
    o.residual = {k: np.asarray(v) for k, v in rd.items()}
    return _points(o)


def _summary_value(summary, item: str) -> float:
    d = summary.to_pydict()
    for i, v in zip(d["item"], d["value"]):
        if i == item:
            return float(v)
    return math.nan


def _deep_corr(correlation) -> dict[str, float]:
    d = correlation.to_pydict()
    for i, s in enumerate(d["scope"]):
        if s == "deep":
            return {"r": float(d["r"][i]), "n_eff": float(d["n_eff"][i])}
    return {"r": math.nan, "n_eff": 0.0}


def run_head_study(out: str | os.PathLike, quick: bool = False, n_jobs: int = 2, plan: StudyPlan | None = None,
                   cache: str | os.PathLike | None = None, corpus=None, device: str = "cpu", force: bool = False,
                   progress: bool = False, command: Any = None) -> dict[str, Any]:
    """Train (cached), analyse every condition, write the study's run directory; return its tables.

    Writes ``summary.parquet`` (item, value, ci_low, ci_high, verdict), ``conditions.parquet``,
    ``models.parquet``, ``study_layers.parquet``, per condition ``<cond>/heads|layers|residual|
    correlation|summary|replicates.parquet``, and the deepest AdamW condition's tables again at
    the top level (heads, layers, residual) for the HTML report.
    """
    from joblib import Parallel, delayed

    from reports.rundir import RunDir

    plan = plan or (quick_plan() if quick else full_plan())
    t0 = time.time()
    corpus_obj = corpus
    if corpus_obj is None:
        from circuits.corpus import load_corpus

        corpus_obj = load_corpus(plan.base.corpus)
    spec = {"study": "heads", "plan": plan.to_dict(), "corpus_hash": corpus_obj.content_hash}
    timings: dict[str, float] = {}
    paths = train_grid(plan, n_jobs=n_jobs, cache=cache, corpus=corpus_obj, device=device, progress=progress)
    timings["train_s"] = round(time.time() - t0, 1)
    names = [n for n, _ in plan.conditions()]
    headline = condition_name(max(plan.depths), *plan.optimizers[-1])
    with RunDir(out, spec=spec, command=command, seed=plan.random_state,
                provenance={"study": plan.name, "corpus": {"name": corpus_obj.name, "sha256": corpus_obj.content_hash}}) as run:
        def models_table():
            rows = {k: [] for k in ("condition", "n_layers", "optimizer", "weight_decay", "seed", "path", "weight_hash",
                                    "val_loss", "train_seconds")}
            for name, r in plan.conditions():
                for s, p in zip(plan.seeds, paths[name]):
                    doc = json.loads((Path(p) / "config.json").read_text())
                    t = doc["meta"]["training"]
                    rows["condition"].append(name)
                    rows["n_layers"].append(r.n_layers)
                    rows["optimizer"].append(r.optimizer)
                    rows["weight_decay"].append(r.weight_decay)
                    rows["seed"].append(int(s))
                    rows["path"].append(str(p))
                    rows["weight_hash"].append(doc["weight_hash"])
                    rows["val_loss"].append(float(t.get("final_val_loss") or math.nan))
                    rows["train_seconds"].append(float(t.get("train_seconds") or math.nan))
            return {"models": rows}

        weights = {n: [json.loads((Path(p) / "config.json").read_text())["weight_hash"] for p in paths[n]] for n in names}
        run.stage("models", models_table, ["models"], params={"weights": weights})
        todo = [n for n in names if not run.is_done(f"analysis-{n}") or force]
        t1 = time.time()
        fitted = {}
        if todo:
            results = Parallel(n_jobs=max(1, min(int(n_jobs), len(todo))), backend="loky")(
                delayed(_fit_condition)(plan, [str(p) for p in paths[n]], corpus_obj) for n in todo)
            fitted = dict(zip(todo, results))
        for n in names:
            outs = [f"{n}/{t}" for t in ("heads", "layers", "residual", "head_details", "correlation", "summary",
                                         "refits", "replicates")]

            def compute(n=n):
                res = fitted.get(n) or _fit_condition(plan, [str(p) for p in paths[n]], corpus_obj)
                tabs = res.tables()
                d = {f"{n}/{k}": v for k, v in tabs.items()}
                d[f"{n}/replicates"] = _replicate_table(res)
                return d

            run.stage(f"analysis-{n}", compute, outs, params={"plan": plan.to_dict(), "weights": weights[n]},
                      depends_on=["models"], force=force)
        timings["analysis_s"] = round(time.time() - t1, 1)

        def summary():
            reps, points, corr = {}, {}, {}
            cond_rows = {k: [] for k in ("condition", "n_layers", "optimizer", "weight_decay", "mean_stability",
                                         "mean_ci_low", "mean_ci_high", "null_mean", "gap", "gap_ci_low", "gap_ci_high",
                                         "least_stable_layer", "residual_linear_post", "val_loss")}
            lay_rows = {k: [] for k in ("condition", "n_layers", "optimizer", "layer", "stability", "ci_low", "ci_high",
                                        "null_mean")}
            mt = run.table("models").to_pydict()
            for name, r in plan.conditions():
                reps[name] = _reps(run.table(f"{name}/replicates"))
                layers = run.table(f"{name}/layers")
                points[name] = _points_from_tables(layers, run.table(f"{name}/residual"))
                points[name]["gap_excess"] = _summary_value(run.table(f"{name}/summary"),
                                                            "excess gap (gap minus its shuffled-layers expectation)")
                corr[name] = _deep_corr(run.table(f"{name}/correlation"))
                ld = layers.to_pydict()
                for i in range(len(ld["layer"])):
                    lay_rows["condition"].append(name)
                    lay_rows["n_layers"].append(r.n_layers)
                    lay_rows["optimizer"].append(r.optimizer)
                    for k in ("layer", "stability", "ci_low", "ci_high", "null_mean"):
                        lay_rows[k].append(ld[k][i])
                p = points[name]
                lo, hi = _ci(reps[name]["mean"])
                glo, ghi = _ci(reps[name]["gap"])
                vl = [v for c, v in zip(mt["condition"], mt["val_loss"]) if c == name]
                for k, v in (("condition", name), ("n_layers", r.n_layers), ("optimizer", r.optimizer),
                             ("weight_decay", r.weight_decay), ("mean_stability", p["mean"]), ("mean_ci_low", lo),
                             ("mean_ci_high", hi), ("null_mean", float(np.nanmean(ld["null_mean"]))), ("gap", p["gap"]),
                             ("gap_ci_low", glo), ("gap_ci_high", ghi), ("least_stable_layer", int(p["argmin"])),
                             ("residual_linear_post", p.get("resid:linear:post", math.nan)),
                             ("val_loss", float(np.mean(vl)) if vl else math.nan)):
                    cond_rows[k].append(v)
            summ = claims_summary(plan, reps, points, corr)
            top = {t: run.table(f"{headline}/{t}") for t in ("heads", "layers", "residual")}
            return {"summary": summ, "conditions": cond_rows, "study_layers": lay_rows, **top}

        run.stage("summary", summary, ["summary", "conditions", "study_layers", "heads", "layers", "residual"],
                  params={"plan": plan.to_dict()}, depends_on=["models"] + [f"analysis-{n}" for n in names], force=force)
        timings["total_s"] = round(time.time() - t0, 1)
        tables = {k: run.table(k) for k in ("summary", "conditions", "study_layers", "models")}
    (Path(out) / "timings.json").write_text(json.dumps(timings, indent=2))
    return {"tables": tables, "timings": timings, "plan": plan}


# =============================================================================================
# CLI
# =============================================================================================
try:
    import typer as _typer

    _Opt = _typer.Option
except ImportError:  # pragma: no cover
    def _Opt(default, *a, **k):  # type: ignore
        return default


def study_heads_command(
    out: Path = _Opt(..., "--out", help="run directory of the study"),
    quick: bool = _Opt(False, "--quick", help="a tiny version (1/2/4 layers, 3 seeds, a few steps) for smoke tests"),
    n_jobs: int = _Opt(2, "--n-jobs", help="parallel training / analysis processes"),
    device: str = _Opt("cpu", "--device", help="training device"),
    force: bool = _Opt(False, "--force", help="recompute analyses that already finished with a different spec"),
) -> dict:
    """Train a grid of models (cached) and test the head-stability claims of Bali et al. (2026) with CIs."""
    res = run_head_study(out, quick=quick, n_jobs=n_jobs, device=device, force=force, command=sys.argv)
    t = res["tables"]["summary"].to_pydict()
    w = max(len(i) for i in t["item"])
    for i, v, lo, hi, vd in zip(t["item"], t["value"], t["ci_low"], t["ci_high"], t["verdict"]):
        print(f"{i:<{w}}  {v:8.4f}  [{lo:8.4f}, {hi:8.4f}]  {vd}")
    print(f"-> {out}  ({res['timings']})")
    return res
