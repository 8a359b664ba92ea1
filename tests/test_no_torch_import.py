"""The serving core must import without torch or transformers (ONNX/TensorRT servers have neither)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PROBE = """
import json, sys
import bert.tokenizer, bert.tasks
from bert.tasks import classify, ner, qa, pad_batch, softmax, Features, TASKS
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers"))
print(json.dumps(heavy))
"""


def test_tasks_and_tokenizer_do_not_import_torch_or_transformers():
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
