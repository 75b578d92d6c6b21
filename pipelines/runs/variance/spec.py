"""The variance study's spec: the estimators, counterfactual draws, fresh datasets, aggregations and
selection it compares (validated by pydantic; see the package docstring)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from circuitstat.core.params import N_RESAMPLES

from circuitstat.pipelines.spec import SCORE_METHOD, BootstrapSpec, KGrid, TaskSpec, RunOptions, StrictSpec, load_yaml, validate_spec

KIND_NAME = "study variance"
"""The study's run kind (circuitstat.pipelines.kinds), by which core.params names its own defaults and minimums."""

__all__ = ["AGGREGATIONS", "EstimatorsSpec", "CounterfactualSpec", "DatasetSpec", "SelectionSpec", "VarianceSpec",
           "parse_variance_spec", "load_variance_spec"]

AGGREGATIONS = ("mean", "median", "trimmed_mean", "mean_abs")  # as circuitstat.stats.factor_stability.AGGREGATIONS


class EstimatorsSpec(StrictSpec):
    """Estimators compared with exact patching (the reference, always first)."""

    methods: list[SCORE_METHOD] = Field(default_factory=lambda: ["exact", "eap", "eap-ig-inputs", "clean-corrupted"],
                                  min_length=2)
    ig_steps: list[int] = Field(default_factory=lambda: [5], min_length=1)

    @field_validator("methods")
    @classmethod
    def _exact_first(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("methods are listed more than once")
        if "exact" not in v:
            raise ValueError("methods must include 'exact' (the reference the others are compared with)")
        from circuitstat.circuits.methods import not_effects

        if problem := not_effects(v):
            raise ValueError(problem)
        return ["exact"] + [m for m in v if m != "exact"]

    @field_validator("ig_steps")
    @classmethod
    def _steps(cls, v: list[int]) -> list[int]:
        if any(s < 1 for s in v):
            raise ValueError("every ig_steps value must be a positive integer")
        return sorted(set(v))


class CounterfactualSpec(StrictSpec):
    """Several corrupted inputs per clean input."""

    n_draws: int = Field(3, ge=1, le=64)
    scheme: Literal["auto", "redraw", "shuffle"] = "auto"


class DatasetSpec(StrictSpec):
    """Fresh draws of the whole dataset (task seeds seed+1 .. seed+n_fresh)."""

    n_fresh: int = Field(2, ge=0, le=64)


class SelectionSpec(StrictSpec):
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


class VarianceSpec(RunOptions):
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
    bootstrap: BootstrapSpec = BootstrapSpec(n_resamples=N_RESAMPLES.default_for(KIND_NAME), ci_method="percentile")
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
        if self.bootstrap.n_resamples < N_RESAMPLES.minimum_for(KIND_NAME):
            raise ValueError(f"bootstrap.n_resamples must be at least {N_RESAMPLES.minimum_for(KIND_NAME)} for the "
                             "variance study (its dataset-sampling source is a variance over the resampled datasets)")
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
            if m.startswith("eap-ig") or m == "ensemble":
                out += [(f"{m}@{s}", m, s) for s in self.estimators.ig_steps]
            else:
                out.append((m, m, 1))
        return out


def parse_variance_spec(data: Any, source: str = "<spec>") -> VarianceSpec:
    """A VarianceSpec from parsed YAML, or InputError naming each bad key."""
    return validate_spec(VarianceSpec, data, source, keys="model, task, estimators, ...")


def load_variance_spec(path: str | Path, *, allow_outside: bool = False) -> VarianceSpec:
    """The validated variance-study spec in a YAML file, local paths resolved relative to it."""
    from circuitstat.pipelines.spec import confine_paths

    return confine_paths(parse_variance_spec(load_yaml(path), str(path)), path, allow_outside=allow_outside)


def spec_view(spec: VarianceSpec, **over) -> SimpleNamespace:
    """The fields circuitstat.pipelines.runs.audit.run's helpers read from an audit spec."""
    base = dict(level=spec.level, ablation="counterfactual", batch_size=spec.batch_size, ig_steps=1,
                seed=spec.seed, bootstrap=spec.bootstrap, ranking=spec.ranking)
    base.update(over)
    return SimpleNamespace(**base)
