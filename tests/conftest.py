"""Test-wide settings, and the shared run builder as a fixture (tests/builders.py)."""

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # builders, report_builders, interval_check, fixture_populations

# Tiny models run faster on one thread than on two competing ones; results are compared within
# a test, never across thread counts.
torch.set_num_threads(1)

# Tests load hundreds of throwaway Hugging Face directories: caching their conversions would fill the
# user's cache with copies (tests/circuits/test_conversion_cache.py turns it on in its own cache).
# Set before any test runs, so subprocesses (CLI tests) inherit it.
os.environ.setdefault("CIRCUITSTAT_CONVERSION_CACHE", "0")

# transformers binds its log handler to the sys.stderr of the moment it first configures its logger. Inside a
# CliRunner invocation that is the runner's stream, closed when the invocation ends, and a later warning then prints
# "--- Logging error ---" with a traceback into another test's output: configure it now, on the session's stderr.
import transformers.utils.logging as _hf_logging  # noqa: E402

_hf_logging.get_verbosity()


@pytest.fixture
def audit_run(tmp_path):
    """A synthetic audit run directory (every registered table, filled from core/schema.py)."""
    from builders import make_run

    return make_run(tmp_path / "audit-run")


def pytest_collection_modifyitems(config, items) -> None:
    """Files with slow-marked tests run first (stable order otherwise): under ``--dist loadfile`` a two-minute file
    picked last would leave one core idle while the other finishes it."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)

