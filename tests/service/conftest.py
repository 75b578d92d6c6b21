"""Fixtures of the service tests: one PostgreSQL server and one fleet of service servers per session."""

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


@pytest.fixture(scope="session")
def fleet(request, tmp_path_factory):
    """The session's service servers (support.Fleet): SQLite, and PostgreSQL when it is installed."""
    from support import Fleet

    f = Fleet(tmp_path_factory.mktemp("fleet"))  # its workers warm up while PostgreSQL starts
    try:
        f.use_postgres(request.getfixturevalue("postgres").create_database("service"))
    except pytest.skip.Exception:  # CIRCUITSTAT_ALLOW_NO_POSTGRES=1 without PostgreSQL: the SQLite half still runs
        pass
    yield f
    codes = f.stop()
    assert codes == [0] * len(codes), codes  # every server drained and exited cleanly
