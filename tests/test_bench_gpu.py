"""bench/gpu.py's logic on tiny shapes on the CPU (``--device cpu --dry``), and its one line without CUDA."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "bench" / "gpu.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_gpu"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_dry_run_on_cpu_fills_every_check(tmp_path, capsys):
    bench = _bench()
    assert bench.main(["--device", "cpu", "--dry", "--json", str(tmp_path / "rows.json")]) == 0
    rows = json.loads((tmp_path / "rows.json").read_text())
    checks = {(r["check"], r["shape"]) for r in rows}
    for shape in ("gpt2-small", "gemma-2-2b"):
        assert {("placement", shape), ("deterministic", shape), ("throughput", shape)} <= checks
    assert ("dtype error", "gpt2-small") in checks
    assert all(r["ok"] == "ok" for r in rows if r["check"] in ("placement", "deterministic", "dtype error"))
    timed = {r["method"] for r in rows if r["check"] == "throughput"}
    assert timed == {"eap", "eap-ig-inputs", "eap-ig-activations", "exact"}
    assert "check" in capsys.readouterr().out  # the table was printed


def test_without_cuda_it_says_so_in_one_line(capsys):
    if torch.cuda.is_available():
        return
    assert _bench().main([]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "no CUDA device" in out[0]
