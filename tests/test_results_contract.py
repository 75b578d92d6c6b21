"""The one result contract, on every Result class of the four packages (discovered, so a new one is covered).

Each class is built by its estimator on tiny inputs (tests/result_factories.py) and must answer
``summary()``, ``to_table()`` for every table name (each registered in core/schema.py and valid
against it), ``write(run_dir)`` through RunDir (the files read back equal the tables) and, when its
tables declare an interval, ``conf_int(alpha=...)`` as a ConfInt naming its estimand and level;
a wrong ``alpha`` is refused. The one Estimator base is checked on every estimator the same way.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from circuitstat.core.errors import DeprecatedNameWarning, InputError
from circuitstat.core.estimator import Estimator
from circuitstat.core.results import ConfInt, Result
from circuitstat.core.schema import schema_for
from result_factories import FACTORIES, NEEDS_PATH

PACKAGES = ("circuitstat.core", "circuitstat.reports", "circuitstat.circuits", "circuitstat.stats",
            "circuitstat.pipelines")


def _discover(base: type) -> dict[str, type]:
    """Every subclass of ``base`` defined in the layers (every module imported first)."""
    for pkg in PACKAGES:
        mod = importlib.import_module(pkg)
        for info in pkgutil.walk_packages(mod.__path__, pkg + "."):
            if not info.name.endswith("__main__") and ".migrations" not in info.name:
                importlib.import_module(info.name)
    found, todo = {}, [base]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith(PACKAGES):
                found[sub.__name__] = sub
    return found


RESULTS = _discover(Result)
ESTIMATORS = _discover(Estimator)
#: every class, and a class's other shapes ("Class/variant" factories: tables only some of its results write)
CASES = sorted(RESULTS) + sorted(k for k in FACTORIES if "/" in k)


def test_every_result_class_has_a_factory() -> None:
    # a Result class nobody can build here is a Result whose contract nobody checks
    assert sorted(set(RESULTS) - set(FACTORIES)) == []
    assert len(RESULTS) >= 21


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                fn = FACTORIES[name]
                cache[name] = fn(tmp_path_factory.mktemp(name)) if name in NEEDS_PATH else fn()
        return cache[name]
    return get


@pytest.mark.parametrize("name", CASES)
def test_tables_are_registered_and_valid(name: str, built) -> None:
    res = built(name)
    assert isinstance(res, RESULTS[name.split("/")[0]]) and isinstance(res.summary(), str) and res.summary()
    names = res.table_names()
    assert names and res.main_table in names
    for table in names:
        t = res.to_table(table)
        assert isinstance(t, pa.Table) and t.num_rows >= 0
        schema = schema_for(table)
        assert schema is not None, f"{name} table {table!r} is not registered in core/schema_results.py"
        schema.validate(t)  # raises SchemaError naming the drift
    assert res.to_table().column_names == res.to_table(res.main_table).column_names


@pytest.mark.parametrize("name", CASES)
def test_write_goes_through_rundir(name: str, built, tmp_path: Path) -> None:
    res = built(name)
    paths = res.write(tmp_path / "run")
    assert sorted(paths) == sorted(res.table_names())
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["format"] == "circuitstat.run/1"
    for table, path in paths.items():
        back = pq.read_table(path)
        want = schema_for(table).validate(res.to_table(table))
        assert back.column_names == want.column_names
        for col in want.column_names:
            assert back.column(col).to_pylist() == want.column(col).to_pylist() or np.allclose(
                np.asarray(back.column(col).to_pylist(), float), np.asarray(want.column(col).to_pylist(), float),
                equal_nan=True), (table, col)
        assert b"circuitstat.provenance" in back.schema.metadata
    # into an open run directory, under a sub-directory
    from circuitstat.core.rundir import RunDir

    with RunDir(tmp_path / "other", spec={}) as run:
        nested = res.write(run, under="part")
    assert all(p.parent.name == "part" and p.exists() for p in nested.values())


@pytest.mark.parametrize("name", CASES)
def test_conf_int_has_one_shape(name: str, built) -> None:
    res = built(name)
    names = res.interval_names()
    declared = [p for t in res.table_names() for p in schema_for(t).intervals()
                if f"{p}_low" in res.to_table(t).column_names]
    assert bool(names) == bool(declared)  # every table interval is reachable through conf_int
    if not names:
        with pytest.raises(TypeError, match="carries no interval"):
            res.conf_int()
        return
    level = res.interval_level()
    assert 0 < level < 1
    default = res.conf_int()
    for which in names:
        ci = res.conf_int(alpha=1 - level, which=which)
        assert isinstance(ci, ConfInt) and ci.name and ci.level == level
        assert isinstance(ci.estimand, str) and len(ci.estimand) > 10, (which, ci.estimand)
        low, high = np.atleast_1d(ci.low), np.atleast_1d(ci.high)
        assert low.shape == high.shape and ci.to_array().shape == (low.size, 2)
        ok = np.isfinite(low) & np.isfinite(high)
        assert (low[ok] <= high[ok] + 1e-12).all(), which
    assert default.name in {res.conf_int(which=w).name for w in names}
    with pytest.raises(InputError, match="refit with confidence_level"):
        res.conf_int(alpha=0.5 if abs(level - 0.5) > 1e-6 else 0.3)
    with pytest.raises(InputError, match="has no interval"):
        res.conf_int(which="no-such-interval")


def test_interval_results_are_the_fourteen_plus() -> None:
    # the classes whose tables declare an interval (issue 24 counted 14 of 18 before ScoreMatrix and Circuit)
    with_intervals = {n for n in RESULTS if n in (
        "BootstrapResult", "FaithfulnessInterval", "StabilityResult", "VarianceComponentsResult", "ICCResult",
        "SimilarityResult", "HeadMatchResult", "SinkResult", "TokenImportanceResult", "TokenStabilityResult",
        "ContributionsResult", "CrossSeedResult", "HeadStabilityResult", "RunTables", "HeadStudyResult")}
    assert len(with_intervals) == 15


def test_the_contract_catches_an_unregistered_table(tmp_path: Path) -> None:
    from dataclasses import dataclass, field

    from circuitstat.core.schema import SchemaError

    @dataclass(repr=False)
    class Rogue(Result):
        params: dict = field(default_factory=dict)
        main_table = "rogue"

        def _tables(self):
            return {"rogue": {"x_low": np.zeros(2), "x_high": np.ones(2)}}

    with pytest.raises(SchemaError, match="rogue"):
        Rogue().write(tmp_path / "run")
    assert not (tmp_path / "run").exists()
    with pytest.raises(TypeError, match="no interval"):  # undeclared columns are not an interval
        Rogue().conf_int()


# --- the one Estimator base ----------------------------------------------------------------------
def test_every_estimator_follows_scikit_learn_conventions() -> None:
    assert {"HeadStability", "TokenContributions"} <= set(ESTIMATORS)
    for name, cls in ESTIMATORS.items():
        assert "get_params" not in cls.__dict__ and "set_params" not in cls.__dict__, name  # one base
        sig = inspect.signature(cls.__init__)
        defaults = {p.name: p.default for p in sig.parameters.values() if p.name != "self"}
        est = cls()
        assert est.get_params() == defaults, name  # stored verbatim
        clone = est.clone()
        assert type(clone) is cls and clone is not est and clone.get_params() == est.get_params()
        assert repr(est) == f"{name}()"


def test_init_stores_verbatim_and_set_params_validates_names() -> None:
    from circuitstat.pipelines.runs.tokens.run import TokenContributions
    from circuitstat.pipelines.runs.heads.stability import HeadStability

    hooks, cka = ["post"], ["linear"]
    est = HeadStability(hooks=hooks, cka=cka, n_null=3)
    assert est.hooks is hooks and est.cka is cka  # no conversion in __init__: fit validates
    assert repr(est) == "HeadStability(n_null=3, hooks=['post'], cka=['linear'])"
    assert est.set_params(n_null=5) is est and est.n_null == 5
    with pytest.raises(InputError, match="unknown HeadStability parameter"):
        est.set_params(n_nul=5)
    ks = [1, 3]
    tc = TokenContributions(ks=ks)
    assert tc.ks is ks and tc.set_params(ks=(2,)).ks == (2,)
    with pytest.raises(InputError, match="unknown TokenContributions parameter"):
        tc.set_params(kss=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecatedNameWarning)
        HeadStability(n_null=2)  # the current names never warn


def test_several_predictors_write_each_coefficient(built) -> None:
    # the variant's extra table holds every coefficient (lam is only their sum); a single predictor writes none
    res, single = built("VerifiedResult/several predictors"), built("VerifiedResult")
    assert "verified_coefficients" in res.table_names() and "verified_coefficients" not in single.table_names()
    t = res.to_table("verified_coefficients").to_pydict()
    E, p = res.coefficients.shape
    assert p == 2 and len(t["coefficient"]) == E * p
    np.testing.assert_array_equal(np.reshape(t["coefficient"], (E, p)), res.coefficients)
    assert t["predictor"][:p] == ["eap", "atp-qkfix"] and t["edge"] == list(np.repeat(np.arange(E), p))
    np.testing.assert_allclose(np.reshape(t["coefficient"], (E, p)).sum(1), res.lam, rtol=0, atol=1e-12)
    assert set(t["design"]) == {res.params["method"]} and "2 predictors" in t["design"][0]
