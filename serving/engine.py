"""The glue between routes and models: tokenise -> queue -> batch -> decode (on the event loop for small
requests, in a codec thread otherwise).

One ModelUnit per served model (a directory under a name): its backend, tokenizer and its own batcher. A
multi-task model serving several tasks under one name is one unit, so a batch may mix classify, ner and qa
sequences: one forward pass gives every head's output and each sequence takes the head its request asked for.
Several names for one directory (--classify-model a=DIR --classify-model b=DIR) share its backend, loaded once,
but each has its own batcher: a queue of its own, so load on one model never queues in front of another's.
Every batcher runs its batches through the device's one ComputeGate (serving/batcher.py): the models share the
device's cores without oversubscribing them, and take turns on them fairly.
Loading, the backends and the task's encode and decode are the inference runtime's (runtime/), as a batch job
runs them; what is the server's own is the queue shared by requests, the lanes and the verification.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bert.tasks import TASKS
from bert.tasks.base import Task
from bert.tasks.common import Limits
from runtime.artifact import verify_graph
from runtime.inference import Encoded, Inference
from runtime.loading import LoadedModel, LoadOptions, exact_model_problem, load_model
from runtime.model_dir import ModelError, resolve_model_path
from serving.batcher import Batcher, ComputeGate, SequenceResult, Ticket
from serving.errors import BackendFailure, NotFound, ServingError, refusal
from serving.settings import DEMO_MODEL_DIR, NamedModel, Settings, default_model_name

log = logging.getLogger("bertserve")
# A request whose texts add up to more than this goes to the long lane (see Engine.__init__).
LIGHT_REQUEST_CHARS = 8192
# A request of a sequence-level task (classify, embed) whose texts add up to at most this, and that asks for
# no truncation, is tokenised and decoded on the event loop: the two thread hand-offs cost more than the work.
# The bound keeps the loop's stall short whatever the request. Per-token tasks (ner, qa) stay in threads:
# their decoding in Python grows with every token. Truncation stays off the loop: it takes a lock a long
# request may hold. Measured: docs/serving.md, "Why it is built this way".
INLINE_REQUEST_CHARS = 1024


def version() -> str:
    try:
        from importlib.metadata import version as _version

        return _version("bertserve")
    except Exception:  # noqa: BLE001 - running from a checkout that is not installed
        return "0.1.0"


class TaskNotServed(NotFound):
    """A task the registry knows but this server's models do not serve."""


class ModelNotServed(NotFound):
    """A request's "model" that is none of its task's models; the message lists them."""


@dataclass
class Timing:
    """Per request: the longest queue wait and model time among its sequences."""

    queue_s: float = 0.0
    inference_s: float = 0.0
    tokens: int = 0  # model input tokens of all its sequences (special tokens included)
    items: int = 0  # texts, pairs or QA items asked for (the access log's "items")
    verified: int = 0  # items answered again by the exact model (--TASK-verify-model)
    # With --otlp-endpoint only (serving/tracing.py): the model and task that ran, and the phases as
    # (name, start, end) in time.monotonic(). None otherwise: no stamps taken.
    trace: dict | None = None

    def add(self, results: list[SequenceResult]) -> None:
        for r in results:
            self.queue_s = max(self.queue_s, r.queue_s)
            self.inference_s = max(self.inference_s, r.inference_s)


@dataclass
class ModelUnit(LoadedModel):
    """A loaded model as the server runs it: with its own batcher and the tasks it serves."""

    batcher: Batcher | None = None
    tasks: list[str] = field(default_factory=list)
    name: str = ""  # what a request's "model" selects it by
    named: bool = False  # the name was given (NAME=DIR), not taken from the directory


def load_options(settings: Settings) -> LoadOptions:
    """How the runtime loads and runs the server's models, from its settings."""
    return LoadOptions(
        backend=settings.backend,
        device=settings.device,
        precision=settings.precision,
        pooling=settings.pooling,
        allow_unverified=settings.allow_unverified,
        max_input_length=settings.max_input_length,
        max_batch_tokens=settings.max_batch_tokens,
        threads=settings.threads,
        inference_workers=settings.inference_workers,
        torch_packed=settings.torch_packed,
        torch_cuda_graphs=settings.torch_cuda_graphs,
        torch_gelu_epilogue=settings.torch_gelu_epilogue,
    )


