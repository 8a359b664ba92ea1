"""The glue between routes and models: tokenise (off the event loop) -> queue -> batch -> decode.

One ModelUnit per distinct model directory: its backend, tokenizer and its own batcher. A multi-task
model serving several tasks is one unit, so a batch may mix classify, ner and qa sequences: one
forward pass gives every head's output and each sequence takes the head its request asked for.
"""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from bert.tasks import classify as classify_codec
from bert.tasks import ner as ner_codec
from bert.tasks import qa as qa_codec
from bert.tokenizer import BertTokenizer, InputTooLong
from serving.backends.base import (TASKS, Backend, ModelError, ModelSpec, create_backend, read_model_spec,
                                   resolve_model_path)
from serving.batcher import Batcher, SequenceResult, Ticket
from serving.errors import BackendFailure, EmptyInput, PayloadTooLarge, ServingError, ValidationFailed
from serving.settings import DEMO_MODEL_DIR, Settings

log = logging.getLogger("bertserve")
# A request whose texts add up to more than this goes to the long lane (see Engine.__init__).
LIGHT_REQUEST_CHARS = 8192
DEFAULT_DOC_STRIDE = 128  # transformers' default (at 384-token windows)


def version() -> str:
    try:
        from importlib.metadata import version as _version
        return _version("bertserve")
    except Exception:  # noqa: BLE001 - running from a checkout that is not installed
        return "0.1.0"


class TaskNotServed(ServingError):
    status, error_type = 404, "not_found"


class CallerGone(Exception):
    """Raised in a codec thread when the request it works for has been abandoned; nobody reads it."""


@dataclass
class Timing:
    """Per request: the longest queue wait and model time among its sequences."""

    queue_s: float = 0.0
    inference_s: float = 0.0

    def add(self, results: list[SequenceResult]) -> None:
        for r in results:
            self.queue_s = max(self.queue_s, r.queue_s)
            self.inference_s = max(self.inference_s, r.inference_s)


@dataclass
class ModelUnit:
    spec: ModelSpec
    backend: Backend
    tokenizer: BertTokenizer
    max_length: int
    batcher: Batcher | None = None
    tasks: list[str] = field(default_factory=list)


