"""Run the service under uvicorn: ``circuitstat serve``.

SIGTERM drains while the server still answers: no new job starts, every request gets a 503 problem+json
with ``draining: true`` (so a load balancer moves on, and no client sees a refused connection), running jobs
get ``drain_seconds``, then are interrupted and requeued, keeping every stage they finished; then uvicorn
stops and the process exits 0. SIGINT stops uvicorn at once, and the app's lifespan drains the same way.
"""

from __future__ import annotations

from .config import ServiceConfig


def serve(cfg: ServiceConfig) -> None:
    """Serve ``cfg`` on its host and port until SIGTERM or SIGINT (blocks); after SIGTERM's drain the
    process exits 0 (uvicorn would raise the signal again, reporting a finished drain as a kill)."""
    import uvicorn

    from . import logs
    from .app import create_app

    sock = bind(cfg.host, cfg.port)  # first: a port in use stops the server before any start-up runs
    cfg.data.mkdir(parents=True, exist_ok=True)
    check_database(cfg.database_url)
    logs.configure(cfg.log_file)
    app = create_app(cfg)
    config = uvicorn.Config(app, host=cfg.host, port=cfg.port, log_config=None, access_log=False,
                            timeout_graceful_shutdown=max(5, int(cfg.drain_seconds) + 5), proxy_headers=False,
                            server_header=False)
    draining_server(config, app, cfg.drain_seconds).run(sockets=[sock])


def bind(host: str, port: int):
    """A listening socket on ``host``:``port`` (uvicorn serves on it); InputError (exit 2) naming the port when
    it is in use or cannot be bound, before the server migrates its database or starts a worker."""
    import socket

    from circuitstat.core.errors import InputError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        raise InputError(f"cannot listen on {host}:{port} ({e.strerror or e}); another server may use that port: "
                         "choose another with --port (or `port:` in --config), or stop the other one") from None
    sock.set_inheritable(True)
    return sock


def draining_server(config, app, drain_seconds: float):
    """The uvicorn Server of ``app`` that drains on SIGTERM while it still serves (see the module's doc)."""
    import signal
    import threading

    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            dispatcher = app.state.service.dispatcher
            if sig == signal.SIGTERM and dispatcher is not None:
                # drain while still serving: requests get 503 `draining` (app.Draining), not a refused connection;
                # then uvicorn stops, and the process exits 0 (the signal is not raised again)
                if not dispatcher.draining:
                    dispatcher.draining = True
                    self.drain_thread = threading.Thread(target=self._drain_then_exit, args=(dispatcher,),
                                                         name="circuitstat-drain", daemon=True)
                    self.drain_thread.start()
                return
            if dispatcher is not None:  # SIGINT: from the signal on, no new job starts
                dispatcher.draining = True
            super().handle_exit(sig, frame)
            if sig == signal.SIGTERM:  # before the dispatcher started: a clean stop, exit 0
                self._captured_signals.remove(sig)

        def _drain_then_exit(self, dispatcher) -> None:
            try:
                dispatcher.drain(drain_seconds)
            finally:
                self.should_exit = True

    return Server(config)


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
