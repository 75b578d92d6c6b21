"""circuitstat.circuits.allocator: freed large blocks are reused instead of page-faulted again (glibc only)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's")

# Allocate and free a 256 MB block twice (numpy's malloc, as torch's CPU allocator); print the minor
# page faults of the second round.  Untuned glibc mmaps a block this large and unmaps it on free,
# so every round faults all 65,536 pages again; tuned, the second round reuses the heap block.
# (numpy's transparent huge pages are off in the probe, as for torch tensors by default.)
PROBE = """
import resource, sys
import numpy as np
from circuitstat.circuits.allocator import reuse_freed_memory
tuned = reuse_freed_memory() if sys.argv[1] == "tune" else None
def round_faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = np.ones(256 * 2**20 // 8)
    del a
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
round_faults()
print(tuned, round_faults())
"""


def _probe(mode: str, **env: str) -> tuple[str, int]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LD_PRELOAD"}
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True,
                         env={**clean, "NUMPY_MADVISE_HUGEPAGE": "0", **env}).stdout.split()
    return out[0], int(out[1])


def test_tuned_process_reuses_a_freed_large_block():
    _, untuned = _probe("plain")
    tuned_flag, tuned = _probe("tune")
    pages = 256 * 2**20 // os.sysconf("SC_PAGE_SIZE")
    assert untuned > pages // 2  # the premise: glibc hands the block back and faults it in again
    assert tuned_flag == "True"
    assert tuned < pages // 20  # reused: (almost) no page is faulted in again


def test_a_users_own_allocator_settings_are_left_alone():
    flag, faults = _probe("tune", MALLOC_ARENA_MAX="2")
    assert flag == "False"
    assert faults > 256 * 2**20 // os.sysconf("SC_PAGE_SIZE") // 2  # untouched: still the default behaviour
