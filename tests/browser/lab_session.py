"""Drive real JupyterLab in headless Chromium: open a notebook, Run → Run All Cells, and check what a learner sees.

Used by tests/browser/check_notebooks.py (`make test`'s last step). Everything runs offline and as root in CI:
- JupyterLab listens on 127.0.0.1 with a random token, with the extension manager read-only, no news feed and
  no update check, and its root_dir is a *copy* of the notebooks (autosave never writes into the repository);
  its config, settings, workspaces and runtime folders are fresh temporary folders, so a user's own JupyterLab
  settings cannot change what the test sees.
- Chromium is Debian's (`/usr/bin/chromium`, or $LAB_CHROMIUM), driven by Playwright through executable_path,
  with a fresh profile and every background network feature off.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

CHROMIUM = os.environ.get("LAB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
                 "--disable-default-apps", "--disable-extensions"]

# User settings written into the fresh settings folder. windowingMode "none" renders every cell (the default
# virtual scrolling leaves off-screen outputs out of the DOM, so they could be neither checked nor captured).
SETTINGS = {"@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
            "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                                 "checkForUpdates": False}}

# A cell prompt reads "[*]:" while the cell is queued or running, "[7]:" when done and "[ ]:" when never run
# (or aborted after an earlier cell raised).
_JS_STATE = """() => {
  const nb = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  if (!nb) return {found: false};
  const ind = nb.querySelector('.jp-Notebook-ExecutionIndicator');
  const prompts = [...nb.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(p => p.textContent.trim());
  return {found: true, status: ind ? ind.getAttribute('data-status') : null, prompts,
          dialog: !!document.querySelector('.jp-Dialog')};
}"""

# Everything the checks need from the rendered notebook, read in one pass.
_JS_OUTPUTS = """() => {
  const nb = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  const outs = [...nb.querySelectorAll('.jp-OutputArea-output')];
  const cellOf = el => {
    const cells = [...nb.querySelectorAll('.jp-Notebook .jp-Cell')];
    return cells.indexOf(el.closest('.jp-Cell'));
  };
  return outs.map(o => {
    const mime = o.getAttribute('data-mime-type');
    const imgs = [...o.querySelectorAll('img')].map(i => ({complete: i.complete, w: i.naturalWidth,
                                                           h: i.naturalHeight}));
    const bars = [...o.querySelectorAll('.widget-hprogress, .widget-vprogress')].map(b => {
      const bar = b.querySelector('.progress-bar');
      return {width: bar ? bar.style.width : null, cls: bar ? bar.className : '', text: b.parentElement ?
              b.parentElement.textContent.trim() : ''};
    });
    return {cell: cellOf(o), mime, text: o.textContent.slice(0, 4000), imgs, bars,
            widgets: o.querySelectorAll('.jupyter-widgets').length,
            broken: o.querySelectorAll('.jupyter-widgets-error-widget').length};
  });
}"""

_TRACEBACK = re.compile(r"Traceback \(most recent call last\)|^\s*\w*(Error|Exception|Interrupt)\b.*", re.M)
# What a widget looks like when the front end could not render it: its Python repr.
_RAW_WIDGET = re.compile(r"^\s*[A-Z]\w*\((children|value|description|layout|options|max|min)=", re.M)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """A JupyterLab server on a copy of `notebooks`; stop() ends it (and its kernels) by its process group."""

    def __init__(self, notebooks: list[Path], workdir: Path, env: dict[str, str] | None = None):
        self.workdir = Path(workdir)
        self.root = self.workdir / "notebooks"
        self.root.mkdir(parents=True)
        for nb in notebooks:
            shutil.copy2(nb, self.root / nb.name)
        self.token = secrets.token_hex(24)
        self.port = free_port()
        jdirs = {name: self.workdir / name for name in ("config", "settings", "workspaces", "runtime", "data")}
        for d in jdirs.values():
            d.mkdir()
        for rel, value in SETTINGS.items():
            target = jdirs["settings"] / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(value))
        self.env = {**os.environ, **(env or {}), "JUPYTER_CONFIG_DIR": str(jdirs["config"]),
                    "JUPYTERLAB_SETTINGS_DIR": str(jdirs["settings"]),
                    "JUPYTERLAB_WORKSPACES_DIR": str(jdirs["workspaces"]),
                    "JUPYTER_RUNTIME_DIR": str(jdirs["runtime"]),
                    # where the server's notary keeps its secret and signatures (trust_saved_outputs)
                    "JUPYTER_DATA_DIR": str(jdirs["data"]),
                    "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
        self.log_path = self.workdir / "jupyterlab.log"
        self.proc: subprocess.Popen | None = None

    def trust_saved_outputs(self, name: str) -> None:
        """Sign the copy of `name` as the server's notary would (`jupyter trust`): JupyterLab renders the stored
        outputs of an unsigned notebook only in "safe" types, so widgets would show as their text repr. Used for
        notebooks whose outputs this test run produced (nbval's executed copies), never for anything else."""
        from nbformat.sign import NotebookNotary

        path = self.root / name
        nb = nbformat.read(path, as_version=4)
        NotebookNotary(data_dir=self.env["JUPYTER_DATA_DIR"]).sign(nb)
        nbformat.write(nb, path)

    def command(self) -> list[str]:
        # Flags checked against jupyterlab 4 (labapp.py): extension_manager "readonly" has no install
        # capability; news_url=None turns the announcements feed off; NeverCheckForUpdate never calls PyPI.
        return [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ip=127.0.0.1",
                f"--port={self.port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
                f"--ServerApp.root_dir={self.root}", "--LabApp.extension_manager=readonly",
                "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                "--ServerApp.open_browser=False", "--LanguageServerManager.autodetect=False"]

    def start(self, timeout: float = 120) -> Lab:
        self.log = open(self.log_path, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(self.command(), stdout=self.log, stderr=subprocess.STDOUT, env=self.env,
                                     cwd=self.root, start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.base}/api/status?token={self.token}", timeout=5) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"JupyterLab did not answer within {timeout:.0f} s:\n{self.log_tail()}")

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, name: str) -> str:
        return f"{self.base}/lab/tree/{name}?token={self.token}&reset"

    def api(self, path: str):
        with urllib.request.urlopen(f"{self.base}{path}?token={self.token}", timeout=30) as r:
            return json.loads(r.read())

    def kernel_state(self, name: str) -> str | None:
        """The execution_state the server reports for the kernel of notebook `name` (None: no session yet)."""
        for session in self.api("/api/sessions"):
            if session.get("path") == name and session.get("kernel"):
                return session["kernel"].get("execution_state")
        return None

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
            except ProcessLookupError:
                pass
        if getattr(self, "log", None):
            self.log.close()


def launch_chromium(playwright, profile_dir: Path):
    """A persistent context gives Chromium a fresh profile folder of our choosing (launch() would not)."""
    if not Path(CHROMIUM).exists():
        raise FileNotFoundError(f"{CHROMIUM} not found: install Debian's chromium (apt-get install chromium) "
                                "or set LAB_CHROMIUM")
    return playwright.chromium.launch_persistent_context(
        str(profile_dir), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
        viewport={"width": 1400, "height": 1000}, service_workers="block")


@dataclass
class Result:
    name: str
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    screenshot: Path | None = None


def _wait(page, predicate, timeout: float, what: str, poll: float = 0.5):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = page.evaluate(_JS_STATE)
        if predicate(last):
            return last
        page.wait_for_timeout(poll * 1000)
    raise TimeoutError(f"{what} not reached within {timeout:.0f} s (last state: {json.dumps(last)[:400]})")


def _menu(page, top: str, item: str) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{re.escape(top)}$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{re.escape(item)}$")).click()


def run_notebook(context, lab: Lab, name: str, timeout: float, shots: Path | None = None,
                 execute: bool = True) -> Result:
    """Open `name` in the lab, wait for an idle kernel, Run All Cells from the menu, wait, check, screenshot.

    execute=False: check what the notebook's stored outputs render to, as a learner sees an executed notebook
    they open (nbval's executed copies; sign them first with Lab.trust_saved_outputs), and leave it unsaved."""
    res = Result(name)
    start = time.time()
    page = context.new_page()
    page_errors: list[str] = []
    page.on("pageerror", lambda e: page_errors.append(f"page error: {e}"))
    page.on("console", lambda m: page_errors.append(f"console error: {m.text[:300]}") if m.type == "error"
            else None)
    try:
        page.goto(lab.url(name), wait_until="domcontentloaded", timeout=120_000)
        # "Run All" before the kernel is ready opens a kernel dialog or is lost. The toolbar indicator says
        # "idle" for a moment before the kernel even starts, so also require the server's session for this
        # notebook to have a kernel that is idle, twice in a row.
        settled = {"n": 0}

        def ready(s):
            ok = s.get("found") and s.get("status") == "idle" and lab.kernel_state(name) == "idle"
            settled["n"] = settled["n"] + 1 if ok else 0
            return settled["n"] >= 2

        _wait(page, ready, 180, "kernel idle", poll=1.0)
        page.keyboard.press("Control+b")  # hide the file browser: the screenshot is the notebook
        if execute:
            _run_all(page, lab, name, timeout)
        # Widgets render asynchronously after the kernel is idle; give pending views a moment.
        page.wait_for_function("() => !document.body.innerText.includes('Loading widget...')", timeout=30_000)
        page.wait_for_timeout(1000)
        res.seconds = time.time() - start
        _check_dom(page, res)
        _check_file(page, lab, name, res, save=execute)
        if shots is not None:
            res.screenshot = _screenshot(page, shots / (Path(name).stem + ".png"))
    except Exception as e:  # the failure names the notebook (the caller reports res), never a bare timeout
        res.seconds = time.time() - start
        res.problems.append(f"{type(e).__name__}: {str(e).splitlines()[0][:500]}")
        if shots is not None:
            try:
                res.screenshot = _screenshot(page, shots / (Path(name).stem + ".png"))
            except Exception as shot_error:
                res.notes.append(f"no screenshot: {shot_error}")
    finally:
        res.problems += page_errors
        page.close()
    return res


def _run_all(page, lab: Lab, name: str, timeout: float) -> None:
    _menu(page, "Run", "Run All Cells")
    # Every code cell is queued at once ("[*]"). The run has started once some prompt shows "*" or a
    # count; it is over when no "[*]" is left and the kernel is idle twice in a row (1 s apart), which
    # also covers a cell that raised (JupyterLab then aborts the queued cells: their prompts go "[ ]").
    _wait(page, lambda s: any(p not in ("[ ]:", "[ ]") for p in s.get("prompts", [])), 60,
          "Run All Cells started")
    settled = {"n": 0}

    def done(s):
        idle = s.get("status") == "idle" and not any("*" in p for p in s.get("prompts", []))
        idle = idle and lab.kernel_state(name) == "idle"
        settled["n"] = settled["n"] + 1 if idle else 0
        return settled["n"] >= 2

    _wait(page, done, timeout, "all cells finished", poll=1.0)


def _check_dom(page, res: Result) -> None:
    outs = page.evaluate(_JS_OUTPUTS)
    state = page.evaluate(_JS_STATE)
    res.counts = {"outputs": len(outs), "widgets": 0, "images": 0, "progress bars": 0}
    for o in outs:
        where = f"cell {o['cell']}"
        text, mime = o["text"], o["mime"]
        if mime == "application/vnd.jupyter.stderr":
            if _TRACEBACK.search(text):
                res.problems.append(f"{where}: error output: {_first_error_line(text)}")
            elif text.strip() and not o["bars"]:
                res.notes.append(f"{where}: stderr: {text.strip().splitlines()[0][:160]}")
        # ipywidgets 8 draws a widget it cannot build as an icon (.jupyter-widgets-error-widget) whose text,
        # "Error displaying widget: ...", only shows on hover; either form is a failure.
        if o["broken"] or "Error displaying widget" in text:
            res.problems.append(f"{where}: Error displaying widget {text.strip()[:200]!r}")
        # The widget renderer's output node carries no data-mime-type (checked on jupyterlab 4.6/ipywidgets 8).
        if mime in (None, "application/vnd.jupyter.widget-view+json"):
            res.counts["widgets"] += 1
            if not o["widgets"]:
                res.problems.append(f"{where}: a widget output rendered no widget: {text.strip()[:200]!r}")
        elif mime == "text/plain" and _RAW_WIDGET.search(text):
            res.problems.append(f"{where}: a widget shown as text: {text.strip()[:120]!r}")
        if mime == "text/plain" and text.lstrip().startswith("<Figure size"):
            res.problems.append(f"{where}: a figure shown as text: {text.strip()[:80]!r}")
        if mime == "image/png":
            res.counts["images"] += 1
            bad = [i for i in o["imgs"] if not (i["complete"] and i["w"] > 0 and i["h"] > 0)]
            if not o["imgs"] or bad:
                res.problems.append(f"{where}: image/png output without a loaded image ({o['imgs']})")
        for b in o["bars"]:
            res.counts["progress bars"] += 1
            # tqdm.notebook leaves a finished bar full; one closed early turns red (bar_style "danger").
            if b["width"] != "100%" or "danger" in b["cls"]:
                res.problems.append(f"{where}: progress bar not finished ({b['width']}): {b['text'][:120]!r}")
    unrun = [i for i, p in enumerate(state.get("prompts", [])) if p in ("[ ]:", "[ ]")]
    if unrun:
        res.problems.append(f"code cells {unrun} (by code-cell index) never ran")


def _first_error_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if re.match(r"\s*\w*(Error|Exception|Interrupt)\b", ln)]
    return (lines[-1] if lines else text.strip().splitlines()[0])[:300]


def _check_file(page, lab: Lab, name: str, res: Result, save: bool = True) -> None:
    """Save (File → Save Notebook) into the copy unless told not to, and cross-check the DOM against the
    stored outputs."""
    path = lab.root / name
    if save:
        _menu(page, "File", "Save Notebook")
        deadline = time.time() + 30
        while time.time() < deadline:
            page.wait_for_timeout(500)
            if page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-mod-dirty").count() == 0:
                break
    nb = nbformat.read(path, as_version=4)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    for e in errors:
        res.problems.append(f"saved notebook has an error output: {e.get('ename')}: {e.get('evalue', '')[:200]}")
    pngs = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
               for o in c.get("outputs", []))
    views = sum("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for c in nb.cells
                if c.cell_type == "code" for o in c.get("outputs", []))
    if pngs != res.counts.get("images"):
        res.problems.append(f"{pngs} image/png outputs saved but {res.counts.get('images')} rendered as images")
    if views != res.counts.get("widgets"):
        res.problems.append(f"{views} widget outputs saved but {res.counts.get('widgets')} rendered as widgets")
    unrun = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.strip()
             and c.get("execution_count") is None]
    if unrun and not any("never ran" in p for p in res.problems):
        res.problems.append(f"cells {unrun} have no execution count after Run All")


_JS_SCROLLER = """() => document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer')
                     || document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook')"""


def _screenshot(page, target: Path) -> Path:
    """The whole notebook in one picture: scroll it to the top, grow the viewport to its height, capture."""
    target.parent.mkdir(parents=True, exist_ok=True)
    top = f"() => {{ const s = ({_JS_SCROLLER})(); if (s) s.scrollTop = 0; return s ? s.scrollHeight : 0; }}"
    height = page.evaluate(top)
    width = page.viewport_size["width"]
    page.set_viewport_size({"width": width, "height": max(1000, min(int(height) + 150, 30000))})
    page.wait_for_timeout(1500)
    page.evaluate(top)  # Run All leaves the last cell active; the resize may scroll to keep it in view
    page.wait_for_timeout(500)
    page.screenshot(path=str(target), full_page=True)
    page.set_viewport_size({"width": width, "height": 1000})
    return target
