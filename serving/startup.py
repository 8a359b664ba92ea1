"""Before the model is loaded: the listening socket, and the answers given on it while the model loads.

The port is taken first, so a port that is busy (a second server, a replica already running) is one line
and exit 2 at once, not after a model load and warm-up. While the model loads, `/health` answers 200 (the
process is alive: an orchestrator must not restart it for loading slowly) and everything else a JSON 503
"the model is loading", `/ready` included; then the same socket is handed to the HTTP server.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from serving.health import ALIVE, is_health

LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost", "ip6-loopback"})


class PortError(OSError):
    """The address cannot be listened on (busy, not this machine's, no permission)."""


def listen(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A bound, listening TCP socket for host:port (IPv6 when host is an IPv6 address)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    # As uvicorn does: a restart may rebind at once while the last run's connections sit in TIME_WAIT.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError as e:
        sock.close()
        raise PortError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


class _LoadingHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 5  # a client that connects and sends nothing does not hold a thread

    def _answer(self) -> None:
        if is_health(self.path):
            status, body, extra = 200, ALIVE, {}
        else:
            status, extra = 503, {"retry-after": "1"}
            body = {"error": "the model is loading", "error_type": "unavailable"}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.send_header("connection", "close")
        for name, value in extra.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        self.close_connection = True

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _answer

    def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's name
        pass


class _LoadingServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        # A client that gives up while the model loads (a health probe's timeout, a reset) is not the server's
        # error: no traceback in the log for it. Anything else is still printed.
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class LoadingResponder:
    """Answers on `sock` from a thread until stop(); the socket stays open for the server that follows."""

    def __init__(self, sock: socket.socket):
        self._server = _LoadingServer(sock.getsockname()[:2], _LoadingHandler, bind_and_activate=False)
        self._server.socket.close()
        self._server.socket = sock
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="bertserve-loading", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop accepting (connections that arrive from now on wait in the backlog for the next server)."""
        self._server.shutdown()
        self._thread.join()
