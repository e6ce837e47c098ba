"""Every chapter, as a learner sees it in JupyterLab in headless Chromium: widgets drawn, progress bars finished,
plots loaded, no error output, no JavaScript error, every cell run.

Run by `make test` as its own step, after nbval: `python -m pytest tests/browser/check_notebooks.py` (the file name
does not match test_*.py on purpose, so `pytest tests` stays the fast suite). One test per notebook, so a failure
names it; a full-page screenshot of each lands in build/screenshots/NN_name.png.

Two ways to see a chapter, so that `make test` executes each one about once:
- rendered: with LAB_BROWSER_EXECUTED=DIR (make test: build/executed, written by nbval through
  lab_utils/nbval_plugin.py), the chapter's executed copy is opened, signed as trusted (as the learner's own
  outputs are), and what its stored outputs and widget state render to is checked, without running it again.
- live: opened and run from the menu (Run → Run All Cells) in a fresh kernel, then saved. Chapters matching
  LAB_BROWSER_LIVE (default 00_preflight: the first chapter every learner runs) always run live, which keeps the
  path a learner takes (kernel, widget messages while cells run, the menu) under test; without
  LAB_BROWSER_EXECUTED every chapter runs live.
Either way each verdict cell's stdout must equal the committed one after nbval's sanitizers
(`nbbuild.verdict_text`, streams coalesced as nbval does), so the browser and nbval agree on what a verdict is.

Two canaries: a deliberately broken notebook is run live, and also run under nbval (with the lab's plugin) and its
executed copy rendered. Each must have every defect reported, so a check that can no longer fail is itself a
failure, in both ways of seeing a chapter; the nbval run must also name the verdict claim that changed.

Environment: LAB_BROWSER_NOTEBOOKS (glob, default notebooks/[0-9]*.ipynb), LAB_BROWSER_EXECUTED (folder, unset:
every chapter live), LAB_BROWSER_LIVE (comma-separated chapter stems run live even so; default 00_preflight),
LAB_BROWSER_TIMEOUT (seconds per notebook, default 900), LAB_CHROMIUM (default /usr/bin/chromium),
LAB_SCREENSHOTS (default build/screenshots).
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

from lab_utils.nbval_plugin import run_nbval  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PATTERN = os.environ.get("LAB_BROWSER_NOTEBOOKS", str(REPO / "notebooks" / "[0-9]*.ipynb"))
NOTEBOOKS = sorted(Path(p) for p in glob.glob(PATTERN))
TIMEOUT = float(os.environ.get("LAB_BROWSER_TIMEOUT", "900"))
SHOTS = Path(os.environ.get("LAB_SCREENSHOTS", REPO / "build" / "screenshots"))
EXECUTED = Path(os.environ["LAB_BROWSER_EXECUTED"]) if os.environ.get("LAB_BROWSER_EXECUTED") else None
LIVE = {s.strip() for s in os.environ.get("LAB_BROWSER_LIVE", "00_preflight").split(",") if s.strip()}
CANARY = "zz_canary_broken.ipynb"
CANARY_EXECUTED = "zz_canary_executed.ipynb"


def rendered(notebook: Path) -> bool:
    """Whether this chapter is checked from nbval's executed copy (else run live)."""
    return EXECUTED is not None and notebook.stem not in LIVE


