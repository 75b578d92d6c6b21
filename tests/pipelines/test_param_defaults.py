"""Every estimator's and command's default and bounds of a declared parameter are its Param's (circuitstat.core.params).

Enumerated, never hand-listed: every command of ``circuitstat`` (typer's tree) and every Estimator subclass of the run
kinds' modules. An option or ``__init__`` parameter named after a Param takes that Param's default for the command's
or the run kind's name (``Param.default_for``), or None (resolved later from the same Param), and an option carries
the Param's minimum and its maximum or none (``--n-jobs`` leaves its ceiling to check_n_jobs, the machine's CPU
count, which names it). Before, ``HeadStability(batch_size=50)``, ``check-circuit --n-resamples 1000``,
``study heads --n-jobs 2`` and ``sample-size --seed`` (no maximum) and ``--n-jobs`` (minimum -1) were typed anew.

The library too (issue 46): every public function, class and method of circuits/, stats/ and pipelines/ (the CLI is
checked above; the service's limits are its own) whose parameter is named after a Param takes the Param's common
default, or the default of the kind it serves (its module's run kind, or :data:`SERVES`), or is listed in
:data:`OWN_DEFAULTS` with why; values are read with inspect.signature, so a literal that differs is caught wherever
it is typed.
"""

from __future__ import annotations

import importlib
import inspect
import numbers
import pkgutil
import sys

import typer

import circuitstat.core.params as params_module
from circuitstat.core.estimator import Estimator
from circuitstat.core.params import PARAMS, Param
from circuitstat.pipelines.kinds import KINDS, module_of


def commands(group, path: tuple[str, ...] = ()):
    """(command path, command) of every command under ``group`` (a typer group)."""
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            yield from commands(cmd, path + (name,))
        else:
            yield " ".join(path + (name,)), cmd


def option_mismatches(app: typer.Typer) -> tuple[list[str], int]:
    """What breaks the rule among ``app``'s options named after a Param, and how many such options there are."""
    bad, seen = [], 0
    for path, cmd in commands(typer.main.get_command(app)):
        for opt in cmd.params:
            param = PARAMS.get(opt.name)
            if param is None:
                continue
            seen += 1
            want = param.default_for(path)
            if opt.default is not None and opt.default != want:
                bad.append(f"{path} {opt.opts[0]}: default {opt.default!r}, the Param's {want!r}")
            low, high = getattr(opt, "min", None), getattr(opt, "max", None)
            if low != param.minimum_for(path) or high not in (None, param.maximum):
                bad.append(f"{path} {opt.opts[0]}: bounds {(low, high)}, the Param's "
                           f"{(param.minimum_for(path), param.maximum)}")
    return bad, seen


