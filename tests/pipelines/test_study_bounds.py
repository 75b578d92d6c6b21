"""Unbounded work and out-of-range knobs in ``study groundtruth`` are refused (exit 2) before anything is
built or written, naming the cost and the limit (issue 38, adversarial item 3)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from circuitstat.pipelines.cli import app

runner = CliRunner()


@pytest.fixture
def no_work(monkeypatch):
    """Any attribution or task building fails the test at once (the old code started them)."""
    import circuitstat.circuits.groundtruth.truth
    import circuitstat.pipelines.runs.audit.run

    def started(*a, **k):
        raise AssertionError("work started before the study was priced")

    monkeypatch.setattr(circuitstat.pipelines.runs.audit.run, "attribution_scores", started)
    monkeypatch.setattr(circuitstat.circuits.groundtruth.truth.GroundTruthModel, "task", started)


def _run(tmp_path: Path, **doc) -> tuple[str, Path]:
    spec = tmp_path / "gt.yaml"
    spec.write_text(yaml.safe_dump({"methods": ["eap"], "faithfulness_methods": [], **doc}))
    out = tmp_path / "run"
    res = runner.invoke(app, ["study", "groundtruth", str(spec), "--out", str(out)])
    assert res.exit_code == 2, res.output + repr(res.exception)
    err = res.stderr.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1 and "Traceback" not in res.output, err
    assert not out.exists()  # no run directory, no .lock
    return err, out


def test_a_billion_prompt_dataset_is_refused_naming_the_count_and_the_limit(tmp_path, no_work):
    err, _ = _run(tmp_path, models=["planted:induction"], sizes=[1_000_000_000])
    assert "20,000,000,000" in err and "above the limit of 1,000,000" in err and "--allow-large" in err


METHODS = ["exact", "eap", "eap-ig-inputs", "eap-ig-activations", "clean-corrupted"]
MODELS = ["planted:induction"] + [f"planted:induction?seed={s}" for s in range(1, 6)]


def test_the_reported_grid_is_refused_by_its_population(tmp_path, no_work):
    """6 models x sizes [4096] x 10,000 datasets x 100,000 resamples (accepted by the old code)."""
    err, _ = _run(tmp_path, models=MODELS, methods=METHODS, sizes=[4096], n_datasets=10_000, n_resamples=100_000)
    assert "40,960,000" in err and "above the limit of 1,000,000" in err


def test_a_grid_within_the_prompt_limit_is_priced_and_refused(tmp_path, no_work):
    err, _ = _run(tmp_path, models=MODELS, methods=METHODS, sizes=[4096], n_datasets=240, n_resamples=100_000,
                  n_subsamples=100_000)
    assert "needs about" in err and "above the maximum of 1e+15" in err and "n_resamples" in err


@pytest.mark.parametrize("query, key", [("background=1000000000", "background"), ("background=-1", "background"),
                                        ("background=nan", "background"), ("signal=0", "signal"),
                                        ("signal_noise=inf", "signal_noise"), ("n_background=100000", "n_background"),
                                        ("d_background=100000000", "d_background"), ("seed=-1", "seed"),
                                        ("resample=2", "resample")])
def test_planted_knobs_out_of_range_are_refused_by_name(tmp_path, no_work, query, key):
    err, _ = _run(tmp_path, models=[f"planted:induction?{query}"])
    assert f"{key}=" in err and "out of range" in err


def test_circuit_sizes_beyond_the_graph_are_refused_before_attribution(tmp_path, no_work):
    """k_multiples [1e6] ran the whole attribution, then failed at scoring (exit 2 after the work)."""
    err, _ = _run(tmp_path, models=["planted:induction"], sizes=[16], n_datasets=5, k_multiples=[1_000_000])
    assert "k_multiples" in err and "at most 18.75" in err  # 75 edges, 4 of them true


def test_every_planted_knob_has_a_declared_range() -> None:
    from circuitstat.circuits.groundtruth import PLANTED_RANGES, parse_planted
    from circuitstat.circuits.groundtruth.planted import PlantedSpec

    names = {f.name for f in dataclasses.fields(PlantedSpec)}
    assert set(PLANTED_RANGES) == names
    default = PlantedSpec()
    for key, (low, high) in PLANTED_RANGES.items():  # the defaults lie inside their ranges
        assert low <= getattr(default, key) <= high and math.isfinite(high)
    assert parse_planted("planted:induction?background=0&signal=1000") == PlantedSpec(background=0.0, signal=1000.0)


def test_two_sources_that_would_share_table_names_are_refused(tmp_path, no_work):
    """background=1.5 and background=1_5 (Python reads 15) both slug to ..._background_1_5: one would
    overwrite the other's scores (the old code let background=-1 write background=1's tables)."""
    err, _ = _run(tmp_path, models=["planted:induction?background=1.5", "planted:induction?background=1_5"])
    assert "same tables" in err
    err, _ = _run(tmp_path, models=["planted:induction", "planted:induction"])
    assert "same tables" in err


def test_a_small_study_is_priced_below_the_limit_and_the_price_grows_with_each_size() -> None:
    from circuitstat.circuits.groundtruth import load_groundtruth
    from circuitstat.circuits.limits import MAX_WORK
    from circuitstat.pipelines.runs.groundtruth.study import parse_groundtruth_spec
    from circuitstat.pipelines.work import groundtruth_operations

    doc = {"models": ["planted:induction"], "methods": ["eap"], "sizes": [16, 32], "n_datasets": 5,
           "n_resamples": 100, "faithfulness_methods": []}
    loaded = {"planted:induction": load_groundtruth("planted:induction")}
    base = groundtruth_operations(parse_groundtruth_spec(doc), loaded)
    assert 0 < base < MAX_WORK
    for key, value in (("n_datasets", 10), ("n_resamples", 1000), ("sizes", [16, 64]), ("methods", ["eap", "exact"]),
                       ("n_subsamples", 1000)):
        assert groundtruth_operations(parse_groundtruth_spec({**doc, key: value}), loaded) > base, key
    faith = groundtruth_operations(parse_groundtruth_spec({**doc, "faithfulness_methods": ["eap"]}), loaded)
    assert faith > base


TINY = "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64&n_positions=64&seed=1"


def test_calibration_and_tokens_say_what_they_cost_before_starting(tmp_path, monkeypatch):
    """task.n 1,000,000 with 100,000 datasets, and tokens --n 1,000,000, ran for minutes in silence."""
    import circuitstat.pipelines.runs.calibration.population
    import circuitstat.pipelines.runs.tokens.run
    from circuitstat.core.errors import InputError

    def stop(*a, **k):
        raise InputError("stopped here by the test")

    monkeypatch.setattr(circuitstat.pipelines.runs.calibration.population, "_build_task", stop)
    monkeypatch.setattr(circuitstat.pipelines.runs.tokens.run.TokenContributions, "run", stop)
    spec = tmp_path / "cal.yaml"
    spec.write_text(yaml.safe_dump({"model": TINY, "task": {"name": "induction", "n": 1_000_000}, "method": "eap",
                                    "sizes": [32], "n_datasets": 100_000}))
    for argv, what in ((["study", "calibration", str(spec), "--out", str(tmp_path / "a")], "study calibration"),
                       (["tokens", "--model", TINY, "--n", "1000000", "--out", str(tmp_path / "b")], "tokens")):
        res = runner.invoke(app, argv)
        err = res.stderr
        assert res.exit_code == 2 and "stopped here by the test" in err, res.output
        line = next(x for x in err.splitlines() if x.startswith(f"{what}: estimated work"))
        ops = float(line.split("estimated work ")[1].split(" ")[0])
        assert 1e11 < ops < 1e15, line  # a million prompts: priced, and under the limit
        assert err.index(line) < err.index("stopped here")


def test_the_calibration_price_counts_every_dataset() -> None:
    """100,000 datasets of 32 prompts cost minutes of interval calls: the price grows with their number."""
    from circuitstat.pipelines.runs.calibration.study import parse_calibration_spec
    from circuitstat.pipelines.work import PER_CALL, check_calibration
    from circuitstat.circuits.model import ModelConfig

    cfg = ModelConfig(n_layers=1, n_heads=2, d_model=16, d_head=8, d_mlp=64, vocab_size=64, n_ctx=64)
    doc = {"model": TINY, "task": {"name": "induction", "n": 2048}, "method": "eap", "sizes": [32]}
    few, many = (check_calibration(parse_calibration_spec({**doc, "n_datasets": d}), cfg, 20, 40, n_population=2048)
                 for d in (1000, 100_000))
    assert many - few >= 99_000 * PER_CALL
