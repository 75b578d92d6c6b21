"""A throwaway PostgreSQL server from Debian's package: initdb into a temporary directory, pg_ctl on a free port.

initdb refuses to run as root, so as root the server runs as the ``postgres`` user (Debian's package
creates it), or as a system user made for the tests when there is none. Durability settings are off
(fsync, synchronous_commit): the data lives for one test session.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from support import free_port

TEST_USER = "circuitstat-pg"


def bindir() -> Path | None:
    """The newest installed PostgreSQL's bin directory (with initdb), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[4]))
    return Path(found[-1]).parent if found else None


def _runner() -> tuple[list[str], int | None, int | None]:
    """(command prefix, uid, gid) to run the server's programs as an unprivileged user."""
    if os.geteuid() != 0:
        return [], None, None
    try:
        user = pwd.getpwnam("postgres")
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", TEST_USER],
                       check=True, capture_output=True)
        user = pwd.getpwnam(TEST_USER)
    return ["runuser", "-u", user.pw_name, "--"], user.pw_uid, user.pw_gid


class Postgres:
    """A running PostgreSQL server; :meth:`create_database` returns a URL per test module."""

    def __init__(self) -> None:
        bins = bindir()
        if bins is None:
            raise FileNotFoundError("PostgreSQL is not installed: run `apt-get install -y postgresql` "
                                    "(`make test` does it)")
        self.bin = bins
        self.prefix, uid, gid = _runner()
        self.dir = Path(tempfile.mkdtemp(prefix="circuitstat-pg-"))
        if uid is not None:
            os.chown(self.dir, uid, gid)
        self.data, self.port = self.dir / "data", free_port()
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")
        opts = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.dir / "server.log"), "-w", "-t", "120",
                  "start")
        self._count = 0

    def _run(self, program: str, *args: str) -> None:
        r = subprocess.run([*self.prefix, str(self.bin / program), *args], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{program} failed: {r.stdout[-2000:]}{r.stderr[-2000:]}")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, prefix: str = "t") -> str:
        """A URL of a new, empty database."""
        import psycopg

        self._count += 1
        name = f"{prefix}{self._count}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        subprocess.run([*self.prefix, str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)
