"""Checkpoint -> deployable artifacts: ONNX export and verification (export.onnx), TensorRT engines
(export.tensorrt, export.tensorrt_runtime), Triton model repositories (export.triton). See docs/export.md.

The modules a server imports (manifest, tensorrt_runtime, triton) need no torch.
"""
