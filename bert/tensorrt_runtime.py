"""TrtEngine: run a serialized TensorRT engine (model.plan) on numpy inputs.

Shared by export (which checks the engine it built) and serving's TensorRT backend, so it lives in the core
both may import; it needs neither of them, nor torch unless cuda-python is missing.

TensorRT 10/11 name-based I/O: `context.set_input_shape`, `context.set_tensor_address`,
`context.execute_async_v3(stream)`. Device buffers come from cuda-python when it is installed
(no torch needed), else from torch CUDA tensors. One engine object serves one thread at a time:
callers (the server's batcher) own the serialisation.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

INSTALL_HINT = (
    "TensorRT is not installed: `pip install bertserve[gpu]` (or `pip install tensorrt`) on a machine "
    "with an NVIDIA GPU and driver, or run inside the NVIDIA TensorRT container "
    "(nvcr.io/nvidia/tensorrt)"
)


class TrtEngine:
    def __init__(self, plan: str | Path, device: int = 0):
        try:
            import tensorrt as trt
        except ImportError:
            raise RuntimeError(INSTALL_HINT) from None
        self._trt = trt
        self._memory = _cuda_memory(device)
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        self.engine = self._runtime.deserialize_cuda_engine(Path(plan).read_bytes())
        if self.engine is None:
            raise RuntimeError(f"TensorRT could not deserialize {plan} (built with another TensorRT version or GPU?)")
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        is_input = {n: self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in names}
        self.input_names = [n for n in names if is_input[n]]
        self.output_names = [n for n in names if not is_input[n]]
        self.dtypes = {n: _numpy_dtype(trt, self.engine.get_tensor_dtype(n)) for n in names}
        # (min, opt, max) shapes of profile 0 per input
        self.profile = {
            n: tuple(tuple(s) for s in self.engine.get_tensor_profile_shape(n, 0)) for n in self.input_names
        }

    @property
    def max_batch(self) -> int:
        return min(p[2][0] for p in self.profile.values())

    @property
    def max_seq(self) -> int:
        return min(p[2][1] for p in self.profile.values())

    def _check(self, inputs: dict[str, np.ndarray]) -> None:
        missing = set(self.input_names) - set(inputs)
        if missing:
            raise ValueError(f"missing inputs {sorted(missing)}; the engine takes {self.input_names}")
        for name in self.input_names:
            shape = inputs[name].shape
            low, _, high = self.profile[name]
            if len(shape) != len(low) or any(not lo <= s <= hi for s, lo, hi in zip(shape, low, high)):
                raise ValueError(f"input {name} has shape {shape}; the engine was built for {low} to {high}")

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """{input name: int64 array (batch, seq)} -> {output name: array}, synchronously."""
        self._check(inputs)
        memory = self._memory
        keep = []  # device buffers alive until the stream is done
        for name in self.input_names:
            host = np.ascontiguousarray(inputs[name], dtype=self.dtypes[name])
            self.context.set_input_shape(name, host.shape)
            buffer = memory.to_device(host)
            keep.append(buffer)
            self.context.set_tensor_address(name, memory.address(buffer))
        outputs = {}
        for name in self.output_names:
            shape = tuple(self.context.get_tensor_shape(name))
            buffer = memory.empty(shape, self.dtypes[name])
            outputs[name] = (shape, buffer)
            self.context.set_tensor_address(name, memory.address(buffer))
        if not self.context.execute_async_v3(memory.stream_handle):
            raise RuntimeError("TensorRT execute_async_v3 failed")
        result = {name: memory.to_host(buffer, shape, self.dtypes[name]) for name, (shape, buffer) in outputs.items()}
        memory.synchronize()
        for buffer in keep + [b for _, b in outputs.values()]:
            memory.free(buffer)
        return result


def _numpy_dtype(trt, dtype) -> np.dtype:
    if hasattr(trt, "nptype"):
        return np.dtype(trt.nptype(dtype))
    table = {
        trt.float32: np.float32,
        trt.float16: np.float16,
        trt.int64: np.int64,
        trt.int32: np.int32,
        trt.int8: np.int8,
        trt.bool: np.bool_,
    }
    return np.dtype(table[dtype])


def _cuda_memory(device: int):
    try:
        return _CudaPythonMemory(device)
    except ImportError:
        pass
    try:
        return _TorchMemory(device)
    except ImportError:
        raise RuntimeError(
            "TrtEngine needs cuda-python (pip install cuda-python) or torch with CUDA for device buffers"
        ) from None


class _TorchMemory:
    def __init__(self, device: int):
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device")
        self.torch = torch
        self.device = torch.device("cuda", device)
        self.stream = torch.cuda.Stream(self.device)
        self.stream_handle = self.stream.cuda_stream

    def to_device(self, host: np.ndarray):
        with self.torch.cuda.stream(self.stream):
            return self.torch.from_numpy(host).to(self.device, non_blocking=False)

    def empty(self, shape, dtype):
        torch_dtype = self.torch.from_numpy(np.empty(0, dtype=dtype)).dtype
        return self.torch.empty(shape, dtype=torch_dtype, device=self.device)

    @staticmethod
    def address(buffer) -> int:
        return buffer.data_ptr()

    def to_host(self, buffer, shape, dtype) -> np.ndarray:
        self.stream.synchronize()
        return buffer.cpu().numpy().reshape(shape).astype(dtype, copy=False)

    def synchronize(self) -> None:
        self.stream.synchronize()

    @staticmethod
    def free(buffer) -> None:
        del buffer  # the caching allocator keeps it for reuse


class _CudaPythonMemory:
    def __init__(self, device: int):
        try:
            from cuda.bindings import runtime as cudart
        except ImportError:
            from cuda import cudart  # cuda-python < 12.6 layout
        self.cudart = cudart
        self._ok(cudart.cudaSetDevice(device))
        self.stream_handle = int(self._ok(cudart.cudaStreamCreate()))
        self._stream = None

    def _ok(self, result):
        err, *rest = result if isinstance(result, tuple) else (result,)
        if int(err) != 0:
            raise RuntimeError(f"CUDA error {err}")
        return rest[0] if len(rest) == 1 else rest

    def to_device(self, host: np.ndarray):
        pointer = int(self._ok(self.cudart.cudaMalloc(max(host.nbytes, 1))))
        self._ok(
            self.cudart.cudaMemcpyAsync(
                pointer,
                host.ctypes.data,
                host.nbytes,
                self.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice,
                self.stream_handle,
            )
        )
        self._ok(self.cudart.cudaStreamSynchronize(self.stream_handle))  # host array may go away after return
        return pointer

    def empty(self, shape, dtype):
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return int(self._ok(self.cudart.cudaMalloc(max(nbytes, 1))))

    @staticmethod
    def address(buffer) -> int:
        return buffer

    def to_host(self, buffer, shape, dtype) -> np.ndarray:
        host = np.empty(shape, dtype=dtype)
        self._ok(
            self.cudart.cudaMemcpyAsync(
                host.ctypes.data,
                buffer,
                host.nbytes,
                self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost,
                self.stream_handle,
            )
        )
        self._ok(self.cudart.cudaStreamSynchronize(self.stream_handle))
        return host

    def synchronize(self) -> None:
        self._ok(self.cudart.cudaStreamSynchronize(self.stream_handle))

    def free(self, buffer) -> None:
        self._ok(self.cudart.cudaFree(buffer))