class Engine:
    def __init__(self, settings: Settings, metrics=None):
        self.settings = settings
        self.load_options = load_options(settings)
        self.metrics = metrics
        self.units: list[ModelUnit] = []
        self.by_task: dict[str, ModelUnit] = {}  # task -> its default model (the first given)
        self.models: dict[str, dict[str, ModelUnit]] = {}  # task -> name -> model, the default first
        self.verify: dict[str, ModelUnit] = {}  # task -> the exact model that re-answers its unsure items
        # The one device every model runs on, shared by their batchers: as many batches at once as the inference
        # workers of one model would run, so that several models together never run more than one would alone.
        self.gate = ComputeGate(settings.effective_inference_workers)
        # Two lanes for tokenising and decoding: a request with long texts (QA contexts, big batches) waits
        # behind other long ones only, never in front of a one-line /classify. Work per request is bounded
        # anyway (tokens, windows, inputs), so one thread is enough for the long lane.
        self._light_lane = ThreadPoolExecutor(max_workers=2, thread_name_prefix="codec")
        self._heavy_lane = ThreadPoolExecutor(max_workers=1, thread_name_prefix="codec-long")
        # (id of a unit, task) -> the Limits of its requests and its Inference: fixed once the models are loaded, so
        # built once rather than per request (the units live as long as the engine, so their ids are never reused)
        self._pipelines: dict[tuple[int, str], tuple[Limits, Inference]] = {}
        self.traced = False  # --otlp-endpoint: requests stamp their phases (Timing.trace) for serving/tracing.py

    # ---- lifecycle ------------------------------------------------------------------------
    def load(self) -> None:
        """Resolve every task's models and build one backend per distinct directory, one unit per (directory,
        name): the tasks one name gives one directory share that unit's batcher."""
        settings = self.settings
        wanted = settings.task_models()
        default = settings.model
        if default is None and not wanted:
            if not DEMO_MODEL_DIR.is_dir():
                raise ModelError(
                    "the built-in demo model is not in this build (serving/demo_model/, see the "
                    'README\'s "Demo model"); pass --model PATH'
                )
            default = str(DEMO_MODEL_DIR)
        # (directory, name) -> the tasks a flag gave it for, and whether it is --model's (then also every task it
        # has that no flag names: `--model DIR --zero-shot-model DIR` is DIR for zero-shot and for the rest)
        asked: dict[tuple[Path, str], tuple[NamedModel, list[str], bool]] = {}
        if default is not None:
            model = NamedModel(default_model_name(default), default, False)
            asked[(resolve_model_path(default), model.name)] = (model, [], True)
        for task, models in wanted.items():
            for model in models:
                asked.setdefault((resolve_model_path(model.source), model.name), (model, [], False))[1].append(task)
        built: dict[Path, ModelUnit] = {}  # one backend per directory, whatever names it goes by
        for (path, name), (model, explicit, every) in asked.items():
            # a directory is loaded once, for every task any of its names is given for (a task served only where
            # asked is then in the backend every name shares)
            load_for = (
                explicit if path in built else [t for (p, _), (_, ts, _) in asked.items() if p == path for t in ts]
            )
            unit = self._build_unit(path, load_for, shared=built.get(path))
            built.setdefault(path, unit)
            unit.name, unit.named = name, model.named
            self.units.append(unit)
            # An explicit per-task model wins over --model for that task.
            for task in explicit + ([t for t in unit.backend.tasks if t not in wanted] if every else []):
                self.models.setdefault(task, {})[name] = unit
        self.models = {t: self.models[t] for t in TASKS if t in self.models}
        self.by_task = {t: next(iter(models.values())) for t, models in self.models.items()}
        # a task with margins may have --TASK-verify-model; one exact model given for several tasks is loaded once,
        # one unit (one batcher) re-answering all of them
        asked_verify = {
            task: (name, f"--{task.name.replace('_', '-')}-verify-model")
            for task in TASKS.values()
            if (name := getattr(settings, f"{task.name}_verify_model", None)) is not None
        }
        if settings.verify_model is not None:  # every other served task with margins
            for task in TASKS.values():
                if task.verify_margin is not None and task.name in self.by_task and task not in asked_verify:
                    asked_verify[task] = (settings.verify_model, "--verify-model")
            if not asked_verify:
                raise ModelError(
                    f"--verify-model {settings.verify_model}: no served task can tell an unsure answer (those that "
                    f"can: {', '.join(t.name for t in TASKS.values() if t.verify_margin is not None)})"
                )
        for task in TASKS.values():  # an int8 artifact's own fp32 graph (export's --verify-graph), unless told not
            if settings.ignore_verify_graph or task.verify_margin is None or task in asked_verify:
                continue
            if len(self.models.get(task.name, {})) == 1:
                served = self.by_task[task.name]
                graph = verify_graph(served.spec, check=not settings.allow_unverified)
                if graph is not None:
                    asked_verify[task] = (str(graph), f"the verify graph of {served.spec.path}")
        verify_for: dict[Path, list[str]] = {}
        for task, (name, _) in asked_verify.items():
            verify_for.setdefault(resolve_model_path(name), []).append(task.name)
        verify_built: dict[Path, ModelUnit] = {}
        for task, (name, flag) in asked_verify.items():
            unit = self._verify_unit(task, name, flag, verify_for, verify_built)
            self.verify[task.name] = unit
            if unit not in self.units:
                self.units.append(unit)
        for path, unit in verify_built.items():
            unit.name = "+".join(verify_for[path]) + "-verify"
        for unit in self.units:
            unit.tasks = [t for t, models in self.models.items() if unit in models.values()]
            quality = unit.spec.config.get("embedding_quality")
            vectors = [t for t in unit.tasks if TASKS[t].head is None]  # the tasks the encoder itself serves
            if vectors and isinstance(quality, dict) and quality.get("warning"):
                log.warning("%s: %s: %s", unit.spec.path.name, ", ".join(vectors), quality["warning"])
            for task in (TASKS[t] for t in unit.tasks):
                if task.many_inputs_per_item and unit.spec.kind == "checkpoint" and settings.device == "cpu":
                    # Its items are many model inputs each; the server never exports itself.
                    route, flag = task.routes[0].path if task.routes else task.name, task.name.replace("_", "-")
                    log.warning(
                        "%s is served from the checkpoint %s in torch fp32 on CPU; its ONNX export is much faster: "
                        "python -m export.onnx --ckpt %s (the default writes int8 where it agrees with fp32), then "
                        "--%s-model ARTIFACT_DIR",
                        route,
                        unit.spec.path,
                        unit.spec.path,
                        flag,
                    )
        log.info("serving %s", {t: {n: str(u.spec.path) for n, u in m.items()} for t, m in self.models.items()})

    def _build_unit(self, path: Path, explicit: list[str], shared: ModelUnit | None = None) -> ModelUnit:
        """The unit of `path` for the tasks `explicit`; `shared`: the unit already built for that directory under
        another name, whose spec, tokenizer and backend it shares (one load)."""
        if shared is not None:
            missing = [t for t in explicit if t not in shared.backend.tasks]
            if missing:
                raise ModelError(
                    f"{path} was given for {', '.join(missing)} but serves only {', '.join(shared.backend.tasks)}"
                )
            return ModelUnit(shared.spec, shared.backend, shared.tokenizer, shared.max_length)
        model = load_model(path, self.load_options, explicit)
        return ModelUnit(model.spec, model.backend, model.tokenizer, model.max_length)

    def _verify_unit(
        self, task: Task, name: str, flag: str, verify_for: dict[Path, list[str]], built: dict[Path, ModelUnit]
    ) -> ModelUnit:
        """The exact model that re-answers `task`'s unsure items (those its `margins` finds unsure): it must read
        the served model's token ids as the same words and take its longest sequences. `verify_for`: the tasks
        each exact model is given for, loaded once (`built`) for all of them."""
        if task.verify_margin is None:  # no margins (the registry holds the two together)
            raise ModelError(f"{flag} {name}: {task.name} has no notion of an unsure answer to verify")
        task = task.name
        served = self.by_task.get(task)
        if served is None:
            raise ModelError(f"{flag} {name}: this server does not serve {task}")
        if len(self.models[task]) > 1:
            raise ModelError(
                f"{flag} {name}: {task} has several models ({', '.join(self.models[task])}); the exact model re-answers "
                "the items of one"
            )
        path = resolve_model_path(name)
        if path == served.spec.path:
            raise ModelError(
                f"{flag} {name} is the model that already serves {task}; give the exact one "
                "(e.g. the fp32 export beside an int8 --model)"
            )
        try:
            unit = built.get(path) or built.setdefault(path, self._build_unit(path, verify_for[path]))
        except ModelError as e:
            raise ModelError(f"{flag}: {e}") from None
        problem = exact_model_problem(unit, served)
        if problem:
            raise ModelError(f"{flag} {name} (for {task}): {problem}")
        return unit

    def warmup(self) -> None:
        for unit in self._backend_owners():  # a shared backend once
            started = time.monotonic()
            unit.backend.warmup(max_length=min(unit.max_length, 128), max_batch=self.max_batch_requests(unit))
            log.info("warmed up %s (%s) in %.2fs", unit.spec.path.name, unit.backend.name, time.monotonic() - started)

    def _backend_owners(self) -> list[ModelUnit]:
        """One unit per distinct backend (units sharing a directory share its backend)."""
        owners: dict[int, ModelUnit] = {}
        for unit in self.units:
            owners.setdefault(id(unit.backend), unit)
        return list(owners.values())

    def max_batch_tokens(self, unit: ModelUnit) -> int:
        return self.settings.effective_max_batch_tokens(unit.backend.cpu_batch_tokens)

    def max_batch_requests(self, unit: ModelUnit) -> int:
        wanted = self.settings.effective_max_batch_requests(unit.backend.cpu_batch_requests)
        return min(x for x in (wanted, unit.backend.max_batch_size) if x)

    def start(self) -> None:
        for unit in self._backend_owners():
            if not unit.backend.concurrent_runs:  # e.g. a TensorRT engine shared by two names: one run at a time
                self.gate.one_at_a_time(unit.backend)
        for unit in self.units:
            unit.batcher = Batcher(
                unit.backend,
                max_batch_tokens=self.max_batch_tokens(unit),
                max_batch_requests=self.max_batch_requests(unit),
                max_wait_ms=self.settings.max_wait_ms,
                workers=self.settings.effective_inference_workers if unit.backend.concurrent_runs else 1,
                max_padding=self.settings.effective_max_padding,
                pad_to_multiple_of=unit.backend.pad_to_multiple_of,
                metrics=self.metrics,
                name=unit.name or unit.spec.path.name,
                labels={"task": "+".join(unit.tasks) or "verify", "model": unit.name},
                gate=self.gate,
            )
            if unit in self.verify.values():
                self.gate.passing(unit.batcher)
            unit.batcher.start()

    async def stop(self) -> None:
        for unit in self.units:
            if unit.batcher is not None:
                await unit.batcher.stop()
        for unit in self._backend_owners():  # a shared backend once
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
        """The longest input every served model takes (/info's top-level field; each model's own limit is in
        models_info): in a server of one model, that model's."""
        return min(u.max_length for u in self.units)

    def models_info(self) -> dict[str, list[dict]]:
        """Per task, its models in order (the first is the default): name, directory, its own longest input in
        tokens, and labels where the task has them."""
        return {
            task: [
                {
                    "name": name,
                    "path": str(unit.spec.path),
                    "max_input_length": unit.max_length,
                    **({"labels": self._labels_of(unit, task)} if TASKS[task].labelled else {}),
                }
                for name, unit in models.items()
            ]
            for task, models in self.models.items()
        }

    @staticmethod
    def _labels_of(unit: ModelUnit, task: str) -> list[str]:
        labels = unit.spec.labels.get(task, {})
        return [labels[i] for i in sorted(labels)]

    def embedding_info(self) -> dict | None:
        """What the encoder's pooled vectors are, in the model that serves the tasks without a head of their own
        (each such task answers from them): how they are pooled and normalised, their dimensions, and what is
        known of them (a model directory may say, in config.json's "embedding_quality", how they were measured
        against a reference). None when no such task is served."""
        unit = next((self.by_task[t] for t in self.tasks if TASKS[t].head is None), None)
        if unit is None:
            return None
        info = {"dimensions": unit.dimensions, **unit.spec.pooling.describe()}
        if unit.spec.config.get("embedding_quality"):
            info["quality"] = unit.spec.config["embedding_quality"]
        return info

    def verify_margin(self, task: str) -> float:
        return getattr(self.settings, f"{task}_verify_margin")

    def verify_info(self) -> dict[str, dict]:
        return {
            task: {
                "model": unit.spec.name,
                "path": str(unit.spec.path),
                "precision": unit.backend.precision,
                "margin": self.verify_margin(task),
            }
            for task, unit in self.verify.items()
        }

    def labels(self) -> dict[str, list[str]]:
        """The labels of each served task that has them (classify, ner), in output order."""
        return {
            t: [labels[i] for i in sorted(labels)]
            for t, u in self.by_task.items()
            if TASKS[t].labelled
            for labels in [u.spec.labels.get(t, {})]
        }

    # ---- helpers --------------------------------------------------------------------------
    def unit(self, task: str, model: str | None = None) -> ModelUnit:
        """The model serving `task` that a request's "model" names (None: the task's default): what a request
        resolves once, before any other check, and runs on. A task served by one
        model given without a name (a plain DIR, or --model) answers whatever name a request sends, as a server
        of one model always has (OpenAI's clients must send one); once a task has a named model or several,
        the name must be one of them."""
        unit = self.by_task.get(task)
        if unit is None:
            raise TaskNotServed(f"this server does not serve {task}; it serves {', '.join(self.tasks)}")
        if model is None:
            return unit
        models = self.models[task]
        if model in models:
            return models[model]
        if len(models) == 1 and not unit.named:
            return unit
        raise ModelNotServed(f"model {model!r} is not served for {task}; its models: {', '.join(models)}")

    def answers_as(self, task: str, unit: ModelUnit) -> str:
        """The model name a request for `task` run on `unit` answers with: a task of several models, or of a named
        one, or a server of several models, names the model that ran; else the server's name (its models' names)."""
        several = len(self.models[task]) > 1 or len(self.units) > 1
        return unit.name if several or unit.named else self.model_name

    def _lane(self, task: Task, chars: int, options: dict) -> ThreadPoolExecutor | None:
        """Where a request's tokenising and decoding run, by its task and text size `chars`: None (on the
        event loop) for a small sequence-level request that asks for no truncation, else the light or the
        long lane."""
        if not task.per_token and chars <= INLINE_REQUEST_CHARS and not options.get("truncate"):
            return None
        return self._heavy_lane if chars > LIGHT_REQUEST_CHARS else self._light_lane

    async def _codec(self, fn: Callable[[], Any], lane: ThreadPoolExecutor) -> Any:
        """Run a codec step in `lane`, its refusals as in _codec_here."""
        return await asyncio.get_running_loop().run_in_executor(lane, self._codec_here, fn)

    @staticmethod
    def _codec_here(fn: Callable[[], Any]) -> Any:
        """Run a codec step here (on the event loop when called there: no coroutine to await). A codec's refusals
        become the client's errors as serving/errors.py's table says (too much work 413, an input too long 422...)."""
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - a refusal is the client's error, anything else stays a fault
            error = refusal(e)
            if error is None:
                raise
            raise error from None

    async def _infer(self, unit: ModelUnit, features: list, ticket: Ticket, timing: Timing) -> list[SequenceResult]:
        submitted = time.monotonic() if timing.trace is not None else 0.0
        futures = unit.batcher.submit(features, ticket)
        try:
            if len(futures) == 1:
                # Most requests are one sequence: awaiting its future spares gather's own future and callbacks.
                results = [await _outcome(futures[0])]
            else:
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
        if timing.trace is not None and results:
            # The batcher's stamps, as offsets from the submission: every sequence was queued then.
            waited = [r.queue_s for r in results]
            phases = timing.trace["phases"]
            phases.append(("queue", submitted, submitted + max(waited)))
            ran = max(r.queue_s + r.inference_s for r in results)
            phases.append(("inference", submitted + min(waited), submitted + ran))
        return results

    # ---- the one inference path, whatever the task ---------------------------------------------
    def limits(self, unit: ModelUnit) -> Limits:
        return Limits(
            max_length=unit.max_length,
            max_sequences=self.settings.max_request_sequences,
            qa_max_length=self.settings.qa_max_length,
            qa_max_question_length=self.settings.qa_max_question_length,
        )

    def _pipeline(self, unit: ModelUnit, task: Task) -> tuple[Limits, Inference]:
        """The Limits of a request to `unit` and the Inference that encodes and decodes its `task` there."""
        key = (id(unit), task.name)
        known = self._pipelines.get(key)
        if known is None:
            known = self._pipelines[key] = (self.limits(unit), Inference(unit, task))
        return known

    async def infer(
        self, unit: ModelUnit, task: Task, items: list, options: dict, *, ticket: Ticket, timing: Timing
    ) -> list:
        """items (texts, pairs or QA items) -> one answer per item, on `unit` (the request's model, resolved once by
        `unit()`): the runtime's Inference encodes them (in the request's lane), the unit's batcher runs their
        sequences, the Inference decodes the outputs."""
        lane = self._lane(task, task.request_chars(items, options), options)
        limits, inference = self._pipeline(unit, task)
        phases = None
        if self.traced:
            if timing.trace is None:  # a request may run more than one inference (its phases add up)
                timing.trace = {"model": unit.name or unit.spec.name, "task": task.name, "phases": []}
            phases = timing.trace["phases"]
            begun = time.monotonic()

        def encode():
            return inference.encode(items, limits, options, cancelled=lambda: ticket.cancelled)

        encoded = self._codec_here(encode) if lane is None else await self._codec(encode, lane)
        if phases is not None:
            phases.append(("tokenize", begun, time.monotonic()))
        sequences = encoded.sequences
        results = await self._infer(unit, sequences, ticket, timing)
        timing.tokens += sum(len(f) for f in sequences)
        timing.items += len(items)
        outputs = encoded.per_item([r.outputs for r in results])

        def decode():
            return inference.decode(encoded, outputs, options)

        def unsure_else_decode():
            # the items the exact model answers again; where there are none (most requests), the answers in the
            # same codec step
            unsure = inference.unsure(encoded, outputs, options, self.verify_margin(task.name))
            return (unsure, None) if unsure else (unsure, decode())

        async def step(fn):
            return self._codec_here(fn) if lane is None else await self._codec(fn, lane)

        begun = time.monotonic()
        if task.name in self.verify:
            unsure, answers = await step(unsure_else_decode)
            if unsure:
                await self._verify(task, encoded, unsure, outputs, ticket, timing)
                begun = time.monotonic()
                answers = await step(decode)
        else:
            answers = await step(decode)
        if phases is not None:
            phases.append(("decode", begun, time.monotonic()))
        return answers

    async def _verify(
        self, task: Task, encoded: Encoded, unsure: list[int], outputs: list, ticket: Ticket, timing: Timing
    ) -> None:
        """The request's `unsure` items (their margins under --TASK-verify-margin) run again on the exact model;
        their outputs are replaced in place."""
        again = encoded.subset(unsure)
        results = await self._infer(self.verify[task.name], again.sequences, ticket, timing)
        for i, item_outputs in zip(unsure, again.per_item([r.outputs for r in results])):
            outputs[i] = item_outputs
        timing.verified += len(unsure)


async def _outcome(future: asyncio.Future):
    """What gather(..., return_exceptions=True) gives for one future: its result, or its exception (its
    CancelledError when the future alone was cancelled); CancelledError raised when the awaiting task is."""
    try:
        return await future
    except asyncio.CancelledError as e:
        if asyncio.current_task().cancelling() or not future.cancelled():
            raise
        return e
    except Exception as e:  # noqa: BLE001 - handed back as gather hands it back
        return e
