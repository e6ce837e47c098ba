"""What every chapter notebook shares: its parameters, launching and comparing runs, the "We measured"
half of an article box, widget controls that run headless, and `Verdicts`, which states each lesson once
and yields both the assertion and the row of the table nbval compares.

Taught in notebooks/00_preflight.ipynb (the first notebook explains each of these once).
"""

from __future__ import annotations

import html
import inspect
import os
from dataclasses import dataclass
from pathlib import Path

from lab_utils.analysis import parity
from lab_utils.core import runfiles
from lab_utils.launch import launcher


@dataclass(frozen=True)
class Params:
    steps: int
    nproc: int
    backend: str
    timeout: float


def params(steps: int = 40, nproc: int = 2) -> Params:
    """The notebook's parameters: defaults sized for 2 CPU cores, overridable from the environment
    (LAB_STEPS, LAB_NPROC, LAB_BACKEND, LAB_TIMEOUT) so CI, a laptop and a GPU box run the same file."""
    def env_number(name, default, kind=int):
        raw = os.environ.get(name)
        if raw is None:
            return default
        try:
            value = kind(raw)
        except ValueError:
            raise ValueError(f"{name}={raw!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not value >= 1:
            raise ValueError(f"{name}={value} must be >= 1")
        return value

    from lab_utils.core.config import KEYS

    backend = os.environ.get("LAB_BACKEND", "auto")
    if backend not in KEYS["backend"].choices:
        raise ValueError(f"LAB_BACKEND={backend!r} is not one of {', '.join(KEYS['backend'].choices)}")
    return Params(env_number("LAB_STEPS", steps), env_number("LAB_NPROC", nproc), backend,
                  env_number("LAB_TIMEOUT", 300.0, float))


def run_dir(name: str) -> Path:
    """The folder of run `name` (runs/NAME, or under $LAB_RUNS_DIR)."""
    return runfiles.runs_dir() / name


def run_request(name: str, nproc: int, p: Params, quiet: bool = False, max_restarts: int = 0,
                **keys) -> launcher.LaunchRequest:
    """The request a notebook's run makes: steps and backend from the parameters cell unless given, its timeout,
    a progress bar unless `quiet`."""
    keys.setdefault("steps", p.steps)
    keys.setdefault("backend", p.backend)
    return launcher.request(name, nproc, dict(keys), timeout=p.timeout, progress=not quiet,
                            max_restarts=max_restarts)


def run(name: str, nproc: int, p: Params, quiet: bool = False, max_restarts: int = 0, **keys) -> launcher.RunResult:
    """Launch one run for a notebook (steps and backend from the parameters cell unless given), print the exact
    command it used, and raise with the failing rank's traceback if it did not finish. `max_restarts`: torchrun's
    elastic restart of every rank after a failure (chapter 12)."""
    result = launcher.launch(run_request(name, nproc, p, quiet, max_restarts, **keys))
    if not quiet:
        print(f"$ {result.command_line}")
    return result.raise_for_status()


def workers(max_workers: int, n_runs: int) -> int:
    """How many launches overlap: `max_workers` is sized for 2 CPU cores (the CI box); a box with more cores runs
    up to one launch per 4 cores. On a GPU box a launch is mostly process start-up (python, torch, a CUDA
    context: 11-14 s on the two-H200 box against ~2 s of training), which more cores absorb."""
    return max(1, min(n_runs, max(max_workers, (os.cpu_count() or 2) // 4)))


def run_many(specs: dict[str, tuple[str, int, dict]], p: Params, max_workers: int = 3
             ) -> dict[str, launcher.RunResult]:
    """Launch independent runs at once: `specs` = {key: (run name, nproc, keys[, max_restarts])}; returns
    {key: RunResult}. `max_workers`: how many at once on 2 cores (more where there are more: `workers`).
    Each training process uses one thread and a fixed reduction order, so overlapping runs changes their wall
    time, never their numbers. Raises with the first failing rank's traceback (in `specs` order) once every run
    has ended; else prints each command."""
    requests = {key: run_request(spec[0], spec[1], p, True, *spec[3:], **spec[2]) for key, spec in specs.items()}
    results = launcher.launch_many(requests, max_workers=workers(max_workers, len(specs)))
    for r in results.values():
        r.raise_for_status()
    for r in results.values():
        print(f"$ {r.command_line}   # {r.status}")
    return results


def compare(a: str, b: str, noise: list[str] | str | None = None, windows: bool = True,
            **tolerances) -> parity.ParityReport:
    """The parity report of two runs by name; `noise`: float twins of `a` by name (or "auto": the runs named
    a-twin-*, which `run(..., twin=True)` makes); `tolerances`: loss_tol, param_tol, output_tol, conv_rtol.

    windows: when the whole-run envelope leaves steps of a tier-2 report not judged (past its blind step) and `b`
    holds window states, replay `a`'s program from them (launch/replay.py, cached in b/replays/) and judge every
    window, as `ddp-lab compare` does. Only then, where the windows can change the verdict (certify those steps,
    or find a bug in them): a replay costs two runs, and a chapter's runs below tier 2 are already judged."""
    if noise and noise != "auto":
        noise = [run_dir(t) for t in ([noise] if isinstance(noise, str) else noise)]
    report = parity.compare(run_dir(a), run_dir(b), noise_runs=noise, **tolerances)
    if windows and report.tier == 2 and report.not_judged:
        from lab_utils.launch import replay

        try:
            pair = replay.ensure(run_dir(a), run_dir(b), progress=False)
        except replay.NoReplay as e:
            report.notes.append(f"windows not replayed: {e}")
            return report
        report = parity.compare(run_dir(a), run_dir(b), noise_runs=noise, replay=pair, **tolerances)
    return report


def twin(name: str, nproc: int, p: Params, quiet: bool = False, **keys) -> launcher.RunResult:
    """Launch the float twin of run `name` (the same keys; float_twin.twin_of picks two micro-batches or a one-ulp
    nudge of the initial weights) as NAME-twin-SUFFIX, where compare(..., noise="auto") finds it."""
    from lab_utils.core import float_twin
    from lab_utils.launch import twins

    keys.setdefault("steps", p.steps)
    keys.setdefault("backend", p.backend)
    suffix, twin_keys = twins.twin_keys(dict(keys), nproc)
    return run(f"{name}{float_twin.SEPARATOR}{suffix}", nproc, p, quiet=quiet, **twin_keys)


def tier_word(report: parity.ParityReport) -> str:
    return report.tier_text()


def _display(obj) -> None:
    try:
        from IPython.display import display

        display(obj)
    except ImportError:  # plain Python: print the text form
        print(getattr(obj, "data", obj))


def measured(text: str, verdict: str = "") -> None:
    """The "We measured" half of an article box; the article's sentence itself is in the markdown cell above.
    `verdict`: right | wrong | incomplete | "" (none)."""
    from IPython.display import HTML

    colour = {"wrong": "#fde2e1", "right": "#e3f6e5", "incomplete": "#fff4d6"}.get(verdict, "#eef2f7")
    _display(HTML(
        f'<div style="border-left:6px solid #888;background:{colour};padding:8px 12px;margin:6px 0">'
        f"<b>We measured:</b> {html.escape(text)}"
        + (f"<br><b>Verdict:</b> the article is {html.escape(verdict)}" if verdict else "") + "</div>"))


def show_source(obj) -> None:
    """Show a lab_utils function where the code *is* the lesson (the notebook never copies it)."""
    from IPython.display import Markdown

    _display(Markdown(f"```python\n{inspect.getsource(obj)}\n```"))


def controls(**specs):
    """Widgets whose *default* values are what a headless run uses. `specs`: name=(widget_kind, default,
    options). Returns (values dict, widget box). Re-run the cells below after changing a control."""
    values = {name: spec[1] for name, spec in specs.items()}
    try:
        import ipywidgets as w
    except ImportError:
        return values, None
    made = {}
    style = {"description_width": "initial"}  # the label gets the width it needs: never "global_ba…"
    for name, (kind, default, *opts) in specs.items():
        if kind == "int":
            lo, hi = opts[0] if opts else (1, max(2 * default, 2))
            made[name] = w.IntSlider(value=default, min=lo, max=hi, description=name, style=style)
        elif kind == "choice":
            made[name] = w.Dropdown(value=default, options=opts[0], description=name, style=style)
        elif kind == "bool":
            made[name] = w.Checkbox(value=default, description=name, style=style)
        else:
            raise ValueError(f"control {name}: unknown kind {kind!r}")

    def update(change):
        for n, widget in made.items():
            values[n] = widget.value

    for widget in made.values():
        widget.observe(update, names="value")
    box = w.VBox(list(made.values()))
    return values, box


class Verdicts:
    """A chapter's lessons, each stated once: `check` records claim, expected, measured and whether it holds;
    `show` prints the table nbval compares (deterministic text only: no timings, no raw floats) and then
    fails with every claim that did not hold. So the assertion and the table row can never disagree.

        v = Verdicts("chapter 01")
        v.tier("single vs correct port", rep, expected=2)       # tier >= 2
        v.tier("single vs naive port", naive, below=2)          # tier <= 1
        v.check("4 ranks vs emulated is bitwise", "False", str(r4.bitwise), ok=not r4.bitwise)
        v.show()
    """

    def __init__(self, title: str = "verdict"):
        self.title = title
        self.rows: list[tuple[str, str, str, bool]] = []

    def check(self, claim: str, expected: str, measured: str, ok: bool) -> bool:
        self.rows.append((claim, str(expected), str(measured), bool(ok)))
        return bool(ok)

    def tier(self, claim: str, report: parity.ParityReport, expected: int | None = None,
             below: int | None = None, exactly: bool = False) -> bool:
        """Tier >= expected (== with exactly=True), or tier < below."""
        if (expected is None) == (below is None):
            raise ValueError("give exactly one of expected= or below=")
        if below is not None:
            return self.check(claim, f"tier < {below}", tier_word(report) if report.tier >= below
                              else f"tier < {below}", report.tier < below)
        want = f"tier {expected}" + ("" if exactly or expected == 3 else "+")
        got = report.tier == expected if exactly else report.tier >= expected
        got = got and (report.certified or report.tier == 3)  # tier 2 with steps not judged certifies nothing
        return self.check(claim, want, want if got else report.tier_text(), got)

    def table(self) -> str:
        head = ("claim", "expected", "measured")
        rows = [r[:3] for r in self.rows]
        widths = [max(len(r[i]) for r in rows + [head]) for i in range(3)]
        line = lambda r: " | ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip()  # noqa: E731
        out = [self.title, line(head), "-+-".join("-" * w for w in widths)] + [line(r) for r in rows]
        return "\n".join(out)

    def show(self) -> None:
        """Print the table, then raise AssertionError naming every claim that failed (None on success: a
        returned value would add an execute_result that nbval would compare too)."""
        print(self.table())
        failed = [r for r in self.rows if not r[3]]
        if failed:
            # One claim a line, in the table's words: what nbval's report shows first (lab_utils/nbval_plugin.py).
            raise AssertionError(f"lesson no longer holds ({self.title}):\n" + "\n".join(
                f"  - {c}: expected {e}, measured {m}" for c, e, m, _ in failed))
