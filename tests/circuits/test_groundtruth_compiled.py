"""tracr-compiled ground-truth models from their fixtures (no jax): equal to tracr, and their truth labels hold.

The fixtures (tests/fixtures/groundtruth, written by circuitstat.circuits.groundtruth.tracr_convert) record tracr's own
logits, decoded outputs and final residual stream on random prompts; CircuitModel must reproduce them.
The truth labels are tested, not trusted: the true circuit alone is fully faithful and its complement not
at all, exact patching puts every true edge above every other, the structural truth (from tracr's craft
graph) agrees with the sparsity of the compiled weights, and a wrong label breaks the AUROC.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from circuitstat.circuits.attribution import attribute
from circuitstat.circuits.faithfulness import faithfulness
from circuitstat.circuits.groundtruth import load_groundtruth
from circuitstat.circuits.groundtruth.compiled import compiled_names, load_reference, truth_document
from circuitstat.circuits.groundtruth.programs import reference_output
from circuitstat.stats.groundtruth import auroc, pessimistic_auroc

PROGRAMS = compiled_names()


@pytest.fixture(scope="module")
def compiled():
    return {name: load_groundtruth(f"tracr:{name}") for name in PROGRAMS}


@pytest.fixture(scope="module")
def exact_scores(compiled):
    out = {}
    for name, gt in compiled.items():
        task = gt.task(48, 3)
        out[name] = (task, attribute(gt.model, task, "exact", progress=False, batch_size=48).scores.astype(np.float64))
    return out


@pytest.mark.parametrize("name", PROGRAMS)
def test_converted_logits_and_residual_equal_tracrs(compiled, name: str) -> None:
    gt, ref = compiled[name], load_reference(f"tracr:{name}")
    model = gt.model
    ids = torch.as_tensor(ref["input_ids"])
    with torch.no_grad():
        out = model.run(ids)
    n_out = ref["logits"].shape[-1]
    ours = out.logits[..., -n_out:].numpy()
    np.testing.assert_allclose(ours, ref["logits"], atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(out.final_resid[: len(ref["final_resid"])].numpy(), ref["final_resid"], atol=1e-4)
    top2 = np.sort(ours, axis=-1)[..., -2:]
    clear = (top2[..., 1] - top2[..., 0]) > 1e-3  # where tracr's argmax is not a tie
    if name != "frac_prevs":
        assert (ours.argmax(-1) == ref["decoded"])[clear].all()
        assert clear[:, 1:].mean() > 0.25  # the comparison is not vacuous (sort: often no key selected, a tie)
    else:  # numerical output: the value is the decoded number
        np.testing.assert_allclose(ours[..., 0], ref["decoded"], atol=1e-4)
    # the input ids' logits are masked so a softmax over the vocabulary is tracr's softmax over its outputs
    assert (out.logits[..., :-n_out] < -1e3).all()


@pytest.mark.parametrize("name", PROGRAMS)
def test_python_readout_equals_the_compiled_model_on_random_prompts(compiled, name: str) -> None:
    ref, t = load_reference(f"tracr:{name}"), truth_document(f"tracr:{name}")
    inputs, outputs = t["input_tokens"], t["output_classes"]
    checked = 0
    for ids, dec in zip(ref["input_ids"], ref["decoded"]):
        want = reference_output(name, [inputs[i] for i in ids[1:]])
        if want is None:  # sort: no key is selected, tracr's argmax of zeros is arbitrary
            continue
        got = float(dec[-1]) if t["numerical"] else outputs[int(dec[-1])]
        assert (abs(got - want) < 1e-4) if t["numerical"] else got == want, (name, ids, got, want)
        checked += 1
    assert checked >= 8  # sort: only prompts whose last token is the unique maximum (12 of the 64)


@pytest.mark.parametrize("name", PROGRAMS)
def test_task_answers_are_the_models_outputs(compiled, name: str) -> None:
    gt = compiled[name]
    task = gt.task(32, 1)
    with torch.no_grad():
        clean, corr = gt.model(task.clean), gt.model(task.corrupted)
    m_clean, m_corr = task.score(clean), task.score(corr)
    assert (m_clean > m_corr + 0.1).all()  # the corruption moves the metric in every example
    if name not in ("frac_prevs", "sort"):  # categorical with a defined corrupted output
        last = task.last_pos
        ar = torch.arange(task.n)
        assert (clean[ar, last].argmax(-1) == task.answer).all()
        assert (corr[ar, last].argmax(-1) == task.wrong_answer).all()


@pytest.mark.parametrize("name", PROGRAMS)
def test_true_circuit_is_faithful_and_its_complement_is_not(compiled, exact_scores, name: str) -> None:
    gt = compiled[name]
    task, _ = exact_scores[name]
    s = gt.extra["structural"]
    masks = np.stack([gt.truth, ~gt.truth, s, ~s])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        f = faithfulness(gt.model, task, masks, progress=False, batch_size=48)
    np.testing.assert_allclose(f.ratio_of_means, [1, 0, 1, 0], atol=1e-4)
    assert f.n_undefined == 0
    # every true edge is needed: dropping any one of them loses faithfulness
    drop = np.repeat(gt.truth[None], gt.truth.sum(), axis=0)
    drop[np.arange(gt.truth.sum()), np.flatnonzero(gt.truth)] = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        fd = faithfulness(gt.model, task, drop, progress=False, batch_size=48)
    assert (fd.ratio_of_means < 0.99).all(), fd.ratio_of_means


@pytest.mark.parametrize("name", PROGRAMS)
def test_exact_patching_ranks_every_true_edge_first_and_a_wrong_label_fails(compiled, exact_scores, name: str) -> None:
    gt = compiled[name]
    _, S = exact_scores[name]
    mean = np.abs(S.mean(0))
    assert mean[gt.truth].min() > 0.05  # every true edge has an effect far above float32 noise
    assert np.abs(S[:, gt.null_edges]).max() < 1e-5  # every other edge: exactly zero up to float rounding
    assert auroc(mean, gt.truth) == 1.0 and pessimistic_auroc(mean, gt.truth) == 1.0
    wrong = gt.truth.copy()
    wrong[np.flatnonzero(gt.truth)[0]] = False  # a true edge labelled false ...
    wrong[np.flatnonzero(~gt.truth)[0]] = True  # ... and a null labelled true
    assert auroc(mean, wrong) < 1.0 and pessimistic_auroc(mean, wrong) < 1.0


def _support(w: torch.Tensor, axis: int) -> set[int]:
    """Residual dimensions a weight touches: nonzero rows (axis=1 reduced) or columns."""
    return set(np.flatnonzero(w.abs().sum(axis).numpy() > 0).tolist())


@pytest.mark.parametrize("name", PROGRAMS)
def test_structural_truth_agrees_with_the_compiled_weights(compiled, name: str) -> None:
    m = compiled[name].model
    g, H = m.graph, m.cfg.n_heads
    writes = {"input": _support(m.W_E, 0) | _support(m.W_pos, 0)}
    reads = {"logits": _support(m.W_U, 1)}
    for L, blk in enumerate(m.blocks):
        writes[f"m{L}"] = _support(blk.W_out, 0)
        reads[f"m{L}"] = _support(blk.W_in, 1)
        for h in range(H):
            writes[f"a{L}.h{h}"] = _support(blk.W_O[h], 0)
            for kind, W in (("q", blk.W_Q), ("k", blk.W_K), ("v", blk.W_V)):
                reads[f"a{L}.h{h}<{kind}>"] = _support(W[h], 1)
    connected = np.array([bool(writes[n.split("->")[0]] & reads[n.split("->")[1]]) for n in g.edge_names])
    structural, truth = compiled[name].extra["structural"], compiled[name].truth
    assert not (connected & ~structural).any()  # no weight path the craft graph missed
    assert connected[truth].all()  # every task edge is a weight path
