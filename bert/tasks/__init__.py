"""Task codecs: text -> model inputs (encode) and model outputs -> answers (decode), and the registry
(`bert.tasks.registry`) that declares each task once for the rest of bertserve.

numpy + tokenizers only (no torch, no transformers): the server imports these with an ONNX or
TensorRT backend and no torch installed. Decoders reproduce transformers' pipelines' outputs.
"""
from bert.tasks.common import Features, pad_batch, sigmoid, softmax
from bert.tasks import classify, embed, ner, qa  # noqa: E402  (after the shared pieces they import)
from bert.tasks.registry import TASKS, Task, register  # noqa: E402

__all__ = ["Features", "pad_batch", "softmax", "sigmoid", "TASKS", "Task", "register", "classify", "ner", "qa",
           "embed"]
