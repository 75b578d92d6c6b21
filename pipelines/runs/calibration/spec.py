"""The calibration study's spec: what it runs (a population, interval families, sizes), validated before any work.

See circuitstat.pipelines.runs.calibration.study for what the study does with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from circuitstat.core.errors import InputError
from circuitstat.core.params import IG_STEPS, N_RESAMPLES, resamples_for_level
from circuitstat.pipelines.spec import ABLATION, SCORE_METHOD, KGrid, TaskSpec, RunOptions, load_yaml, validate_spec

__all__ = ["CalibrationSpec", "FROM_SCORES_RUN", "PER_EXAMPLE_ABLATIONS", "check_calibration_spec",
           "load_calibration_spec", "parse_calibration_spec"]


#: ablations under which a prompt's metric does not depend on the other prompts evaluated
PER_EXAMPLE_ABLATIONS = ("counterfactual", "zero")


class CalibrationSpec(RunOptions):
    """What a calibration study runs; see the module docstring."""

    model: str | None = None
    scores: str | None = None  # an attribution run directory whose scores are the population
    task: TaskSpec | None = None  # default (without scores): induction on 1024 prompts
    method: SCORE_METHOD = "exact"
    ablation: ABLATION = "counterfactual"
    ig_steps: int = IG_STEPS.pydantic()
    sizes: KGrid = Field(default_factory=lambda: [32, 64, 128], min_length=1)
    n_datasets: int = Field(200, ge=20, le=100_000)
    n_resamples: int = N_RESAMPLES.pydantic("calibration")
    confidence_level: float = Field(0.95, gt=0.5, lt=1.0)
    intervals: list[Literal["edge", "stability", "faithfulness"]] = Field(default_factory=lambda: ["edge"],
                                                                          min_length=1)
    ks: KGrid = Field(default_factory=lambda: [5, 10, 20], min_length=1)
    ranking: Literal["absolute", "signed"] = "absolute"
    n_truth_pairs: int = Field(4000, ge=200, le=1_000_000)

    @field_validator("method")
    @classmethod
    def _an_effect(cls, v: str) -> str:
        from circuitstat.circuits.methods import not_effects

        if problem := not_effects([v]):
            raise ValueError(problem)
        return v

    @property
    def level(self) -> str:
        """Attribution level: the calibration study works on edges."""
        return "edge"

    @model_validator(mode="before")
    @classmethod
    def _default_task(cls, data: Any) -> Any:
        # a study that attributes its own population needs a task; one that reads a run has the run's
        if isinstance(data, dict) and data.get("scores") is None and data.get("task") is None:
            return {**data, "task": {"n": 1024}}
        return data


#: keys an attribution run given as ``scores`` decides (the study's own values would be ignored)
FROM_SCORES_RUN = ("method", "ablation", "ig_steps")


def parse_calibration_spec(data: Any, source: str = "<spec>") -> CalibrationSpec:
    """A validated CalibrationSpec from parsed YAML, or InputError naming each bad key."""
    spec = validate_spec(CalibrationSpec, data, source, kind="calibration spec")
    check_calibration_spec(spec, source)
    return spec


def check_calibration_spec(spec: CalibrationSpec, source: str = "<spec>") -> None:
    """InputError naming the key when the spec's keys contradict each other (see the module docstring)."""
    bad = f"invalid calibration spec {source}:"
    resamples_for_level(spec.n_resamples, spec.confidence_level, f"{bad} n_resamples")
    if spec.scores is None and spec.model is None:
        raise InputError(f"{bad} give the model (and task) to attribute a population, or scores: DIR, an "
                         "attribution run (`circuitstat attribute --out DIR`) whose scores are the population")
    if spec.scores is not None:
        clash = [k for k in FROM_SCORES_RUN if k in spec.model_fields_set]
        if clash:
            raise InputError(f"{bad} {', '.join(clash)} come from the attribution run in scores ({spec.scores}); "
                             "drop them from the spec")
    elif spec.sizes[-1] > spec.task.n:
        raise InputError(f"{bad} sizes go up to {spec.sizes[-1]} but the population "
                         f"(task.n) has {spec.task.n} prompts; make task.n at least 8x the largest size")
    if "stability" in spec.intervals:
        from circuitstat.stats.stability_data import MIN_OBS

        if spec.sizes[0] < MIN_OBS:
            raise InputError(f"{bad} the stability intervals need datasets of at least "
                             f"{MIN_OBS} prompts, but sizes start at {spec.sizes[0]}; drop the smaller sizes")
    if "faithfulness" in spec.intervals:
        from circuitstat.stats.folds import MIN_PER_FOLD

        if spec.scores is None and spec.ablation not in PER_EXAMPLE_ABLATIONS:
            raise InputError(f"{bad} the faithfulness intervals need a per-example "
                             f"ablation ({' or '.join(PER_EXAMPLE_ABLATIONS)}), got {spec.ablation!r}; a mean or "
                             "resample ablation depends on the reference prompts, which differ between a dataset "
                             "and the population")
        if spec.sizes[0] < 2 * MIN_PER_FOLD:
            raise InputError(f"{bad} the selection-aware faithfulness interval needs "
                             f"datasets of at least {2 * MIN_PER_FOLD} prompts (two cross-fitting folds of "
                             f"{MIN_PER_FOLD}), but sizes start at {spec.sizes[0]}; drop the smaller sizes")


def load_calibration_spec(path: str | Path, *, allow_outside: bool = False,
                          scores: str | Path | None = None) -> CalibrationSpec:
    """The validated calibration spec in a YAML file, local paths (model, task file, scores) resolved relative to it.

    ``scores`` (the command line's ``--scores``) replaces the file's; it is not confined, as ``check --run``."""
    from circuitstat.pipelines.spec import confine_paths
    from circuitstat.pipelines.yamlio import resolve_inside

    data = load_yaml(path)
    if scores is not None and isinstance(data, dict):
        data = {**data, "scores": str(scores)}
    spec = confine_paths(parse_calibration_spec(data, str(path)), path, allow_outside=allow_outside)
    if spec.scores is not None and scores is None:
        spec = spec.model_copy(update={"scores": str(resolve_inside(path, spec.scores, key="scores",
                                                                     allow_outside=allow_outside))})
    return spec
