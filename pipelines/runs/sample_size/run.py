"""``sample-size`` as a run kind: its spec, what runs it into a run directory, and its :class:`RunKind` record.

The statistics are circuitstat.pipelines.runs.sample_size.simulate (and circuitstat.stats.sample_size under it); here the kind's
spec (the command's options, as a spec the manifest records and ``parse`` reads back), its run (read the pilot,
predict, write the tables and the figure through RunDir, recording the kind) and its declaration, which the
registry (circuitstat.pipelines.kinds) reads. The command line builds a spec and calls ``KIND.run``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field

from circuitstat.core.errors import InputError
from circuitstat.core.params import N_JOBS, N_RESAMPLES, SEED
from circuitstat.pipelines.kinds import RunKind, check_run_out
from circuitstat.pipelines.options import (SAMPLE_SIZE_DATASETS, SAMPLE_SIZE_DATASETS_RANGE, SAMPLE_SIZE_KS,
                                           SAMPLE_SIZE_LEVEL, SAMPLE_SIZE_LEVEL_RANGE, SAMPLE_SIZE_MEANS,
                                           SAMPLE_SIZE_N_RANGE, SAMPLE_SIZE_NS, SAMPLE_SIZE_TARGET)

__all__ = ["KIND_NAME", "SampleSizeSpec", "check_sample_out", "run_sample_size", "KIND"]

KIND_NAME = "sample-size"


class SampleSizeSpec(BaseModel):
    """What a ``sample-size`` run predicts from: the pilot run, the sizes N and k, the claims file and the settings."""

    model_config = ConfigDict(extra="forbid")

    pilot: str  # the --out of `circuitstat attribute` or `circuitstat audit`
    n: list[Annotated[int, Field(ge=SAMPLE_SIZE_N_RANGE[0], le=SAMPLE_SIZE_N_RANGE[1])]] = Field(
        default_factory=lambda: list(SAMPLE_SIZE_NS), min_length=1)
    k: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: list(SAMPLE_SIZE_KS), min_length=1)
    target: float = Field(SAMPLE_SIZE_TARGET, ge=0.0, le=1.0)
    claims: str | None = None
    method: str | None = None  # which scores of an audit pilot
    datasets: int = Field(SAMPLE_SIZE_DATASETS, ge=SAMPLE_SIZE_DATASETS_RANGE[0], le=SAMPLE_SIZE_DATASETS_RANGE[1])
    means: Literal[SAMPLE_SIZE_MEANS] = SAMPLE_SIZE_MEANS[0]
    resamples: int | None = N_RESAMPLES.pydantic(default=None)  # None: the pilot audit's, else the audit default
    level: float = Field(SAMPLE_SIZE_LEVEL, ge=SAMPLE_SIZE_LEVEL_RANGE[0], le=SAMPLE_SIZE_LEVEL_RANGE[1])
    plan: bool = False
    model: str | None = None  # with plan: the model to price (None: the pilot's)
    seed: int = SEED.pydantic()


def _parse(data: Any, source: str) -> SampleSizeSpec:
    from circuitstat.pipelines.spec import validate_spec

    return validate_spec(SampleSizeSpec, data, source, kind="sample-size spec", keys="pilot, n, k, target, ...")


def check_sample_out(out: Path, force: bool) -> None:
    """InputError when --out is not new, empty or (with --force) an earlier sample-size output (core/outpath.py)."""
    check_run_out(out, KIND_NAME, force=force)  # a link, a file or another command's run: refused, --force or not
    if not force and (Path(out) / "manifest.json").is_file():
        raise InputError(f"--out {out} holds an earlier sample-size output; give a new --out or pass --force to "
                         "replace it")


def _pilot_inputs(spec: SampleSizeSpec, trust_unrecorded: bool):
    """(pilot ScoreMatrix, the AuditSpec the full run will use or None, ClaimsFile or None), checked."""
    from circuitstat.pipelines.runs.sample_size.simulate import read_pilot

    sm, audit = read_pilot(spec.pilot, spec.method, trust_unrecorded=trust_unrecorded)
    if sm.level != "edge":
        raise InputError(f"the pilot {spec.pilot} scored {sm.level}s; sample-size needs edge scores "
                         "(`circuitstat attribute --level edge`)")
    cf = None
    if spec.claims is not None:
        from circuitstat.pipelines.claims.parsing import load_claims

        cf = load_claims(spec.claims)
    if spec.resamples is not None:
        from circuitstat.pipelines.spec import AuditSpec

        audit = audit or AuditSpec(model="pilot")
        audit = audit.model_copy(update={"bootstrap": audit.bootstrap.model_copy(
            update={"n_resamples": spec.resamples})})
    return sm, audit, cf


def run_sample_size(spec: SampleSizeSpec, out: Path | None = None, *, n_jobs: int = N_JOBS.default,
                    allow_pickle: bool = False, allow_large: bool = False, trust_unrecorded: bool = False,
                    force: bool = False, say: Callable[[str], None] | None = None):
    """Return the SampleSizeResult of ``spec``, written (with ``out``) into run directory ``out`` with
    sample_size.svg, its manifest recording the kind and the spec; ``say`` receives what the run tells its user.
    ``allow_pickle`` is unused (a pilot is Parquet tables); taken as every run kind's ``run`` takes it."""
    from circuitstat.pipelines.runs.sample_size.simulate import pilot_groups, sample_size

    if out is not None:
        check_sample_out(Path(out), force)
    sm, audit, cf = _pilot_inputs(spec, trust_unrecorded)
    cost = _cost(sm, sorted(set(spec.n)), spec.model, say) if spec.plan else None
    res = sample_size(sm.scores, sm.names, sm.method, spec.n, spec.k, spec.target, claims=cf, spec=audit,
                      n_datasets=spec.datasets, seed=spec.seed, means=spec.means, prediction_level=spec.level,
                      n_jobs=n_jobs, cost=cost, groups=pilot_groups(sm), allow_large=allow_large)
    if out is not None:
        _write(res, spec, Path(out))
    return res


