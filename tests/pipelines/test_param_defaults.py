"""Every estimator's and command's default and bounds of a declared parameter are its Param's (circuitstat.core.params).

Enumerated, never hand-listed: every command of ``circuitstat`` (typer's tree) and every Estimator subclass of the run
kinds' modules. An option or ``__init__`` parameter named after a Param takes that Param's default for the command's
or the run kind's name (``Param.default_for``), or None (resolved later from the same Param), and an option carries
the Param's minimum and its maximum or none (``--n-jobs`` leaves its ceiling to check_n_jobs, the machine's CPU
count, which names it). Before, ``HeadStability(batch_size=50)``, ``check-circuit --n-resamples 1000``,
``study heads --n-jobs 2`` and ``sample-size --seed`` (no maximum) and ``--n-jobs`` (minimum -1) were typed anew.
"""

from __future__ import annotations

import importlib
import inspect
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
