"""lab_utils/nbval_plugin.py (the chapters under nbval, loaded by notebooks/conftest.py) and its sanitizers:
a failed verdict cell names the claims that changed, the executed copy keeps what a learner would see, and the
sanitizers leave every committed verdict as it is (one that rewrote a claim would hide it)."""
import glob

import nbformat
import pytest

from lab_utils.chapter import Verdicts
from lab_utils.nbbuild import (
    KERNELSPEC,
    MARK,
    claims_report,
    sanitize,
    sanitize_patterns,
    verdict_tables,
    verdict_text,
)
from lab_utils.nbval_plugin import SANITIZE_FILE, run_nbval, verdict_failure

CHAPTERS = sorted(glob.glob(str(SANITIZE_FILE.parent / "[0-9]*.ipynb")))


def _table(measured: str = "tier 2", ok: bool = True) -> str:
    v = Verdicts("chapter 99 — a title | with a bar")
    v.check("a claim | with a bar", "tier 2", measured, ok=ok)
    v.check("another claim", "yes / no", "yes / no", ok=True)
    return v.table() + "\n"


def test_verdict_tables_reads_back_what_verdicts_prints():
    assert verdict_tables(_table()) == [("chapter 99 — a title | with a bar",
                                         [("a claim | with a bar", "tier 2", "tier 2"),
                                          ("another claim", "yes / no", "yes / no")])]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.rsplit("/", 1)[-1])
def test_every_committed_verdict_is_a_table_and_untouched_by_the_sanitizers(path):
    text = verdict_text(nbformat.read(path, as_version=4))
    rows = sum(len(r) for _, r in verdict_tables(text))
    assert rows and rows == sum(" | " in ln for ln in text.splitlines()) - len(verdict_tables(text))
    assert sanitize(text, sanitize_patterns(SANITIZE_FILE)) == text


def test_sanitizers_replace_what_differs_between_boxes():
    raw = "\x1b[31mrank 1\x1b[0m at 0x7f3a2b1c4d50, pid 4242, 127.0.0.1:29517, /tmp/pytest-3/run_a done  \r\n"
    assert sanitize(raw, sanitize_patterns(SANITIZE_FILE)) == \
        "rank 1 at 0xADDRESS, pid PID, 127.0.0.1:PORT, TMPDIR done\n"


def test_claims_report_names_changed_missing_and_new_claims():
    committed = _table()
    changed = _table(measured="tier 1").replace("another claim", "a third claim")
    out = claims_report(committed, changed)
    assert out[0].startswith("✗ chapter 99 — a title | with a bar: a claim | with a bar: expected tier 2, this "
                             "run measured tier 1 (the committed run: expected tier 2, measured tier 2)")
    assert any("'another claim' is missing" in ln for ln in out)
    assert any(ln.startswith("+ ") and "a third claim: new in this run" in ln for ln in out)


def test_verdict_failure_leads_with_the_claim_and_quotes_verdicts_show():
    cell = nbformat.v4.new_code_cell(f"# {MARK}\nv.show()")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=_table())]
    run = [nbformat.v4.new_output("stream", name="stdout", text=_table("tier 1", ok=False)),
           nbformat.v4.new_output("error", ename="AssertionError", evalue="lesson no longer holds (chapter 99):\n"
                                  "  - a claim: expected tier 2, measured tier 1", traceback=[])]
    text = verdict_failure(cell, run)
    assert text.startswith("VERDICT FAILED: ✗ chapter 99")
    assert "Verdicts.show: AssertionError: lesson no longer holds (chapter 99):" in text
    assert "not printed" in verdict_failure(cell, [])


@pytest.mark.slow
def test_nbval_run_reports_the_claim_and_saves_what_it_executed(tmp_path):
    cells = ["import ipywidgets as w\nfrom tqdm.auto import tqdm\nfor i in tqdm(range(3)):\n    pass",
             "w.IntSlider(3)",
             "w.IntSlider(4).close()\nprint('closed')",
             f"# {MARK}\nprint({_table('tier 1')!r}, end='')",
             "# NBVAL_SKIP\nprint('skipped')"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.cells[3].outputs = [nbformat.v4.new_output("stream", name="stdout", text=_table())]
    nb.cells[3].execution_count = 1
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nbformat.write(nb, tmp_path / "t.ipynb")
    run = run_nbval(tmp_path / "t.ipynb", tmp_path / "out")
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "1 failed, 3 passed, 1 skipped" in out, out
    assert "VERDICT FAILED: ✗ chapter 99 — a title | with a bar: a claim | with a bar: expected tier 2, this run " \
           "measured tier 1" in out, out
    saved = nbformat.read(tmp_path / "out" / "t.ipynb", as_version=4)
    assert [c.execution_count for c in saved.cells] == [1, 2, 3, 4, None]
    state = saved.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    views = [o["data"]["application/vnd.jupyter.widget-view+json"]["model_id"] for c in saved.cells
             for o in c.outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert len(views) == 2 and all(v in state for v in views)  # the tqdm bar and the slider; not the closed one
    assert saved.cells[2].outputs[0]["text"] == "closed\n"
    assert verdict_text(saved) == _table("tier 1")
