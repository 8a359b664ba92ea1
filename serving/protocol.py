"""uvicorn's HTTP protocol with bounded headers, and JSON for the errors it answers itself.

uvicorn bounds the idle time between requests (keep-alive) but neither the time a client takes to send a
request's headers nor their size: a client that connects and trickles a header byte every few seconds holds
its connection, and a file descriptor, forever (slowloris), and one that sends megabytes of headers has them
buffered. Here every request's headers must be complete `header_timeout_s` after the connection opens or
after the request's first byte (else 408), and within MAX_HEADER_BYTES (else 431); then the connection is
closed. A request that does not parse as HTTP gets uvicorn's 400, but as JSON like every other error.
(The body has its own bounds, in the middleware.)

A request's scope carries ON_DISCONNECT in its "extensions": `on_disconnect(callback)` calls `callback` once if the
client hangs up before the response is complete (at once if it already has) and returns its unregistering. The
inference routes use it instead of a task per request that waits for the http.disconnect message. BODY_RECEIVED
is a function that says whether the request's whole body has arrived (receive() then returns without waiting:
the middleware's body timeout is not needed).

A response leaves in one write: uvicorn writes the status line and headers as soon as the app starts its
response, and the body when it comes, and on a busy machine the process can be descheduled between the two.
A replica killed there leaves its load balancer a 200 with no body, which it can neither retry nor pass on
whole. Held until the body's first write, the head leaves with it: a kill leaves either nothing (retried
elsewhere) or the answer.
"""

from __future__ import annotations

import functools
import json
import logging

from serving.errors import BadRequest, HeadersTooLarge, RequestTimeout, ServingError, error_body

log = logging.getLogger("bertserve")
MAX_HEADER_BYTES = 64 * 1024  # request line + headers; nginx's default buffers hold 4 x 8 KiB
ON_DISCONNECT = "bertserve.on_disconnect"  # scope extensions (see the module's docstring)
BODY_RECEIVED = "bertserve.body_received"
_LOST = "bertserve_on_lost"  # the callback, kept on uvicorn's RequestResponseCycle


def _on_disconnect(cycle, callback):
    """Register `callback` for `cycle`'s client hanging up; returns its unregistering."""
    if cycle.disconnected:
        callback()
        return _nothing
    setattr(cycle, _LOST, callback)
    return functools.partial(setattr, cycle, _LOST, None)


def _nothing() -> None:
    pass


def _body_received(cycle) -> bool:
    return not cycle.more_body


def _json_response(error: ServingError, reason: str) -> bytes:
    """The whole HTTP response for an error answered below the ASGI app (the connection then closes)."""
    body = json.dumps(error_body(error.message, error.error_type)).encode()
    return (
        f"HTTP/1.1 {error.status} {reason}\r\ncontent-type: application/json\r\nconnection: close\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body


class _OneWriteResponses:
    """A transport that holds a response's head (status line and headers) until the next write, its body's,
    and writes both at once. Everything else passes through."""

    def __init__(self, transport):
        self._transport = transport
        self._head = b""

    def write(self, data: bytes) -> None:
        if self._head:
            data, self._head = self._head + data, b""
        elif (
            isinstance(data, bytes)
            and data.startswith(b"HTTP/1.1 ")
            and data[9:10] != b"1"
            and data.endswith(b"\r\n\r\n")
        ):
            self._head = bytes(data)  # a whole head with no body yet (1xx, e.g. 100 Continue, goes at once)
            return
        self._transport.write(data)

    def flush(self) -> None:
        if self._head:
            head, self._head = self._head, b""
            self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


def http_protocol(header_timeout_s: float):
    """The protocol class to hand to uvicorn.Config(http=...); "auto" where httptools is missing (h11)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # pragma: no cover - uvicorn[standard] brings httptools on CPython
        log.warning("httptools is not installed: no header read timeout")
        return "auto"

    too_slow = _json_response(
        RequestTimeout(f"request headers not received within {header_timeout_s:g} s (header_timeout_s)"),
        "Request Timeout",
    )
    too_big = _json_response(
        HeadersTooLarge(f"request line and headers larger than {MAX_HEADER_BYTES} bytes"),
        "Request Header Fields Too Large",
    )

    class BoundedHeadersProtocol(HttpToolsProtocol):
        _header_timer = None
        _header_bytes = 0
        _headers_completed = 0  # requests whose headers have been read on this connection

        def connection_made(self, transport) -> None:
            super().connection_made(_OneWriteResponses(transport))
            self._arm()

        def on_response_complete(self) -> None:
            self.transport.flush()  # a response with no body bytes (HEAD, 204) has had no write to carry its head
            super().on_response_complete()

        def data_received(self, data: bytes) -> None:
            if self._header_timer is not None or not (self.cycle is None or self.cycle.response_complete):
                super().data_received(data)
                return
            # The first byte of the next request on a kept-alive connection: its headers' clock starts now. Most
            # requests arrive whole, so the timer is armed only if the headers are still incomplete once this
            # data is parsed (in the same turn of the loop: the same deadline), not armed and cancelled each time.
            self._header_bytes = 0
            completed = self._headers_completed
            super().data_received(data)
            if self._headers_completed == completed and not self.transport.is_closing():
                self._arm()

        def on_url(self, url: bytes) -> None:
            self._header_bytes += len(url)
            if self._header_bytes > MAX_HEADER_BYTES:
                self._too_big()
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._header_bytes += len(name) + len(value) + 4
            if self._header_bytes > MAX_HEADER_BYTES:
                self._too_big()
            super().on_header(name, value)

        def _too_big(self) -> None:
            self._refuse(too_big)
            raise ValueError("headers too large")  # stops the parser; uvicorn's 400 finds the connection closed

        def send_400_response(self, msg: str) -> None:
            self._refuse(_json_response(BadRequest(msg), "Bad Request"))

        def on_headers_complete(self) -> None:
            self._disarm()
            self._headers_completed += 1
            super().on_headers_complete()
            cycle = self.cycle
            if cycle is not None and cycle.scope is self.scope:  # not an upgrade, which makes no cycle
                extensions = self.scope.setdefault("extensions", {})
                extensions[ON_DISCONNECT] = functools.partial(_on_disconnect, cycle)
                extensions[BODY_RECEIVED] = functools.partial(_body_received, cycle)

        def on_message_complete(self) -> None:
            super().on_message_complete()
            # uvicorn stops reading while more than 64 KiB of body waits for the app, and reads again only at the
            # app's next receive(); a route that has its whole body and listens for the hang-up through
            # ON_DISCONNECT calls none, so the client's FIN went unread until the response was written and the
            # work for a caller that had gone ran to the end. Nothing is left to hold back once the body is in (a
            # pipelined request behind it is held back by uvicorn itself).
            if self.cycle is not None and not self.cycle.response_complete:
                self.flow.resume_reading()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)
            cycle = self.cycle
            callback = getattr(cycle, _LOST, None) if cycle is not None and cycle.disconnected else None
            if callback is not None:
                setattr(cycle, _LOST, None)
                callback()

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout_s, self._refuse, too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _refuse(self, response: bytes) -> None:
            self._disarm()
            if not self.transport.is_closing():
                self.transport.write(response)
                self.transport.close()

    return BoundedHeadersProtocol
