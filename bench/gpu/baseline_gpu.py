"""The GPU server a user would write today: FastAPI + a transformers pipeline on the GPU, one request at a time.

    python -m bench.gpu.baseline_gpu --ckpt serving/demo_model --task classify --port 8100 --device cuda

bench/baseline_server.py's server (same routes, same request and response shapes, the same multi-task
head cut by `task_model`), with the pipeline on `--device` in `--dtype` (fp16 by default on CUDA: the
fast choice a user would make), so that the GPU comparison is against a GPU baseline.
"""

from __future__ import annotations

import argparse

import torch
import uvicorn
from fastapi import FastAPI

from bench.baseline_server import PIPELINES
from bench.baseline_server import create_app as baseline_app

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def create_app(ckpt: str, task: str, device: str, dtype: str) -> FastAPI:
    return baseline_app(ckpt, task, device=device, dtype=DTYPES[dtype])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True)
    p.add_argument("--task", choices=sorted(PIPELINES), default="classify")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default fp16 on cuda, fp32 on cpu")
    args = p.parse_args()
    dtype = args.dtype or ("fp16" if args.device.startswith("cuda") else "fp32")
    uvicorn.run(
        create_app(args.ckpt, args.task, args.device, dtype), host="127.0.0.1", port=args.port, log_level="warning"
    )


if __name__ == "__main__":
    main()
