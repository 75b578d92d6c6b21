"""The service's commands: ``serve`` (the server), ``submit`` (its client) and ``users`` (the operator's
accounts). ``check --server`` lives with ``check`` (circuitstat.pipelines.cli.checks). Nothing starts at import."""

from __future__ import annotations

from pathlib import Path

import typer

from .app import app, choices, echo

users_app = typer.Typer(no_args_is_help=True, help="Accounts of `circuitstat serve`: users and their bearer tokens "
                                                   "(operator commands; they open the database directly).")
app.add_typer(users_app, name="users")

Kind = choices("Kind", "audit", "variance", "calibration", "attribute")
Scope = choices("Scope", "read", "full")


@app.command("serve")
def serve_command(
    data: Path | None = typer.Option(None, "--data", help="data directory: the SQLite database (by default), job "
                                     "inputs, run directories and logs"),
    database: str | None = typer.Option(None, "--database", help="database URL, e.g. postgresql://user@host/db "
                                        "(default: SQLite in --data; or $CIRCUITSTAT_DATABASE, which keeps a "
                                        "password off the command line)"),
    scheduler: str | None = typer.Option(None, "--scheduler", help="Dask scheduler tcp://HOST:PORT: run jobs on that "
                                         "cluster (sharing --data) instead of local worker processes"),
    workers: int | None = typer.Option(None, "--workers", min=1, help="local worker processes (default 1)"),
    host: str | None = typer.Option(None, "--host", help="address to listen on (default 127.0.0.1)"),
    port: int | None = typer.Option(None, "--port", min=0, max=65535, help="port (default 8000)"),
    config: Path | None = typer.Option(None, "--config", help="service settings (YAML): allow-listed model sources, "
                                       "quotas, leases (pipelines/service/config.py)"),
    log_file: Path | None = typer.Option(None, "--log-file", help="also write the JSON log lines to this file"),
) -> None:
    """Run the audit service: the JSON API under /api/v1, the web pages, /healthz and /metrics."""
    from circuitstat.pipelines.service.config import load_config
    from circuitstat.pipelines.service.server import serve

    cfg = load_config(config, data=data, database=database, scheduler=scheduler, workers=workers, host=host,
                      port=port, log_file=log_file)
    serve(cfg)


@app.command("submit")
def submit_command(
    spec: Path = typer.Argument(..., help="the spec the local command takes (YAML); a task file it names is uploaded"),
    server: str = typer.Option(..., "--server", help="the service's URL, e.g. http://HOST:8000"),
    kind: Kind = typer.Option(Kind("audit"), "--kind", help="what the spec is for: audit, variance (study), "
                              "calibration (study) or attribute (a mapping of attribute's options)"),
    name: str | None = typer.Option(None, "--name", help="the job's name in the job list (default: the spec's file name)"),
    public: bool = typer.Option(False, "--public", help="let every user of the server see the run"),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="follow the job with a progress bar, then download it"),
    out: Path | None = typer.Option(None, "--out", help="where to download the finished run (default runs/JOB_ID)"),
) -> None:
    """Submit a spec to a circuitstat server (token from $CIRCUITSTAT_TOKEN); exit as the job ended
    (0 completed, 1 cancelled, 2 bad input or over quota, 3 internal error)."""
    from circuitstat.pipelines.kinds import SERVED, check_run_out
    from circuitstat.pipelines.service.client import submit

    if out is not None:  # the one output-path policy: no link, no file, no run of another kind
        check_run_out(out, SERVED[kind.value])
    raise typer.Exit(submit(server, spec, kind=kind.value, name=name, public=public, wait=wait, out=out,
                            echo=echo))


def _database(data: Path | None, database: str | None, config: Path | None, *, create: bool = False):
    """The server's database, its schema upgraded; InputError (exit 2) for a URL no driver opens, a file that is not
    a database, or (unless ``create``: ``users add``) a SQLite database that does not exist yet, before anything
    is created. Errors name the URL's scheme, never the URL (it may hold a password)."""
    from sqlalchemy.exc import ArgumentError, DatabaseError

    from circuitstat.core.errors import InputError
    from circuitstat.pipelines.service.config import load_config
    from circuitstat.pipelines.service.db import Database, migrate
    from circuitstat.pipelines.service.server import check_database

    cfg = load_config(config, need_data=False, data=data, database=database)
    url = cfg.database_url
    scheme = url.split(":", 1)[0]
    if scheme.startswith("sqlite") and not create:
        path = url.split("///", 1)[-1]
        if path and path != ":memory:" and not Path(path).is_file():
            raise InputError(f"there is no service database at {path}; give the server's --data (or --database), or "
                             "create the first user with `circuitstat users add NAME --data DIR`")
    try:
        db = Database(url)
    except ArgumentError:  # NoSuchModuleError too: an unknown scheme
        raise InputError(f"--database: no database driver for the scheme {scheme!r}; give sqlite:///PATH or "
                         "postgresql://USER@HOST/DB") from None
    except ImportError as e:
        raise InputError(f"--database: the driver for {scheme!r} is not installed ({e.name}); install it or use "
                         "sqlite:///PATH") from None
    if not scheme.startswith("sqlite"):  # a server that does not answer is one line and exit 2, not a traceback
        check_database(url)
    try:
        migrate(db.engine)
    except DatabaseError as e:
        what = "is not a SQLite database" if scheme.startswith("sqlite") else "cannot be opened"
        raise InputError(f"the service database ({scheme}) {what}: {type(e.orig or e).__name__}; give the server's "
                         "database (--data DIR or --database URL)") from None
    return db


