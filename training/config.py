"""Typed run configurations and the command line that fills them.

Every field of a config dataclass is one option, declared with its help (bert/options.py: `--flag` with dashes,
env var BERTSERVE_<COMMAND>_<NAME>, e.g. BERTSERVE_FINETUNE_LEARNING_RATE; flag > env > default); unknown flags and, through `validate()`, contradictory ones
are refused before any data is read.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bert import options
from bert.config import ConfigError  # options that cannot work together: the core's one ConfigError
from bert.options import bounds_problems, flag, option

PRECISIONS = ("fp32", "bf16", "fp16")

# Settings a --resume may change: where and how often it reports, evaluates and saves, and where it runs. Every
# other option decided the data, the schedule, the optimizer's maths or the RNG streams of the steps already taken
# and must be as the saved run had it (an option added later is held to that too, unless named here).
RESUME_FREE = frozenset(
    {
        "resume",
        "output_dir",
        "stop_at_step",
        "device",
        "torch_threads",
        "progress",
        "log_every",
        "eval_every",
        "save_every",
        "save_dtype",
        "eval_batch_size",
        "eval_data",
        "max_eval_examples",
        "max_eval_instances",
        "max_answer_length",
        "gradient_checkpointing",
        "classify_eval",
        "ner_eval",
        "qa_eval",
        "rerank_eval",
    }
)


def saved_run_config(resume: str) -> dict:
    """The `config` a last/ directory's trainer_state.json recorded (also from last.old, where a killed save left
    only that); {} when there is none or it cannot be read."""
    import json

    for directory in (resume, resume + ".old"):
        path = Path(directory) / "trainer_state.json"
        if path.is_file():
            try:
                config = json.loads(path.read_text(encoding="utf-8")).get("config")
            except (OSError, ValueError, AttributeError):
                return {}
            return config if isinstance(config, dict) else {}
    return {}


def _same_setting(mine, saved) -> bool:
    if isinstance(mine, float) or isinstance(saved, float):
        try:
            return float(mine) == float(saved)
        except (TypeError, ValueError):
            return False
    return mine == saved


@dataclass
class TrainConfig:
    """What every training run shares: optimisation, schedule, batching, checkpoints, logging."""

    output_dir: str = option("runs/out", "checkpoints (best/, last/), log.jsonl and metrics go here")
    seed: int = option(42, "one seed for data order, masking, dropout and head initialisation")
    learning_rate: float = option(5e-5, "peak learning rate (after warmup)", above=0)
    weight_decay: float = option(0.01, "AdamW decay; never applied to biases or LayerNorm weights")
    adam_beta1: float = option(0.9, "AdamW beta1")
    adam_beta2: float = option(0.999, "AdamW beta2")
    adam_epsilon: float = option(1e-6, "AdamW epsilon")
    warmup_ratio: float = option(0.1, "fraction of total steps spent warming up (ignored if warmup_steps > 0)")
    warmup_steps: int = option(0, "warmup length in optimizer steps; 0 = use warmup_ratio", minimum=0)
    num_epochs: float = option(3.0, "passes over the training data (fractions allowed)")
    max_steps: int = option(
        0, "stop after this many optimizer steps (0 = run num_epochs); also sets the schedule length", minimum=0
    )
    batch_size: int = option(32, "examples per optimizer step (across accumulation and processes)", minimum=1)
    grad_accum_steps: int = option(
        1, "micro-batches per optimizer step (per process); batch_size must divide by it", minimum=1
    )
    max_grad_norm: float = option(1.0, "gradient clipping (0 = off)")
    eval_every: int = option(0, "evaluate every N optimizer steps (0 = at the end of each epoch)", minimum=0)
    save_every: int = option(0, "write last/ (resumable) every N steps (0 = with each evaluation)", minimum=0)
    log_every: int = option(10, "write a log.jsonl line every N steps", minimum=0)
    precision: str = option("fp32", "fp32 | bf16 | fp16 autocast (fp16: GPU only, with a GradScaler)")
    device: str = option("auto", "auto | cpu | cuda | cuda:N")
    torch_threads: int = option(0, "torch.set_num_threads (0 = torch's default)", minimum=0)
    group_by_length: bool = option(True, "batches of similar length (less padding, same examples per epoch)")
    resume: str = option("", "a last/ checkpoint directory written by an earlier run of the same config")
    progress: bool = option(True, "tqdm progress bar (rank 0)")
    gradient_checkpointing: bool = option(False, "trade compute for activation memory")

    def validate(self) -> None:
        problems = []
        if not 0 <= self.warmup_ratio < 1:
            problems.append(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.num_epochs <= 0 and self.max_steps <= 0:
            problems.append("set num_epochs > 0 or max_steps > 0")
        if self.batch_size > 0 and self.grad_accum_steps > 0 and self.batch_size % self.grad_accum_steps:
            problems.append(
                f"batch_size {self.batch_size} is not divisible by grad_accum_steps {self.grad_accum_steps}"
            )
        if self.precision not in PRECISIONS:
            problems.append(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.precision == "fp16" and self.device == "cpu":
            problems.append("precision fp16 needs a GPU (use fp32 or bf16 on CPU)")
        if problem := device_problem(self.device):
            problems.append(problem)
        # last.old: a save was killed between its two renames; the run resumes from that previous copy
        if self.resume and not any(
            (Path(d) / "trainer_state.json").is_file() for d in (self.resume, self.resume + ".old")
        ):
            problems.append(f"--resume {self.resume}: no trainer_state.json there (pass a last/ directory)")
        elif self.resume:
            problems += self.resume_problems()
        problems += bounds_problems(type(self), vars(self), lambda name: flag(self, name))
        problems += self.task_problems()
        if problems:
            raise ConfigError("; ".join(problems))

    def task_problems(self) -> list[str]:
        return []

    def resume_problems(self) -> list[str]:
        """Options that --resume must not change: the resumed run continues bit for bit only with the settings
        that shaped the steps already taken (the saved run's config in trainer_state.json). One problem naming
        every option that differs; none when the saved state has no config (older runs) or cannot be read (the
        resume itself then says why)."""
        saved = saved_run_config(self.resume)
        mine = self.to_dict()
        changed = [
            f"--{name.replace('_', '-')} {mine[name]!r} (that run: {saved[name]!r})"
            for name in mine
            if name not in RESUME_FREE
            and name in saved
            and not _same_setting(mine[name], saved[name])
            # the planned length is max_steps when both runs set it; then num_epochs does not count
            and not (name == "num_epochs" and mine.get("max_steps") and saved.get("max_steps"))
        ]
        if not changed:
            return []
        return [
            f"--resume {self.resume}: {', '.join(changed)} {'differs' if len(changed) == 1 else 'differ'} from the "
            "run being resumed; "
            "resume with the same options (or start a new run)"
        ]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------- command line


def parse_config(cls, argv=None, description: str = ""):
    """argv (and the command's env vars, BERTSERVE_<COMMAND>_<NAME>) -> a validated config (bert/options.py: flag > env > default); a bad or
    contradictory option is one `error:` line and exit 2, before any data is read."""
    config = cls(**options.read(cls, argv, description=description))
    try:
        config.validate()
    except ConfigError as e:
        options.fail(str(e))
    return config


def run(main, argv=None) -> int:
    """What `python -m training.X` does with main: a bad checkpoint, config or tokenizer file (bert's errors)
    or options found contradictory once work began is one line on stderr and exit 2, never a traceback."""
    from bert.errors import EXIT_BAD_INPUT, run_cli
    from bert.tasks.base import UnknownTask
    from bert.tasks.common import DataError

    # DataError: a data file that is not the format it claims to be (its message names the file and line)
    code = run_cli(
        main, argv, lambda e: EXIT_BAD_INPUT if isinstance(e, (ConfigError, UnknownTask, DataError)) else None
    )
    if argv is None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        _leave_as_a_torchrun_worker(code)
    return code


def _leave_as_a_torchrun_worker(code: int) -> None:
    """A torchrun worker whose run is over (files written, the process group left) ends here, without the
    interpreter's teardown: there gloo's native threads can abort a finished process (SIGABRT / SIGSEGV), and
    torchrun then reports the whole run failed and stops the other workers."""
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def model_config(preset_or_path: str, **overrides):
    """A BertConfig from a preset name (tiny ... large) or a config.json path / directory holding one
    (e.g. a hidden-32 test model), with overrides (vocab_size, labels ...) applied."""
    import dataclasses as dc

    from bert.config import PRESETS, BertConfig

    if preset_or_path in PRESETS:
        return BertConfig.preset(preset_or_path, **overrides)
    config = BertConfig.from_json_file(preset_or_path)
    return dc.replace(config, **overrides)


def is_model_spec(value: str) -> bool:
    from bert.config import PRESETS

    return value in PRESETS or Path(value).is_file() or (Path(value) / "config.json").is_file()


def device_problem(name: str) -> str | None:
    """Why `name` cannot be a run's device (None: it can): not auto, cpu, cuda or cuda:N, or a CUDA device this
    machine lacks."""
    if name not in ("auto", "cpu", "cuda") and not re.fullmatch(r"cuda:\d+", name):
        return f"device must be auto, cpu, cuda or cuda:N, got {name!r}"
    if name.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            return f"device {name}: no CUDA device here (use cpu)"
        if name.startswith("cuda:") and int(name[5:]) >= torch.cuda.device_count():
            return f"device {name}: this machine has {torch.cuda.device_count()} CUDA devices"
    return None


def resolve_device(name: str) -> str:
    """`auto` as the device it means here (cuda where there is one, else cpu); any other name as it is."""
    if name != "auto":
        return name
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
