"""The committed-notebook stripper keeps exactly what nbval compares (verdict stdout, with a count)."""
import nbformat

from lab_utils.nbbuild import KERNELSPEC, strip


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
