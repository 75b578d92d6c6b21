"""The client commands: ``circuitstat submit --server URL SPEC`` and ``circuitstat check --server URL``.

The token comes from ``$CIRCUITSTAT_TOKEN`` (never from an option: it would show in ``ps`` and in
shell histories). A refusal by the server is one ``error:`` line with what the server said (exit 2),
as a local command's bad input is; ``check`` exits as a local ``check`` does (0 all claims hold,
1 any fails, 2 errors), so a CI job with neither weights nor a GPU can gate on it.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from circuitstat.core.errors import InputError

TOKEN_ENV = "CIRCUITSTAT_TOKEN"
FINAL = ("completed", "failed", "cancelled")


class ServerError(InputError):
    """The server refused a request (4xx) or could not be reached."""


def _token() -> str:
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise InputError(f"set {TOKEN_ENV} to your token (the operator creates it with `circuitstat users token NAME`)")
    return token


class Client:
    """An HTTP client of one server, authenticated with the caller's token."""

    def __init__(self, server: str, token: str | None = None, timeout: float = 120.0) -> None:
        import httpx

        if not server.startswith(("http://", "https://")):
            raise InputError(f"--server {server!r} is not a URL; give it like http://HOST:8000")
        self.server = server.rstrip("/")
        self.http = httpx.Client(base_url=self.server, timeout=timeout,
                                 headers={"Authorization": f"Bearer {token or _token()}"})

    def request(self, method: str, path: str, **kw) -> Any:
        """The response of one request; ServerError naming what the server said for a 4xx/5xx."""
        import httpx

        try:
            resp = self.http.request(method, path, **kw)
        except httpx.HTTPError as e:
            raise ServerError(f"cannot reach the server at {self.server} ({type(e).__name__}); check --server and that "
                              "`circuitstat serve` runs there") from None
        if resp.status_code >= 400:
            try:
                detail = resp.json().get("detail", resp.text)
            except ValueError:
                detail = resp.text[:300]
            raise ServerError(f"the server refused the request ({resp.status_code}): {detail}")
        return resp

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()


def spec_upload(spec: Path, kind: str) -> tuple[bytes, list[tuple[str, tuple[str, bytes]]]]:
    """(spec YAML to send, task files to upload): a task file the spec names (relative to the spec, as
    the CLI resolves it) is uploaded under its bare name, and the spec sent names it so."""
    import yaml

    from circuitstat.pipelines.spec import load_yaml
    from circuitstat.pipelines.yamlio import resolve_inside

    from .submission import TASK_FILE_SUFFIXES

    data = load_yaml(spec)
    text = spec.read_bytes()
    if not isinstance(data, dict):
        return text, []
    task = data.get("task")
    name = task if kind == "attribute" else (task.get("name") if isinstance(task, dict) else None)
    if not isinstance(name, str) or not name.lower().endswith(TASK_FILE_SUFFIXES):
        return text, []
    path = resolve_inside(spec, name, key="task")
    if not path.is_file():
        raise InputError(f"the task file {name} named by {spec} does not exist next to it")
    if kind == "attribute":
        data["task"] = path.name
    else:
        data["task"] = {**task, "name": path.name}
    return yaml.safe_dump(data, sort_keys=False).encode(), [("files", (path.name, path.read_bytes()))]


def submit(server: str, spec: Path, *, kind: str = "audit", name: str | None = None, public: bool = False,
           wait: bool = True, out: Path | None = None, echo: Callable[[str], None] = print) -> int:
    """Submit ``spec``; with ``wait``, follow it with a progress bar and download its run into ``out``.
    The exit code: 0 completed (or queued, without ``wait``), 1 cancelled, 2 failed on its input, 3 internal."""
    text, files = spec_upload(spec, kind)
    client = Client(server)
    try:
        form = {"kind": kind, "name": name or spec.name, "public": "true" if public else "false"}
        job = client.request("POST", "/api/v1/jobs", data=form,
                             files=[("spec", (spec.name, text)), *files]).json()
        echo(f"job {job['id']} queued on {client.server} ({client.server}/jobs/{job['id']})")
        if not wait:
            return 0
        job = _follow(client, job)
        if job["state"] == "completed":
            folder = out or Path("runs") / job["id"]
            fetch_run(client, job["id"], folder)
            echo(f"job {job['id']} completed -> {folder}")
            return 0
        echo(f"job {job['id']} {job['state']}" + (f": {job['error']}" if job.get("error") else ""))
        return {"cancelled": 1, "input": 2, "quota": 2}.get(job.get("error_kind") or job["state"], 3)
    finally:
        client.close()


