"""The asyncio client: the same calls as Client, awaited."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import httpx

from ._base import (
    BaseClient,
    Call,
    Endpoints,
    Planned,
    _parse,
    endpoint_names,
    is_many,
    json_or_raise,
    probe_result,
    retry_delay,
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
    """

    def __init__(
        self, base_url: str | None = None, *, http_client: httpx.AsyncClient | None = None, **options: Any
    ) -> None:
        super().__init__(base_url, **options)
        self._owns_http = http_client is None
        self._http = http_client or httpx.AsyncClient()

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
            await self._http.aclose()

    @property
    def is_closed(self) -> bool:
        return self._http.is_closed

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- transport ---------------------------------------------------------------------------

    async def _batch_limit(self, inputs: Any) -> int | None:
        if not is_many(inputs) or len(inputs) <= 1:
            return None
        if self.batch_size is None:
            await self.info()
        return self.batch_size

    async def _run(self, planned: Planned) -> Any:
        limit = None if planned.inputs is None else await self._batch_limit(planned.inputs)
        plan = planned.build(limit)
        return plan.assemble([await self._request(call) for call in plan.calls])

    async def _send(self, call: Call) -> httpx.Response:
        try:
            return await self._http.request(call.method, self._url(call.path), **self._request_kwargs(call))
        except httpx.TransportError as e:
            raise transport_error(e) from e

    async def _request(self, call: Call) -> Any:
        attempt = 0
        while True:
            try:
                return json_or_raise(await self._send(call))
            except BertserveError as error:
                delay = retry_delay(error, attempt, self.max_retries)
                if delay is None:
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
