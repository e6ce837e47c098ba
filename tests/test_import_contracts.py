"""The layout's "never" rules, checked on every import statement (module level and inside functions).

- core (what the rank side runs) never imports the launcher, the CLI, the notebook side or the analysis;
- what torchrun runs (scripts/) never imports the launcher, the CLI, the notebook side or the analysis;
- the analysis reads run folders (lab_utils.runfiles), never the training code or the launcher.
A violation names the file, the line and the rule, so the fix is obvious.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "lab_utils"

LAUNCH_SIDE = {"launcher", "twins", "elastic_driver", "cli", "chapter", "nbbuild", "checklist", "drivers", "probes",
               "preflight", "__main__", "launch_lessons", "checkpoint_lessons"}
ANALYSIS = {"parity", "noise", "causes", "plotting", "doctor", "portbugs", "bitwise_lessons"}
TRAINING = {"step", "emulate", "ddp", "workloads", "distenv", "checkpoint", "samplers", "global_sampler",
            "keyed_rng"}
# Modules the rank side may import: everything that is neither launch side nor analysis.
CORE = {p.stem for p in PKG.glob("*.py")} - LAUNCH_SIDE - ANALYSIS - {"__init__", "sampler_plots", "rng_probe",
                                                                      "port"} | {"workloads"}


def lab_imports(path: Path, root: Path = REPO) -> list[tuple[int, str]]:
    """(line, first lab_utils submodule) for every import of lab_utils in `path`, relative imports resolved
    against `path`'s place under `root` (the folder that holds lab_utils/)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    rel_parts = path.relative_to(root).with_suffix("").parts
    package = rel_parts[:-1] if rel_parts[-1] != "__init__" else rel_parts[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "lab_utils" and len(parts) > 1:
                    found.append((node.lineno, parts[1]))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[: len(package) - node.level + 1])
                mod = base + (node.module.split(".") if node.module else [])
            else:
                mod = node.module.split(".") if node.module else []
            if mod[:1] != ["lab_utils"]:
                continue
            if len(mod) > 1:
                found.append((node.lineno, mod[1]))
            else:  # from lab_utils import a, b
                found += [(node.lineno, alias.name) for alias in node.names]
    return found


def _module(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _violations(files, forbidden: set[str], rule: str) -> list[str]:
    return [f"{f.relative_to(REPO)}:{line}: imports lab_utils.{mod} ({rule})"
            for f in files for line, mod in lab_imports(f) if mod in forbidden]


def test_core_never_imports_launch_side_or_analysis():
    files = [p for p in PKG.rglob("*.py") if _module(p) in CORE]
    assert files, "no core modules found: the contract would check nothing"
    assert _violations(files, LAUNCH_SIDE | ANALYSIS, "core must not import launch side or analysis") == []


def test_rank_side_never_imports_launch_side_or_analysis():
    files = list((REPO / "scripts").rglob("*.py"))
    assert any(f.name == "train.py" for f in files)
    assert _violations(files, LAUNCH_SIDE | ANALYSIS, "scripts/ run under torchrun") == []


def test_analysis_reads_run_folders_not_training_code():
    files = [p for p in PKG.rglob("*.py") if _module(p) in ANALYSIS]
    assert any(f.stem == "parity" for f in files)
    assert _violations(files, TRAINING | LAUNCH_SIDE, "analysis reads run folders via runfiles") == []


@pytest.mark.parametrize("where, source, expected", [
    ("lab_utils/workloads/probe.py", "from lab_utils import launcher\n", [(1, "launcher")]),
    ("lab_utils/workloads/probe.py", "def f():\n    from .. import launcher\n", [(2, "launcher")]),
    ("lab_utils/workloads/probe.py", "import lab_utils.parity as p\n", [(1, "parity")]),
    # `.` inside lab_utils/workloads/ is the workloads package itself; directly in lab_utils/ it is lab_utils.
    ("lab_utils/workloads/probe.py", "from .runfiles import read_metrics\n", [(1, "workloads")]),
    ("lab_utils/probe.py", "from .runfiles import read_metrics\n", [(1, "runfiles")]),
    ("lab_utils/probe.py", "from . import doctor, parity\n", [(1, "doctor"), (1, "parity")]),
    ("scripts/probe.py", "import torch\nfrom lab_utils.launcher import launch\n", [(2, "launcher")]),
])
def test_the_checker_sees_every_import_form(tmp_path, where, source, expected):
    """The contract must be able to fail: each import form, module level or in a function, is seen. The files
    are a fake package under tmp_path, so the real source tree is never written to."""
    path = tmp_path / where
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    assert lab_imports(path, root=tmp_path) == expected
