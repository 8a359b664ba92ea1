"""The blocking client."""

from __future__ import annotations

import time
from typing import Any

import httpx

from ._base import (
    BaseClient,
    Call,
    Endpoints,
    Planned,
    _parse,
    decoding_error,
    is_many,
    json_or_raise,
    note_info,
    note_request,
    probe_result,
    transport_error,
)
from ._exceptions import BertserveError
from .types import Info


class Client(Endpoints, BaseClient):
    """A bertserve server over HTTP, one blocking call at a time.

        with Client("http://localhost:8000", api_key="...") as client:
            client.classify("a great film")            # [Label(label='positive', score=0.98)]
            client.classify(["great", "awful"])        # one list of labels per input

    `http_client` lets you bring your own `httpx.Client` (proxies, TLS, transports); the client
    closes only the connection pool it created itself. One Client may be shared by several threads.
    """

    def __init__(self, base_url: str | None = None, *, http_client: httpx.Client | None = None, **options: Any) -> None:
        super().__init__(base_url, **options)
        self._owns_http = http_client is None
        self._http = http_client or httpx.Client()

    # -- endpoints: the inference calls are Endpoints' (_base.py); the status calls ---------------------

    def health(self) -> bool:
        """Is the process up? One attempt, no retries; raises APIConnectionError when unreachable."""
        return probe_result(self._send(Call("GET", "/health")))

    def ready(self) -> bool:
        """Is the model loaded and warm? False while the server answers 503."""
        return probe_result(self._send(Call("GET", "/ready")))

    def info(self) -> Info:
        info = _parse(Info, self._request(Call("GET", "/info")))
        if self.batch_size is None:
            self.batch_size = self._limit_from_info(info)
        return info

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    @property
    def is_closed(self) -> bool:
        return self._http.is_closed

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- transport ---------------------------------------------------------------------------

    def _batch_limit(self, planned: Planned) -> int | None:
        inputs = planned.inputs
        if not is_many(inputs) or len(inputs) <= 1:
            return None
        if self.batch_size is None:
            planned.build(None)  # wrong arguments fail before any request, /info's included
            try:
                self.info()
            except BertserveError as error:
                note_info(error)
                raise
        return self.batch_size

    def _run(self, planned: Planned) -> Any:
        limit = None if planned.inputs is None else self._batch_limit(planned)
        plan = planned.build(limit)
        answers = []
        for index, call in enumerate(plan.calls):
            try:
                answers.append(self._request(call))
            except BertserveError as error:
                note_request(error, plan, answers, call, index)
                raise
        return plan.assemble(answers)

    def _send(self, call: Call) -> httpx.Response:
        url = self._url(call.path)
        try:
            return self._http.request(call.method, url, **self._request_kwargs(call))
        except httpx.TransportError as e:
            raise transport_error(e, call, url, self.timeout) from e
        except httpx.DecodingError as e:
            raise decoding_error(e, call, url) from e

    def _request(self, call: Call) -> Any:
        attempt = 0
        while True:
            try:
                return json_or_raise(self._send(call))
            except BertserveError as error:
                delay = self.retries.delay(error, attempt)
                if delay is None:
                    self.retries.note_giving_up(error, attempt)
                    raise
            time.sleep(delay)
            attempt += 1
