"""``sample-size`` on a pilot audit that resampled templates (issue 43 item 3): the pilot's groups are read from its
task, every simulated dataset is resampled by those templates, and a task that changed since the pilot is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from circuitstat.pipelines.cli import app

MODEL = "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=50257&n_positions=64&seed=1"
TEMPLATES = {"store": "When {a} and {b} went to the store, {b} gave a drink to",
             "park": "After {a} and {b} met at the park, {b} handed a book to",
             "office": "Then {a} and {b} sat in the office, and {b} passed a note to",
             "school": "While {a} and {b} walked to the school, {b} threw a ball to",
             "lake": "As {a} and {b} swam in the lake, {b} tossed a stone to"}
NAMES = [("Mary", "John", "Alice"), ("Tom", "Anna", "David"), ("Sarah", "James", "Mark"), ("Paul", "Lisa", "Emma"),
         ("Kate", "Mike", "Jack"), ("Bob", "Jane", "Sam"), ("Ann", "Tim", "Joe"), ("Mary", "Paul", "Alice")]


def _rows(group: bool = True) -> list[dict]:
    """40 IOI-style pairs from 5 templates (8 each); the corrupted prompt swaps the repeated name."""
    out = []
    for g, t in TEMPLATES.items():
        for a, b, c in NAMES:
            head, tail = t.format(a=a, b=b).rsplit(f" {b} ", 1)
            row = {"clean": t.format(a=a, b=b), "corrupted": f"{head} {c} {tail}", "answer": " " + a,
                   "wrong_answer": " " + b}
            out.append({**row, "group": g} if group else row)
    return out


@pytest.fixture(scope="module")
def pilot(tmp_path_factory):
    """An EAP audit of 40 prompts in 5 templates with a cluster bootstrap: the pilot of the issue's report."""
    d = tmp_path_factory.mktemp("pilot")
    (d / "ioi40.jsonl").write_text("\n".join(json.dumps(r) for r in _rows()))
    (d / "spec.yaml").write_text(
        f"models: ['{MODEL}']\ntask: {{name: ioi40.jsonl, n: 40}}\nmethods: [eap]\nk: [3, 6]\nfaithfulness: false\n"
        "bootstrap: {n_resamples: 100, scheme: clusters}\nranking: absolute\nseed: 0\nn_jobs: 1\n")
    r = CliRunner().invoke(app, ["audit", str(d / "spec.yaml"), "--out", str(d / "run")])
    assert r.exit_code == 0, r.output
    return d


def test_a_cluster_pilot_is_simulated_with_its_own_templates(pilot, monkeypatch):
    """Before: 'bootstrap scheme clusters needs a task with groups' although the task has 5 templates."""
    from circuitstat.stats import ResamplingPlan

    seen = []
    cluster = ResamplingPlan.cluster.__func__

    def spy(cls, groups, *a, **kw):
        seen.append(np.asarray(groups))
        return cluster(cls, groups, *a, **kw)

    monkeypatch.setattr(ResamplingPlan, "cluster", classmethod(spy))
    r = CliRunner().invoke(app, ["sample-size", str(pilot / "run"), "--n", "40", "--k", "3", "--datasets", "2",
                                 "--resamples", "50"])
    assert r.exit_code == 0, r.output
    assert "needs a task with groups" not in r.output
    assert len(seen) == 2  # one cluster plan per simulated dataset
    truth = np.repeat(np.arange(5), 8)  # the file's rows, in order: 8 per template
    for g in seen:
        assert g.shape == (40,) and set(np.unique(g)) <= set(range(5)) and np.unique(g).size >= 4
    # each simulated prompt keeps its pilot row's template: the pilot's groups are the file's, row for row
    from circuitstat.pipelines.sample_size import pilot_groups, read_pilot

    sm, spec = read_pilot(pilot / "run")
    groups = pilot_groups(sm, spec, pilot / "run")
    assert all(np.array_equal(groups == groups[8 * j], truth == j) for j in range(5))


def test_a_task_file_changed_since_the_pilot_is_refused(pilot):
    """Negative control: the pilot's file without its group column no longer builds the pilot's prompts."""
    path = pilot / "ioi40.jsonl"
    kept = path.read_text()
    try:
        path.write_text("\n".join(json.dumps(r) for r in _rows(group=False)))
        r = CliRunner().invoke(app, ["sample-size", str(pilot / "run"), "--n", "40", "--k", "3", "--datasets", "2"])
    finally:
        path.write_text(kept)
    assert r.exit_code == 2, r.output
    assert "no longer builds the prompts" in r.output or "no group column" in r.output
