"""Run the service under uvicorn: ``circuitstat serve``.

uvicorn turns SIGTERM and SIGINT into a graceful shutdown: it stops accepting connections,
finishes the requests in flight, and then the app's lifespan drains the job dispatcher (no new job
starts; running jobs get ``drain_seconds``, then are interrupted and requeued, keeping every stage
they finished).
"""

from __future__ import annotations

from .config import ServiceConfig


def serve(cfg: ServiceConfig) -> None:
    """Serve ``cfg`` on its host and port until SIGTERM or SIGINT (blocks); after SIGTERM's drain the
    process exits 0 (uvicorn would raise the signal again, reporting a finished drain as a kill)."""
    import signal

    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            dispatcher = app.state.service.dispatcher
            if dispatcher is not None:  # from the signal on, no new job starts (uvicorn first closes connections)
                dispatcher.draining = True
            super().handle_exit(sig, frame)
            if sig == signal.SIGTERM:
                self._captured_signals.remove(sig)

    from . import logs
    from .app import create_app

    cfg.data.mkdir(parents=True, exist_ok=True)
    check_database(cfg.database_url)
    logs.configure(cfg.log_file)
    app = create_app(cfg)
    config = uvicorn.Config(app, host=cfg.host, port=cfg.port, log_config=None, access_log=False,
                            timeout_graceful_shutdown=max(5, int(cfg.drain_seconds) + 5), proxy_headers=False,
                            server_header=False)
    Server(config).run()


def check_database(url: str) -> None:
    """None once the database at ``url`` answers; InputError (exit 2, one line naming the setting to fix) when it
    cannot be reached: the operator's configuration, not a bug, and no traceback."""
    from sqlalchemy import text
    from sqlalchemy.exc import SQLAlchemyError

    from circuitstat.core.errors import InputError

    from .db import Database
    from .logs import redact

    try:
        db = Database(url)
    except (SQLAlchemyError, ValueError) as e:
        raise InputError(f"the database URL cannot be used ({type(e).__name__}); fix `database:` in --config, "
                         "--database or $CIRCUITSTAT_DATABASE (e.g. postgresql://USER@HOST/DB)") from None
    shown = db.engine.url.render_as_string(hide_password=True)
    try:
        with db.engine.connect() as c:
            c.execute(text("SELECT 1"))
    except SQLAlchemyError as e:
        reason = " ".join(str(getattr(e, "orig", None) or e).split())[:300]
        raise InputError(redact(f"cannot reach the database {shown} ({reason}); check `database:` in --config, "
                                "--database or $CIRCUITSTAT_DATABASE, and that the database server runs")) from None
    finally:
        db.dispose()