def _write(res, spec: SampleSizeSpec, out: Path) -> dict:
    """Write ``res`` and its figure into ``out`` through RunDir (the manifest records the kind and ``spec``); an
    earlier output's tables this result does not have go, records too."""
    from circuitstat.core.atomic import atomic_write
    from circuitstat.core.rundir import RunDir
    from circuitstat.reports.html.sample_size import sample_size_svg

    with RunDir(out, spec=spec.model_dump(mode="json"), kind=KIND_NAME) as run:
        for stale in sorted(out.glob("sample_size_*.parquet")):
            if stale.stem not in res.tables():
                run.remove_table(stale.stem)
        paths = res.write(run)
    with atomic_write(out / "sample_size.svg") as f:
        f.write(sample_size_svg(res.stability, res.widths, target=spec.target, level=spec.level).encode())
    return paths


def _cost(sm, ns: list[int], source: str | None, say: Callable[[str], None] | None) -> dict:
    """Rows of cost_rows for the pilot's model (or ``source``), priced at this machine's matmul rate."""
    import torch

    from circuitstat.pipelines.plan import flop_rate
    from circuitstat.pipelines.runs.sample_size.simulate import cost_rows
    from circuitstat.pipelines.sources import LOCAL

    source = source or (sm.provenance.get("model") or {}).get("source")
    if not source:
        raise InputError("the pilot records no model source to price; pass --model")
    skeleton = LOCAL.skeleton(source, weights=False, allow_large=True)  # shapes on meta: no size to refuse
    positions = int((sm.provenance.get("task") or {}).get("n_positions") or 0)
    if positions < 1:
        raise InputError("the pilot records no prompt length (task n_positions) to price; rerun the pilot with "
                         "`circuitstat attribute`")
    rate, how = flop_rate("cpu", torch.float32)
    if say is not None:
        say(f"cost priced at {rate:.3g} TFLOP/s ({how}); a lower bound: per-call overhead and memory-bound work are "
            "left out (`circuitstat attribute --plan` times the passes)")
    return cost_rows(skeleton.cfg, ns, positions, ["exact", "eap"], rate)


def _sources(spec: SampleSizeSpec) -> list[str]:
    """The model sources a run loads: with ``plan``, the priced model's skeleton (shapes on meta, no weights); the
    pilot's own source is read from its tables, so it is not known from the spec alone."""
    return [spec.model] if spec.plan and spec.model else []


# stages: none (its tables are written in one RunDir, not as resumable stages); flops: None, as it runs no model
# pass: its work is the simulation, priced from the pilot's shape before it starts (pipelines.work.check_sample_size)
KIND = RunKind(KIND_NAME, "how many prompts a full run needs, predicted from a pilot run's per-example scores",
               parse=_parse, run=run_sample_size, stages=lambda spec: [], flops=None, sources=_sources)