class Engine:
    def __init__(self, settings: Settings, metrics=None):
        self.settings = settings
        self.metrics = metrics
        self.units: list[ModelUnit] = []
        self.by_task: dict[str, ModelUnit] = {}
        # Two lanes for tokenising and decoding: a request with long texts (QA contexts, big batches) waits
        # behind other long ones only, never in front of a one-line /classify. Work per request is bounded
        # anyway (tokens, windows, inputs), so one thread is enough for the long lane.
        self._light_lane = ThreadPoolExecutor(max_workers=2, thread_name_prefix="codec")
        self._heavy_lane = ThreadPoolExecutor(max_workers=1, thread_name_prefix="codec-long")

    # ---- lifecycle ------------------------------------------------------------------------
    def load(self) -> None:
        """Resolve the model directory of every task and build one backend per distinct directory."""
        settings = self.settings
        wanted = settings.model_paths()
        default = settings.model
        if default is None and not any(wanted.values()):
            if not DEMO_MODEL_DIR.is_dir():
                raise ModelError("the built-in demo model is not in this build (serving/demo_model/, see the "
                                 "README's \"Demo model\"); pass --model PATH")
            default = str(DEMO_MODEL_DIR)
        paths: dict[Path, list[str]] = {}
        if default is not None:
            paths[resolve_model_path(default)] = []
        for task, name in wanted.items():
            if name is not None:
                paths.setdefault(resolve_model_path(name), []).append(task)
        for path, explicit in paths.items():
            spec = read_model_spec(path)
            missing = [t for t in explicit if t not in spec.tasks]
            if missing:
                raise ModelError(f"{path} was given for {', '.join(missing)} but serves only {', '.join(spec.tasks)}")
            backend = create_backend(spec, settings)
            tokenizer = BertTokenizer.from_dir(path)
            limits = [spec.max_position_embeddings, settings.max_input_length, backend.max_sequence_length]
            max_length = min(x for x in limits if x)
            if max_length > settings.max_batch_tokens:
                raise ModelError(f"max_batch_tokens ({settings.max_batch_tokens}) must be at least the longest "
                                 f"input ({max_length} tokens); raise it or lower --max-input-length")
            unit = ModelUnit(spec, backend, tokenizer, max_length)
            self.units.append(unit)
            # An explicit per-task model wins over --model for that task.
            for task in (explicit or spec.tasks):
                if task not in self.by_task or explicit:
                    self.by_task[task] = unit
        for unit in self.units:
            unit.tasks = [t for t, u in self.by_task.items() if u is unit]
        log.info("serving %s", {t: str(u.spec.path) for t, u in self.by_task.items()})

    def warmup(self) -> None:
        for unit in self.units:
            started = time.monotonic()
            unit.backend.warmup(max_length=min(unit.max_length, 128), max_batch=self.max_batch_requests(unit))
            log.info("warmed up %s (%s) in %.2fs", unit.spec.path.name, unit.backend.name, time.monotonic() - started)

    def max_batch_requests(self, unit: ModelUnit) -> int:
        return min(x for x in (self.settings.max_batch_requests, unit.backend.max_batch_size) if x)

    def start(self) -> None:
        for unit in self.units:
            unit.batcher = Batcher(
                unit.backend, max_batch_tokens=self.settings.max_batch_tokens,
                max_batch_requests=self.max_batch_requests(unit), max_wait_ms=self.settings.max_wait_ms,
                workers=self.settings.effective_inference_workers if unit.backend.concurrent_runs else 1,
                max_padding=self.settings.effective_max_padding,
                pad_token_id=unit.tokenizer.pad_token_id,
                pad_to_multiple_of=8 if self.settings.device == "cuda" else None,
                metrics=self.metrics, name=unit.spec.path.name)
            unit.batcher.start()

    async def stop(self) -> None:
        for unit in self.units:
            if unit.batcher is not None:
                await unit.batcher.stop()
            unit.backend.close()
        self._light_lane.shutdown(wait=False, cancel_futures=True)
        self._heavy_lane.shutdown(wait=False, cancel_futures=True)

    # ---- description ----------------------------------------------------------------------
    @property
    def tasks(self) -> list[str]:
        return [t for t in TASKS if t in self.by_task]

    @property
    def model_name(self) -> str:
        return ",".join(dict.fromkeys(u.spec.name for u in self.units))

    @property
    def backend_name(self) -> str:
        return ",".join(dict.fromkeys(u.backend.name for u in self.units))

    @property
    def precision(self) -> str:
        return ",".join(dict.fromkeys(u.backend.precision for u in self.units))

    @property
    def max_input_length(self) -> int:
        return min(u.max_length for u in self.units)

    def labels(self) -> dict[str, list[str]]:
        return {t: [labels[i] for i in sorted(labels)]
                for t, u in self.by_task.items() for labels in [u.spec.labels.get(t, {})]}

    # ---- helpers --------------------------------------------------------------------------
    def _unit(self, task: str) -> ModelUnit:
        unit = self.by_task.get(task)
        if unit is None:
            raise TaskNotServed(f"this server does not serve {task}; it serves {', '.join(self.tasks)}")
        return unit

    async def _off_loop(self, fn: Callable[[], Any], chars: int = 0) -> Any:
        """Tokenising and decoding are CPU work: never on the event loop. `chars`, the request's text size,
        picks the lane."""
        lane = self._heavy_lane if chars > LIGHT_REQUEST_CHARS else self._light_lane
        try:
            return await asyncio.get_running_loop().run_in_executor(lane, fn)
        except InputTooLong as e:
            raise ValidationFailed(str(e)) from None
        except qa_codec.QuestionTooLong as e:
            raise ValidationFailed(str(e)) from None
        except ServingError:
            raise
        except (ValueError, TypeError, UnicodeError) as e:
            raise ValidationFailed(f"cannot encode the input: {e}") from None

    async def _infer(self, unit: ModelUnit, features: list, ticket: Ticket, timing: Timing) -> list[SequenceResult]:
        futures = unit.batcher.submit(features, ticket)
        try:
            results = await asyncio.gather(*futures, return_exceptions=True)
        except asyncio.CancelledError:
            ticket.cancelled = True
            for f in futures:
                f.cancel()
            raise
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            ticket.cancelled = True
            error = errors[0]
            if isinstance(error, ServingError):
                raise error
            raise BackendFailure(f"inference failed: {type(error).__name__}")
        timing.add(results)
        return results

    # ---- tasks ----------------------------------------------------------------------------
    async def classify(self, inputs: list, *, top_k: int | None, function: str | None, truncate: bool,
                       ticket: Ticket, timing: Timing) -> list[list[dict]]:
        unit = self._unit("classify")
        chars = _chars(inputs)
        features = await self._off_loop(lambda: classify_codec.encode(
            unit.tokenizer, [tuple(x) if isinstance(x, list) else x for x in inputs],
            max_length=unit.max_length, truncate=truncate), chars)
        results = await self._infer(unit, features, ticket, timing)
        logits = np.stack([r.outputs["classify"] for r in results])
        return await self._off_loop(lambda: classify_codec.decode(
            logits, unit.spec.labels["classify"], top_k=top_k, function=function,
            problem_type=unit.spec.problem_type), chars)

    async def ner(self, texts: list[str], *, aggregation: str, truncate: bool, ticket: Ticket,
                  timing: Timing) -> list[list[dict]]:
        unit = self._unit("ner")
        chars = _chars(texts)
        features = await self._off_loop(lambda: ner_codec.encode(
            unit.tokenizer, texts, max_length=unit.max_length, truncate=truncate), chars)
        results = await self._infer(unit, features, ticket, timing)
        id2label = unit.spec.labels["ner"]
        return await self._off_loop(lambda: [
            ner_codec.decode(f, r.outputs["ner"], id2label, aggregation=aggregation, word_from_text=True)
            for f, r in zip(features, results)], chars)

    def qa_limits(self, unit: ModelUnit | None = None) -> tuple[int, int, int]:
        """(tokens per window, question tokens kept, largest doc_stride) for the QA model."""
        unit = unit or self._unit("qa")
        max_length = min(self.settings.qa_max_length, unit.max_length)
        max_query = min(self.settings.qa_max_question_length, max_length // 2)
        # Neighbours share at most half of the narrowest window, so each window advances by at least half a
        # window: the window count stays within 2x of the unshared count, and is known before any is built.
        return max_length, max_query, (max_length - max_query - 3) // 2

    async def qa(self, items: list[dict], *, truncate: bool = False, ticket: Ticket,
                 timing: Timing) -> list[list[dict]]:
        """items: {question, context, top_k, max_answer_len, doc_stride} -> per item its answers, best first."""
        unit = self._unit("qa")
        max_length, max_query, max_stride = self.qa_limits(unit)
        strides = []
        for index, item in enumerate(items):
            stride = item.get("doc_stride")
            if stride is not None and stride > max_stride:
                where = f"[{index}].doc_stride" if len(items) > 1 else "doc_stride"
                raise ValidationFailed(f"{where}: {stride} is more than half a window; at most "
                                       f"{max_stride} with {max_length}-token windows")
            strides.append(min(DEFAULT_DOC_STRIDE, max_stride) if stride is None else stride)
        limit = self.settings.qa_max_windows

        def encode_all():
            windows, used = [], 0
            for item, stride in zip(items, strides):
                if ticket.cancelled:  # the caller has gone (its route has stopped waiting): stop working for it
                    raise CallerGone()
                try:
                    item_windows = qa_codec.encode(
                        unit.tokenizer, item["question"], item["context"], max_length=max_length, doc_stride=stride,
                        max_query_length=max_query, truncate_question=item.get("truncate", truncate),
                        max_windows=limit - used)
                except qa_codec.TooManyWindows as e:
                    needed = "more than " + str(limit) if e.needed is None else str(used + e.needed)
                    raise PayloadTooLarge(
                        f"the contexts of this request need {needed} windows of {max_length} tokens; the limit is "
                        f"{limit} (qa_max_windows): send shorter contexts or fewer items") from None
                used += len(item_windows)
                windows.append(item_windows)
            return windows

        chars = sum(len(item["context"]) + len(item["question"]) for item in items)
        windows = await self._off_loop(encode_all, chars)
        flat = [w for item_windows in windows for w in item_windows]
        results = await self._infer(unit, flat, ticket, timing)

        def decode_all():
            answers, at = [], 0
            for item, item_windows in zip(items, windows):
                mine = results[at: at + len(item_windows)]
                at += len(item_windows)
                found = qa_codec.decode(item["context"], item_windows, [r.outputs["qa_start"] for r in mine],
                                        [r.outputs["qa_end"] for r in mine], top_k=item["top_k"],
                                        max_answer_len=item["max_answer_len"])
                answers.append(found or [{"answer": "", "score": 0.0, "start": 0, "end": 0}])
            return answers

        return await self._off_loop(decode_all, chars)


def _chars(inputs: list) -> int:
    return sum(len(x) if isinstance(x, str) else sum(map(len, x)) for x in inputs)


def check_batch(inputs: list, limit: int, field: str = "inputs") -> None:
    """Refuse an empty request, or one with more inputs than a request may carry, before any work."""
    if not inputs:
        raise EmptyInput(f"{field} is empty")
    if len(inputs) > limit:
        raise PayloadTooLarge(f"{len(inputs)} inputs in one request; the limit is {limit} (max_client_batch_size)")


def check_texts(texts: list, field: str = "inputs[{}]") -> None:
    """An empty or blank text has nothing to classify, tag or embed: 400, not a confident answer about nothing.
    `field` names the text in the message ("{}" takes its index)."""
    for index, text in enumerate(texts):
        parts = [text] if isinstance(text, str) else text
        if any(not part.strip() for part in parts):
            raise EmptyInput(f"{field.format(index)} is empty")
