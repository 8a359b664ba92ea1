"""uvicorn's HTTP protocol with a header read timeout.

uvicorn bounds the idle time between requests (keep-alive) but not the time a client takes to send a
request's headers: a client that connects and trickles a header byte every few seconds holds its
connection, and a file descriptor, forever (slowloris). Here every request's headers must be complete
`header_timeout_s` after the connection opens or after the request's first byte; otherwise the
client gets a 408 and the connection is closed. (The body has its own bound, in the middleware.)
"""
from __future__ import annotations

import json
import logging

log = logging.getLogger("bertserve")


def http_protocol(header_timeout_s: float):
    """The protocol class to hand to uvicorn.Config(http=...); "auto" where httptools is missing (h11)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # pragma: no cover - uvicorn[standard] brings httptools on CPython
        log.warning("httptools is not installed: no header read timeout")
        return "auto"

    body = json.dumps({"error": f"request headers not received within {header_timeout_s:g} s (header_timeout_s)",
                       "error_type": "timeout"}).encode()
    response = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
                b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)

    class HeaderTimeoutProtocol(HttpToolsProtocol):
        _header_timer = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._header_timer is None and (self.cycle is None or self.cycle.response_complete):
                self._arm()  # the first byte of the next request on a kept-alive connection
            super().data_received(data)

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout_s, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                self.transport.write(response)
                self.transport.close()

    return HeaderTimeoutProtocol
