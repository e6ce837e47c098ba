"""The layers are folders, and these rules say which folder may import which (module level and inside functions):

- `lab_utils/core/` (what a rank runs) and `scripts/` (what torchrun starts) import only `core/`;
- `lab_utils/analysis/` reads run folders: it imports `analysis/` and, of `core/`, only the run-folder contract and
  the pure key tables (`ANALYSIS_MAY_READ`), never the training code or the launcher;
- `lab_utils/launch/` starts and watches processes: never `analysis/`, `lessons/`, `drivers/` or the notebook face;
- `lab_utils/lessons/` holds one module per chapter: only the notebooks, the tests and the notebook face import it;
- nothing imports the CLI but `__main__`.
A file's layer is its folder, so a new file cannot fall into a leftover bucket, and a violation names the file, the
line and the rule. docs/design.md's module table lists every module in its folder with its job, and every file or
name design.md points to exists (the design.md tests), so the picture cannot drift either.

Two more rules about shape: lab_utils' import graph has no circle (every import counts: module level, inside a
function, under `if TYPE_CHECKING:`; a lazy import still makes the two modules one knot to read), and no module is
over MAX_LINES lines.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "lab_utils"
LAYERS = ("core", "launch", "analysis", "lessons", "drivers")
FACE = {"cli", "chapter", "nbbuild", "nbval_plugin", "checklist", "__main__", "__init__"}  # the notebook face, the CLI
ANALYSIS_MAY_READ = {"runfiles", "mix64", "config", "float_twin"}
MAX_LINES = 600
OVER_MAX_LINES_FOR_NOW: set[str] = set()  # none: the audit became a package (issue 35)


def lab_imports(path: Path, root: Path = REPO) -> list[tuple[int, tuple[str, ...]]]:
    """(line, dotted path under lab_utils) for every import of lab_utils in `path`, relative imports resolved
    against `path`'s place under `root`; `from lab_utils.core import a, b` gives ("core", "a") and ("core", "b")."""
    return list(_lab_imports(path.read_text(), str(path), path.relative_to(root).with_suffix("").parts[:-1]))


@functools.cache  # several tests read the same files: each source is parsed once
def _lab_imports(source: str, filename: str, package: tuple[str, ...]) -> tuple[tuple[int, tuple[str, ...]], ...]:
    tree = ast.parse(source, filename=filename)
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
    return tuple(found)


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


def modules_of(root: Path = REPO) -> dict[tuple[str, ...], Path]:
    """Every module of lab_utils under `root` by its dotted path under lab_utils: ("launch", "launcher"); a
    package's __init__.py is the package itself: ("core", "workloads")."""
    found = {}
    for path in (root / "lab_utils").rglob("*.py"):
        parts = path.relative_to(root / "lab_utils").with_suffix("").parts
        found[parts[:-1] if parts[-1] == "__init__" else parts] = path
    return found


def import_graph(root: Path = REPO) -> dict[tuple[str, ...], dict[tuple[str, ...], int]]:
    """{module: {module it imports: the first line that does}} over lab_utils under `root`. An import names the
    longest module prefix of its dotted path (`from lab_utils.launch.launcher import RunResult` -> launcher;
    `from lab_utils.launch import launcher` -> launcher). Every form counts, wherever it stands in the file."""
    modules = modules_of(root)
    graph: dict[tuple[str, ...], dict[tuple[str, ...], int]] = {}
    for name, path in modules.items():
        edges = graph.setdefault(name, {})
        for line, dotted in lab_imports(path, root):
            target = next((dotted[:k] for k in range(len(dotted), 0, -1) if dotted[:k] in modules), None)
            if target is not None and target != name:
                edges.setdefault(target, line)
    return graph


def cycles(graph: dict[tuple[str, ...], dict[tuple[str, ...], int]]) -> list[list[tuple[str, ...]]]:
    """One shortest circle through each knot (strongly connected component of more than one module) of `graph`,
    as [a, b, ..., a]."""
    index: dict = {}
    low: dict = {}
    stack: list = []
    knots: list[set] = []

    def visit(v) -> None:  # Tarjan; the graph is ~80 modules, so recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            knot = set()
            while True:
                w = stack.pop()
                knot.add(w)
                if w == v:
                    break
            if len(knot) > 1:
                knots.append(knot)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    found = []
    for knot in knots:
        start = min(knot)
        paths, seen = [[start]], {start}
        while paths:  # breadth first, inside the knot: the shortest way back to start
            path = paths.pop(0)
            if start in graph[path[-1]] and len(path) > 1:
                found.append([*path, start])
                break
            for w in sorted(graph[path[-1]]):
                if w in knot and w not in seen:
                    seen.add(w)
                    paths.append([*path, w])
    return found


def describe(circle: list[tuple[str, ...]], graph) -> str:
    return " -> ".join(f"{'/'.join(a)}.py:{graph[a][b]}" for a, b in zip(circle, circle[1:], strict=False)) \
        + f" -> {'/'.join(circle[-1])}.py"


def test_lab_utils_has_no_import_circle():
    graph = import_graph()
    assert len(graph) > 50 and graph[("launch", "launcher")], "the graph must see lab_utils' modules and imports"
    found = [describe(c, graph) for c in cycles(graph)]
    assert found == [], "import circles (move the shared code down to where both can import it):\n" + \
        "\n".join(found)


