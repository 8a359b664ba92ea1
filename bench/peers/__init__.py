"""What the server benchmarks measure: a peer is a server a user could deploy, described as a command
line (interpreter, arguments, environment, working directory), how to tell it is ready, and an
adapter between the benchmark's work items ("classify this sentence", "embed this sentence") and
that server's HTTP API.

    python -m bench.peers --task classify,embed --concurrency 1,8,32 --seconds 15 [--plot]

runs every peer of bench/peers/catalog.py (bertserve's variants, the transformers baseline, infinity's
engines) one at a time on the same weights with the load generator of bench/server_bench.py; see
bench/peers/__main__.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import REPO

# Where exports and infinity's venv are cached (the catalog and infinity_env both read it).
WORK = Path(os.environ.get("BERTSERVE_PEERS_DIR", REPO / "bench" / ".peers"))


class PeerUnavailable(Exception):
    """A peer that cannot run here (an environment not set up, an export the checkout cannot make, an
    endpoint the server does not have): the benchmark records the reason and goes on with the others."""


@dataclass(frozen=True)
class Adapter:
    """One server's way of doing one task over HTTP.

    body: a work item (a sentence; for qa a {"question", "context"} dict; for rerank a {"query", "texts"} dict)
    -> the JSON request body.
    answer: the decoded JSON response -> a label (classify), a vector (embed) or the best text's index (rerank); None where the
    benchmark compares no answers (ner, qa)."""

    path: str
    body: Callable[[Any], dict]
    answer: Callable[[Any], Any] | None = None


@dataclass
class Peer:
    """A server under test, for one task. `argv` may hold "{port}", replaced by the port it gets."""

    name: str  # the variant, e.g. "bertserve-default"
    server: str  # the product it belongs to: "bertserve", "baseline", "infinity"
    task: str  # "classify", "embed", "rerank", "ner", "qa"
    engine: str  # "torch", "onnxruntime", ...
    precision: str  # "fp32", "int8", ...
    argv: list[str]
    adapter: Adapter
    ready_path: str = "/health"  # answers 200 once the model is loaded
    cwd: Path = REPO
    env: dict[str, str] = field(default_factory=dict)
    prepare: Callable[[], None] | None = None  # makes what argv needs (weights, a venv); may raise PeerUnavailable
    notes: str = ""  # what was done to make it run here, for the results

    def command(self, port: int) -> list[str]:
        return [a.replace("{port}", str(port)) for a in self.argv]

    def describe(self) -> dict:
        return {
            "name": self.name,
            "server": self.server,
            "task": self.task,
            "engine": self.engine,
            "precision": self.precision,
            "argv": self.argv,
            "cwd": str(self.cwd),
            "env": self.env,
            "notes": self.notes,
        }


def _top_label(scores: list[dict]) -> str:
    return max(scores, key=lambda s: s["score"])["label"]


def _single(answer: Any) -> Any:
    """The answer for the one input sent: servers answer a single string with either the item itself or
    a list holding it ([{"label", "score"}] vs [[...]]; [float] vs [[float]])."""
    return answer[0] if isinstance(answer, list) and answer and isinstance(answer[0], list) else answer


def bertserve_adapter(task: str) -> Adapter:
    """bertserve's API (docs/architecture.md, "HTTP API"), which bench/baseline_server.py copies for single inputs."""
    if task == "classify":
        return Adapter("/classify", lambda s: {"inputs": s}, lambda a: _top_label(_single(a)))
    if task == "embed":  # TEI's shape: {"inputs": str | [str], "normalize": true} -> [[float]]
        return Adapter("/embed", lambda s: {"inputs": s, "normalize": True}, _single)
    if task == "ner":
        return Adapter("/ner", lambda s: {"inputs": s})
    if task == "qa":
        return Adapter("/qa", lambda item: item)
    if task == "rerank":  # best first: the top text's index
        return Adapter(
            "/rerank", lambda item: {"query": item["query"], "texts": item["texts"]}, lambda a: a[0]["index"]
        )
    raise ValueError(f"bertserve has no task {task!r}")


def infinity_adapter(task: str) -> Adapter:
    """infinity's API: POST /classify {"input": [str]} -> {"data": [[{"label", "score"}, ...]]};
    POST /embeddings (OpenAI's shape) {"input": [str]} -> {"data": [{"embedding": [float], "index": 0}]};
    POST /rerank {"query", "documents"} -> {"results": [{"index", "relevance_score"}]}."""
    if task == "classify":
        return Adapter("/classify", lambda s: {"input": [s]}, lambda a: _top_label(a["data"][0]))
    if task == "embed":
        return Adapter("/embeddings", lambda s: {"input": [s]}, lambda a: a["data"][0]["embedding"])
    if task == "rerank":  # Cohere's shape: {"query", "documents"} -> {"results": [{"index", "relevance_score"}]}
        return Adapter(
            "/rerank",
            lambda item: {"query": item["query"], "documents": item["texts"], "return_documents": False},
            lambda a: max(a["results"], key=lambda r: r["relevance_score"])["index"],
        )
    raise ValueError(f"infinity has no task {task!r} here")
