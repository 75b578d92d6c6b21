"""The audit's stages are declared once (circuitstat.pipelines.runs.audit.stages.STAGES): for every stage, the stage list
(audit_stages), the pricing (audit_flops) and what run_audit really writes (the manifest) agree, on real audits of a
tiny model that between them run every stage and leave each optional one out."""

from __future__ import annotations

import json

import pytest

from circuitstat.pipelines.runs.audit.stages import audit_flops
from circuitstat.pipelines.runs.audit.run import audit_stages, is_audit_stage, run_audit
from circuitstat.pipelines.runs.audit.stages import STAGES, Stage
from circuitstat.pipelines.spec import parse_spec

MODEL = "random:gpt2?n_layer=2&n_head=2&n_embd=32&vocab_size=128&n_positions=64&seed=3"
MODEL2 = MODEL.replace("seed=3", "seed=4")
BASE = {"task": {"name": "induction", "n": 12, "options": {"seq_len": 5}}, "batch_size": 4,
        "bootstrap": {"n_resamples": 40}, "k": [3, 6], "seed": 5, "faithfulness": False}
CIRCUIT = ["input->a0.h1<v>", "a0.h1->a1.h0<k>", "a1.h0->logits", "m1->logits"]


def _specs(tmp) -> dict:
    circuit = tmp / "circuit.txt"
    circuit.write_text("\n".join(CIRCUIT) + "\n")
    one = {**BASE, "model": MODEL}
    return {
        "full": {**one, "methods": ["exact", "eap"], "faithfulness": True,
                 "tests": {"k": 3, "n_random": 30, "n_permutations": 19}},
        "verified": {**one, "methods": ["eap"], "verify": {"n": 6, "seed": 11}},
        "masks": {**one, "methods": ["edge-pruning"], "edge_pruning": {"steps": 2, "n_refits": 2}},
        "published": {**one, "methods": ["eap"], "circuit": {"file": str(circuit), "format": "edges"}},
        "heads": {**BASE, "models": [MODEL, MODEL2], "methods": ["eap"], "heads": {"n_probe": 8, "n_resamples": 10}},
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{name: (spec, the manifest its audit wrote)} for five audits that between them run every stage."""
    tmp = tmp_path_factory.mktemp("stages")
    out = {}
    for name, doc in _specs(tmp).items():
        spec = parse_spec(doc)
        run_audit(spec, tmp / name)
        out[name] = (spec, json.loads((tmp / name / "manifest.json").read_text()))
    return out


def disagreements(stages: tuple[Stage, ...], spec, manifest: dict) -> list[str]:
    """What the declared stages say of ``spec`` that the run's manifest contradicts: the stages it lists, their
    order, and each stage's tables."""
    listed = [n for st in stages for n in st.stage_names(spec)]
    ran = list(manifest["stages"])
    problems = [] if listed == ran else [f"listed {listed}, ran {ran}"]
    for st in stages:
        for name in st.stage_names(spec):
            if name not in manifest["stages"]:
                continue
            recorded = set(manifest["stages"][name]["outputs"])
            declared = set(st.outputs(spec)) if st.names is None else {name}
            if recorded != declared:
                problems.append(f"{name}: declared {sorted(declared)}, wrote {sorted(recorded)}")
    return problems


def _cfg():
    from circuitstat.pipelines.sources import LOCAL

    return LOCAL.skeleton(MODEL).cfg


@pytest.mark.slow  # five tiny audits, ~40 s unloaded
@pytest.mark.parametrize("stage", STAGES, ids=[st.name for st in STAGES])
def test_the_stage_list_its_price_and_the_run_agree(runs, stage):
    cfg = _cfg()
    ran_in = [name for name, (spec, _) in runs.items() if stage.when(spec)]
    assert ran_in, f"no audit here runs stage {stage.name}: the agreement is untested"
    left_out = [name for name, (spec, _) in runs.items() if not stage.when(spec)]
    assert left_out or stage.name in {"index", "stability"}, stage.name  # every optional stage is left out somewhere
    for name, (spec, manifest) in runs.items():
        names = stage.stage_names(spec)
        assert all(n in manifest["stages"] for n in names), (name, names)  # listed => written
        assert all(n in audit_stages(spec) for n in names)
        assert all(is_audit_stage(n) for n in names)
        if not stage.when(spec):  # not listed => not written
            assert not any(n == stage.name or (stage.names and n.startswith("scores_")) for n in manifest["stages"]), name
        assert disagreements(STAGES, spec, manifest) == [], name
        # the price is the sum over the listed stages: this stage's share counts exactly when it runs
        priced = sum(st.flops(spec, cfg) for st in STAGES if st.stage_names(spec))
        assert audit_flops(spec, cfg) == pytest.approx(priced, rel=1e-12)
        if stage.when(spec) and stage.name in {"scores", "masks", "faithfulness", "circuit_tests", "heads"}:
            assert stage.flops(spec, cfg) > 0, (stage.name, name)  # the stages that do model work are priced


@pytest.mark.slow
def test_a_stage_declared_wrongly_is_caught(runs):
    """Negative control: a tuple whose heads stage claims to run with one model, or whose stability stage names a
    table it does not write, disagrees with the runs."""
    from dataclasses import replace

    spec, manifest = runs["full"]
    wrong_when = tuple(replace(st, when=lambda s: True) if st.name == "heads" else st for st in STAGES)
    assert any("listed" in p for p in disagreements(wrong_when, spec, manifest))
    wrong_out = tuple(replace(st, outputs=lambda s: ["stability_vs_k"]) if st.name == "stability" else st
                      for st in STAGES)
    assert any(p.startswith("stability:") for p in disagreements(wrong_out, spec, manifest))
    assert disagreements(STAGES, spec, manifest) == []


def test_each_stage_name_is_declared_once_and_recognised():
    names = [st.name for st in STAGES]
    assert len(names) == len(set(names))
    assert all(is_audit_stage(n) for n in names if n != "scores")
    assert is_audit_stage("scores_eap-ig-inputs") and not is_audit_stage("variance") and not is_audit_stage("scores")


def test_a_stage_left_out_is_not_priced():
    """Without faithfulness, tests or heads, those stages' prices are absent from audit_flops; with them, present."""
    from circuitstat.pipelines.runs.audit.pricing import faithfulness_flops, heads_flops, tests_flops

    cfg = _cfg()
    base = parse_spec({**BASE, "model": MODEL, "methods": ["eap"]})
    more = parse_spec({**BASE, "models": [MODEL, MODEL2], "methods": ["eap"], "faithfulness": True,
                       "tests": {"k": 3, "n_random": 30, "n_permutations": 19}})
    extra = faithfulness_flops(more, cfg) + tests_flops(more, cfg) + heads_flops(more, cfg)
    assert extra > 0
    assert audit_flops(more, cfg) == pytest.approx(audit_flops(base, cfg) + extra, rel=1e-12)
    assert set(audit_stages(more)) - set(audit_stages(base)) == {"faithfulness", "circuit_tests", "heads"}
