"""`ddp-lab notebooks`: execute every chapter headless into build/ with a progress bar and a gallery index;
and `strip`: keep a committed notebook's outputs only where nbval checks them.

A verdict cell is a code cell whose source contains `# NBVAL_CHECK_OUTPUT`; nbval (--nbval-lax) compares
its stored output, so its output is the one thing kept when a notebook is stripped for commit.
"""

from __future__ import annotations

import base64
import glob
import html
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import nbformat

MARK = "NBVAL_CHECK_OUTPUT"


def is_verdict(cell) -> bool:
    return cell.get("cell_type") == "code" and MARK in "".join(cell.get("source", ""))


# What JupyterLab writes on save; storing it avoids a modified notebook every time a learner saves.
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def strip(nb) -> None:
    """Remove outputs, counts and volatile metadata (nbstripout does it), except the verdict cells' table."""
    from nbstripout import strip_output

    for cell in nb.cells:
        if is_verdict(cell):
            cell.setdefault("metadata", {})["keep_output"] = True  # nbstripout's per-cell opt-out
    strip_output(nb, keep_output=False, keep_count=False, keep_id=True)
    for cell in nb.cells:
        cell.get("metadata", {}).pop("execution", None)
        if is_verdict(cell):
            cell["metadata"].pop("keep_output", None)
            # nbval refuses a reference cell with outputs but no execution count ("Unrun reference cell"),
            # so verdict cells keep a fixed count of 1; only their stdout (the table) is compared.
            cell["execution_count"] = 1
            cell["outputs"] = [o for o in cell.get("outputs", []) if o.get("output_type") == "stream"
                               and o.get("name") == "stdout"]
    nb.metadata.pop("widgets", None)
    nb.metadata["kernelspec"] = dict(KERNELSPEC)


def quiet_kernel_config(socket_dir: str) -> dict:
    """nbclient config for a kernel on IPC transport (Unix sockets in `socket_dir`).

    ipykernel warns "Kernel is running over TCP without encryption" at every start (ipykernel/kernelapp.py,
    init_sockets) unless the transport is IPC. The socket path must be absolute: the kernel runs in the
    notebook's folder and would resolve jupyter_client's default relative "kernel-ipc" elsewhere than the
    client. KernelManager's config applies to nbclient's AsyncKernelManager (a subclass).
    """
    return {"KernelManager": {"transport": "ipc", "ip": os.path.join(socket_dir, "kernel")}}


def execute(path: Path, timeout: float = 900, cwd: Path | None = None):
    """Run a notebook headless; widget state is stored in its metadata so an HTML export draws the controls."""
    from nbclient import NotebookClient
    from traitlets.config import Config

    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="nbk-") as sockets:
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3", store_widget_state=True,
                                config=Config(quiet_kernel_config(sockets)),
                                resources={"metadata": {"path": str(cwd or path.parent)}})
        client.execute()
    return nb


def refresh(path: str | Path, timeout: float = 900) -> None:
    """Execute a notebook in place and strip it: how a chapter's stored verdict output is (re)made."""
    path = Path(path)
    nb = execute(path, timeout)
    strip(nb)
    nbformat.write(nb, path)


# ------------------------------------------------------------------ the gallery (build/index.html)
def card(nb) -> dict:
    """What the index shows of a chapter, read from the notebook itself: title, lesson line, objectives."""
    markdown = [c.source for c in nb.cells if c.cell_type == "markdown"]
    first = markdown[0] if markdown else ""
    title = next((ln.lstrip("#").strip() for text in markdown for ln in text.splitlines()
                  if ln.startswith("#")), "")
    # The chapter card is a table whose "You will be able to" row lists the objectives, separated by <br>.
    objectives = []
    for line in first.splitlines():
        if "You will be able to" in line:
            cell = line.split("|")[2] if line.count("|") >= 3 else ""
            objectives = [o.strip(" •-") for o in re.split(r"<br\s*/?>", cell) if o.strip(" •-")]
            break
    # Otherwise the lesson is the first plain paragraph after the title.
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", first)
                  if p.strip() and not p.lstrip().startswith(("#", "|", ">", "```"))]
    lesson = objectives[0] if objectives else (" ".join(paragraphs[0].split()) if paragraphs else "")
    return {"title": title, "lesson": lesson, "objectives": objectives}


