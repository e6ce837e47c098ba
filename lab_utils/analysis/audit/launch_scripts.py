"""The project's files that are not Python but decide how a run starts: the shell scripts that launch it
(`torchrun --master_port 12345 train.py`, `export MASTER_PORT=29500` sourced by a SLURM job) and the JSON
configs a script reads its rendezvous address from. Chapter 09's port rule asks both."""

from __future__ import annotations

import os
import re
from pathlib import Path

from .registry import Finding

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


# `--master_port 12345`, `--master-port=29500`, `MASTER_PORT=29500` (exported or inline); not `$PORT`, not
# `${MASTER_PORT:-29500}` (a fallback the environment overrides)
FIXED_PORT = re.compile(r"(--master[_-]port[= ]+|\bMASTER_PORT=)(\d{2,5})\b")


def fixed_ports_in_launch_scripts(root: Path) -> list[Finding]:
    """A fixed rendezvous port in a shell script of the project: every run launched by that script, on a host
    where another job (or a stale one) holds the port, fails to rendezvous."""
    found = []
    for path in project_files(root, ".sh"):
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for i, line in enumerate(lines, 1):
            code = line.split("#", 1)[0]
            hit = FIXED_PORT.search(code)
            if hit is None:
                continue
            found.append(Finding(i, "hard-coded-master-port", (
                f"`{hit.group(0).strip()}` in this launch script fixes the rendezvous port: a second job on this "
                "host (or a stale one) collides on the port — torchrun --standalone, or "
                "--master_port=${MASTER_PORT:-29500} so the environment can choose"), "check-by-hand", str(path)))
            break  # one finding per script: its port is one choice
    return found