DATA = typer.Option(None, "--data", help="the server's data directory (its SQLite database; not needed with --database)")
DATABASE = typer.Option(None, "--database", help="the server's database URL (or $CIRCUITSTAT_DATABASE)")
CONFIG = typer.Option(None, "--config", help="the server's settings file")


@users_app.command("add")
def users_add(name: str = typer.Argument(..., help="user name"), data: Path | None = DATA,
              database: str | None = DATABASE, config: Path | None = CONFIG) -> None:
    """Add a user."""
    from circuitstat.pipelines.service.accounts import add_user

    with _database(data, database, config, create=True).session() as s:
        add_user(s, name)
    echo(f"user {name} added; give them a token with `circuitstat users token {name}`")


@users_app.command("token")
def users_token(name: str = typer.Argument(..., help="user name"),
                label: str = typer.Option("", "--label", help="what the token is for (e.g. ci)"),
                scope: Scope = typer.Option(Scope("full"), "--scope", help="read: list, fetch, check and query only "
                                            "(for CI); full: also submit, cancel, delete, share and manage tokens"),
                expires_days: float | None = typer.Option(None, "--expires-days", min=0.001, max=3650,
                                                          help="it expires after this many days (default never)"),
                data: Path | None = DATA, database: str | None = DATABASE, config: Path | None = CONFIG) -> None:
    """Create a bearer token for a user and print it once (only its hash is stored)."""
    from circuitstat.pipelines.service.accounts import create_token
    from circuitstat.pipelines.service.db import now

    expires = None if expires_days is None else now() + expires_days * 86400
    with _database(data, database, config).session() as s:
        token = create_token(s, name, label, scope=scope.value, expires_at=expires)
    echo(token)


@users_app.command("revoke")
def users_revoke(token_id: str = typer.Argument(..., help="the token's id (from `users list`) or the token"),
                 data: Path | None = DATA, database: str | None = DATABASE, config: Path | None = CONFIG) -> None:
    """Revoke a token (its browser sessions end with it)."""
    from circuitstat.pipelines.service.accounts import revoke_token

    with _database(data, database, config).session() as s:
        revoke_token(s, token_id)
    echo("token revoked")


@users_app.command("rotate")
def users_rotate(token_id: str = typer.Argument(..., help="the token's id (from `users tokens`) or the token"),
                 data: Path | None = DATA, database: str | None = DATABASE, config: Path | None = CONFIG) -> None:
    """Replace a token by a new one (same user, label, scope and expiry), revoke the old one, print the new one once."""
    from circuitstat.pipelines.service.accounts import rotate_token

    with _database(data, database, config).session() as s:
        token = rotate_token(s, token_id)
    echo(token)


def _when(t: float | None, never: str = "never") -> str:
    import time

    return never if t is None else time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


@users_app.command("tokens")
def users_tokens(name: str = typer.Argument(..., help="user name"), data: Path | None = DATA,
                 database: str | None = DATABASE, config: Path | None = CONFIG) -> None:
    """List a user's tokens: id, label, scope, created, expires, revoked (never a secret)."""
    from circuitstat.pipelines.service.accounts import list_tokens, user_by_name

    with _database(data, database, config).session() as s:
        rows = list_tokens(s, user_by_name(s, name).id)
    echo(f"{'id':<12}  {'scope':<5}  {'created':<20}  {'expires':<20}  {'state':<8}  label")
    for r in rows:
        state = "revoked" if r["revoked"] else "expired" if r["expired"] else "live"
        echo(f"{r['id']:<12}  {r['scope']:<5}  {_when(r['created_at']):<20}  {_when(r['expires_at']):<20}  "
             f"{state:<8}  {r['label']}")


@users_app.command("admin")
def users_admin(name: str = typer.Argument(..., help="user name"),
                off: bool = typer.Option(False, "--off", help="take the admin role away instead"),
                data: Path | None = DATA, database: str | None = DATABASE, config: Path | None = CONFIG) -> None:
    """Make a user an admin (list, cancel and delete any job; each such action is logged), or not (--off)."""
    from circuitstat.pipelines.service.accounts import set_admin

    with _database(data, database, config).session() as s:
        set_admin(s, name, not off)
    echo(f"user {name} is {'no longer ' if off else ''}an admin")


@users_app.command("list")
def users_list(data: Path | None = DATA, database: str | None = DATABASE, config: Path | None = CONFIG) -> None:
    """List the users (admins marked) and their tokens' ids (never a secret)."""
    from circuitstat.pipelines.service.accounts import list_users

    with _database(data, database, config).session() as s:
        for u in list_users(s):
            tokens = ", ".join(f"{t['id']}{' (revoked)' if t['revoked'] else ' (expired)' if t['expired'] else ''}"
                               f"{' ' + t['label'] if t['label'] else ''}{' [read]' if t['scope'] == 'read' else ''}"
                               for t in u["tokens"]) or "no tokens"
            echo(f"{u['name']}{' (admin)' if u['admin'] else ''}: {tokens}")
