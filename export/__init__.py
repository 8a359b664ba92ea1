"""Checkpoint -> deployable artifacts: ONNX export and verification (export.onnx), TensorRT engines
(export.tensorrt; its engine runtime is bert.tensorrt_runtime, shared with serving), Triton model repositories (export.triton). Of bertserve it imports bert/, and runtime/ to
measure an int8 graph answered as a server runs it (export/verified.py). See docs/export.md.

The modules a server imports (manifest, triton) need no torch.
"""