def run_kind_estimators() -> list[tuple[type, str]]:
    """(Estimator subclass, its run kind's name) of every estimator the run kinds' modules define."""
    for k in KINDS:
        importlib.import_module(module_of(k))
    found, todo = [], list(Estimator.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        kind = getattr(sys.modules[cls.__module__], "KIND", None)
        if kind is not None:
            found.append((cls, kind.name))
    return found


def estimator_mismatches(estimators: list[tuple[type, str]]) -> list[str]:
    """What breaks the rule among the ``__init__`` parameters named after a Param of ``estimators``."""
    bad = []
    for cls, kind in estimators:
        for name, p in inspect.signature(cls.__init__).parameters.items():
            param = PARAMS.get(name)
            if param is not None and p.default is not None and p.default != param.default_for(kind):
                bad.append(f"{cls.__name__}({name}={p.default!r}): the Param's default for {kind} is "
                           f"{param.default_for(kind)!r}")
    return bad


def test_every_param_is_registered_by_its_own_name():
    declared = [v for v in vars(params_module).values() if isinstance(v, Param)]
    assert sorted(p.name for p in declared) == sorted(PARAMS)  # a Param outside PARAMS would go unchecked
    assert all(PARAMS[p.name] is p for p in declared)


def test_every_command_option_takes_its_params_default_and_bounds():
    from circuitstat.pipelines.cli import app

    bad, seen = option_mismatches(app)
    assert bad == []
    assert seen >= 35  # the enumeration reaches the commands (39 options named after a Param today)


def test_every_run_kinds_estimator_takes_its_params_defaults():
    estimators = run_kind_estimators()
    assert {c.__name__ for c, _ in estimators} >= {"HeadStability", "TokenContributions"}
    assert estimator_mismatches(estimators) == []


def test_the_checks_catch_a_literal_default_or_bound():
    """Negative controls: a command with its own resample count and a seed with its own minimum, and an estimator of
    the tokens kind with the audit's resample count, are each reported."""
    app = typer.Typer()

    @app.command("tokens")
    def tokens(n_resamples: int = typer.Option(1000, "--n-resamples", min=10, max=100_000),
               seed: int = typer.Option(0, "--seed", min=1), batch_size: int | None = typer.Option(None, "--batch-size",
                                                                                                   min=1, max=4096)):
        pass

    @app.command("other")
    def other() -> None:  # a second command: typer then builds a group, as circuitstat's app is
        pass

    bad, seen = option_mismatches(app)
    assert seen == 3 and len(bad) == 2, bad
    assert "tokens --n-resamples: default 1000, the Param's 2000" in bad[0]
    assert "tokens --seed: bounds (1, None)" in bad[1]

    class Literal(Estimator):
        def __init__(self, n_resamples: int = 1000, seed: int | None = 0, n_jobs: int | None = None) -> None:
            self.n_resamples, self.seed, self.n_jobs = n_resamples, seed, n_jobs

    assert estimator_mismatches([(Literal, "tokens")]) == [
        "Literal(n_resamples=1000): the Param's default for tokens is 2000"]
    assert estimator_mismatches([(Literal, "audit")]) == []  # the audit's own default is 1000


LIBRARY = ("circuitstat.circuits", "circuitstat.stats", "circuitstat.pipelines")
NOT_LIBRARY = (".service", ".cli", ".migrations", "__main__")  # the service's own limits; the CLI's options (above)

#: callables (by qualified-name prefix) that serve one kind of run: they take that kind's default (Param.default_for)
SERVES = {
    "circuitstat.circuits.readouts": "heads",  # the heads kind's readouts (HeadStability passes its batch)
    "circuitstat.stats.similarity.head_matching": "heads",
    "circuitstat.pipelines.spec.HeadsSpec": "heads",
    "circuitstat.pipelines.runs.heads.study.StudyPlan": "heads",  # each cell is a HeadStability fit
    "circuitstat.circuits.contributions": "tokens",
    "circuitstat.stats.sinks": "tokens",
    "circuitstat.stats.token_importance": "tokens",
    "circuitstat.circuits.ugs": "ugs",
    "circuitstat.pipelines.mask_options.UGS": "ugs",  # UGSOptions, UGSSpec
    "circuitstat.pipelines.runs.calibration.spec": "calibration",
    "circuitstat.pipelines.runs.groundtruth.study.GroundTruthSpec": "groundtruth",
}

#: (qualified name, parameter) -> (its own default, why it is not the Param's): reviewed, never a silent copy
OWN_DEFAULTS = {
    ("circuitstat.circuits.ablation.Ablation", "batch_size"): (32, "batches of the reference set its means average"),
    ("circuitstat.circuits.ablation.sender_means", "batch_size"): (32, "as Ablation"),
    ("circuitstat.circuits.optimal_ablation.OptimalAblation", "batch_size"): (32, "as Ablation"),
    ("circuitstat.circuits.optimal_ablation.OptimalAblation.from_reference", "batch_size"): (32, "as Ablation"),
    ("circuitstat.circuits.contributions.ablation_drops", "batch_size"): (256, "rows of ablated prompts x orders"),
    ("circuitstat.circuits.edge_pruning.fit_edge_pruning", "batch_size"): (64, "a mask fit's step batch; the audit "
                                                                           "passes its spec's"),
    ("circuitstat.circuits.ugs.fit_ugs", "batch_size"): (64, "as fit_edge_pruning"),
    ("circuitstat.stats.intervals.edges.bootstrap_edges", "n_resamples"): (2000, "the per-edge bootstrap's own "
                                                                           "(scipy.stats.bootstrap's is 9999)"),
    ("circuitstat.stats.intervals.statistic.bootstrap_statistic", "n_resamples"): (2000, "as bootstrap_edges"),
    ("circuitstat.stats.stability.circuit_stability", "n_resamples"): (200, "top-k circuits per resample: the "
                                                                          "pairwise Jaccard is O(B^2)"),
    ("circuitstat.stats.sample_size.predict_widths", "n_resamples"): (999, "the bootstrap whose width is predicted"),
    ("circuitstat.stats.groundtruth_scoring.score_dataset", "n_resamples"): (500, "per simulated dataset, many "
                                                                               "datasets per cell"),
    ("circuitstat.stats.groundtruth_scoring.faithfulness_dataset", "n_resamples"): (500, "as score_dataset"),
    ("circuitstat.stats.groundtruth_scoring.faithfulness_refit_dataset", "n_resamples"): (500, "as score_dataset"),
    ("circuitstat.pipelines.demo.demo_spec", "n_jobs"): (2, "the demo's audit on 2 workers"),
    ("circuitstat.pipelines.zoo.default_zoo", "n_jobs"): (2, "the zoo trains 2 models at a time"),
    ("circuitstat.pipelines.zoo.induction_metrics", "batch_size"): (32, "the zoo report's induction prompts"),
    # a parameter that only shares a Param's name: the training recipe's learning rate and steps (not the mask
    # fits'), a count of resampling weights to price (0: none), a Jaccard or share target (not edge pruning's)
    ("circuitstat.pipelines.training.recipe.TrainRecipe", "lr"): (1e-3, "the training learning rate"),
    ("circuitstat.pipelines.training.recipe.TrainRecipe", "steps"): (1000, "training steps"),
    ("circuitstat.pipelines.build.check_work", "n_resamples"): (0, "resampling weights priced (0: none)"),
    ("circuitstat.pipelines.runs.sample_size.run.SampleSizeSpec", "target"): (0.5, "a Jaccard to clear"),
    ("circuitstat.pipelines.runs.variance.spec.SelectionSpec", "target"): (0.8, "a share of the variance"),
}


def library_callables(packages=LIBRARY) -> list[tuple[str, object, str | None]]:
    """(qualified name, callable, its module's run kind or None) of every public function, class and method defined
    in the modules of ``packages`` (every module imported)."""
    found = []
    for pkg in packages:
        names = [pkg] + [i.name for i in pkgutil.walk_packages(importlib.import_module(pkg).__path__, pkg + ".")]
        for mod in (importlib.import_module(n) for n in names if not any(s in n for s in NOT_LIBRARY)):
            kind = getattr(getattr(mod, "KIND", None), "name", None)
            for name, obj in vars(mod).items():
                if name.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
                    continue
                if inspect.isfunction(obj) or inspect.isclass(obj):
                    found.append((f"{mod.__name__}.{name}", obj, kind))
                if inspect.isclass(obj):
                    for attr, v in vars(obj).items():
                        f = v.__func__ if isinstance(v, (staticmethod, classmethod)) else v
                        if not attr.startswith("_") and inspect.isfunction(f):
                            found.append((f"{mod.__name__}.{name}.{attr}", f, kind))
    return found


def served_kind(qualname: str, module_kind: str | None) -> str | None:
    """The kind a callable serves: the longest :data:`SERVES` prefix of its name, else its module's run kind."""
    prefixes = [p for p in SERVES if qualname == p or qualname.startswith(p)]
    return SERVES[max(prefixes, key=len)] if prefixes else module_kind


def signature_mismatches(callables, own=OWN_DEFAULTS) -> tuple[list[str], int]:
    """What breaks the rule among the parameters of ``callables`` named after a Param with a numeric default (a flag
    or a list of that name is another thing), and how many such parameters there are."""
    bad, seen = [], 0
    for qualname, fn, module_kind in callables:
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):  # a builtin or a class without a Python signature
            continue
        for name, p in params.items():
            param, value = PARAMS.get(name), p.default
            if param is None or not isinstance(value, numbers.Real) or isinstance(value, bool):
                continue
            seen += 1
            kind = served_kind(qualname, module_kind)
            if (qualname, name) in own:
                if value != own[(qualname, name)][0]:
                    bad.append(f"{qualname}({name}={value!r}): OWN_DEFAULTS says {own[(qualname, name)][0]!r}")
            elif value != param.default_for(kind):
                bad.append(f"{qualname}({name}={value!r}): the Param's default"
                           + (f" for {kind}" if kind else "") + f" is {param.default_for(kind)!r}")
    return bad, seen


