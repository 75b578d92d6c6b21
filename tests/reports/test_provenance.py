"""Provenance records and hashes."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from circuitstat.core.provenance import hash_array, hash_bytes, hash_file, hash_json, provenance, to_jsonable
from circuitstat.core.seeds import seed_record

ROOT = Path(__file__).resolve().parents[2]


def test_provenance_has_versions_time_and_caller_fields():
    ss = np.random.SeedSequence(12345)
    p = provenance(model={"name": "gpt2", "weights_sha256": "ab"}, seed=ss, params={"k": np.int64(3), "a": np.float32(0.5)})
    assert p["package"]["name"] == "circuitstat" and p["package"]["version"]
    assert {"numpy", "pyarrow"} <= set(p["libraries"])
    assert p["created_utc"].endswith("Z")
    assert p["seed"]["entropy"] == 12345
    assert p["params"] == {"k": 3, "a": 0.5}
    json.dumps(p, allow_nan=False)  # strictly JSON-safe


def test_caller_fields_override_defaults():
    assert provenance(created_utc="fixed")["created_utc"] == "fixed"


def test_to_jsonable_numpy_paths_nonfinite():
    out = to_jsonable({"a": np.arange(3), 1: Path("/x"), "f": float("nan"), "i": np.float64("-inf"), "b": np.bool_(True)})
    assert out == {"a": [0, 1, 2], "1": "/x", "f": "nan", "i": "-inf", "b": True}
    with pytest.raises(TypeError, match="cannot record"):
        to_jsonable(object())


def test_to_jsonable_fallback_reaches_nested_objects_only():
    class Thing:
        def __repr__(self) -> str:
            return "Thing()"

    out = to_jsonable({"k": [Thing(), 2.5, float("inf")], "t": (Thing(),)}, repr)
    assert out == {"k": ["Thing()", 2.5, "inf"], "t": ["Thing()"]}
    assert json.loads(json.dumps(out)) == out  # strict JSON: the result round-trips


def test_seed_record_reproduces_sequence():
    ss = np.random.SeedSequence().spawn(3)[2]
    rec = json.loads(json.dumps(seed_record(ss)))
    again = np.random.SeedSequence(rec["entropy"], spawn_key=tuple(rec["spawn_key"]))
    assert np.array_equal(again.generate_state(4), ss.generate_state(4))


def test_hash_array_sensitive_to_dtype_shape_and_bytes():
    a = np.arange(6, dtype=np.float32)
    h = hash_array(a)
    assert h == hash_array(a.copy())
    assert h != hash_array(a.reshape(2, 3))
    assert h != hash_array(a.astype(np.float64))
    b = a.copy()
    b[5] = np.nextafter(b[5], np.float32(10))
    assert h != hash_array(b)
    assert hash_array(a.reshape(2, 3).T) == hash_array(np.ascontiguousarray(a.reshape(2, 3).T))


def test_hash_json_canonical_and_hash_file(tmp_path):
    assert hash_json({"a": 1, "b": [np.int32(2)]}) == hash_json({"b": [2], "a": 1})
    assert hash_json({"a": 1}) != hash_json({"a": 2})
    f = tmp_path / "x.bin"
    f.write_bytes(b"hello" * 100000)
    assert hash_file(f, chunk_size=1000) == hash_bytes(b"hello" * 100000)


def test_reports_does_not_import_torch_or_circuits():
    code = "import sys, reports; assert 'torch' not in sys.modules and 'circuits' not in sys.modules, sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
