"""The commit a result measures (``git_state``): for every part of the project that writes
results (the benchmarks, the TorchRec adapter's plan simulation, the pipelines' apps).
Imports nothing from the project."""

import os
import subprocess
from pathlib import Path


def git_state() -> dict:
    """The commit the benchmark measures and whether the tree differs from it (``git status
    --porcelain``: modified and untracked files; build outputs are ignored by .gitignore)."""
    if os.environ.get("TBE_PLUGIN_COMMIT"):  # a copy of the tree without .git (the device): the caller says
        dirty = {"1": True, "0": False}.get(os.environ.get("TBE_PLUGIN_DIRTY", ""))
        return {"git_commit": os.environ["TBE_PLUGIN_COMMIT"], "git_dirty": dirty,
                "git_source": "TBE_PLUGIN_COMMIT / TBE_PLUGIN_DIRTY, set by the caller from its checkout"}
    root = Path(__file__).resolve().parents[1]
    try:
        def git(*command: str) -> str:
            return subprocess.run(["git", *command], cwd=root, capture_output=True, text=True,
                                  timeout=60, check=True).stdout

        commit, status = git("rev-parse", "HEAD").strip(), git("status", "--porcelain")
    except (OSError, subprocess.SubprocessError) as error:  # e.g. a copy of the tree without .git
        return {"git_commit": "unknown", "git_dirty": None, "git_error": f"{type(error).__name__}: {error}"[:200]}
    changed = [line[3:] for line in status.splitlines() if line.strip()]
    return {"git_commit": commit, "git_dirty": bool(changed), "git_changed": changed[:40]}
