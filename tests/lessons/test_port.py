"""The port diff of chapter 00 is generated from the real code: it must show the DDP lines and nothing else."""

import ast
import io
import re
import tokenize

import pytest

from lab_utils.lessons import ch00_preflight


def test_diff_shows_the_ddp_lines():
    diff = ch00_preflight.port_diff()
    added = [ln[1:] for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert any("model = ddp.wrap(model, cfg, env.device)" in ln for ln in added)
    assert any("dist.all_reduce(" in ln for ln in added)
    assert any("dist.init_process_group(" in ln for ln in added)
    assert any("wrapped = DDP(model" in ln for ln in added)
    assert any("all_reduce_mean(local_loss, env)" in ln for ln in added)
    # every hunk header names a real line of a real file, and that line is the hunk's first DDP-side line
    for rel, lineno in re.findall(r"^@@ (\S+):(\d+) @@$", diff, flags=re.M):
        assert 1 <= int(lineno) <= len((ch00_preflight.REPO / rel).read_text().splitlines())


def code_tokens(src: str) -> str:
    """The source's code tokens joined by spaces: comments and strings (docstrings) do not count."""
    skip = (tokenize.COMMENT, tokenize.STRING, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    return " ".join(t.string for t in tokenize.generate_tokens(io.StringIO(src).readline) if t.type not in skip)


@pytest.mark.parametrize("rel", list(ch00_preflight.PORT_FILES))
def test_single_gpu_side_has_no_distributed_call_and_parses(rel):
    single = ch00_preflight.single_gpu_source(rel)
    code = code_tokens(single)
    assert not re.search(r"\bdist \.|\bDDP \(|init_process_group|@ record|all_reduce|ddp \. wrap", code), rel
    assert re.search(r"\bdist \.|\bDDP \(|@ record|ddp \. wrap", code_tokens((ch00_preflight.REPO / rel).read_text()))
    for lines, _ in ch00_preflight._chunks(rel):  # each kept function (or the whole script) is still valid Python
        ast.parse("".join(ch00_preflight.single_gpu_lines(lines, rel)))


def test_single_gpu_script_is_valid_python_and_keeps_rank0_work():
    single = ch00_preflight.single_gpu_source("scripts/train.py")
    ast.parse(single)
    assert "\n    checkpoint.save_final(model, out, probe, state=final)" in single  # the guard's body, moved left
    assert "if env.is_main:  # DDP guard" not in single


def test_marks_are_applied_by_statement():
    src = ("import os\n"
           "x = 1\n"
           "# why y exists\n"
           "y = f(\n"
           "    2)  # not a mark on the first line\n"
           "z = g(  # DDP: gone, with both lines\n"
           "    3)\n"
           "if rank == 0:  # DDP guard: one process runs the body\n"
           "    save(x)\n"
           "    if dist_only:  # DDP: a nested block goes whole\n"
           "        sync()\n"
           "s = '# DDP: inside a string is not a mark'\n")
    out = "".join(ch00_preflight.single_gpu_lines(src.splitlines(keepends=True)))
    assert out == ("import os\nx = 1\n# why y exists\ny = f(\n    2)  # not a mark on the first line\n"
                   "save(x)\ns = '# DDP: inside a string is not a mark'\n")


def test_bad_marks_fail_loudly():
    with pytest.raises(ch00_preflight.MarkError, match="comment line"):
        ch00_preflight.single_gpu_lines(["# DDP: nothing to remove\n", "x = 1\n"])
    with pytest.raises(ch00_preflight.MarkError, match="guard"):
        ch00_preflight.single_gpu_lines(["if a:  # DDP guard: x\n", "    b = 1\n", "else:\n", "    b = 2\n"])


def test_marked_lines_lists_step_marks_outside_the_port():
    found = ch00_preflight.marked_lines()
    files = {f for f, _, _ in found}
    assert {"scripts/train.py", "lab_utils/core/step.py", "lab_utils/core/distenv.py", "lab_utils/core/ddp.py"} <= files
    assert any("no_sync" in code for f, _, code in found if f == "lab_utils/core/step.py")
