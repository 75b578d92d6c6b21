"""The registry of run kinds: the one place that says which kinds of run exist and where each is declared.

A run kind is what a command writes into a run directory (``attribute``, ``audit``, ``study variance``, ...).
Each kind declares once, in its own module, a :class:`RunKind`: how its spec is read, what runs it, the
stages it writes (in order) and what it costs (the ``--plan`` arithmetic, from the model's config alone);
every run records its kind in its manifest. The command line, ``check`` and the service read it here, so a kind is
never dispatched by a chain of ``if kind == ...`` elsewhere. Light to import: a kind's module is imported
only when its declaration is asked for.

A run-like entry point that writes no run directory (no manifest records a kind, so ``check`` has nothing to read and
``--out`` names a file) is a :class:`Script`, listed once in :data:`SCRIPTS`: ``circuitstat scripts`` prints them,
and docs/usage.md lists each (tests/pipelines/test_scripts.py checks both, and that no other module runs as one).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from circuitstat.core.errors import InputError

__all__ = ["RunKind", "KINDS", "SERVED", "NO_KIND", "Script", "SCRIPTS", "kind", "recorded_kind", "check_run_out"]


@dataclass(frozen=True)
class RunKind:
    """One kind of run and what every entry point needs of it.

    ``parse(data, source)`` validates a spec (parsed YAML) into the kind's spec object; ``run(spec, out, *,
    n_jobs, allow_pickle, allow_large, inputs)`` writes the run into ``out``, for the service and the command line
    alike (the command line builds the same spec from its options, and passes what only its machine decides, such
    as ``force`` or a Dask ``scheduler``, as further keyword arguments); ``stages(spec)`` lists the RunDir stages
    it writes, in order; ``flops(spec, cfg)`` prices its attribution work from a model config; ``sources(spec)``
    lists the models it loads; ``report`` says whether ``report.html`` is rendered after it."""

    name: str
    summary: str
    parse: Callable[[Any, str], Any] | None = None
    run: Callable[..., Any] | None = None
    stages: Callable[[Any], list[str]] | None = None
    flops: Callable[[Any, Any], float] | None = None
    sources: Callable[[Any], list[str]] = field(default=lambda spec: list(spec.sources))
    report: bool = False


# kind name -> the module that declares it as ``KIND``. A run records its kind in its manifest (RunDir's ``kind``),
# so a run directory's kind is read, never guessed from its spec's keys.
_REGISTRY = {
    "study heads": "circuitstat.pipelines.runs.heads.study",
    "study groundtruth": "circuitstat.pipelines.runs.groundtruth.study",
    "study calibration": "circuitstat.pipelines.runs.calibration.study",
    "study variance": "circuitstat.pipelines.runs.variance.study",
    "audit": "circuitstat.pipelines.runs.audit.run",
    "attribute": "circuitstat.pipelines.runs.attribute.run",
    "tokens": "circuitstat.pipelines.runs.tokens.run",
    "heads": "circuitstat.pipelines.runs.heads.stability",
    "sample-size": "circuitstat.pipelines.runs.sample_size.run",
}
KINDS = tuple(_REGISTRY)
#: what a run recorded before its manifest held its kind is told (check_run_out refuses to write into it)
NO_KIND = ("was written before circuitstat recorded a run's kind in manifest.json, so what it holds cannot be "
           "checked; give a new --out (rerun the command there), or read it as it is")


@dataclass(frozen=True)
class Script:
    """A ``python -m MODULE`` entry point that is not a run kind: it writes no run directory, so no manifest records
    what made its output and nothing checks or resumes it; ``writes`` says what it leaves, ``doc`` where it is
    documented."""

    name: str
    module: str
    summary: str
    writes: str
    doc: str

    @property
    def command(self) -> str:
        """The shell command that runs it (its own ``--help`` lists its options)."""
        return f"python -m {self.module}"


SCRIPTS = {s.name: s for s in (
    # a calibration study whose rows docs/hypothesis-tests.md quotes: one JSON file, no stages to resume (its pool is
    # evaluated once and the datasets are resamples of it, seconds each)
    Script("circuit-tests-study", "circuitstat.pipelines.circuit_tests_study",
           "type-I error and power of the circuit hypothesis tests against N on a ground-truth model",
           "a JSON file of rows (--out FILE.json)", "docs/hypothesis-tests.md"),
    Script("zoo", "circuitstat.pipelines.zoo", "builds or reuses the whole default zoo and prints its induction table",
           "models in the zoo's cache (as `circuitstat zoo build`, one model per call)", "docs/usage.md"),
    Script("tracr-convert", "circuitstat.circuits.groundtruth.tracr_convert",
           "compiles the ground-truth RASP programs with tracr (the tracr extra) into fixtures",
           "one fixture directory per program (--out DIR)", "docs/groundtruth.md"),
)}
"""Every run-like entry point that is not a run kind, by name; a module that runs as ``python -m`` is either the
command line or listed here."""

# the service's job kinds and the run kind each runs
SERVED = {"audit": "audit", "variance": "study variance", "calibration": "study calibration",
          "attribute": "attribute"}


def module_of(name: str) -> str:
    """The dotted name of the module that declares run kind ``name`` (a command's name, or a service job kind)."""
    name = SERVED.get(name, name)
    if name not in _REGISTRY:
        raise InputError(f"unknown run kind {name!r}; kinds: {', '.join(KINDS)}")
    return _REGISTRY[name]


def kind(name: str) -> RunKind:
    """The declaration of run kind ``name`` (a command's name, or a service job kind); InputError if unknown."""
    module = module_of(name)
    name = SERVED.get(name, name)
    declared = importlib.import_module(module).KIND
    if declared.name != name:  # a module declaring another kind is a bug in this table
        raise RuntimeError(f"{module} declares {declared.name!r}, not {name!r}")
    return declared


def recorded_kind(manifest: Any) -> str | None:
    """The run kind a run's manifest records (RunDir ``kind``), or None when it records none (a run written before
    kinds were recorded, or not a command's run)."""
    kind_ = manifest.get("kind") if isinstance(manifest, dict) else None
    return kind_ if isinstance(kind_, str) else None


def check_run_out(out: Path, name: str | None = None, *, force: bool = False) -> None:
    """InputError when ``out`` is a symbolic link or exists and is not a directory, or (with ``name``, the command's
    kind) when it holds a run of another kind: writing into it would merge both kinds' stages into one manifest
    and replace its spec, so ``force`` never lifts that (it only recomputes a run of the same kind; the one
    output-path policy, circuitstat.core.outpath). Checked before anything is loaded."""
    import os

    out = Path(out)
    if os.path.islink(out):
        raise InputError(f"--out {out} is a symbolic link; a run is never written through a link: give the directory "
                         "it points to, or a new one")
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is a file, not a directory; give a new or existing run directory")
    if name is None or not (out / "manifest.json").is_file():
        return
    from circuitstat.core.rundir import RunDir

    manifest = RunDir.read_manifest(out)
    if "kind" not in manifest:
        raise InputError(f"--out {out} {NO_KIND}")
    other = recorded_kind(manifest)
    if other != name:
        what = f"a `circuitstat {other}` run" if other else "a run of another command"
        raise InputError(f"--out {out} holds {what}, not a `circuitstat {name}` run; give a new --out (--force only "
                         "recomputes a run of the same kind, never writes into another command's run)")
