"""`autotune studies dashboard`: optuna-dashboard (an optional extra) serving the study
database, so every study's trials, history and parameter importance can be browsed
while `profile` runs. Imports optuna-dashboard only when asked to serve."""

from __future__ import annotations

from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from autotune.errors import AutotuneError

INSTALL = "pip install 'autotune[dashboard]'"


class _Server(ThreadingMixIn, WSGIServer):
    """One thread a request: the dashboard's page asks for several things at once (Optuna
    storages are thread-safe)."""

    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args) -> None:
        pass  # wsgiref logs every request on stderr: the page polls, so that is a flood


def require_dashboard():
    """The optuna_dashboard module, or a one-line error that says how to install it."""
    try:
        import optuna_dashboard
    except ImportError:
        raise AutotuneError(
            f"`autotune studies dashboard` needs optuna-dashboard, an optional extra: {INSTALL}"
        ) from None
    return optuna_dashboard


def dashboard_server(storage, host: str, port: int) -> WSGIServer:
    """A server of optuna-dashboard on ``storage`` (an Optuna storage), bound to
    ``host:port`` (port 0: any free one; ``server.server_port`` says which)."""
    app = require_dashboard().wsgi(storage)
    try:
        return make_server(host, port, app, server_class=_Server, handler_class=_QuietHandler)
    except OSError as exc:
        raise AutotuneError(
            f"cannot serve the dashboard on {host}:{port}: {exc.strerror or exc}; pass "
            "another --port (0 picks a free one) or --host"
        ) from None
