"""Task codecs: text -> model inputs (encode) and model outputs -> answers (decode).

numpy + tokenizers only (no torch, no transformers): the server imports these with an ONNX or
TensorRT backend and no torch installed. Decoders reproduce transformers' pipelines' outputs.
"""
from bert.tasks.common import Features, pad_batch, sigmoid, softmax
from bert.tasks import classify, ner, qa  # noqa: E402  (after the shared pieces they import)

TASKS = ("classify", "ner", "qa")

__all__ = ["Features", "pad_batch", "softmax", "sigmoid", "TASKS", "classify", "ner", "qa"]