def test_a_planted_import_circle_is_named(tmp_path):
    files = {"lab_utils/launch/a.py": "from lab_utils.launch import b\n",
             "lab_utils/launch/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import C\n",
             "lab_utils/launch/c.py": "def f():\n    from lab_utils.launch.a import g\n",
             "lab_utils/launch/d.py": "from lab_utils.launch import a\n"}
    for where, source in files.items():
        (tmp_path / where).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / where).write_text(source)
    graph = import_graph(tmp_path)
    assert cycles(graph) == [[("launch", "a"), ("launch", "b"), ("launch", "c"), ("launch", "a")]]
    assert describe(cycles(graph)[0], graph) == "launch/a.py:1 -> launch/b.py:3 -> launch/c.py:2 -> launch/a.py"


def test_no_module_is_over_max_lines():
    sizes = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in PKG.rglob("*.py")}
    over = {path: n for path, n in sizes.items() if n > MAX_LINES and path not in OVER_MAX_LINES_FOR_NOW}
    assert over == {}, f"modules over {MAX_LINES} lines (split each by job): {over}"
    assert set(OVER_MAX_LINES_FOR_NOW) <= set(sizes), "an allowed path is gone: drop it from OVER_MAX_LINES_FOR_NOW"


DESIGN = REPO / "docs" / "design.md"


def design_modules(text: str) -> list[tuple[str, str, str]]:
    """(folder, module, job) for each row of design.md's module table (the `| folder | module | job |` table
    under "### Modules")."""
    section = text.split("\n### Modules\n", 1)[1].split("\n#", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip().strip("`").strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 3 and cells[0] not in ("folder", "---"):
            rows.append((cells[0], cells[1], cells[2]))
    return rows


def real_modules(root: Path = REPO) -> set[tuple[str, str]]:
    """(folder, module) for every Python module of scripts/ and lab_utils/ under `root`; an empty __init__.py
    (a folder marker) is not a module with a job."""
    found = set()
    for path in [*(root / "scripts").rglob("*.py"), *(root / "lab_utils").rglob("*.py")]:
        if path.name == "__init__.py" and not path.read_text().strip():
            continue
        found.add((path.parent.relative_to(root).as_posix() + "/", path.name))
    return found


def table_drift(rows: list[tuple[str, str, str]], real: set[tuple[str, str]]) -> list[str]:
    """What design.md's module table gets wrong against the files, one line each."""
    listed = [(folder, module) for folder, module, _ in rows]
    problems = [f"{f}{m}: listed twice" for f, m in sorted(set(listed)) if listed.count((f, m)) > 1]
    problems += [f"{f}{m}: no job given" for f, m, job in rows if not job]
    gone, missing = set(listed) - real, real - set(listed)
    for folder, module in sorted(missing):
        elsewhere = [f for f, m in gone if m == module]
        problems.append(f"{folder}{module}: listed in {elsewhere[0]}, but it lives in {folder}" if elsewhere
                        else f"{folder}{module}: missing from the table")
    problems += [f"{f}{m}: listed, but there is no such file" for f, m in sorted(gone)
                 if not any(m == module for _, module in missing)]
    return problems


def test_design_md_module_table_matches_the_files():
    rows = design_modules(DESIGN.read_text())
    assert len(rows) > 60, "design.md's module table was not found under '### Modules'"
    problems = table_drift(rows, real_modules())
    assert problems == [], "docs/design.md's module table has drifted:\n" + "\n".join(problems)


def test_the_table_check_can_fail():
    real = {("lab_utils/core/", "a.py"), ("lab_utils/launch/", "b.py"), ("lab_utils/launch/", "c.py")}
    rows = [("lab_utils/core/", "a.py", "job"), ("lab_utils/core/", "b.py", "job"), ("lab_utils/core/", "a.py", ""),
            ("lab_utils/analysis/", "gone.py", "job")]
    assert table_drift(rows, real) == [
        "lab_utils/core/a.py: listed twice",
        "lab_utils/core/a.py: no job given",
        "lab_utils/launch/b.py: listed in lab_utils/core/, but it lives in lab_utils/launch/",
        "lab_utils/launch/c.py: missing from the table",
        "lab_utils/analysis/gone.py: listed, but there is no such file",
    ]


def top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            names |= {t.id for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                      if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def test_every_file_and_name_design_md_points_to_exists():
    """Anywhere in design.md (the chapter table, the decisions): `core/step.py`, `scripts/probes/x.py`,
    `tests/outside/x.py` must be files, and `core/distenv.pick_backend` a name defined in that module."""
    text = DESIGN.read_text()
    problems = []
    for token in re.findall(r"`([^`\s]+)`", text):
        if token.endswith((".py", ".md", ".sh", ".sbatch")) and "/" in token and "{" not in token:
            if not ((REPO / token).exists() or (PKG / token).exists()):
                problems.append(f"{token}: no such file")
        elif m := re.fullmatch(r"(?:lab_utils/)?((?:" + "|".join(LAYERS) + r")(?:/\w+)+)\.(\w+)\W?.*", token):
            module = PKG / f"{m[1]}.py"
            if not module.exists():
                problems.append(f"{token}: no module {m[1]}.py")
            elif m[2] not in top_level_names(module):
                problems.append(f"{token}: {m[1]}.py defines no {m[2]}")
    assert problems == [], "docs/design.md points to what is not there:\n" + "\n".join(problems)


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
