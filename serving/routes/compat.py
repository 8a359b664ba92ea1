"""Other servers' APIs, answered by ours: Hugging Face's Inference API and TEI's root route (compat_hf.py), the
rest of TEI's routes (compat_tei.py), Cohere's, infinity's and OpenAI's (compat_cohere.py). docs/compat.md says what
each client needs.

`router` holds every compat route. Some share a path with one of our routes (TEI's /embed fields, infinity's and
Cohere's rerank bodies, TEI's /info fields): the app includes `router` before our routes, so a body our route takes
is still answered by the lean path (serving/routes/lean.py) as before, and only a body our route refuses reaches the
compat route, which answers our route's own error for any body that is not the other API's.
"""

from __future__ import annotations

from fastapi import APIRouter

from serving.routes import compat_cohere, compat_hf, compat_tei

router = APIRouter()
for _module in (compat_hf, compat_tei, compat_cohere):
    router.include_router(_module.router)

__all__ = ["router"]