def test_every_library_default_is_its_params():
    callables = library_callables()
    bad, seen = signature_mismatches(callables)
    assert bad == []
    assert seen >= 150  # the enumeration reaches the library (198 such parameters today)
    names = {q for q, _, _ in callables}
    # every exception still names a callable that exists (a renamed function would leave a dead entry)
    assert {q for q, _ in OWN_DEFAULTS} <= names
    assert all(any(q == p or q.startswith(p) for q in names) for p in SERVES)


def test_the_library_check_catches_a_planted_literal():
    """Negative controls: a function with its own resample count, one with a kind's batch size it does not serve, one
    serving the tokens kind with the common default, and an exception whose value drifted are each reported; the same
    functions written from the Params pass."""
    from circuitstat.core.params import BATCH_SIZE, N_RESAMPLES

    def planted(S, *, n_resamples: int = 1234, batch_size: int = 64, seed: int = 0, n_jobs: int | None = None):
        pass

    def from_params(S, *, n_resamples: int = N_RESAMPLES.default, batch_size: int = BATCH_SIZE.default):
        pass

    def serving(S, *, n_resamples: int = 1000):
        pass

    bad, seen = signature_mismatches([("x.planted", planted, None), ("x.from_params", from_params, None),
                                      ("circuitstat.stats.sinks.planted", serving, None),
                                      ("x.kind_module", from_params, "tokens")])
    assert seen == 8
    assert bad == ["x.planted(n_resamples=1234): the Param's default is 1000",
                   "x.planted(batch_size=64): the Param's default is 16",
                   "circuitstat.stats.sinks.planted(n_resamples=1000): the Param's default for tokens is 2000",
                   "x.kind_module(n_resamples=1000): the Param's default for tokens is 2000",
                   "x.kind_module(batch_size=16): the Param's default for tokens is 32"]
    assert signature_mismatches([("x.f", serving, None)], own={("x.f", "n_resamples"): (999, "why")})[0] == [
        "x.f(n_resamples=1000): OWN_DEFAULTS says 999"]
