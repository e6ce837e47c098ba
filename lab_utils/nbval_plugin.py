"""pytest hooks for the chapters under nbval (`pytest --nbval-lax --nbval-current-env notebooks/`).

notebooks/conftest.py loads them, so the bare nbval command gets them too; elsewhere (a notebook outside
notebooks/) pass `-p lab_utils.nbval_plugin`. Three things, none of which changes what nbval compares:

1. A verdict cell (`# NBVAL_CHECK_OUTPUT`) that fails is reported first as the learner reads it: each claim of the
   committed table whose expected or measured value this run changed, with both values, and `Verdicts.show`'s own
   list of the claims that no longer hold; nbval's text diff follows.
2. The sanitizer file beside the chapters (notebooks/nbval_sanitize.cfg) is used unless --nbval-sanitize-with
   names another.
3. With LAB_NBVAL_SAVE=DIR, each notebook is written to DIR/NAME.ipynb as nbval executed it: every cell's
   outputs (streams coalesced, as nbval compares them), an execution count for each cell that ran, and the
   widget state the kernel held at the end, so JupyterLab draws the widgets without re-running the notebook
   (`make test`'s browser step opens these copies: tests/browser/check_notebooks.py).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from lab_utils import nbbuild

try:
    from nbval.plugin import IPyNbCell
except ImportError:  # nbval absent: nothing here applies
    IPyNbCell = None

SANITIZE_FILE = Path(__file__).resolve().parents[1] / "notebooks" / "nbval_sanitize.cfg"
SAVE_ENV = "LAB_NBVAL_SAVE"
# Evaluated in the kernel after the notebook's last cell: ipywidgets' own serialisation of every live widget
# (the format JupyterLab restores from a notebook's metadata). A closed widget is absent, as on screen.
_WIDGET_STATE = ("__import__('json').dumps(__import__('ipywidgets').Widget.get_manager_state(drop_defaults=True)"
                 " if 'ipywidgets' in __import__('sys').modules else None)")


def pytest_configure(config):
    option = config.option
    if getattr(option, "nbval_sanitize_with", "unset") is None and SANITIZE_FILE.exists():
        option.nbval_sanitize_with = str(SANITIZE_FILE)


def _is_nbval_cell(item) -> bool:
    return IPyNbCell is not None and isinstance(item, IPyNbCell)


@pytest.hookimpl(trylast=True)
def pytest_runtest_setup(item):
    """Once per notebook, while its kernel runs: register the saving of the executed copy at its teardown."""
    if not (_is_nbval_cell(item) and os.environ.get(SAVE_ENV)):
        return
    nbfile = item.parent
    if getattr(nbfile, "_lab_outputs", None) is None:
        nbfile._lab_outputs = {}
        # Finalizers run last-in first-out, so this runs before nbval's teardown stops the kernel.
        nbfile.addfinalizer(lambda: save_executed(nbfile, Path(os.environ[SAVE_ENV])))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not _is_nbval_cell(item):
        return
    outputs = getattr(item, "test_outputs", None)
    if getattr(item.parent, "_lab_outputs", None) is not None:
        item.parent._lab_outputs[item.cell_num] = outputs
    if report.failed and nbbuild.is_verdict(item.cell):
        report.longrepr = f"{verdict_failure(item.cell, outputs or [])}\n\n---- nbval's report ----\n{report.longrepr}"


def verdict_failure(cell, run_outputs) -> str:
    """What failed, in the chapter's words: the claims whose row changed, and the error Verdicts.show raised."""
    committed, measured = _stdout(cell.get("outputs", [])), _stdout(run_outputs)
    if measured:
        claims = nbbuild.claims_report(committed, measured)
    else:
        claims = ["the verdict table was not printed: the cell failed before printing it (or an earlier cell did;"
                  " see the first failure above)"]
    lines = [f"VERDICT FAILED: {claims[0]}", *("  " + c for c in claims[1:])]
    errors = [o for o in run_outputs if o.get("output_type") == "error"]
    if errors:
        e = errors[-1]
        said = "Verdicts.show" if "lesson no longer holds" in e.get("evalue", "") else "the cell raised"
        lines.append(f"  {said}: {e.get('ename')}: {e.get('evalue', '')}".replace("\n", "\n  "))
    lines.append("  (the committed table is the chapter's promise; if this change is meant: make strip NB=<notebook>)")
    return "\n".join(lines)


def _stdout(outputs) -> str:
    return "".join(o.get("text", "") for o in outputs
                   if o.get("output_type") == "stream" and o.get("name") == "stdout")


def _widget_state(kernel, timeout: float = 30) -> dict | None:
    """Ask the notebook's kernel (nbval's RunningKernel) for its widgets' state; None when it cannot say."""
    if kernel is None or not kernel.is_alive():
        return None
    kc = kernel.kc
    msg_id = kc.execute("", silent=True, store_history=False, user_expressions={"state": _WIDGET_STATE})
    while True:
        msg = kc.get_shell_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") == msg_id:
            break
    result = msg["content"].get("user_expressions", {}).get("state", {})
    if result.get("status") != "ok":
        return None
    value = ast.literal_eval(result["data"]["text/plain"])
    return None if value is None else json.loads(value)


def save_executed(nbfile, out_dir: Path) -> Path:
    """Write the notebook as nbval ran it: outputs per cell, a count per cell that ran, the widget state."""
    nb = nbformat.read(str(nbfile.fspath), as_version=4)
    ran = nbfile._lab_outputs
    try:
        state = _widget_state(nbfile.kernel)
    except Exception as e:  # the copy is still worth writing; the browser check then reports the widgets
        state = None
        nb.metadata["lab_nbval_note"] = f"widget state not read: {type(e).__name__}: {e}"[:300]
    models = set((state or {}).get("state", {}))
    count, code_index = 0, 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outputs = ran.get(code_index)
        code_index += 1
        cell.outputs, cell.execution_count = [], None
        if outputs is None:  # skipped, or never reached: JupyterLab shows an empty prompt, as for a learner
            continue
        count += 1
        cell.execution_count = count
        for out in outputs:
            out = nbformat.from_dict(dict(out))
            if out.output_type in ("display_data", "execute_result"):
                out.setdefault("metadata", {})
                view = out.get("data", {}).get("application/vnd.jupyter.widget-view+json")
                if view and view.get("model_id") not in models:
                    continue  # a widget closed before the end is gone from a learner's screen too
                if out.output_type == "execute_result":
                    out["execution_count"] = count
            cell.outputs.append(out)
    if state:
        nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": state}
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / Path(str(nbfile.fspath)).name
    nbformat.write(nb, str(target))
    return target


def run_nbval(notebook: Path, save_dir: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """nbval as `make test` runs it, with this plugin, on one notebook outside notebooks/ (its tests' canaries)."""
    cmd = [sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env", "-p", "lab_utils.nbval_plugin",
           "-p", "no:cacheprovider", "-q", "--color=no", str(notebook)]
    env = {**os.environ, SAVE_ENV: str(save_dir)}
    return subprocess.run(cmd, cwd=notebook.parent, env=env, capture_output=True, text=True, timeout=timeout)
