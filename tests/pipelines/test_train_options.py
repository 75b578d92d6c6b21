"""`circuitstat train` takes what the zoo's recipe sets (--init-std, --repeat-fraction, --warmup, --min-lr-ratio,
--d-mlp, --activation), and each option reaches the trained model."""

import numpy as np
import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

from circuitstat.circuits import load_model
from circuitstat.core.errors import InputError
from circuitstat.pipelines.training import LOG_TABLE, TrainRecipe


def _app():
    from circuitstat.pipelines.cli.studies import train_command

    app = typer.Typer()
    app.command()(train_command)
    return app


def _docs(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(200):
        (docs / f"{i}.txt").write_text(f"line {i} of the text; the value is {i * 7}\n" * 20)
    return docs


BASE = ["--layers", "1", "--heads", "2", "--d-model", "32", "--seeds", "0", "--n-ctx", "16", "--vocab-size", "280",
        "--batch-size", "2"]


def test_train_options_reach_the_model(tmp_path, monkeypatch):
    monkeypatch.setenv("CIRCUITSTAT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "m"
    # lr so small that three steps leave the weights at their initialisation (to ~1e-8)
    res = CliRunner().invoke(_app(), BASE + [
        "--corpus", str(_docs(tmp_path)), "--out", str(out), "--steps", "3", "--eval-every", "1", "--lr", "1e-9",
        "--d-mlp", "48", "--activation", "relu", "--init-std", "0.3", "--warmup", "7", "--min-lr-ratio", "1.0",
        "--repeat-fraction", "0.5"])
    assert res.exit_code == 0, res.output
    m = load_model(out / "seed-0")
    assert m.cfg.d_mlp == 48 and m.cfg.act == "relu"
    recipe = m.meta["training"]["recipe"]
    assert (recipe["warmup_steps"], recipe["min_lr_ratio"], recipe["repeat_fraction"], recipe["init_std"]) == \
        (7, 1.0, 0.5, 0.3)
    # init std: the MLP's input matrix (32 x 48 entries) has SD 0.3, not GPT-2's 0.02
    w_in = [p.detach().numpy() for n, p in m.named_parameters() if n.endswith("W_in")][0]
    assert w_in.size == 32 * 48 and abs(w_in.std() / 0.3 - 1) < 0.08
    # warmup: the learning rate of steps 1..3 is lr * step / 7
    log = pq.read_table(out / "seed-0" / LOG_TABLE).to_pydict()
    np.testing.assert_allclose(log["lr"], [1e-9 * s / 7 for s in (1, 2, 3)], rtol=1e-9)


@pytest.mark.parametrize("bad", [["--repeat-fraction", "1.5"], ["--init-std", "0"], ["--warmup", "-1"],
                                 ["--d-mlp", "0"], ["--activation", "tanh"], ["--min-lr-ratio", "2"],
                                 ["--attn-only", "--d-mlp", "16"]])
def test_train_options_are_bounded(tmp_path, bad):
    res = CliRunner().invoke(_app(), BASE + ["--out", str(tmp_path / "m"), "--steps", "1"] + bad)
    # typer's bounds exit 2 here; the clash of --attn-only with an MLP option is an InputError (exit 2 in main)
    assert res.exit_code == 2 or isinstance(res.exception, InputError), res.output
    assert "No such option" not in res.output  # refused for its value, not as an unknown option
    assert not (tmp_path / "m").exists()


def test_recipe_shares_the_bounds_of_params():
    from circuitstat.circuits.engine.config import ACTIVATIONS
    from circuitstat.pipelines.cli.studies import Activation

    assert {a.value for a in Activation} <= set(ACTIVATIONS)
    for key, value in (("warmup_steps", -1), ("repeat_fraction", 1.01), ("init_std", -0.1), ("d_mlp", 0),
                       ("min_lr_ratio", -0.5)):
        with pytest.raises(InputError, match=key):
            TrainRecipe(**{key: value})


def test_the_zoo_recipe_as_a_command_in_the_docs_is_the_zoos(tmp_path, monkeypatch):
    import shlex
    from pathlib import Path

    import circuitstat.pipelines.training as training
    from circuitstat.pipelines.zoo import ZOO_RECIPES

    usage = (Path(__file__).resolve().parents[2] / "docs" / "usage.md").read_text()
    (line,) = [ln for ln in usage.splitlines() if ln.startswith("circuitstat train --layers 2 ")]
    argv = shlex.split(line)[2:]
    argv[argv.index("--out") + 1] = str(tmp_path / "m")
    seen = []
    monkeypatch.setattr(training, "train_models", lambda recipe, *a, **k: seen.append(recipe) or [])
    res = CliRunner().invoke(_app(), argv)
    assert res.exit_code == 0, res.output
    assert seen == [ZOO_RECIPES["mlp-2l"]]  # every field, so the same recipe hash and zoo key
