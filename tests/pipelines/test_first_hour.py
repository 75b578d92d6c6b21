"""The traps a new user meets in the first hour (issue 23 item 4): each test fails on the code before the fix."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

TINY = "random:gpt2?n_layer=2&n_head=2&n_embd=32&vocab_size=128&n_positions=64&seed=1"


def invoke(*args: str):
    from circuitstat.pipelines.cli import app

    return CliRunner().invoke(app, list(args))


@pytest.fixture(scope="module")
def tiny_graph():
    from circuitstat.circuits import load_model

    return load_model(TINY).graph


def _scores(graph, path_edges: dict[str, float], positive: float, n: int = 8, seed: int = 0) -> np.ndarray:
    """[n, E] scores: the ``path_edges`` (an input -> logits path) with their negative means, small positive
    means on every edge into a layer-1 head (no path to the logits), noise elsewhere."""
    rng = np.random.default_rng(seed)
    S = rng.normal(0, 1e-3, (n, graph.n_edges)).astype(np.float32)
    for i, name in enumerate(graph.edge_names):
        if name.split("->")[1].startswith("a1."):
            S[:, i] += positive
        if name in path_edges:
            S[:, i] += path_edges[name]
    return S


PATH = {"input->a0.h0<v>": -2.0, "a0.h0->a1.h0<k>": -1.5, "a1.h0->logits": -1.8}


def _write_run(path, graph, tables: dict[str, np.ndarray], spec: dict):
    from circuitstat.circuits.scores import ScoreMatrix
    from circuitstat.core.rundir import RunDir

    with RunDir(path, spec=spec, seed=0) as run:
        for name, S in tables.items():
            sm = ScoreMatrix(S, graph, "edge", name.rsplit("_", 1)[-1], "counterfactual", "logit_diff")
            for table_name, table in sm.tables(name=name).items():
                run.write_table(table_name, table)
    return path


def test_circuit_on_an_audit_run_takes_exact_and_says_method_and_ranking(tmp_path, tiny_graph):
    """Today: the audit's EAP scores are taken silently (sorted names: eap < exact) and lose a0.h0."""
    exact = _scores(tiny_graph, PATH, positive=0.05)
    eap = _scores(tiny_graph, {"input->a1.h0<v>": -2.0, "a1.h0->logits": -1.8}, positive=0.05, seed=1)
    run = _write_run(tmp_path / "audit", tiny_graph, {"scores_exact": exact, "scores_eap": eap},
                     {"methods": ["exact", "eap"], "ranking": "absolute"})
    r = invoke("circuit", str(run), "--k", "3")
    assert r.exit_code == 0, r.output
    head = r.output.splitlines()[0]
    assert "from exact scores" in head and "--method eap" in head and "|score|" in head and "audit's ranking" in head
    assert "a0.h0" in r.output and "edges      : 3 of 46" in r.output
    r = invoke("circuit", str(run), "--k", "3", "--method", "eap")
    assert r.exit_code == 0 and "from eap scores (as asked)" in r.output and "a0.h0" not in r.output
    r = invoke("circuit", str(run), "--k", "3", "--method", "eap-ig-inputs")
    assert r.exit_code == 2 and "it has exact, eap" in r.output


def test_an_empty_circuit_says_why_and_what_to_pass(tmp_path, tiny_graph):
    """Today: `circuit RUN --k 10` ranks by signed score by default and prints '0 of 46 edges' with no hint."""
    S = _scores(tiny_graph, PATH, positive=0.05)
    run = _write_run(tmp_path / "attr", tiny_graph, {"scores": S}, {"method": "exact"})
    r = invoke("circuit", str(run), "--k", "10", "--ranking", "signed")
    assert r.exit_code == 0, r.output
    assert "edges      : 0 of 46" in r.output
    note = [line for line in r.output.splitlines() if line.startswith("note: ")]
    assert note and "no path from input to logits" in note[0] and "pass --ranking absolute" in note[0]
    assert "--no-prune" in note[0] and "largest effects are negative" in note[0]
    # without a ranking on the command line an attribute run is ranked by |score|, and says so
    r = invoke("circuit", str(run), "--k", "3")
    assert r.exit_code == 0 and "ranked by |score| (the default" in r.output and "--ranking signed for" in r.output
    assert "edges      : 3 of 46" in r.output and "note:" not in r.output
    r = invoke("circuit", str(run), "--k", "3", "--method", "eap")
    assert r.exit_code == 2 and "holds exact scores only" in r.output


