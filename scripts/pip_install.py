"""`pip install ARGS` into the venv, through uv when it can be had (the Makefile's set-up calls this).

Why: on the 2-core CI box pip took about 2.5 minutes to install torch and the dev tools, most of it spent
unpacking and byte-compiling some 20,000 files one at a time; uv installs the same wheels in about 15 s. The
Makefile lets Python write bytecode on first import (it unexports PYTHONDONTWRITEBYTECODE), so nothing is
compiled that no process imports.

uv does not read pip's configuration, so this hands it pip's own: the index, the extra indexes, the find-links
folders and the constraint files that `pip config list` and the PIP_* variables give (a box whose wheels lie on
its disk keeps using them), and `--index-strategy unsafe-best-match`, pip's rule of taking the best version from
any index. Anything that fails on the uv path (uv not installable, an index it cannot read, a resolution it
refuses) falls back to plain pip with the same arguments, saying why, so set-up never depends on uv.

Usage: python scripts/pip_install.py [pip install arguments...]   (run with the venv's python)
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

# pip's option -> uv's (both take the same values). find-links folders that do not exist are dropped: pip
# ignores them with a warning, uv stops.
OPTIONS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
           "constraint": "--constraint"}


def pip(*args: str, quiet: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], text=True,
                          capture_output=quiet)


def pip_settings() -> dict[str, list[str]]:
    """pip's effective index/find-links/constraint settings: its config files, then PIP_* variables."""
    found: dict[str, list[str]] = {}
    listed = pip("config", "list", quiet=True)
    for line in listed.stdout.splitlines() if listed.returncode == 0 else []:
        key, _, value = line.partition("=")
        name = key.rsplit(".", 1)[-1]
        if name in OPTIONS and not key.startswith(":env:"):
            found[name] = shlex.split(value.strip().strip("'\""))
    for name in OPTIONS:
        env = os.environ.get("PIP_" + name.upper().replace("-", "_"))
        if env:
            found[name] = env.split()
    return found


def uv_arguments(settings: dict[str, list[str]]) -> list[str]:
    out = ["--index-strategy", "unsafe-best-match"]
    for name, values in settings.items():
        for value in values:
            if name == "find-links" and "://" not in value and not Path(value).is_dir():
                continue
            if name == "constraint" and not Path(value).is_file():
                continue
            out += [OPTIONS[name], value]
    return out


def sees_system_packages() -> bool:
    """A venv made with --system-site-packages (a GPU box's CUDA torch lives outside it): pip is kept there,
    because the lab must never replace that torch and pip is the installer that has always honoured it."""
    cfg = Path(sys.prefix) / "pyvenv.cfg"
    return cfg.is_file() and "include-system-site-packages = true" in cfg.read_text()


def main(args: list[str]) -> int:
    if sees_system_packages():
        return pip("install", "-q", *args).returncode
    if pip("install", "-q", "uv", quiet=True).returncode == 0:
        cmd = [sys.executable, "-m", "uv", "pip", "install", "--quiet", "--python", sys.executable,
               *uv_arguments(pip_settings()), *args]
        if subprocess.run(cmd).returncode == 0:
            return 0
        print("setup: uv could not install this (above); installing with pip instead", flush=True)
    else:
        print("setup: uv is not installable here; installing with pip", flush=True)
    return pip("install", "-q", *args).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