def _follow(client: Client, job: dict, poll: float = 1.0) -> dict:
    """Poll ``job`` until it ends, with a progress bar on stderr; the final status."""
    from tqdm.auto import tqdm

    with tqdm(total=100, desc=f"job {job['id'][:8]}", unit="%", file=sys.stderr,
              bar_format="{desc} {percentage:3.0f}%|{bar}| {postfix}") as bar:
        while job["state"] not in FINAL:
            time.sleep(poll)
            job = client.request("GET", f"/api/v1/jobs/{job['id']}").json()
            bar.n = round(100 * (job.get("progress") or 0))
            eta = job.get("eta_seconds")
            bar.set_postfix_str(f"{job['state']} {job.get('stage') or ''}" + (f" ~{eta:.0f} s left" if eta else ""))
    return job


def fetch_run(client: Client, job_id: str, folder: Path) -> list[Path]:
    """Download the job's tables (Parquet), manifest.json and report.html into ``folder``; their paths. Each is
    written atomically under a plain name (a server's table name is untrusted), never through a link or over a
    special file (circuitstat.core.outpath)."""
    import re

    from circuitstat.core.atomic import atomic_write_bytes
    from circuitstat.core.outpath import check_no_links

    folder.mkdir(parents=True, exist_ok=True)
    tables = client.request("GET", f"/api/v1/jobs/{job_id}/tables").json()["tables"]
    names = [f"{t['name']}.parquet" for t in tables]
    bad = [n for n in names if not re.fullmatch(r"[A-Za-z0-9_.-]{1,200}\.parquet", n) or n.startswith(".")]
    if bad:
        raise InputError(f"the server names a table {bad[0][:80]!r}, not a plain file name; nothing downloaded")
    written = []
    for name, url in [*zip(names, (t["parquet"] for t in tables)),
                      ("manifest.json", f"/api/v1/jobs/{job_id}/manifest"),
                      ("report.html", f"/api/v1/jobs/{job_id}/report")]:
        check_no_links(folder, folder / name, flag="--out")
        written.append(atomic_write_bytes(folder / name, client.request("GET", url).content))
    return written


def check(server: str, claims: Path, job_id: str, junit: Path | None = None,
          echo: Callable[[str], None] = print) -> int:
    """Check ``claims`` against job ``job_id`` on ``server``; the exit code a local ``check`` would give."""
    if not claims.is_file():
        raise InputError(f"{claims} not found; pass the path of a claims file (YAML)")
    if junit is not None and junit.is_dir():
        raise InputError(f"--junit {junit} is a directory; give a file path such as claims.xml")
    client = Client(server)
    try:
        doc = client.request("POST", f"/api/v1/jobs/{job_id}/claims",
                             files={"claims": (claims.name, claims.read_bytes())}).json()
    finally:
        client.close()
    echo(f"claims {claims} against job {job_id} on {client.server}")
    echo(doc["table"])
    c = doc["counts"]
    echo(f"{len(doc['results'])} claims: {c['pass']} hold, {c['fail']} fail, {c['error']} cannot be evaluated")
    for note in doc.get("notes", []):
        echo(f"note: {note}")
    if junit is not None:
        from circuitstat.core.atomic import atomic_write_bytes

        atomic_write_bytes(junit, doc["junit"].encode())
        echo(f"JUnit XML -> {junit}")
    return int(doc["exit_code"])


def compare(server: str, job_a: str, job_b: str):
    """The comparison (circuitstat.reports.compare.RunComparison) of jobs ``job_a`` and ``job_b`` on ``server``, as
    the server computed it (``GET /api/v1/jobs/{a}/compare/{b}``: the numbers of a local `compare`)."""
    from circuitstat.reports.compare import RunComparison

    client = Client(server)
    try:
        doc = client.request("GET", f"/api/v1/jobs/{job_a}/compare/{job_b}").json()
    finally:
        client.close()
    return RunComparison.from_dict(doc)
