"""The gallery index (lab_utils/nbbuild.py) reads each chapter's card, verdict and first figure from the notebook."""
import base64

import nbformat

from lab_utils.nbbuild import card, first_png, quiet_kernel_config, verdict_text, write_index

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()


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


def test_index_shows_gpu_time_only_when_measured(tmp_path):
    ch = {"stem": "07_a", "page": "07_a.html", "thumb": "img/07_a.png", "seconds": 42.0, "error": "",
          "verdict": "x | yes", "title": "07 — A", "lesson": "do one thing", "objectives": ["do one thing"]}
    failed = {**ch, "stem": "08_b", "error": "boom", "verdict": ""}
    text = write_index(tmp_path, [ch, failed], "CPU, 2 cores", gpu={}).read_text()
    assert "42 s" in text and "not measured" in text and "img/07_a.png" in text and "FAILED: boom" in text
    assert "do one thing" in text and "x | yes" in text and "no verdict output" in text
    text = write_index(tmp_path, [ch, failed], "CPU, 2 cores", gpu={"2x H200": {"07_a": 12.0}}).read_text()
    assert "2x H200" in text and "12 s" in text and text.count("not measured") == 1  # 08_b has no number


def test_kernel_sockets_are_absolute_ipc_paths(tmp_path):
    km = quiet_kernel_config(str(tmp_path))["KernelManager"]
    assert km["transport"] == "ipc" and km["ip"].startswith(str(tmp_path))
