"""Backends, and the registry that makes them: a backend joins by name with the module that defines it, which
is imported only when that backend is chosen (torch and tensorrt are large, and absent from a CPU image).

    create_backend(spec, settings)  # settings.backend: a registered name, "auto", or "package.module:factory"
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from runtime.backends.base import Backend
from runtime.model_dir import ModelError, ModelSpec


@dataclass(frozen=True)
class BackendEntry:
    name: str
    target: str  # "package.module:Class", imported when chosen
    kinds: tuple[str, ...]  # model directory kinds it runs (ModelSpec.kind); "auto" picks the first that lists one


BACKENDS: dict[str, BackendEntry] = {}


def register_backend(name: str, target: str, kinds: tuple[str, ...]) -> None:
    BACKENDS[name] = BackendEntry(name, target, kinds)


register_backend("torch", "runtime.backends.torch_backend:TorchBackend", ("checkpoint",))
register_backend("onnxruntime", "runtime.backends.onnx_backend:OnnxBackend", ("onnx",))
register_backend("tensorrt", "runtime.backends.tensorrt_backend:TensorRTBackend", ("tensorrt",))


def _load(target: str):
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def create_backend(spec: ModelSpec, settings) -> Backend:
    choice = settings.backend
    if ":" in choice:  # "package.module:factory": a backend of one's own (tests use ones that fail on purpose)
        return _load(choice)(spec, settings)
    if choice == "auto":
        choice = next(e.name for e in BACKENDS.values() if spec.kind in e.kinds)
    entry = BACKENDS.get(choice)
    if entry is None:
        raise ModelError(f"unknown backend {choice!r}; registered: {', '.join(BACKENDS)}")
    if spec.kind not in entry.kinds:
        raise ModelError(
            f"the {choice} backend runs {' or '.join(entry.kinds)} directories; {spec.path} is "
            f"a{'n' if spec.kind[0] in 'aeiou' else ''} {spec.kind} directory"
        )
    return _load(entry.target)(spec, settings)


__all__ = ["BACKENDS", "Backend", "BackendEntry", "ModelError", "ModelSpec", "create_backend", "register_backend"]
