"""Tasks: one object per task (bert/tasks/<name>.py, `TASK`), found by the registry (`bert.tasks.registry`).

numpy + tokenizers only (no torch, no transformers): the server imports these with an ONNX or
TensorRT backend and no torch installed. Decoders reproduce transformers' pipelines' outputs.
"""

from bert.tasks.base import Head, Route, Task, UnknownTask  # noqa: E402
from bert.tasks.common import Features, pad_batch, sigmoid, softmax
from bert.tasks.registry import TASKS, get, register  # noqa: E402

__all__ = [
    "Features",
    "pad_batch",
    "softmax",
    "sigmoid",
    "TASKS",
    "Task",
    "Head",
    "Route",
    "UnknownTask",
    "get",
    "register",
]