def verdict_text(nb) -> str:
    """The verdict cell's stdout (the table nbval compares), as the executed notebook printed it."""
    return "".join(o.get("text", "") for c in nb.cells if is_verdict(c) for o in c.get("outputs", [])
                   if o.get("output_type") == "stream" and o.get("name") == "stdout")


def verdict_tables(text: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """Read back what `chapter.Verdicts.table` prints: [(title, [(claim, expected, measured), ...]), ...].

    The dashed line under the header gives each column's width, so a claim may hold any character."""
    lines = text.splitlines()
    tables, i = [], 0
    while i < len(lines):
        ruler = lines[i]
        if i >= 2 and ruler.count("-+-") == 2 and set(ruler) <= {"-", "+"}:
            w0, w1, _ = (len(part) for part in ruler.split("-+-"))
            rows, i = [], i + 1
            while i < len(lines) and lines[i][w0:w0 + 3] == " | " and lines[i][w0 + w1 + 3:w0 + w1 + 6] in (
                    " | ", " |"):
                ln = lines[i]
                rows.append((ln[:w0].rstrip(), ln[w0 + 3:w0 + 3 + w1].rstrip(), ln[w0 + w1 + 6:].rstrip()))
                i += 1
            tables.append((lines[i - len(rows) - 3] if i - len(rows) - 3 >= 0 else "", rows))
            continue
        i += 1
    return tables


def claims_report(committed: str, measured: str) -> list[str]:
    """The claims of a committed verdict table that this run's table changed, each with both values."""
    def rows(text):
        return {(title, claim): (exp, got) for title, table in verdict_tables(text) for claim, exp, got in table}

    want, got = rows(committed), rows(measured)
    out = []
    for (title, claim), (exp, meas) in want.items():
        now = got.get((title, claim))
        if now is None:
            out.append(f"✗ {title}: {claim!r} is missing from this run's table (committed: expected {exp}, "
                       f"measured {meas})")
        elif now != (exp, meas):
            out.append(f"✗ {title}: {claim}: expected {now[0]}, this run measured {now[1]} (the committed run: "
                       f"expected {exp}, measured {meas})")
    out += [f"+ {title}: {claim}: new in this run: expected {e}, measured {m}"
            for (title, claim), (e, m) in got.items() if (title, claim) not in want]
    if out:
        return out
    import difflib

    diff = [ln.rstrip("\n") for ln in difflib.unified_diff(committed.splitlines(True), measured.splitlines(True),
                                                           "committed", "this run", n=0)]
    if not want or not got:
        return ["the output is not a verdict table (chapter.Verdicts); the lines that differ:", *diff]
    return ["every claim reads as committed; the table's other lines differ:", *diff]


def sanitize(text: str, patterns) -> str:
    """nbval's sanitizing (`--nbval-sanitize-with`): each (regex, replacement) in turn."""
    for regex, replace in patterns:
        text = re.sub(regex, replace, text)
    return text


def sanitize_patterns(path: str | Path) -> list[tuple[str, str]]:
    from nbval.plugin import get_sanitize_patterns

    return list(get_sanitize_patterns(Path(path).read_text()))


def first_png(nb) -> bytes | None:
    for c in nb.cells:
        for o in c.get("outputs", []) if c.cell_type == "code" else []:
            data = o.get("data", {}).get("image/png")
            if data:
                return base64.b64decode(data if isinstance(data, str) else "".join(data))
    return None


def this_machine() -> str:
    """How the index names the machine the timings were taken on (the notebooks pick the GPU when present)."""
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.device_count()}x {torch.cuda.get_device_name(0)}"
    return f"CPU, {os.cpu_count()} cores"


_CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
.ch{display:flex;gap:1.5em;border-top:1px solid #ddd;padding:1.2em 0}.ch img{width:320px;border:1px solid #eee}
.noimg{width:320px;color:#888}.ch h2{margin:0 0 .3em;font-size:1.25em}pre{background:#f6f6f6;padding:.6em;
overflow-x:auto;font-size:12px}.bad{color:#b00020;font-weight:bold}.ok{color:#1b7f3b}td,th{padding:2px 10px 2px 0;
text-align:left}details{margin:.4em 0}"""


def write_index(out: Path, chapters: list[dict], machine: str) -> Path:
    """build/index.html: per chapter its title, lesson, first figure, verdict table and this build's run time.

    Only this build's time is shown: times from other machines live in docs/results.md with the file they came
    from, not in a gallery that cannot say which commit they were measured at."""
    e = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>DDP Parity Lab — chapters</title>"
             f"<style>{_CSS}</style></head><body><h1>DDP Parity Lab — the chapters, executed</h1>"
             "<p>Each chapter below was executed by <code>ddp-lab notebooks</code>; open its page to read it with "
             "its outputs, or open the .ipynb in JupyterLab to run it. The table under each chapter is its verdict "
             "cell's output: the claims it proves and what this run measured.</p>"]
    for ch in chapters:
        img = (f"<a href='{e(ch['page'])}'><img src='{e(ch['thumb'])}' alt='first figure of {e(ch['stem'])}'></a>"
               if ch["thumb"] else "<div class='noimg'>(no figure)</div>")
        status = ("<span class='ok'>ran without error</span>" if not ch["error"]
                  else f"<span class='bad'>FAILED: {e(ch['error'])}</span>")
        times = f"<tr><th>{e(machine)} (this build)</th><td>{ch['seconds']:.0f} s</td></tr>"
        goals = "".join(f"<li>{e(o)}</li>" for o in ch["objectives"])
        parts.append(
            f"<div class='ch'>{img}<div><h2><a href='{e(ch['page'])}'>{e(ch['title'] or ch['stem'])}</a></h2>"
            f"<p>{e(ch['lesson'])}</p>"
            + (f"<details><summary>all objectives</summary><ul>{goals}</ul></details>" if goals else "")
            + f"<p>{status} · <a href='{e(ch['stem'])}.ipynb'>executed notebook</a></p>"
            f"<table>{times}</table>"
            + (f"<details open><summary>verdict</summary><pre>{e(ch['verdict'])}</pre></details>"
               if ch["verdict"] else "<p class='bad'>no verdict output</p>")
            + "</div></div>")
    parts.append("</body></html>")
    target = out / "index.html"
    target.write_text("\n".join(parts))
    return target


def run_all(pattern: str = "notebooks/[0-9]*.ipynb", out_dir: str = "build", timeout: float = 900) -> bool:
    from nbconvert import HTMLExporter
    from tqdm.auto import tqdm

    paths = sorted(Path(p) for p in glob.glob(pattern))
    if not paths:
        raise FileNotFoundError(f"no notebooks match {pattern!r}")
    out = Path(out_dir)
    (out / "img").mkdir(parents=True, exist_ok=True)
    machine = this_machine()
    chapters, all_ok = [], True
    for path in tqdm(paths, desc="notebooks", unit="nb"):
        start = time.time()
        try:
            nb, error = execute(path, timeout), ""
        except Exception as e:  # the failing cell's error is in the message; keep going with the others
            nb, error = nbformat.read(path, as_version=4), str(e).strip().splitlines()[-1][:300]
            all_ok = False
        seconds = time.time() - start
        # The lab template draws the stored widget state (controls need the widget bundle from unpkg.com).
        body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
        page = out / (path.stem + ".html")
        page.write_text(body)
        nbformat.write(nb, out / path.name)
        png = first_png(nb)
        thumb = f"img/{path.stem}.png" if png else ""
        if png:
            (out / thumb).write_bytes(png)
        chapters.append({"stem": path.stem, "page": page.name, "thumb": thumb, "seconds": seconds,
                         "error": error, "verdict": verdict_text(nb), **card(nb)})
        print(f"{path.stem}: {'ok' if not error else 'FAILED'} ({seconds:.0f} s)", file=sys.stderr)
    (out / "notebook_times.json").write_text(json.dumps(
        {"machine": machine, "seconds": {c["stem"]: round(c["seconds"], 1) for c in chapters}}, indent=2) + "\n")
    print(f"wrote {write_index(out, chapters, machine)}")
    return all_ok


if __name__ == "__main__":  # python -m lab_utils.nbbuild strip|refresh NB...
    cmd, *files = sys.argv[1:]
    for f in files:
        if cmd == "refresh":
            refresh(f)
        elif cmd == "strip":
            nb = nbformat.read(f, as_version=4)
            strip(nb)
            nbformat.write(nb, f)
        else:
            raise SystemExit(f"unknown command {cmd!r}: use strip or refresh")
