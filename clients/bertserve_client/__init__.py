"""bertserve-client: a small SDK for a bertserve server, installed on its own (httpx + pydantic only; it imports
nothing of the server). See docs/sdk.md and clients/README.md.

    from bertserve_client import Client
    with Client("http://localhost:8000") as client:
        print(client.classify("a gripping, beautifully shot film"))

Errors are all `BertserveError`; see `bertserve_client._exceptions` for which status maps to
which class. `APIConnectionError` / `APITimeoutError` are named so as not to shadow the builtins.
"""

from ._async_client import AsyncClient
from ._client import Client
from ._exceptions import (
    APIConnectionError,
    APITimeoutError,
    BertserveError,
    NotFoundError,
    OverloadedError,
    ServerError,
    UnauthorizedError,
    ValidationError,
)
from ._version import __version__
from .types import *  # noqa: F403 - every result type (types.__all__)
from .types import __all__ as _types

__all__ = [
    "AsyncClient",
    "Client",
    "APIConnectionError",
    "APITimeoutError",
    "BertserveError",
    "NotFoundError",
    "OverloadedError",
    "ServerError",
    "UnauthorizedError",
    "ValidationError",
    *_types,
    "__version__",
]
