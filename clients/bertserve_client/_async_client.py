"""The asyncio client: the same calls as Client, awaited."""
from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import httpx

from ._base import (
    BaseClient,
    Call,
    ClassifyInput,
    NerInput,
    Plan,
    _parse,
    QAItem,
    is_many,
    json_or_raise,
    EmbedInput,
    plan_classify,
    plan_embed,
    plan_ner,
    plan_qa,
    probe_result,
    retry_delay,
    transport_error,
)
from ._exceptions import BertserveError
from .types import Answer, Entity, Info, Label


class AsyncClient(BaseClient):
    """A bertserve server over HTTP, with asyncio; calls may run concurrently.

        async with AsyncClient("http://localhost:8000", api_key="...") as client:
            await client.classify("a great film")            # [Label(label='positive', score=0.98)]
            await client.classify(["great", "awful"])        # one list of labels per input

    `http_client` lets you bring your own `httpx.AsyncClient` (proxies, TLS, transports); the client
    closes only the connection pool it created itself.
    """

    def __init__(self, base_url: str | None = None, *, http_client: httpx.AsyncClient | None = None, **options: Any) -> None:
        super().__init__(base_url, **options)
        self._owns_http = http_client is None
        self._http = http_client or httpx.AsyncClient()

    # -- endpoints ---------------------------------------------------------------------------

    async def classify(self, inputs: ClassifyInput, *, top_k: int = 1, truncate: bool = False) -> list[Label] | list[list[Label]]:
        """Labels for one text (a list of Label) or for many texts or [text, text_pair] pairs (a list per input)."""
        return await self._run(plan_classify(inputs, top_k=top_k, truncate=truncate, batch_limit=await self._batch_limit(inputs)))

    async def ner(self, inputs: NerInput, *, aggregation: str = "first", truncate: bool = False) -> list[Entity] | list[list[Entity]]:
        """Entities of one text (a list of Entity) or of many texts (a list per input)."""
        return await self._run(plan_ner(inputs, aggregation=aggregation, truncate=truncate, batch_limit=await self._batch_limit(inputs)))

    async def embed(self, inputs: EmbedInput, *, normalize: bool = True, truncate: bool = False) -> list[float] | list[list[float]]:
        """The vector of one text (a list of floats), or of many texts (one vector per input), unit length
        unless `normalize=False`."""
        return await self._run(plan_embed(inputs, normalize=normalize, truncate=truncate, batch_limit=await self._batch_limit(inputs)))

    async def qa(
        self,
        question: str | Sequence[QAItem],
        context: str | None = None,
        *,
        top_k: int = 1,
        max_answer_len: int = 30,
        doc_stride: int | None = None,
    ) -> Answer | list[Answer] | list[Answer | list[Answer]]:
        """`qa(question, context)` gives an Answer (a list of top_k Answers when top_k > 1);
        `qa([(question, context), ...])` gives one of those per item."""
        limit = None if isinstance(question, str) else await self._batch_limit(question)
        plan = plan_qa(question, context, top_k=top_k, max_answer_len=max_answer_len, doc_stride=doc_stride, batch_limit=limit)
        return await self._run(plan)

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

    async def _run(self, plan: Plan) -> Any:
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
