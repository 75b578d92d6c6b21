"""Each parameter's bounds are declared once (circuitstat.core.params) and every entry point refuses the same values.

Before the declaration, n_resamples's lower bound was 2 (``heads --n-resamples``), 10 (audit spec),
40 (``tokens``), 50 (calibration and ground-truth specs) or 1 (HeadStability), and its upper bound
10,000 in an audit's ``heads:`` section but 100,000 elsewhere.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from circuitstat.core.params import N_RESAMPLES, SEED, resamples_for_level
from circuitstat.core.errors import InputError

RANDOM = "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64"
OUT_OF_RANGE = (N_RESAMPLES.minimum - 1, N_RESAMPLES.maximum + 1)


def _audit(b):
    from circuitstat.pipelines.spec import parse_spec

    return parse_spec({"model": RANDOM, "faithfulness": False, "bootstrap": {"n_resamples": b}})


def _audit_heads(b):
    from circuitstat.pipelines.spec import parse_spec

    return parse_spec({"models": [RANDOM, RANDOM], "faithfulness": False, "heads": {"n_resamples": b}})


def _calibration(b):
    from circuitstat.pipelines.runs.calibration.study import parse_calibration_spec

    return parse_calibration_spec({"model": RANDOM, "task": {"name": "induction", "n": 512}, "n_resamples": b})


def _groundtruth(b):
    from circuitstat.pipelines.runs.groundtruth.study import parse_groundtruth_spec

    return parse_groundtruth_spec({"models": ["planted:induction"], "n_resamples": b})


def _head_study(b):
    from circuitstat.pipelines.runs.heads.study import HeadStudySpec
    from circuitstat.pipelines.spec import validate_spec

    return validate_spec(HeadStudySpec, {"start": "quick", "n_resamples": b}, "<plan>", kind="head-study plan")


def _service(b):
    from circuitstat.pipelines.service.submission import parse_kind

    return parse_kind("calibration", {"model": RANDOM, "task": {"name": "induction", "n": 512}, "n_resamples": b})


def _head_estimator(b):
    from circuitstat.pipelines.runs.heads.stability import HeadStability

    return HeadStability(n_resamples=b)._validate()


def _tokens_estimator(b):
    from circuitstat.pipelines.runs.tokens.run import TokenContributions

    return TokenContributions(n_resamples=b).check_sizes()


def _cli(command: str):
    def run(b):
        from circuitstat.pipelines.cli import app

        args = {"heads": ["heads", "--models", "a,b", "--out", "/nonexistent/x"],
                "tokens": ["tokens", "--model", "x", "--out", "/nonexistent/x"]}[command]
        r = CliRunner().invoke(app, args + ["--n-resamples", str(b)])
        if r.exit_code == 2 and "n-resamples" in (r.output + str(r.stderr_bytes or b"")).replace("_", "-"):
            raise InputError(r.output)
        return r
    return run


ENTRY_POINTS = {"audit spec": _audit, "audit heads section": _audit_heads, "calibration spec": _calibration,
                "ground-truth spec": _groundtruth, "head-study plan": _head_study, "service job": _service,
                "HeadStability": _head_estimator, "TokenContributions": _tokens_estimator,
                "heads --n-resamples": _cli("heads"), "tokens --n-resamples": _cli("tokens")}


@pytest.mark.parametrize("value", OUT_OF_RANGE)
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_every_entry_point_refuses_the_same_out_of_range_resamples(entry, value) -> None:
    with pytest.raises(InputError):
        ENTRY_POINTS[entry](value)


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_every_entry_point_accepts_the_smallest_count_a_95_percent_interval_needs(entry) -> None:
    """40 resamples put one beyond each quantile of a 95% interval: no entry point may refuse them
    for their number (calibration and ground-truth specs refused anything under 50)."""
    need = resamples_for_level(40, 0.95)
    try:
        ENTRY_POINTS[entry](need)
    except InputError as e:
        assert "resamples" not in str(e).replace("-", "_").replace("n_resamples", "resamples"), str(e)


def test_a_level_needs_one_resample_beyond_each_quantile() -> None:
    """Brute force: the fewest B with floor(B * (1 - level) / 2) >= 1, checked against the declared rule."""
    for level in (0.8, 0.9, 0.95, 0.99):
        fewest = next(b for b in range(1, 10_000) if b * (1 - level) / 2 >= 1 - 1e-9)
        assert resamples_for_level(max(fewest, 10), level) == max(fewest, 10)
        if fewest > N_RESAMPLES.minimum:
            with pytest.raises(InputError, match=f"at least {fewest}"):
                resamples_for_level(fewest - 1, level)


@pytest.mark.parametrize("value", [-1, SEED.maximum + 1])
def test_seeds_outside_the_declared_range_are_refused_by_specs_train_and_zoo(value) -> None:
    from circuitstat.pipelines.cli import app
    from circuitstat.pipelines.spec import parse_spec
    from circuitstat.pipelines.training import parse_seeds

    with pytest.raises(InputError):
        parse_spec({"model": RANDOM, "seed": value})
    with pytest.raises(InputError, match="use 0 to"):
        parse_seeds(str(value))
    with pytest.raises(InputError, match="use 0 to"):
        parse_seeds([0, value])
    for argv in (["zoo", "build", "attn-only-2l", f"--seed={value}"], ["train", f"--seeds={value}", "--out", "/x/y"]):
        r = CliRunner().invoke(app, argv)
        assert r.exit_code == 2 and "Traceback" not in r.output, (argv, r.output)
