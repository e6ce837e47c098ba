"""docs/design.md's table of `LAB_*` environment variables is the whole list, and each of its rows is alive.

A variable counts as *read* where code looks it up: `os.environ.get("LAB_X")`, `os.environ["LAB_X"]`,
`os.getenv`, `"LAB_X" in os.environ`, any call taking the name first (a helper such as `chapter.params`'
`env_number("LAB_STEPS", ...)`), through a constant (`ENV = "LAB_ZYGOTE"` ... `env.get(ENV)`), and `$LAB_X` /
`${LAB_X...}` in the Makefile and the shell scripts. It counts as *set* where a dict key, a `setenv` or a
`LAB_X=` assignment hands it to a child. Docstrings, comments and messages count as neither.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NAME = re.compile(r"LAB_[A-Z0-9_]+")
SETTERS = {"setenv", "putenv", "delenv", "unsetenv"}


def python_files() -> list[Path]:
    files = [*(REPO / "lab_utils").rglob("*.py"), *(REPO / "scripts").rglob("*.py"), *(REPO / "tests").rglob("*.py")]
    return [p for p in files if "outside" not in p.relative_to(REPO).parts]


def shell_files() -> list[Path]:
    return [REPO / "Makefile", REPO / ".ci" / "run", *(REPO / "scripts").rglob("*.sh"),
            *(REPO / "scripts").rglob("*.sbatch")]


def python_uses(source: str) -> tuple[set[str], set[str]]:
    """(variables read, variables set for a child) in one Python file."""
    tree = ast.parse(source)
    constants = {t.id: n.value.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                 and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                 and NAME.fullmatch(n.value.value) for t in n.targets if isinstance(t, ast.Name)}

    def name(node) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value):
            return node.value
        return constants.get(node.id) if isinstance(node, ast.Name) else None

    read, set_ = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and (found := name(node.args[0])):
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            (set_ if func in SETTERS else read).add(found)
        elif isinstance(node, ast.Subscript) and (found := name(node.slice)):
            (read if isinstance(node.ctx, ast.Load) else set_).add(found)
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            if found := name(node.left):
                read.add(found)
        elif isinstance(node, ast.Dict):
            set_ |= {found for key in node.keys if key is not None and (found := name(key))}
    return read, set_


def shell_uses(text: str) -> tuple[set[str], set[str]]:
    read, set_ = set(), set()
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        read |= set(re.findall(r"\$[{(]?(LAB_[A-Z0-9_]+)", line))
        set_ |= set(re.findall(r"(?<![\w$])(LAB_[A-Z0-9_]+)=", line))
    return read, set_


@functools.cache  # two tests read the same scan: the files do not change during a session
def uses() -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """({variable: files that read it}, {variable: files that set it})."""
    read: dict[str, list[str]] = {}
    set_: dict[str, list[str]] = {}
    for path in python_files() + shell_files():
        text = path.read_text()
        if "LAB_" not in text:  # nothing to find (a name held in a constant is the file's own constant)
            continue
        r, s = (python_uses if path.suffix == ".py" else shell_uses)(text)
        where = str(path.relative_to(REPO))
        for var in r:
            read.setdefault(var, []).append(where)
        for var in s:
            set_.setdefault(var, []).append(where)
    return read, set_


def design_table() -> dict[str, list[str]]:
    """{variable: its row's cells} from design.md's `| variable | read by | what it does | default |` table."""
    text = (REPO / "docs" / "design.md").read_text()
    section = text.split("\n### Environment variables (`LAB_*`)\n", 1)[1].split("\n#", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if cells and (m := re.fullmatch(r"`(LAB_[A-Z0-9_]+)`", cells[0])):
            assert m[1] not in rows, f"{m[1]} has two rows"
            assert len(cells) == 4 and all(cells), f"{m[1]}: every row gives who reads it, what it does, the default"
            rows[m[1]] = cells
    return rows


def test_every_variable_read_is_in_design_md_and_every_row_is_read():
    read, _ = uses()
    table = design_table()
    assert len(read) > 15 and len(table) > 15, "the scan or the table found next to nothing"
    missing = {var: where for var, where in read.items() if var not in table}
    assert missing == {}, f"read but not in docs/design.md's LAB_* table: {missing}"
    dead = sorted(set(table) - set(read))
    assert dead == [], f"in docs/design.md's LAB_* table but read nowhere (remove the row, and any setter): {dead}"


def test_nothing_sets_a_variable_nobody_reads():
    read, set_ = uses()
    dead = {var: where for var, where in set_.items() if var not in read}
    assert dead == {}, f"set for a child but read nowhere: {dead}"


def test_the_scan_sees_each_form():
    source = '''
import os
ENV = "LAB_A"
os.environ.get("LAB_B", "x"); os.environ["LAB_C"]; os.getenv("LAB_D"); "LAB_E" in os.environ
env_number("LAB_F", 3); os.environ.get(ENV)
os.environ["LAB_G"] = "1"; run(extra_env={"LAB_H": "off"}); monkeypatch.setenv("LAB_I", "1")
print("set LAB_J to change it")  # LAB_K
'''
    assert python_uses(source) == ({"LAB_A", "LAB_B", "LAB_C", "LAB_D", "LAB_E", "LAB_F"},
                                   {"LAB_G", "LAB_H", "LAB_I"})
    assert shell_uses('# $LAB_X\n[ -x "${LAB_Y:-/bin/y}" ]\nLAB_Z=1 python -m pytest\n\t$(LAB_W) x\n') == \
        ({"LAB_Y", "LAB_W"}, {"LAB_Z"})
