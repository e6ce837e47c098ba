"""Every chapter, opened in JupyterLab in headless Chromium and run from the menu, renders what a learner expects.

Run by `make test` as its own step: `python -m pytest tests/browser/check_notebooks.py` (the file name does not
match test_*.py on purpose, so `pytest tests` stays the fast suite). One test per notebook, so a failure names
it; a full-page screenshot of each lands in build/screenshots/NN_name.png. The first test runs a deliberately
broken notebook and requires every check to fire, so a check that can no longer fail is itself a failure.

This is the only place `make test` executes the notebooks. Besides what a learner sees, it makes nbval-lax's two
checks on the notebook JupyterLab saved: no cell has an error output, and each verdict cell
(`# NBVAL_CHECK_OUTPUT`) printed exactly the stdout committed in the repository (`nbbuild.verdict_text`, streams
coalesced as nbval does). Running nbval as well would execute every chapter a second time for no extra check;
`make nbval` keeps it as the headless runner for boxes without Chromium.

Environment: LAB_BROWSER_NOTEBOOKS (glob, default notebooks/[0-9]*.ipynb), LAB_BROWSER_TIMEOUT (seconds per
notebook, default 900), LAB_CHROMIUM (default /usr/bin/chromium), LAB_SCREENSHOTS (default build/screenshots).
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lab_session import Lab, launch_chromium, run_notebook  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PATTERN = os.environ.get("LAB_BROWSER_NOTEBOOKS", str(REPO / "notebooks" / "[0-9]*.ipynb"))
NOTEBOOKS = sorted(Path(p) for p in glob.glob(PATTERN))
TIMEOUT = float(os.environ.get("LAB_BROWSER_TIMEOUT", "900"))
SHOTS = Path(os.environ.get("LAB_SCREENSHOTS", REPO / "build" / "screenshots"))
CANARY = "zz_canary_broken.ipynb"


def _canary(path: Path) -> None:
    """One of each defect the checks exist for; the canary test requires each one to be reported."""
    from lab_utils.nbbuild import KERNELSPEC, MARK

    cells = [
        "import ipywidgets as w\nfrom tqdm.auto import tqdm\nfor i in tqdm(range(10), desc='stops early'):\n"
        "    if i == 4:\n        break",
        "class Broken(w.DOMWidget):\n    _model_module = _view_module = 'no-such-widget-module'\n"
        "    _model_name, _view_name = 'NoModel', 'NoView'\nBroken()",
        # What a learner sees when the widget manager is missing: the widget's repr as plain text.
        "from IPython.display import display\ndisplay({'text/plain': repr(w.VBox([w.IntSlider()]))}, raw=True)",
        "import matplotlib.pyplot as plt\nplt.figure()  # an empty figure: the inline backend shows only its repr",
        # A verdict cell whose table is not the committed one (the committed output is set below).
        f"# {MARK}\nprint('measured: tier 1')",
        "1 / 0",
        "print('aborted by the error above')",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    verdict = next(c for c in nb.cells if MARK in c.source)
    verdict.outputs = [nbformat.v4.new_output("stream", name="stdout", text="measured: tier 2\n")]
    verdict.execution_count = 1
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nbformat.write(nb, path)


@pytest.fixture(scope="module")
def lab_and_browser(_live_progress):
    from playwright.sync_api import sync_playwright

    work = Path(tempfile.mkdtemp(prefix="lab_browser_"))
    canary = work / CANARY
    _canary(canary)
    # The kernels' runs go to a fresh folder, as on a clean clone (never into the repository's runs/).
    env = {"LAB_RUNS_DIR": str(work / "runs"), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    lab = Lab([*NOTEBOOKS, canary], work / "lab", env=env)
    committed = {p.name: p for p in [*NOTEBOOKS, canary]}
    t0 = time.time()
    lab.start()
    try:
        with sync_playwright() as pw:
            context = launch_chromium(pw, work / "chromium-profile")
            _progress(f"JupyterLab on 127.0.0.1:{lab.port} and Chromium up in {time.time() - t0:.0f} s "
                      f"(work folder {work})")
            try:
                yield lab, context, committed
            finally:
                context.close()
    finally:
        lab.stop()
    if os.environ.get("LAB_BROWSER_KEEP"):
        _progress(f"kept {work} (JupyterLab log: {lab.log_path})")
    else:
        shutil.rmtree(work, ignore_errors=True)


_CAPTURE = {}


def _progress(msg: str) -> None:
    """Print now, past pytest's output capture: a long run should say which notebook it is on."""
    manager = _CAPTURE.get("manager")
    if manager is None:
        print(f"[browser] {msg}", file=sys.stderr, flush=True)
        return
    with manager.global_and_fixture_disabled():
        print(f"[browser] {msg}", file=sys.stderr, flush=True)


@pytest.fixture(scope="module", autouse=True)
def _live_progress(pytestconfig):
    _CAPTURE["manager"] = pytestconfig.pluginmanager.getplugin("capturemanager")


def test_checks_catch_a_broken_notebook(lab_and_browser):
    lab, context, committed = lab_and_browser
    res = run_notebook(context, lab, CANARY, timeout=300)
    res.problems += verdict_problems(committed[CANARY], lab.root / CANARY)
    _progress(f"canary: {len(res.problems)} problems found as expected ({res.seconds:.0f} s)")
    text = "\n".join(res.problems)
    expected = {"unfinished progress bar": "progress bar not finished",
                "unknown widget model": "Error displaying widget",
                "widget printed as text": "a widget shown as text",
                "figure printed as text": "a figure shown as text",
                "traceback": "error output: ZeroDivisionError",
                "saved error output": "saved notebook has an error output: ZeroDivisionError",
                "aborted cell": "never ran",
                "verdict table not the committed one": "verdict output differs from the committed notebook",
                "console error from the widget manager": "console error:"}
    missed = [what for what, fragment in expected.items() if fragment not in text]
    assert not missed, f"checks that did not fire on the canary: {missed}\nproblems:\n{text}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_in_jupyterlab(lab_and_browser, notebook):
    lab, context, committed = lab_and_browser
    _progress(f"{notebook.name}: opening, Run → Run All Cells ...")
    res = run_notebook(context, lab, notebook.name, timeout=TIMEOUT, shots=SHOTS)
    res.problems += verdict_problems(committed[notebook.name], lab.root / notebook.name)
    counts = ", ".join(f"{v} {k}" for k, v in res.counts.items())
    _progress(f"{notebook.name}: {'ok' if not res.problems else 'FAILED'} in {res.seconds:.0f} s ({counts}); "
              f"screenshot {res.screenshot}")
    for note in res.notes:
        _progress(f"  note: {note}")
    assert not res.problems, f"{notebook.name}:\n" + "\n".join(f"  - {p}" for p in res.problems)


def verdict_problems(committed: Path, saved: Path) -> list[str]:
    """nbval-lax's output check, on the notebook JupyterLab saved: each verdict cell's stdout equals the committed."""
    import difflib

    from lab_utils.nbbuild import verdict_text

    want, got = (verdict_text(nbformat.read(p, as_version=4)) for p in (committed, saved))
    if not want:
        return [f"{committed.name}: the committed notebook has no verdict output (make strip NB=...)"]
    if got == want:
        return []
    diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), "committed", "this run"))
    return [f"verdict output differs from the committed notebook (refresh with `make strip "
            f"NB=notebooks/{committed.name}` if the change is meant):\n{diff}"]


def test_notebooks_found():
    assert NOTEBOOKS, f"no notebooks match {PATTERN}"
