"""lab_utils/nbbuild.py: the committed-notebook stripper keeps exactly what nbval compares (verdict stdout, with a
count), and the gallery index (build/index.html) reads each chapter's card, verdict and first figure from the
notebook itself."""
import base64

import nbformat

from lab_utils.nbbuild import KERNELSPEC, card, first_png, quiet_kernel_config, strip, verdict_text, write_index

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()


def _notebook():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# title"),
                nbformat.v4.new_code_cell('x = 1\nprint("noise")'),
                nbformat.v4.new_code_cell('# NBVAL_CHECK_OUTPUT\nprint("verdict")')]
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="noise\n")]
    nb.cells[1].execution_count = 3
    nb.cells[2].outputs = [nbformat.v4.new_output("stream", name="stdout", text="verdict\n"),
                           nbformat.v4.new_output("stream", name="stderr", text="progress\n"),
                           nbformat.v4.new_output("execute_result", data={"text/plain": "1"}, execution_count=4)]
    nb.metadata["widgets"] = {"state": {}}
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def test_strip_keeps_only_verdict_stdout_with_a_count():
    nb = _notebook()
    strip(nb)
    assert nb.cells[1].outputs == [] and nb.cells[1].execution_count is None
    assert [o["text"] for o in nb.cells[2].outputs] == ["verdict\n"]
    assert nb.cells[2].execution_count == 1  # nbval rejects a reference cell with outputs and no count
    assert "keep_output" not in nb.cells[2].metadata
    assert "widgets" not in nb.metadata


def test_strip_writes_the_kernelspec_jupyterlab_saves():
    nb = _notebook()
    strip(nb)
    assert nb.metadata["kernelspec"] == KERNELSPEC  # saving in JupyterLab then changes nothing


# ------------------------------------------------------------------ the gallery
def _chapter():
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# 07 — A chapter\n\n| | |\n|---|---|\n| **You will be able to** | "
                                      "• do one thing<br>• do another |\n| **Time** | 1 min |"),
        nbformat.v4.new_code_cell("plot()"),
        nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nv.show()"),
    ]
    nb.cells[1].outputs = [nbformat.v4.new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure>"})]
    nb.cells[2].outputs = [nbformat.v4.new_output("stream", name="stdout", text="claim | measured\nx     | yes\n"),
                           nbformat.v4.new_output("stream", name="stderr", text="progress 100%\n")]
    return nb


def test_card_verdict_and_figure_come_from_the_notebook():
    nb = _chapter()
    assert card(nb) == {"title": "07 — A chapter", "lesson": "do one thing",
                        "objectives": ["do one thing", "do another"]}
    assert verdict_text(nb) == "claim | measured\nx     | yes\n"  # stdout only: no progress text
    assert first_png(nb) == base64.b64decode(PNG)


def test_card_without_objectives_uses_the_first_paragraph():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# T\n\nThe lesson,\nin two lines.\n\nMore.")])
    assert card(nb)["lesson"] == "The lesson, in two lines."


def test_index_shows_each_chapter_with_this_builds_time(tmp_path):
    ch = {"stem": "07_a", "page": "07_a.html", "thumb": "img/07_a.png", "seconds": 42.0, "error": "",
          "verdict": "x | yes", "title": "07 — A", "lesson": "do one thing", "objectives": ["do one thing"]}
    failed = {**ch, "stem": "08_b", "seconds": 7.0, "thumb": "", "error": "boom", "verdict": ""}
    text = write_index(tmp_path, [ch, failed], "CPU, 2 cores").read_text()
    assert "<th>CPU, 2 cores (this build)</th><td>42 s</td>" in text and "<td>7 s</td>" in text
    assert "img/07_a.png" in text and "(no figure)" in text and "FAILED: boom" in text
    assert "do one thing" in text and "x | yes" in text and "no verdict output" in text
    assert "not measured" not in text  # no column for machines this build did not run on


def test_kernel_sockets_are_absolute_ipc_paths(tmp_path):
    km = quiet_kernel_config(str(tmp_path))["KernelManager"]
    assert km["transport"] == "ipc" and km["ip"].startswith(str(tmp_path))