# --- faithfulness folds with grouped (IOI-style template) task files --------------------------------------
GPT2_VOCAB = "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=50257&n_positions=64&seed=0"
TEMPLATES = ["When{a} and{b} went to the store,{b} gave a drink to",
             "Then{a} and{b} had a long argument, and afterwards{b} said to",
             "After{a} and{b} went to the park,{b} gave a ball to"]
NAMES = [" Mary", " John", " Tom", " James", " Anna", " Paul", " Kate", " Mark"]


def write_grouped_task(path, per_template: int = 8):
    """An IOI-style task file: ``per_template`` rows of each of 3 templates, the template as the group."""
    import json

    rows = []
    for g, t in enumerate(TEMPLATES):
        for i in range(per_template):
            a, b = NAMES[i % 8], NAMES[(i + 1) % 8]
            c, d = NAMES[(i + 2) % 8], NAMES[(i + 3) % 8]
            rows.append({"clean": t.format(a=a, b=b), "corrupted": t.format(a=c, b=d), "answer": a,
                         "wrong_answer": b, "group": f"template-{g}"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _grouped_spec(tmp_path, **extra) -> dict:
    return {"model": GPT2_VOCAB, "task": {"name": str(write_grouped_task(tmp_path / "ioi.jsonl")), "n": 24},
            "methods": ["eap"], "batch_size": 8, "bootstrap": {"n_resamples": 40}, "k": [2, 4], **extra}


def test_a_task_with_three_groups_audits_with_three_folds(tmp_path):
    """Today: the default audit of a 3-template task fails in its faithfulness stage ('groups cannot fill 5
    folds ... use fewer folds') and no spec key sets the folds."""
    import pyarrow.parquet as pq

    from circuitstat.pipelines.runs.audit.run import run_audit
    from circuitstat.pipelines.spec import parse_spec

    out = run_audit(parse_spec(_grouped_spec(tmp_path)), tmp_path / "run")
    notes = pq.read_table(out / "faithfulness_vs_k.parquet").column("f_selected_note").to_pylist()
    assert notes == ["3-fold cross-fitting of whole groups, 2 repeats"] * 2


def test_faithfulness_folds_is_a_spec_key_and_its_error_names_it(tmp_path):
    from circuitstat.core.errors import InputError
    from circuitstat.pipelines.runs.audit.run import prepare_audit
    from circuitstat.pipelines.spec import parse_spec

    assert parse_spec(_grouped_spec(tmp_path, faithfulness_folds=2)).faithfulness_folds == 2
    with pytest.raises(InputError, match=r"faithfulness_folds: 24 examples in 3 groups .* cannot fill 4 folds.*"
                                         r"set faithfulness_folds to 3 or fewer"):
        prepare_audit(parse_spec(_grouped_spec(tmp_path, faithfulness_folds=4)))


def test_fold_counts_follow_the_groups():
    from circuitstat.stats.folds import fillable_folds, fold_loads, fold_split

    groups = np.repeat([0, 1, 2, 3, 4], [10, 6, 3, 3, 2])  # dealt largest first, each to the smallest fold
    assert sorted(fold_loads(24, 4, groups)) == [3, 5, 6, 10] and sorted(fold_loads(24, 3, groups)) == [6, 8, 10]
    assert fillable_folds(24, groups) == 3 and fillable_folds(24, groups, limit=2) == 2
    assert fillable_folds(24, None) == 5 and fillable_folds(7, None) == 1 and fillable_folds(3, None) == 0
    split = fold_split(np.random.default_rng(0), 24, 3, groups)
    assert sorted(map(len, split)) == [6, 8, 10]
    assert all(len(set(groups[f])) == len(set(groups[f]) - set(groups[np.setdiff1d(np.arange(24), f)]))
               for f in split)  # every group whole in one fold


# --- head names: a1.h5 everywhere -------------------------------------------------------------------------
def test_claims_accept_both_head_spellings_and_print_a1_h5(tmp_path):
    """Today: a claim written head: "1.5" is labelled and explained as "1.5" / "head 1.5"."""
    from builders import make_run
    from circuitstat.pipelines.claims import evaluate_claims, format_results, parse_claims

    run = make_run(tmp_path / "run")
    claims = parse_claims({"claims": [
        {"kind": "head_stability", "head": "1.5", "statistic": "stability", "min": 0.99},
        {"kind": "head_stability", "head": "a1.h5", "statistic": "stability", "min": 0.99},
        {"kind": "head_stability", "layer": 1, "head": 5, "statistic": "stability", "min": 0.99}]})
    results = evaluate_claims(claims, run)
    assert [r.status for r in results] == ["fail"] * 3
    assert len({(r.claim.label(0), r.reason) for r in results}) == 1  # one claim, however it was written
    text = format_results(results)
    assert "a1.h5 stability" in text and "stability of head a1.h5 is 0.95" in text
    assert " 1.5" not in text and "head 1.5" not in text


# --- one zoo model on its own -----------------------------------------------------------------------------
def test_zoo_build_trains_just_the_named_model(tmp_path, monkeypatch):
    """Today: `zoo:attn-only-2l/seed-1` says to build the whole zoo, and no command trains one model."""
    from circuitstat.pipelines import zoo
    from circuitstat.pipelines.sources import LOCAL
    from circuitstat.pipelines.training import TrainRecipe

    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(100):
        (docs / f"{i}.txt").write_text(f"value_{i} = compute(value_{i}, {i})\n" * 8)
    tiny = TrainRecipe(n_layers=1, n_heads=2, d_model=16, n_ctx=16, vocab_size=280, batch_size=2, steps=3,
                       eval_every=3, eval_batches=1, checkpoint_every=3, warmup_steps=1, corpus=str(docs),
                       attn_only=True)
    monkeypatch.setitem(zoo.ZOO_RECIPES, "attn-only-2l", tiny)
    monkeypatch.setenv("CIRCUITSTAT_CACHE", str(tmp_path / "cache"))
    from circuitstat.core.errors import InputError

    with pytest.raises(InputError, match=r"circuitstat zoo build attn-only-2l --seed 1"):
        LOCAL.resolve("zoo:attn-only-2l/seed-1").location
    r = invoke("zoo", "build", "attn-only-2l", "--seed", "1")
    assert r.exit_code == 0, r.output
    root = zoo.recipe_dir("attn-only-2l")
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("seed-")) == ["seed-1"]
    assert LOCAL.resolve("zoo:attn-only-2l/seed-1").location == str(root / "seed-1") and "zoo:attn-only-2l/seed-1" in r.output
    out = invoke("zoo", "list").output.splitlines()
    listed = [ln for ln in out if ln.startswith("zoo:")]  # after the line naming the cache key's environment
    assert out[0].startswith("environment of the cache key: training_path")
    assert "zoo:attn-only-2l/seed-1  trained  weights sha256:" in listed[1] and "not trained" in listed[0]
    r = invoke("zoo", "build", "nope", "--seed", "1")
    assert r.exit_code == 2 and "recipes: attn-only-2l, mlp-2l" in r.output


# --- the task-file format and --task-option -------------------------------------------------------------
ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def test_the_documented_five_row_task_file_builds(tmp_path):
    """docs/usage.md's example is a valid task file (clean, corrupted, answer, wrong_answer, group)."""
    import re

    from circuitstat.circuits import load_model
    from circuitstat.pipelines.build import build_task

    text = (ROOT / "docs" / "usage.md").read_text()
    (block,) = re.findall(r"```jsonl\n(.*?)```", text, flags=re.S)
    assert len(block.strip().splitlines()) == 5
    path = tmp_path / "ioi.jsonl"
    path.write_text(block)
    task = build_task(load_model(GPT2_VOCAB), str(path), n=5)
    assert task.clean.shape[0] == 5 and len(set(task.group.tolist())) == 2


def test_help_of_attribute_and_audit_states_the_task_file_format():
    for command in ("attribute", "audit"):
        text = " ".join(invoke(command, "--help").output.split())
        assert "clean, corrupted" in text and "wrong_answer" in text and "group" in text, command
    assert "--task-option" in invoke("attribute", "--help").output and "--task-option" in invoke("tokens", "--help").output


def test_task_options_on_the_command_line_are_typed_and_checked():
    """Today: `--task-option` does not exist (task options such as seq_len have no flag)."""
    from circuitstat.pipelines.build import parse_task_options

    r = invoke("attribute", "--model", TINY, "--n", "4", "--task-option", "seq_len=4", "--plan")
    assert r.exit_code == 0, r.output
    assert "4 examples x 7 positions" in r.output  # BOS + 2 x 4 - 1 tokens, not the default seq_len 20
    for bad, words in (("seq_len=four", "seq_len"), ("bogus=1", "its options are bos_id, corrupt"),
                       ("n=3", "set it with --n"), ("seq_len", "is not KEY=VALUE")):
        r = invoke("attribute", "--model", TINY, "--n", "4", "--task-option", bad, "--plan")
        assert r.exit_code == 2 and words in r.output, (bad, r.output)
    assert parse_task_options("greater-than", ["corrupt_yy=01", "prepend_bos=false"]) == {
        "corrupt_yy": "01", "prepend_bos": False}  # a string where the builder declares one, YAML elsewhere
    assert parse_task_options("ioi", ["names=[' Mary', ' John', ' Tom']"]) == {"names": [" Mary", " John", " Tom"]}
    from circuitstat.core.errors import InputError
    from circuitstat.circuits.tasks import make_task

    with pytest.raises(InputError, match=r"option prepend_bos='no' is not bool"):
        make_task("induction", n=4, vocab_size=50, prepend_bos="no")  # the same check for spec options
    import numpy as np

    for ids in (range(1, 32), np.arange(1, 32), list(range(1, 32))):  # any sequence of ints is a Sequence[int]
        assert make_task("induction", n=4, vocab_size=50, token_ids=ids, seq_len=5).n == 4
    with pytest.raises(InputError, match="token_ids"):
        make_task("induction", n=4, vocab_size=50, token_ids="abc")  # a string is no sequence of token ids


# --- --plan in seconds, and the cost of long commands in their --help -----------------------------------
def test_plan_calibration_work_does_not_grow_with_depth_on_a_large_model(monkeypatch):
    """Today: --plan times every pass 4 times and a suffix run from every layer, on the full batch: about
    4 min on the GPT-2-small shape. Here every pass counts as long (LONG_PASS_S = 0), as on GPT-2 small."""
    import circuitstat.pipelines.plan as plan
    from circuitstat.circuits import load_model
    from circuitstat.circuits.model import CircuitModel
    from circuitstat.pipelines.build import build_task

    monkeypatch.setattr(plan, "LONG_PASS_S", 0.0, raising=False)
    calls = []
    real = CircuitModel.run

    def counted(self, ids, *a, **kw):
        calls.append(int(ids.shape[0]))
        return real(self, ids, *a, **kw)

    monkeypatch.setattr(CircuitModel, "run", counted)
    counts = {}
    for layers in (2, 6):
        model = load_model(f"random:gpt2?n_layer={layers}&n_head=2&n_embd=32&vocab_size=128&n_positions=64&seed=1")
        task = build_task(model, "induction", n=8, seq_len=4)
        calls.clear()
        cal = plan.calibrate(model, task, 8, probe_s=0.0)
        counts[layers] = len(calls)
        assert len(cal.suffix_s) == layers and all(call >= 0 and row >= 0 for call, row in cal.suffix_s)
        assert cal.batch_size == 8 and sorted(calls)[-3:] == [8, 8, 8]  # timed on 2, rescaled by one forward of 8
        assert sum(rows > 2 for rows in calls) == 3  # that forward and 2 suffix runs of 8 rows, each long pass timed once
    assert counts[6] == counts[2] <= 13, counts  # two start layers timed, the others interpolated (26 before issue 38)


def test_long_commands_state_their_cost_in_help():
    long = [("demo",), ("audit",), ("train",), ("heads",), ("zoo", "build"), ("study", "heads"),
            ("study", "variance"), ("study", "calibration")]
    for command in long:
        text = " ".join(invoke(*command, "--help").output.split())
        assert "Cost:" in text and ("min" in text or " s " in text or " s)" in text), command
