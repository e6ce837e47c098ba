"""`ddp-lab notebooks`: execute every chapter headless into build/ with a progress bar and an HTML index;
and `strip`: keep a committed notebook's outputs only where nbval checks them.

A verdict cell is a code cell whose source contains `# NBVAL_CHECK_OUTPUT`; nbval (--nbval-lax) compares
its stored output, so its output is the one thing kept when a notebook is stripped for commit.
"""

from __future__ import annotations

import glob
import html
import sys
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


def execute(path: Path, timeout: float = 900, cwd: Path | None = None):
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd or path.parent)}})
    client.execute()
    return nb


def refresh(path: str | Path, timeout: float = 900) -> None:
    """Execute a notebook in place and strip it: how a chapter's stored verdict output is (re)made."""
    path = Path(path)
    nb = execute(path, timeout)
    strip(nb)
    nbformat.write(nb, path)


def run_all(pattern: str = "notebooks/[0-9]*.ipynb", out_dir: str = "build", timeout: float = 900) -> bool:
    from nbconvert import HTMLExporter
    from tqdm.auto import tqdm

    paths = sorted(Path(p) for p in glob.glob(pattern))
    if not paths:
        raise FileNotFoundError(f"no notebooks match {pattern!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows, all_ok = [], True
    for path in tqdm(paths, desc="notebooks", unit="nb"):
        start = time.time()
        try:
            nb, error = execute(path, timeout), ""
        except Exception as e:  # the failing cell's error is in the message; keep going with the others
            nb, error = nbformat.read(path, as_version=4), str(e).strip().splitlines()[-1][:300]
            all_ok = False
        body, _ = HTMLExporter().from_notebook_node(nb)
        target = out / (path.stem + ".html")
        target.write_text(body)
        nbformat.write(nb, out / path.name)
        rows.append((path.stem, target.name, "ok" if not error else f"FAILED: {error}", time.time() - start))
        print(f"{path.stem}: {'ok' if not error else 'FAILED'} ({time.time() - start:.0f} s)", file=sys.stderr)
    items = "\n".join(f'<tr><td><a href="{html.escape(t)}">{html.escape(s)}</a></td><td>{html.escape(st)}</td>'
                      f"<td>{sec:.0f} s</td></tr>" for s, t, st, sec in rows)
    (out / "index.html").write_text(
        "<html><head><title>DDP Parity Lab — executed notebooks</title></head><body>"
        "<h1>DDP Parity Lab — executed notebooks</h1><table border=1 cellpadding=4>"
        f"<tr><th>chapter</th><th>status</th><th>time</th></tr>{items}</table></body></html>")
    print(f"wrote {out / 'index.html'}")
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
