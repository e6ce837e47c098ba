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


def strip(nb) -> None:
    """Remove outputs and execution counts except on verdict cells; drop volatile metadata."""
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        cell.get("metadata", {}).pop("execution", None)
        if is_verdict(cell):
            # nbval refuses a reference cell with outputs but no execution count ("Unrun reference cell"),
            # so verdict cells keep a fixed count of 1; only their stdout (the table) is compared.
            cell["execution_count"] = 1
            cell["outputs"] = [o for o in cell["outputs"] if o.get("output_type") == "stream"
                               and o.get("name") == "stdout"]
        else:
            cell["execution_count"] = None
            cell["outputs"] = []
    nb.metadata.pop("widgets", None)


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


def from_percent(text: str):
    """A notebook from percent-format text (`# %%` code cells, `# %% [markdown]` markdown cells), the form
    that is easiest to write and review as a diff; convert, then `refresh` to execute and strip."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    chunks = text.split("\n# %%")
    for i, chunk in enumerate(chunks):
        if i == 0 and not chunk.startswith("# %%"):
            if chunk.strip():
                raise ValueError("text before the first '# %%' marker")
            continue
        header, _, body = chunk.removeprefix("# %%").partition("\n")
        body = body.strip("\n")
        if "[markdown]" in header:
            lines = [ln[2:] if ln.startswith("# ") else ln.lstrip("#") for ln in body.splitlines()]
            nb.cells.append(nbformat.v4.new_markdown_cell("\n".join(lines)))
        else:
            nb.cells.append(nbformat.v4.new_code_cell(body))
    return nb


if __name__ == "__main__":  # python -m lab_utils.notebooks strip|refresh NB... | build SRC.py OUT.ipynb
    cmd, *files = sys.argv[1:]
    if cmd == "build":
        nbformat.write(from_percent(Path(files[0]).read_text()), files[1])
        raise SystemExit(0)
    for f in files:
        if cmd == "refresh":
            refresh(f)
        elif cmd == "strip":
            nb = nbformat.read(f, as_version=4)
            strip(nb)
            nbformat.write(nb, f)
        else:
            raise SystemExit(f"unknown command {cmd!r}: use strip or refresh")
