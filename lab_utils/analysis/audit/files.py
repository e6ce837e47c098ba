"""The project's files on disk that are not Python: launch scripts and YAML or JSON configs, found under the audited
folder (hidden folders, virtual environments and caches skipped). The port, BatchNorm and default-option rules read
them, and the scalars they hold; nothing here imports another module of the audit."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

UNKNOWN = type("Unknown", (), {"__repr__": lambda self: "UNKNOWN"})()  # a config value's "cannot tell"

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


def yaml_scalar(text: str):
    """The value a YAML scalar's text holds: a boolean, a number, None, a plain word; else UNKNOWN."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "~"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text if re.fullmatch(r"[A-Za-z_][\w.\-/]*", text) else UNKNOWN


def json_scalar(text: str):
    """The value a JSON scalar's text holds (`0`, `null`, `"x"`), or the text itself when it is not one."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def launch_flags(root: Path) -> set[str]:
    """Every `--flag` a shell script of the project passes (as argparse's attribute, `-` read as `_`): not a
    commented-out command; a Hydra override (`++train_config.gradient_accumulation_steps=8`, SLAM-LLM) too."""
    return {flag.replace("-", "_") for path in shell_scripts(root) for line in path.read_text(
        encoding="utf-8", errors="replace").splitlines() if not line.lstrip().startswith("#")
        for flag in re.findall(r"(?<![\w-])--?([A-Za-z][\w-]+)|(?<![\w.])\+{0,2}(?:[A-Za-z_]\w*\.)+([A-Za-z_]\w*)=",
                               line) for flag in flag if flag}


def script_flags(root: Path, script: str) -> set[str]:
    """The `--flag`s the project's shell scripts pass to one Python script (`torchrun ... trainer/xsum_trainer.py
    \\` and its continued lines, GPST's fine-tuning script with `--pretrain_dir`), as argparse attributes."""
    return set().union(*script_commands(root, script))


def script_commands(root: Path, script: str) -> list[set[str]]:
    """Each shell command that runs one Python script, as the set of `--flag`s it passes (empty: no script runs
    it)."""
    name = Path(script).name
    commands: list[set[str]] = []
    for path in shell_scripts(root):
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        for i, line in enumerate(lines):
            if line.lstrip().startswith("#") or not re.search(rf"(^|[\s/]){re.escape(name)}(\s|$|\\)", line):
                continue
            command, j = [line], i
            while command[-1].rstrip().endswith("\\") and j + 1 < len(lines):
                j += 1
                command.append(lines[j])
            commands.append({flag.replace("-", "_") for part in command for flag in re.findall(
                r"(?<![\w-])--([A-Za-z][\w-]+)", part.split(name, 1)[-1] if part is line else part)})
    return commands
