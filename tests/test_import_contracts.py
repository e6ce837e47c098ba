"""The layers are folders, and these rules say which folder may import which (module level and inside functions):

- `lab_utils/core/` (what a rank runs) and `scripts/` (what torchrun starts) import only `core/`;
- `lab_utils/analysis/` reads run folders: it imports `analysis/` and, of `core/`, only the run-folder contract and
  the pure key tables (`ANALYSIS_MAY_READ`), never the training code or the launcher;
- `lab_utils/launch/` starts and watches processes: never `analysis/`, `lessons/`, `drivers/` or the notebook face;
- `lab_utils/lessons/` holds one module per chapter: only the notebooks, the tests and the notebook face import it;
- nothing imports the CLI but `__main__`.
A file's layer is its folder, so a new file cannot fall into a leftover bucket, and a violation names the file, the
line and the rule. docs/design.md's layout lists every module (the last test), so the picture cannot drift either.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "lab_utils"
LAYERS = ("core", "launch", "analysis", "lessons", "drivers")
FACE = {"cli", "chapter", "nbbuild", "nbval_plugin", "checklist", "__main__", "__init__"}  # the notebook face, the CLI
ANALYSIS_MAY_READ = {"runfiles", "mix64", "config", "float_twin"}


def lab_imports(path: Path, root: Path = REPO) -> list[tuple[int, tuple[str, ...]]]:
    """(line, dotted path under lab_utils) for every import of lab_utils in `path`, relative imports resolved
    against `path`'s place under `root`; `from lab_utils.core import a, b` gives ("core", "a") and ("core", "b")."""
    tree = ast.parse(path.read_text(), filename=str(path))
    rel_parts = path.relative_to(root).with_suffix("").parts
    package = rel_parts[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "lab_utils" and len(parts) > 1:
                    found.append((node.lineno, tuple(parts[1:])))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[: len(package) - node.level + 1])
                mod = base + (node.module.split(".") if node.module else [])
            else:
                mod = node.module.split(".") if node.module else []
            if mod[:1] != ["lab_utils"]:
                continue
            found += [(node.lineno, (*mod[1:], alias.name)) for alias in node.names]
    return found


def layer_of(dotted: tuple[str, ...]) -> str:
    """The layer of lab_utils.<dotted>: its folder, or "face" for the top-level modules."""
    return dotted[0] if dotted and dotted[0] in LAYERS else "face"


def layer_of_file(path: Path) -> str:
    return layer_of(path.relative_to(PKG).with_suffix("").parts)


def files_in(layer: str) -> list[Path]:
    return [p for p in PKG.rglob("*.py") if layer_of_file(p) == layer]


def violations(files: list[Path], allowed, rule: str) -> list[str]:
    return [f"{f.relative_to(REPO)}:{line}: imports lab_utils.{'.'.join(d)} ({rule})"
            for f in files for line, d in lab_imports(f) if not allowed(d)]


def test_every_module_is_in_a_layer_folder_or_the_face():
    loose = [p.name for p in PKG.glob("*.py") if p.stem not in FACE]
    assert loose == [], f"modules outside the layer folders: {loose} (each goes in core/, launch/, analysis/, lessons/)"
    for layer in LAYERS:
        assert files_in(layer), f"lab_utils/{layer}/ is empty: the rules about it would check nothing"


def test_core_and_scripts_import_only_core():
    rule = "core/ and scripts/ run on every rank: they import only core/"
    files = files_in("core") + list((REPO / "scripts").rglob("*.py"))
    assert any(f.name == "train.py" for f in files)
    assert violations(files, lambda d: layer_of(d) == "core", rule) == []


def test_analysis_reads_run_folders_not_training_code():
    rule = f"analysis/ imports analysis/ and core's {', '.join(sorted(ANALYSIS_MAY_READ))} only"
    ok = lambda d: layer_of(d) == "analysis" or (layer_of(d) == "core" and len(d) > 1 and d[1] in ANALYSIS_MAY_READ)  # noqa: E731
    assert violations(files_in("analysis"), ok, rule) == []


def test_launch_never_imports_analysis_lessons_drivers_or_the_face():
    rule = "launch/ starts processes: never analysis/, lessons/, drivers/ or the notebook face"
    assert violations(files_in("launch"), lambda d: layer_of(d) in ("core", "launch"), rule) == []


def test_only_notebooks_tests_and_the_face_import_lessons():
    rule = "lessons/ is each chapter's logic: only notebooks, tests and the notebook face import it"
    files = [f for layer in ("core", "launch", "analysis", "drivers") for f in files_in(layer)]
    files += list((REPO / "scripts").rglob("*.py"))
    assert violations(files, lambda d: layer_of(d) != "lessons", rule) == []


def test_nothing_but_main_imports_the_cli():
    files = [p for p in PKG.rglob("*.py") if p.name != "__main__.py"]
    assert violations(files, lambda d: d[:1] != ("cli",), "the CLI is the top") == []


def test_design_md_lists_every_module():
    design = (REPO / "docs" / "design.md").read_text()
    missing = [str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
               if p.name != "__init__.py" and p.name not in design and p.stem not in design
               and p.stem.removeprefix("bench_") not in design]
    assert missing == [], f"docs/design.md's layout does not mention: {missing}"


@pytest.mark.parametrize("where, source, expected", [
    ("lab_utils/core/probe.py", "from lab_utils.launch import launcher\n", [(1, ("launch", "launcher"))]),
    ("lab_utils/core/probe.py", "def f():\n    from ..launch import launcher\n", [(2, ("launch", "launcher"))]),
    ("lab_utils/core/probe.py", "import lab_utils.analysis.parity as p\n", [(1, ("analysis", "parity"))]),
    ("lab_utils/core/probe.py", "from .runfiles import read_metrics\n", [(1, ("core", "runfiles", "read_metrics"))]),
    ("lab_utils/core/workloads/probe.py", "from ..runfiles import fingerprint\n",
     [(1, ("core", "runfiles", "fingerprint"))]),
    ("lab_utils/analysis/probe.py", "from ..core import step, runfiles\n",
     [(1, ("core", "step")), (1, ("core", "runfiles"))]),
    ("lab_utils/probe.py", "from . import doctor\n", [(1, ("doctor",))]),
    ("scripts/probe.py", "import torch\nfrom lab_utils.launch.launcher import launch\n",
     [(2, ("launch", "launcher", "launch"))]),
])
def test_the_checker_sees_every_import_form(tmp_path, where, source, expected):
    """The contract must be able to fail: each import form, module level or in a function, is seen. The files
    are a fake package under tmp_path, so the real source tree is never written to."""
    path = tmp_path / where
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    assert lab_imports(path, root=tmp_path) == expected


def test_a_planted_violation_is_reported(tmp_path):
    bad = tmp_path / "lab_utils" / "core" / "bad.py"
    bad.parent.mkdir(parents=True)
    bad.write_text("from lab_utils.analysis import parity\n")
    found = [d for _, d in lab_imports(bad, root=tmp_path) if layer_of(d) != "core"]
    assert found == [("analysis", "parity")]
