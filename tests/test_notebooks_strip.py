"""The committed-notebook stripper keeps exactly what nbval compares (verdict stdout, with a count)."""
import nbformat

from lab_utils.notebooks import from_percent, strip

SRC = """# %% [markdown]
# # title
# %%
x = 1
print("noise")
# %%
# NBVAL_CHECK_OUTPUT
print("verdict")
"""


def test_strip_keeps_only_verdict_stdout_with_a_count():
    nb = from_percent(SRC)
    assert [c.cell_type for c in nb.cells] == ["markdown", "code", "code"]
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="noise\n")]
    nb.cells[1].execution_count = 3
    nb.cells[2].outputs = [nbformat.v4.new_output("stream", name="stdout", text="verdict\n"),
                           nbformat.v4.new_output("execute_result", data={"text/plain": "1"}, execution_count=4)]
    strip(nb)
    assert nb.cells[1].outputs == [] and nb.cells[1].execution_count is None
    assert [o["text"] for o in nb.cells[2].outputs] == ["verdict\n"]
    assert nb.cells[2].execution_count == 1  # nbval rejects a reference cell with outputs and no count
