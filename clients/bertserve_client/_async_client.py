"""The asyncio client: the same calls as Client, awaited."""

from __future__ import annotations

import asyncio
import functools
import weakref
from typing import Any

import httpx

from ._base import (
    BaseClient,
    Call,
    Endpoints,
    Planned,
    _parse,
    decoding_error,
    endpoint_names,
    is_many,
    json_or_raise,
    note_info,
    note_request,
    probe_result,
    transport_error,
)
from ._exceptions import BertserveError
from .types import Info


class AsyncClient(Endpoints, BaseClient):
    """A bertserve server over HTTP, with asyncio; calls may run concurrently.

        async with AsyncClient("http://localhost:8000", api_key="...") as client:
            await client.classify("a great film")            # [Label(label='positive', score=0.98)]
            await client.classify(["great", "awful"])        # one list of labels per input

    `http_client` lets you bring your own `httpx.AsyncClient` (proxies, TLS, transports); the client
    closes only the connection pool it created itself.

    A connection pool belongs to the event loop it was first used in. A client used again after that loop has
    closed (a second `asyncio.run`) starts a new pool of its own; one used in two live loops at once, or
    whose `http_client` was given, raises RuntimeError: make one AsyncClient per event loop.
    """

    def __init__(
        self, base_url: str | None = None, *, http_client: httpx.AsyncClient | None = None, **options: Any
    ) -> None:
        super().__init__(base_url, **options)
        self._owns_http = http_client is None
        self._http = http_client or httpx.AsyncClient()
        self._loop: weakref.ref[asyncio.AbstractEventLoop] | None = None  # where self._http's connections live

    # -- endpoints: the inference calls are Endpoints' (_base.py); the status calls ---------------------

    async def health(self) -> bool:
        """Is the process up? One attempt, no retries; raises APIConnectionError when unreachable."""
        return probe_result(await self._send(Call("GET", "/health")))

    async def ready(self) -> bool:
        """Is the model loaded and warm? False while the server answers 503."""
        return probe_result(await self._send(Call("GET", "/ready")))

    async def info(self) -> Info:
        info = _parse(Info, await self._request(Call("GET", "/info")))
        if self.batch_size is None:
            self.batch_size = self._limit_from_info(info)
        return info

    # -- lifecycle ---------------------------------------------------------------------------

    async def close(self) -> None:
        if self._owns_http:
            try:
                await self._http.aclose()
            except RuntimeError:  # "Event loop is closed": its connections died with their loop, unclosable
                if not self._first_loop_closed():
                    raise

    @property
    def is_closed(self) -> bool:
        return self._http.is_closed

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- transport ---------------------------------------------------------------------------

    async def _batch_limit(self, planned: Planned) -> int | None:
        inputs = planned.inputs
        if not is_many(inputs) or len(inputs) <= 1:
            return None
        if self.batch_size is None:
            planned.build(None)  # wrong arguments fail before any request, /info's included
            try:
                await self.info()
            except BertserveError as error:
                note_info(error)
                raise
        return self.batch_size

    async def _run(self, planned: Planned) -> Any:
        limit = None if planned.inputs is None else await self._batch_limit(planned)
        plan = planned.build(limit)
        answers = []
        for index, call in enumerate(plan.calls):
            try:
                answers.append(await self._request(call))
            except BertserveError as error:
                note_request(error, plan, answers, call, index)
                raise
        return plan.assemble(answers)

    def _first_loop_closed(self) -> bool:
        """Has the event loop self._http was used in closed (or gone) since?"""
        first = self._loop() if self._loop is not None else None
        return self._loop is not None and (first is None or first.is_closed())

    def _check_loop(self) -> None:
        """Keep self._http to the event loop its connections were opened in (see the class's docstring)."""
        loop = asyncio.get_running_loop()
        first = self._loop() if self._loop is not None else None
        if self._loop is not None and first is not loop:
            if not self._first_loop_closed():
                raise RuntimeError(
                    "this AsyncClient is in use in another event loop, which is still open: an httpx connection pool"
                    " cannot serve two loops; make one AsyncClient per event loop"
                )
            if not self._owns_http:
                raise RuntimeError(
                    "this AsyncClient's http_client was used in an event loop that has closed since, and its"
                    " connections with it: give it an httpx.AsyncClient made in this loop"
                )
            if not self._http.is_closed:  # its connections died with their loop: a new pool for this one
                self._http = httpx.AsyncClient()
        self._loop = weakref.ref(loop)

    async def _send(self, call: Call) -> httpx.Response:
        self._check_loop()
        url = self._url(call.path)
        try:
            return await self._http.request(call.method, url, **self._request_kwargs(call))
        except httpx.TransportError as e:
            raise transport_error(e, call, url, self.timeout) from e
        except httpx.DecodingError as e:
            raise decoding_error(e, call, url) from e

    async def _request(self, call: Call) -> Any:
        attempt = 0
        while True:
            try:
                return json_or_raise(await self._send(call))
            except BertserveError as error:
                delay = self.retries.delay(error, attempt)
                if delay is None:
                    self.retries.note_giving_up(error, attempt)
                    raise
            await asyncio.sleep(delay)
            attempt += 1


def _awaited(method):
    """An Endpoints method as a coroutine function: what it returns (`_run`'s coroutine) is awaited."""

    @functools.wraps(method)
    async def call(self, *args: Any, **kwargs: Any) -> Any:
        return await method(self, *args, **kwargs)

    return call


for _name in endpoint_names():  # every endpoint of Endpoints, awaited: none is written twice
    setattr(AsyncClient, _name, _awaited(getattr(Endpoints, _name)))
