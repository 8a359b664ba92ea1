"""PyTorch backend: a checkpoint dir on CPU (fp32/bf16) or CUDA (fp16/bf16 with SDPA attention).

The only serving module that imports torch."""
from __future__ import annotations

import logging

import numpy as np
import torch

from serving.backends.base import Backend, ModelError, ModelSpec, threads_per_run

log = logging.getLogger("bertserve")
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class TorchBackend(Backend):
    name = "torch"
    concurrent_runs = True  # inference under no_grad keeps no state between calls

    def __init__(self, spec: ModelSpec, settings):
        super().__init__(spec)
        from bert.checkpoint import load_checkpoint

        if settings.device == "cuda" and not torch.cuda.is_available():
            raise ModelError("--device cuda was asked for, but torch sees no CUDA device")
        threads = threads_per_run(settings, torch.get_num_threads())
        if threads:
            torch.set_num_threads(threads)
        self.precision = settings.effective_precision
        self.device = torch.device(settings.device)
        task = spec.tasks[0] if len(spec.tasks) == 1 and not spec.config.get("task_labels") else None
        self.model, _ = load_checkpoint(spec.path, task=task, dtype=DTYPES[self.precision], device=self.device)
        self.model.set_attention_implementation("sdpa")
        self.model.eval()

    @torch.inference_mode()
    def run(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        inputs = {k: torch.from_numpy(np.ascontiguousarray(batch[k])).to(self.device, non_blocking=True)
                  for k in ("input_ids", "attention_mask", "token_type_ids")}
        output = self.model(**inputs)
        named: dict[str, torch.Tensor] = {}
        if hasattr(output, "classify_logits"):  # multi-task: one forward, a head per task
            for field, key in (("classify_logits", "classify"), ("ner_logits", "ner"),
                               ("qa_start_logits", "qa_start"), ("qa_end_logits", "qa_end")):
                if getattr(output, field) is not None:
                    named[key] = getattr(output, field)
        elif hasattr(output, "start_logits"):
            named = {"qa_start": output.start_logits, "qa_end": output.end_logits}
        else:
            named = {self.tasks[0]: output.logits}
        return {k: v.float().cpu().numpy() for k, v in named.items()}
