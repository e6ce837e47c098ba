"""The project's files on disk that are not Python: launch scripts and YAML or JSON configs, found under the audited
folder (hidden folders, virtual environments and caches skipped). The port, BatchNorm and default-option rules read
them; nothing here imports another module of the audit."""

from __future__ import annotations

import os
from pathlib import Path

SKIPPED_DIRS = {"node_modules", "__pycache__", "venv", "site-packages"}


def project_files(root: Path, suffix: str, limit: int = 200) -> list[Path]:
    """The project's files ending in `suffix`, outside hidden folders and virtual environments; at most `limit`
    (a data folder of a million JSON files is not read)."""
    out: list[Path] = []
    for here, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS)
        out += [Path(here) / n for n in sorted(names) if n.endswith(suffix)]
        if len(out) >= limit:
            break
    return out[:limit]


def shell_scripts(root: Path) -> list[Path]:
    """The project's shell scripts: `train.sh`, and `pt_run_*.bash` (RoboFlamingo's launch scripts)."""
    return [*project_files(root, ".sh"), *project_files(root, ".bash")]
