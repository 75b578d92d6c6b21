"""The local pool's forkserver preloads what the workers run today: each served kind's module, never the CLI."""

from __future__ import annotations

import importlib.util

from circuitstat.pipelines.kinds import SERVED, kind, module_of
from circuitstat.pipelines.service.pools import PRELOAD


def test_the_preload_names_every_served_kinds_module_existing_modules_and_no_cli():
    for name in SERVED:
        assert module_of(name) in PRELOAD, name
        assert importlib.import_module(module_of(name)).KIND is kind(name)  # the module the runner's kind lives in
    missing = [m for m in PRELOAD if importlib.util.find_spec(m) is None]
    assert missing == []  # a renamed or removed module would fail only in the forkserver's log
    # the service never imports the command line (tests/test_layers.py); a preload is an import too
    assert [m for m in PRELOAD if m.startswith("circuitstat.pipelines.cli")] == []
    assert PRELOAD[-1] == "circuitstat.pipelines.service.warmup"  # last: its audit needs the rest loaded
