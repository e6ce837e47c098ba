"""What every chapter notebook shares: its parameters, launching runs, the "Article says / We measured"
box, widget controls that run headless, and the deterministic verdict table nbval compares.

Taught in notebooks/00_preflight.ipynb (the first notebook explains each of these once).
"""

from __future__ import annotations

import html
import inspect
import os
from dataclasses import dataclass

from . import launcher, parity


@dataclass(frozen=True)
class Params:
    steps: int
    nproc: int
    backend: str
    timeout: float


def params(steps: int = 40, nproc: int = 2) -> Params:
    """The notebook's parameters: defaults sized for 2 CPU cores, overridable from the environment
    (LAB_STEPS, LAB_NPROC, LAB_BACKEND, LAB_TIMEOUT) so CI, a laptop and a GPU box run the same file."""
    def env_int(name, default):
        raw = os.environ.get(name)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"{name}={raw!r} is not an integer") from None
        if value < 1:
            raise ValueError(f"{name}={value} must be >= 1")
        return value

    backend = os.environ.get("LAB_BACKEND", "auto")
    if backend not in ("auto", "gloo", "nccl"):
        raise ValueError(f"LAB_BACKEND={backend!r} is not one of auto, gloo, nccl")
    return Params(env_int("LAB_STEPS", steps), env_int("LAB_NPROC", nproc), backend,
                  float(os.environ.get("LAB_TIMEOUT", "300")))


def run(name: str, nproc: int, p: Params, **keys) -> launcher.RunResult:
    """Launch one run for a notebook (steps and backend from the parameters cell unless given) and raise
    with the failing rank's traceback if it did not finish."""
    keys.setdefault("steps", p.steps)
    keys.setdefault("backend", p.backend)
    result = launcher.launch(name, nproc, {k: v for k, v in keys.items()}, timeout=p.timeout, progress=True)
    return result.raise_for_status()


def compare(a: str, b: str, **tolerances) -> parity.ParityReport:
    """The parity report of two runs by name; `tolerances`: loss_tol, param_tol, output_tol, conv_rtol."""
    return parity.compare(launcher.RUNS / a, launcher.RUNS / b, **tolerances)


def _display(obj) -> None:
    try:
        from IPython.display import display

        display(obj)
    except ImportError:  # plain Python: print the text form
        print(getattr(obj, "data", obj))


def article_box(section: str, article: str, measured: str, verdict: str = "") -> None:
    """The per-claim box: what the article (§section) says, what our runs measured, and the verdict."""
    from IPython.display import HTML

    colour = {"wrong": "#fde2e1", "right": "#e3f6e5", "incomplete": "#fff4d6"}.get(verdict, "#eef2f7")
    _display(HTML(
        f'<div style="border-left:6px solid #888;background:{colour};padding:8px 12px;margin:6px 0">'
        f"<b>Article says (§{html.escape(section)}):</b> {html.escape(article)}<br>"
        f"<b>We measured:</b> {html.escape(measured)}"
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
    for name, (kind, default, *opts) in specs.items():
        if kind == "int":
            lo, hi = opts[0] if opts else (1, max(2 * default, 2))
            made[name] = w.IntSlider(value=default, min=lo, max=hi, description=name)
        elif kind == "choice":
            made[name] = w.Dropdown(value=default, options=opts[0], description=name)
        elif kind == "bool":
            made[name] = w.Checkbox(value=default, description=name)
        else:
            raise ValueError(f"control {name}: unknown kind {kind!r}")

    def update(change):
        for n, widget in made.items():
            values[n] = widget.value

    for widget in made.values():
        widget.observe(update, names="value")
    box = w.VBox(list(made.values()))
    return values, box


def verdict_table(rows: list[tuple[str, str, str]], title: str = "verdict") -> None:
    """Print deterministic text (no timings, no floats): claim | expected | measured. nbval compares it.
    Returns None on purpose: a returned value would add an execute_result that strip() drops."""
    widths = [max(len(str(r[i])) for r in rows + [("claim", "expected", "measured")]) for i in range(3)]
    line = lambda r: " | ".join(str(c).ljust(widths[i]) for i, c in enumerate(r)).rstrip()  # noqa: E731
    out = [title, line(("claim", "expected", "measured")), "-+-".join("-" * w for w in widths)]
    out += [line(r) for r in rows]
    print("\n".join(out))


def tier_word(report: parity.ParityReport) -> str:
    return f"tier {report.tier} ({report.tier_name})"
