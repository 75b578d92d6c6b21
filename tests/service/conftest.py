"""Fixtures of the service tests: one PostgreSQL server per session (Debian's package, started here)."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # support.py, postgres.py


@pytest.fixture(scope="session")
def postgres():
    """A running PostgreSQL server for the session (fails naming the fix when it is not installed)."""
    from postgres import Postgres, bindir

    if bindir() is None:
        if os.environ.get("CIRCUITSTAT_ALLOW_NO_POSTGRES") == "1":
            pytest.skip("PostgreSQL not installed and CIRCUITSTAT_ALLOW_NO_POSTGRES=1")
        pytest.fail("the service tests need PostgreSQL: run `apt-get install -y postgresql` (`make test` does it), "
                    "or set CIRCUITSTAT_ALLOW_NO_POSTGRES=1 to skip them")
    pg = Postgres()
    yield pg
    pg.stop()
