"""docs/checklist.md is generated from the chapters' "What to change in your script" bullets (lab_utils/checklist.py):
the committed file must be exactly what the committed notebooks render, and the generator must see every bullet."""
import difflib

import nbformat
import pytest

from lab_utils import checklist


def test_committed_checklist_is_what_the_notebooks_render():
    expected = checklist.render()
    committed = checklist.TARGET.read_text()
    if committed != expected:
        diff = "".join(difflib.unified_diff(committed.splitlines(keepends=True), expected.splitlines(keepends=True),
                                            "docs/checklist.md (committed)", "docs/checklist.md (from the notebooks)"))
        pytest.fail(f"docs/checklist.md is not what the notebooks' bullets give. Refresh it with "
                    f"`{checklist.REFRESH}` and commit it.\n{diff}", pytrace=False)


def test_every_chapter_has_a_section_with_its_bullets():
    text = checklist.render()
    chapters = sorted(checklist.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    assert len(chapters) >= 12
    for path in chapters:
        assert f"[{path.stem}](../notebooks/{path.name})" in text, path.name
        for bullet in checklist.bullets(nbformat.read(path, as_version=4), path.name):
            assert "- " + " ".join(bullet) + "\n" in text, (path.name, bullet[0])
    assert "\n- (ch" not in text  # the leading chapter tags are dropped (a cross-reference inside a line stays)


def _write(folder, name, cells):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(c) for c in cells])
    nbformat.write(nb, folder / name)


def test_render_takes_each_bullet_and_joins_wrapped_lines(tmp_path):
    _write(tmp_path, "00_a.ipynb", ["# 00 — First chapter\n\nintro",
                                    "## Takeaways\n- takeaway line\n\n## What to change in your script\n"
                                    "- (ch00) Wrap once, after `model.to(device)`:\n  `DDP(model)`.\n"
                                    "* (ch00) Second, with `x\n  * y`.\n\n## Exercises\n- exercise line"])
    _write(tmp_path, "01_b.ipynb", ["# 01 — Second\n", "## What to change in your script\n- Untagged bullet."])
    text = checklist.render(tmp_path)
    assert text.startswith(checklist.HEADER) and text.endswith(checklist.FOOTER)
    assert "## First chapter — [00_a](../notebooks/00_a.ipynb)\n" \
           "- Wrap once, after `model.to(device)`: `DDP(model)`.\n- Second, with `x * y`.\n" in text
    assert "## Second — [01_b](../notebooks/01_b.ipynb)\n- Untagged bullet.\n" in text
    assert "takeaway line" not in text and "exercise line" not in text
    # A bullet edited in a notebook changes the rendered checklist (so the drift test above can fail).
    _write(tmp_path, "01_b.ipynb", ["# 01 — Second\n", "## What to change in your script\n- Edited bullet."])
    changed = checklist.render(tmp_path)
    assert changed != text and "- Edited bullet.\n" in changed and "Untagged bullet" not in changed


@pytest.mark.parametrize("cells, message", [
    (["# 03 — T", "## Takeaways\n- a"], "03_x.ipynb: no markdown cell with the heading"),
    (["# 03 — T", "## What to change in your script\n\n## Next"], "03_x.ipynb: the section"),
    (["# 03 — T", "## What to change in your script\n- (ch04) copied"], "tagged (ch04) in chapter 03's list"),
    (["# 03 — T", "## What to change in your script\n- a\n\nA closing sentence."], "neither a bullet nor"),
])
def test_a_section_the_checklist_cannot_take_is_named(tmp_path, cells, message):
    _write(tmp_path, "03_x.ipynb", cells)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        checklist.render(tmp_path)


def test_no_chapters_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no chapter notebooks"):
        checklist.render(tmp_path)
