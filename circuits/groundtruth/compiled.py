"""tracr-compiled models from their fixtures (no tracr or jax): model, true circuit, task, tracr's outputs.

A fixture directory (written by circuitstat.circuits.groundtruth.tracr_convert) holds the CircuitModel
(``config.json``, ``model.safetensors``), ``truth.json`` and ``reference.safetensors`` (tracr's own
logits, decoded outputs and final residual stream on fixed random prompts).  The repository keeps them
in ``tests/fixtures/groundtruth``; ``tracr:NAME`` resolves there.

The truth scored against is the *task* circuit (the structural edges that carry the task's
counterfactual; tracr_convert says how it is derived); the *structural* circuit (every edge of the
program's computation) is kept as ``extra["structural"]``.  Every other edge carries no direction its
receiver reads, so its effect is exactly zero on every prompt: it is a null with population mean 0.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from circuitstat.core.errors import InputError

from .programs import PROGRAMS, sample_pairs
from .truth import GroundTruthModel, edge_mask

__all__ = ["FIXTURES", "compiled_names", "fixture_dir", "load_compiled", "load_reference", "compiled_task",
           "truth_document"]

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "groundtruth"


def compiled_names() -> list[str]:
    """The compiled programs (circuitstat.circuits.groundtruth.programs)."""
    return sorted(PROGRAMS)


def fixture_dir(source: str | Path) -> Path:
    """The fixture directory of ``tracr:NAME`` or of a path (InputError when it is not one)."""
    s = str(source)
    path = FIXTURES / s.split(":", 1)[1] if s.startswith("tracr:") else Path(s)
    if not (path / "truth.json").is_file():
        where = f"{FIXTURES}" if s.startswith("tracr:") else str(path)
        raise InputError(f"{source}: no compiled ground-truth fixture at {where} (truth.json missing); "
                         f"use tracr:NAME with NAME in {compiled_names()} from a source checkout, or write the "
                         "fixtures with python -m circuitstat.circuits.groundtruth.tracr_convert")
    return path


def truth_document(source: str | Path) -> dict:
    """The fixture's truth.json: vocabularies, residual labels, edge sets and the conversion's checks."""
    return _read_truth(fixture_dir(source))


def _read_truth(path: Path) -> dict:
    try:
        truth = json.loads((path / "truth.json").read_text())
    except ValueError:
        raise InputError(f"{path / 'truth.json'} is not valid JSON; rewrite the fixture") from None
    if not isinstance(truth, dict) or truth.get("program") not in PROGRAMS:
        raise InputError(f"{path / 'truth.json'} does not describe a known compiled program")
    return truth


def compiled_task(truth: dict, n: int, seed: int, metric: str = "logit_diff"):
    """The program's task (circuitstat.circuits.groundtruth.programs) as token ids of its compiled model."""
    from circuitstat.circuits.tasks import task_from_token_lists

    tok = {t: i for i, t in enumerate(truth["input_tokens"])}
    out = {c: len(tok) + j for j, c in enumerate(truth["output_classes"])}
    bos = tok[truth["bos"]]
    clean, corr, ans, wrong = [], [], [], []
    for c, x, a, w in sample_pairs(truth["program"], n, seed):
        clean.append([bos] + [tok[t] for t in c])
        corr.append([bos] + [tok[t] for t in x])
        ans.append(out[a])
        wrong.append(out[w])
    return task_from_token_lists(f"tracr-{truth['program']}", clean, corr, ans, wrong, pad_id=tok[truth["pad"]],
                                 metric=metric, meta={"program": truth["program"], "seed": int(seed)})


def load_reference(source: str | Path) -> dict[str, np.ndarray]:
    """tracr's recorded outputs: input_ids [R, T], logits [R, T, V_out], decoded [R, T], final_resid."""
    from safetensors.numpy import load_file

    return load_file(str(fixture_dir(source) / "reference.safetensors"))


def load_compiled(source: str | Path, metric: str = "logit_diff") -> GroundTruthModel:
    """The compiled model of ``tracr:NAME`` (or a fixture path) with its truth and task generator."""
    from circuitstat.circuits.loading import load_model

    path = fixture_dir(source)
    truth = _read_truth(path)
    model = load_model(path)
    g = model.graph
    task_mask = edge_mask(g, truth["task"])
    structural = edge_mask(g, truth["structural"])
    if (task_mask & ~structural).any():
        raise InputError(f"{path / 'truth.json'}: a task edge is not structural; rewrite the fixture")
    name = truth["program"]
    return GroundTruthModel(
        name=f"tracr:{name}", kind="compiled", model=model, truth=task_mask, null_edges=~task_mask,
        make_task=lambda n, seed: compiled_task(truth, n, seed, metric), describe=truth["describe"],
        per_example_nulls=np.zeros(g.n_edges, dtype=bool), extra={"structural": structural},
        meta={"program": name, "varying": truth["varying"], "checks": truth["checks"], "fixture": str(path)})
