"""CPR/CMD against MIB's own evaluation, to the last digit, on the float64 2-layer GPT-2 parity model.

tests/fixtures/mib-cpr-parity-gpt2.json holds what MIB's ``evaluate_area_under_curve`` (with EAP-IG at the commit
MIB pins, on a float64 HookedTransformer of the same weights) returned for the same prompts and scores; it was
recorded outside this repository by tests/fixtures/make_mib_cpr.py (no MIB code is in the repository)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from circuitstat.circuits import load_hf
from circuitstat.circuits.convert import from_hf
from circuitstat.circuits.faithfulness import faithfulness_curve
from circuitstat.circuits.tasks import make_task

FIXTURE = json.loads((Path(__file__).parents[1] / "fixtures" / "mib-cpr-parity-gpt2.json").read_text())
WEIGHTS = Path(__file__).parents[1] / "fixtures" / "mib-parity-gpt2-weights.safetensors"


@pytest.fixture(scope="module")
def setup():
    from safetensors.torch import load_file

    # The weights MIB's numbers were recorded with, from a file: a random init is drawn by torch kernels that differ
    # between CPUs (ATen's default level draws other normals than AVX2/AVX-512), so the source alone would not
    # rebuild them everywhere. The shape comes from the source; lm_head is tied to the embedding.
    hf = load_hf(FIXTURE["model"])
    missing, unexpected = hf.load_state_dict(load_file(str(WEIGHTS)), strict=False)
    assert set(missing) <= {"lm_head.weight"} and not unexpected
    assert from_hf(hf).weight_hash() == FIXTURE["weight_hash"], "the parity model's weights changed"
    spec = dict(FIXTURE["task"])
    task = make_task(spec.pop("name"), **spec)
    n_edges = from_hf(hf).graph.n_edges
    scores = np.random.default_rng(3).normal(size=n_edges).astype(np.float32)
    return hf, task, scores


def _curve(hf, task, scores, dtype, ranking):
    m = from_hf(hf, dtype=dtype)
    return faithfulness_curve(m, task, scores, ranking=ranking, prune=True, batch_size=len(task.clean), progress=False)


@pytest.mark.parametrize("ranking", ["absolute", "signed"])
def test_cpr_cmd_equal_mibs_evaluation_in_float64(setup, ranking):
    hf, task, scores = setup
    want = FIXTURE[ranking]
    cur = _curve(hf, task, scores, torch.float64, ranking)
    assert cur.m_circuit.dtype == np.float64  # a float64 model's metrics stay float64
    assert abs(cur.cpr - want["cpr"]) <= 1e-9 and abs(cur.cmd - want["cmd"]) <= 1e-9, (cur.cpr, cur.cmd, want)
    np.testing.assert_allclose(cur.ratio_of_means, want["faithfulness"], rtol=0, atol=1e-9)
    assert len(set(np.round(want["faithfulness"], 6))) >= 3  # the curve moves: the areas test the circuits


@pytest.mark.parametrize("ranking", ["absolute", "signed"])
def test_float32_run_misses_the_1e9_bound(setup, ranking):
    """Negative control: the same curve in float32 is only float32-close to MIB's float64 numbers."""
    hf, task, scores = setup
    want = FIXTURE[ranking]
    cur = _curve(hf, task, scores, torch.float32, ranking)
    assert cur.m_circuit.dtype == np.float32
    gap = max(abs(cur.cpr - want["cpr"]), abs(cur.cmd - want["cmd"]))
    assert 1e-9 < gap < 1e-3, gap  # measured 3.7e-5 to 7.5e-5: float32 rounding, not another circuit