def _canary(path: Path) -> None:
    """One of each defect the checks exist for; the canary tests require each one to be reported."""
    from lab_utils.nbbuild import KERNELSPEC, MARK

    cells = [
        "import ipywidgets as w\nfrom tqdm.auto import tqdm\nfor i in tqdm(range(10), desc='stops early'):\n"
        "    if i == 4:\n        break",
        "class Broken(w.DOMWidget):\n    _model_module = _view_module = 'no-such-widget-module'\n"
        "    _model_name, _view_name = 'NoModel', 'NoView'\nBroken()",
        # What a learner sees when the widget manager is missing: the widget's repr as plain text.
        "from IPython.display import display\ndisplay({'text/plain': repr(w.VBox([w.IntSlider()]))}, raw=True)",
        "import matplotlib.pyplot as plt\nplt.figure()  # an empty figure: the inline backend shows only its repr",
        # A verdict cell whose table is not the committed one (the committed table is set below): the claim's
        # measured value changed while the cell itself passes, which only the comparison catches.
        f"# {MARK}\nfrom lab_utils.chapter import Verdicts\nv = Verdicts('canary')\n"
        "v.check('the canary claim', 'tier 2', 'tier 1', ok=True)\nv.show()",
        "1 / 0",
        # Aborted by the error above when run live; skipped by nbval, so its executed copy has it unrun.
        "# NBVAL_SKIP\nprint('aborted by the error above')",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    verdict = next(c for c in nb.cells if MARK in c.source)
    verdict.outputs = [nbformat.v4.new_output("stream", name="stdout", text=(
        "canary\nclaim            | expected | measured\n-----------------+----------+---------\n"
        "the canary claim | tier 2   | tier 2\n"))]
    verdict.execution_count = 1
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nbformat.write(nb, path)


# What each canary must have reported: check → a fragment of its message.
CANARY_EXPECTED = {"unfinished progress bar": "progress bar not finished",
                   "unknown widget model": "Error displaying widget",
                   "widget printed as text": "a widget shown as text",
                   "figure printed as text": "a figure shown as text",
                   "traceback": "error output: ZeroDivisionError",
                   "saved error output": "saved notebook has an error output: ZeroDivisionError",
                   "aborted cell": "never ran",
                   "verdict table not the committed one": "verdict output differs from the committed notebook",
                   "console error from the widget manager": "console error:"}


@pytest.fixture(scope="module")
def lab_and_browser(_live_progress):
    from playwright.sync_api import sync_playwright

    work = Path(tempfile.mkdtemp(prefix="lab_browser_"))
    canary = work / CANARY
    _canary(canary)
    # The kernels' runs go to a fresh folder, as on a clean clone (never into the repository's runs/).
    env = {"LAB_RUNS_DIR": str(work / "runs"), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    # A rendered chapter's copy in the lab is nbval's executed notebook (missing: its test says so).
    shown = [EXECUTED / p.name if rendered(p) and (EXECUTED / p.name).exists() else p for p in NOTEBOOKS]
    lab = Lab([*shown, canary], work / "lab", env=env)
    for p in NOTEBOOKS:
        if rendered(p) and (lab.root / p.name).exists() and (EXECUTED / p.name).exists():
            lab.trust_saved_outputs(p.name)
    committed = {p.name: p for p in [*NOTEBOOKS, canary]}
    committed[CANARY_EXECUTED] = canary
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


def _missed(problems: list[str]) -> list[str]:
    text = "\n".join(problems)
    return [what for what, fragment in CANARY_EXPECTED.items() if fragment not in text]


def test_checks_catch_a_broken_notebook(lab_and_browser):
    """Live: the canary run from the menu."""
    lab, context, committed = lab_and_browser
    res = run_notebook(context, lab, CANARY, timeout=300)
    res.problems += verdict_problems(committed[CANARY], lab.root / CANARY)
    _progress(f"canary, live: {len(res.problems)} problems found as expected ({res.seconds:.0f} s)")
    missed = _missed(res.problems)
    assert not missed, f"checks that did not fire on the canary: {missed}\nproblems:\n" + "\n".join(res.problems)


def test_checks_catch_a_broken_executed_notebook(lab_and_browser):
    """Rendered: the canary under nbval with the lab's plugin (as make test runs the chapters), then its executed
    copy opened without running. nbval must fail the verdict cell naming the claim that changed."""
    lab, context, committed = lab_and_browser
    saved = lab.workdir / "nbval-executed"
    t0 = time.time()
    run = run_nbval(committed[CANARY], saved)
    out = run.stdout + run.stderr
    assert run.returncode == 1, f"nbval on the canary: exit {run.returncode}, expected 1 (tests failed)\n{out}"
    for fragment in ("VERDICT FAILED: ✗ canary: the canary claim: expected tier 2, this run measured tier 1",
                     "ZeroDivisionError"):
        assert fragment in out, f"nbval's report lacks {fragment!r}:\n{out[-6000:]}"
    shutil.copy2(saved / CANARY, lab.root / CANARY_EXECUTED)
    lab.trust_saved_outputs(CANARY_EXECUTED)
    res = run_notebook(context, lab, CANARY_EXECUTED, timeout=300, execute=False)
    res.problems += verdict_problems(committed[CANARY_EXECUTED], lab.root / CANARY_EXECUTED)
    _progress(f"canary, nbval then rendered: {len(res.problems)} problems found as expected "
              f"({time.time() - t0:.0f} s)")
    missed = _missed(res.problems)
    assert not missed, (f"checks that did not fire on the executed canary: {missed}\nproblems:\n"
                        + "\n".join(res.problems))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_in_jupyterlab(lab_and_browser, notebook):
    lab, context, committed = lab_and_browser
    if rendered(notebook):
        executed = EXECUTED / notebook.name
        assert executed.exists(), (f"no executed copy {executed}: nbval writes it (make test runs nbval first, "
                                   "with LAB_NBVAL_SAVE)")
        stale = _stale(notebook, executed)
        assert not stale, stale
        _progress(f"{notebook.name}: opening nbval's executed copy ...")
    else:
        _progress(f"{notebook.name}: opening, Run → Run All Cells ...")
    res = run_notebook(context, lab, notebook.name, timeout=TIMEOUT, shots=SHOTS, execute=not rendered(notebook))
    res.problems += verdict_problems(committed[notebook.name], lab.root / notebook.name)
    counts = ", ".join(f"{v} {k}" for k, v in res.counts.items())
    how = "rendered" if rendered(notebook) else "run live"
    _progress(f"{notebook.name}: {'ok' if not res.problems else 'FAILED'} ({how}) in {res.seconds:.0f} s "
              f"({counts}); screenshot {res.screenshot}")
    for note in res.notes:
        _progress(f"  note: {note}")
    assert not res.problems, f"{notebook.name}:\n" + "\n".join(f"  - {p}" for p in res.problems)


def _stale(committed: Path, executed: Path) -> str:
    """An executed copy must be of this notebook: the same code, cell by cell."""
    def code(p):
        return [c.source for c in nbformat.read(p, as_version=4).cells if c.cell_type == "code"]

    return "" if code(committed) == code(executed) else (
        f"{executed} is not an execution of the committed {committed.name} (its code differs): a stale copy")


def verdict_problems(committed: Path, saved: Path) -> list[str]:
    """nbval-lax's output check, on the notebook saved: each verdict cell's stdout equals the committed one after
    nbval's sanitizers (the same file nbval uses)."""
    import difflib

    from lab_utils.nbbuild import sanitize, sanitize_patterns, verdict_text
    from lab_utils.nbval_plugin import SANITIZE_FILE

    patterns = sanitize_patterns(SANITIZE_FILE)
    want, got = (sanitize(verdict_text(nbformat.read(p, as_version=4)), patterns) for p in (committed, saved))
    if not want:
        return [f"{committed.name}: the committed notebook has no verdict output (make strip NB=...)"]
    if got == want:
        return []
    diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), "committed", "this run"))
    return [f"verdict output differs from the committed notebook (refresh with `make strip "
            f"NB=notebooks/{committed.name}` if the change is meant):\n{diff}"]


def test_notebooks_found():
    assert NOTEBOOKS, f"no notebooks match {PATTERN}"
