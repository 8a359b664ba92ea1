"""`python tests/export_pausing.py PHASE ARGS...`: `python -m export.onnx ARGS...`, stopped for good at PHASE so
that a test can SIGKILL it exactly there. Test-only: the product has no such hook; the phases are found by
wrapping the functions that mark them.

Phases: manifest-written (the new artifact is whole in its temporary sibling), before-swap (fsync'd, nothing
renamed yet), renamed-old (the old artifact moved to NAME.old, the new one not yet in place), renamed-new (the
new one in place, NAME.old still there), removing-old (NAME.old half deleted).
"""

from __future__ import annotations

import os
import runpy
import shutil
import sys
import time

import export.manifest

PHASE = sys.argv[1]


def pause(phase: str) -> None:
    if phase == PHASE:
        print(f"PAUSED {phase}", file=sys.stderr, flush=True)
        time.sleep(3600)


real_write_manifest = export.manifest.write_manifest
real_rename = os.rename
real_rmtree = shutil.rmtree


def write_manifest(directory, manifest):
    path = real_write_manifest(directory, manifest)
    pause("manifest-written")
    return path


def rename(src, dst, *args, **kwargs):
    if str(dst).endswith(".old"):
        pause("before-swap")
    real_rename(src, dst, *args, **kwargs)
    pause("renamed-old" if str(dst).endswith(".old") else "renamed-new" if ".tmp-" in str(src) else "")


def rmtree(path, *args, **kwargs):
    if str(path).endswith(".old") and os.path.isdir(path):
        for name in sorted(os.listdir(path))[:3]:
            os.unlink(os.path.join(path, name))
        pause("removing-old")
    return real_rmtree(path, *args, **kwargs)


export.manifest.write_manifest = write_manifest
os.rename = rename
shutil.rmtree = rmtree
sys.argv = ["export.onnx", *sys.argv[2:]]
runpy.run_module("export.onnx", run_name="__main__", alter_sys=True)
