"""Every size a file or option can set is bounded before any work starts (issue 28 item 11): refused
with the minimum and maximum (or the work estimate and its maximum) named, leaving nothing behind."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from circuitstat.pipelines.cli import app

MODEL = "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64&n_positions=64&seed=1"
runner = CliRunner()


def _refused(args: list[str], *needles: str) -> str:
    res = runner.invoke(app, [str(a) for a in args])
    assert res.exit_code == 2, res.output + res.stderr + repr(res.exception)
    err = res.stderr.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


@pytest.fixture
def no_work(monkeypatch):
    """Any attribution, training or tokenizing fails the test at once (today's code would start it)."""
    import circuitstat.pipelines.runs.audit.run
    import circuitstat.pipelines.training

    def started(*a, **k):
        raise AssertionError("work started before the sizes were checked")

    monkeypatch.setattr(circuitstat.pipelines.runs.audit.run, "attribution_scores", started)
    monkeypatch.setattr(circuitstat.pipelines.training, "prepare_data", started)
    monkeypatch.setattr(circuitstat.pipelines.training, "run_train_jobs", started)


def test_a_huge_calibration_grid_is_refused_before_any_work(tmp_path, no_work):
    spec = tmp_path / "cal.yaml"
    spec.write_text(yaml.safe_dump({"model": MODEL, "task": {"name": "induction", "n": 100_000},
                                    "method": "eap", "sizes": [32, 50_000], "n_datasets": 100_000,
                                    "n_resamples": 100_000, "intervals": ["edge"]}))
    out = tmp_path / "run"
    _refused(["study", "calibration", spec, "--out", out], "calibration study", "above the maximum of",
             "n_datasets", "--allow-large")
    assert not out.exists()


def test_a_head_study_plan_with_huge_steps_or_seeds_is_refused_before_training(tmp_path, monkeypatch, no_work):
    monkeypatch.setenv("CIRCUITSTAT_CACHE", str(tmp_path / "cache"))
    for recipe, seeds, needle in (({"steps": 1_000_000_000}, None, "above the maximum of"),
                                  ({}, list(range(1000)), "above the limit of 1,000")):
        plan = tmp_path / "plan.yaml"
        plan.write_text(yaml.safe_dump({"start": "quick", "recipe": recipe, **({"seeds": seeds} if seeds else {})}))
        _refused(["study", "heads", plan, "--out", tmp_path / "run"], "head-study plan", needle)
        assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()


def test_training_steps_are_bounded_before_anything_is_written(tmp_path, no_work):
    out = tmp_path / "models"
    _refused(["train", "--steps", "1000000000", "--seeds", "0-9", "--out", out], "training", "steps",
             "above the maximum of")
    assert not out.exists()


@pytest.mark.parametrize("option, value, needles", [
    # the resample count's bounds are circuitstat.core.params.N_RESAMPLES's, the same for every entry point
    ("--n-resamples", "1000000000", ("--n-resamples", "100000")),
    ("--n-random", "100000000", ("use 1 to 1,000", "--allow-large")),
])
def test_tokens_counts_name_their_minimum_and_maximum(tmp_path, option, value, needles):
    out = tmp_path / "run"
    _refused(["tokens", "--model", MODEL, "--n", "8", option, value, "--out", out], *needles)
    assert not out.exists()


def test_tokens_k_is_bounded_by_the_shortest_prompt(tmp_path):
    out = tmp_path / "run"
    # induction (seq_len 20): 39-token prompts (BOS + 2 x 20 - 2), every token up to the read-out ablatable
    _refused(["tokens", "--model", MODEL, "--n", "8", "--k", "1,2,1000", "--n-resamples", "40", "--out", out],
             "k (--k) goes up to 1000", "has 39 tokens that may be ablated", "use k from 1 to 38")
    _refused(["tokens", "--model", MODEL, "--n", "8", "--k", "1,38", "--exclude-first", "--out", out],
             "use k from 1 to 37")
    assert not out.exists()


def test_the_estimates_are_of_the_order_of_the_work(tmp_path):
    """The defaults of every study stay well below the limit; the refused sizes far above it."""
    from circuitstat.circuits.limits import MAX_WORK
    from circuitstat.pipelines.runs.heads.study import full_plan, quick_plan
    from circuitstat.pipelines.training import TrainRecipe
    from circuitstat.pipelines.work import head_study_operations, training_operations

    assert head_study_operations(full_plan()) < MAX_WORK / 5 and head_study_operations(quick_plan()) < 1e11
    r = TrainRecipe(n_layers=2, n_heads=4, d_model=64, n_ctx=64, vocab_size=300, batch_size=32, steps=1000)
    # 6 x parameters x tokens is the textbook count; the estimate adds attention scores and all-position logits
    from circuitstat.circuits.own_format import circuit_parameters

    cfg = r.model_config(300)
    params = circuit_parameters(cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_head, cfg.d_mlp, 300, cfg.n_ctx)
    textbook = 6 * params * r.steps * r.batch_size * r.n_ctx
    assert 0.5 * textbook < training_operations(r) < 3 * textbook
