"""The single-GPU -> DDP port as a diff, generated from the lab's real code, and a picture of one DDP step.

Taught in notebooks/00_preflight.ipynb. The code marks every line that exists only because of DDP:

- `# DDP:` on the first line of a statement: one process does not have that statement at all (with its body,
  if it opens a block, and with the comment lines directly above it). On a decorator line: that decorator.
- `# DDP guard:` on an `if`/`with` header: the condition exists only because of DDP; one process runs the
  body unconditionally (the header goes, the body moves left).

`single_gpu_source` removes the marked lines; `port_diff` is the unified diff "without them" -> "with them",
so the diff can never drift from the code that runs. Nothing here imports the training code: it reads it.
"""

from __future__ import annotations

import ast
import difflib
import io
import re
import tokenize
from pathlib import Path

from lab_utils.core.runfiles import REPO

MARK = re.compile(r"#\s*DDP:")
GUARD = re.compile(r"#\s*DDP guard:")

# What the port touches: the whole script, plus the lab functions it calls that carry the DDP mechanics.
# step.py's marks (no_sync, the sum-loss scale) belong to gradient accumulation and sum losses (chapters 05
# and 06), not to the minimal port; `marked_lines` lists them too.
PORT_FILES: dict[str, tuple[str, ...] | None] = {
    "scripts/train.py": None,  # None: the whole file
    "lab_utils/core/distenv.py": ("setup", "teardown", "all_reduce_mean"),
    "lab_utils/core/ddp.py": ("wrap",),
}
MARKED_FILES = ("scripts/train.py", "lab_utils/core/step.py", "lab_utils/core/distenv.py", "lab_utils/core/ddp.py")


class MarkError(ValueError):
    """A `# DDP:` mark that cannot be applied (on a comment line, or a guard with an else branch)."""


def _comments(lines: list[str]) -> dict[int, str]:
    """{line number (1-based): comment text} from the tokenizer, so '# DDP:' inside a string never counts."""
    found = {}
    tokens = tokenize.generate_tokens(io.StringIO("".join(lines)).readline)
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            found[tok.start[0]] = tok.string
    return found


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def single_gpu_lines(lines: list[str], where: str = "<source>") -> list[str]:
    """`lines` (one Python source, keepends) with every DDP-marked statement removed, guards unwrapped."""
    tree = ast.parse("".join(lines))
    starts: dict[int, ast.stmt] = {}
    decorators: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt):
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            starts.setdefault(node.lineno, node)
            starts.setdefault(first, node)
            decorators.update(d.lineno for d in getattr(node, "decorator_list", []))
    drop: set[int] = set()
    dedent: dict[int, int] = {}
    for lineno, comment in sorted(_comments(lines).items()):
        guard, mark = GUARD.match(comment), MARK.match(comment)
        if not (guard or mark):
            continue
        if not lines[lineno - 1].split("#")[0].strip():
            raise MarkError(f"{where}:{lineno}: a DDP mark on a comment line; put it on the statement")
        if mark and lineno in decorators:
            drop.add(lineno)
            continue
        node = starts.get(lineno)
        if node is None:
            raise MarkError(f"{where}:{lineno}: a DDP mark must be on the first line of a statement")
        if mark:
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            drop.update(range(first, node.end_lineno + 1))
            above = first - 1  # its comment lines go with it
            while above >= 1 and lines[above - 1].lstrip().startswith("#") and \
                    _indent(lines[above - 1]) == _indent(lines[first - 1]):
                drop.add(above)
                above -= 1
            continue
        if not isinstance(node, ast.If | ast.With) or getattr(node, "orelse", None):
            raise MarkError(f"{where}:{lineno}: `# DDP guard:` needs an if (without else) or a with")
        body_first = node.body[0].lineno
        drop.update(range(node.lineno, body_first))
        shift = _indent(lines[body_first - 1]) - _indent(lines[node.lineno - 1])
        for n in range(body_first, node.end_lineno + 1):
            dedent[n] = dedent.get(n, 0) + shift
    out = []
    for n, line in enumerate(lines, start=1):
        if n in drop:
            continue
        cut = min(dedent.get(n, 0), _indent(line)) if line.strip() else 0
        out.append(line[cut:])
    return out


def _chunks(rel: str) -> list[tuple[list[str], int]]:
    """The parts of `rel` the port shows (the whole file, or each named top-level function) as (lines, the
    line number of their first line in the file)."""
    lines = (REPO / rel).read_text().splitlines(keepends=True)
    names = PORT_FILES.get(rel)
    if names is None:
        return [(lines, 1)]
    defs = {n.name: n for n in ast.parse("".join(lines)).body if isinstance(n, ast.FunctionDef)}
    missing = [n for n in names if n not in defs]
    if missing:
        raise MarkError(f"{rel}: no top-level function {', '.join(missing)} (update ch00_preflight.PORT_FILES)")
    chunks = []
    for name in names:
        node = defs[name]
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        chunks.append((lines[first - 1:node.end_lineno], first))
    return chunks


def single_gpu_source(rel: str) -> str:
    """What `rel` (a PORT_FILES entry) would be in a one-process script: its DDP lines removed."""
    return "\n".join("".join(single_gpu_lines(lines, rel)) for lines, _ in _chunks(rel))


def port_diff(context: int = 2) -> str:
    """The unified diff single-GPU -> DDP over PORT_FILES; hunk headers give the real file and line."""
    out = []
    for rel, names in PORT_FILES.items():
        what = "" if names is None else f" ({', '.join(names)})"
        out += [f"--- single-GPU {rel}{what}", f"+++ DDP        {rel}{what}"]
        for lines, first in _chunks(rel):
            diff = difflib.unified_diff(single_gpu_lines(lines, rel), lines, n=context, lineterm="")
            for line in list(diff)[2:]:  # [2:]: the ---/+++ lines, written once per file above
                m = re.match(r"@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@", line)
                if m:  # the DDP side's line in the real file, so a reader can open it there
                    line = f"@@ {rel}:{first + max(int(m.group(1)), 1) - 1} @@"
                out.append(line.rstrip("\n"))
    return "\n".join(out) + "\n"


def port_diff_markdown(context: int = 2) -> str:
    """`port_diff` as a Markdown ```diff block (Jupyter colours the + and - lines)."""
    return f"```diff\n{port_diff(context)}```"


def marked_lines(files: tuple[str, ...] = MARKED_FILES) -> list[tuple[str, int, str]]:
    """Every `# DDP:` / `# DDP guard:` line of `files`: (file, line number, code without indentation)."""
    found = []
    for rel in files:
        lines = (REPO / rel).read_text().splitlines(keepends=True)
        for lineno, comment in sorted(_comments(lines).items()):
            if MARK.match(comment) or GUARD.match(comment):
                found.append((rel, lineno, lines[lineno - 1].strip()))
    return found


def draw_ddp_step(world_size: int = 2, global_batch_size: int = 16, path: str | Path | None = None):
    """One DDP optimizer step as a picture: the global batch split over the ranks (DistributedSampler deals
    position i to rank i % world_size), a forward and backward per rank on its own samples, the gradient
    all-reduce overlapping backward, and the same optimizer step on every rank."""
    from lab_utils.analysis.plotting import plt

    colours = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c"]
    W, G = world_size, global_batch_size
    fig, ax = plt.subplots(figsize=(11, 1.9 + 1.35 * W))
    ax.set_xlim(0, 100)
    ax.set_ylim(-1.4 * W - 0.6, 2.6)
    ax.axis("off")
    cell = 60 / G  # the global batch as G squares, coloured by the rank that computes each sample
    ax.text(0, 2.2, f"global batch: {G} samples (global_batch_size={G}); each rank computes G/W = {G // W}",
            fontsize=10, va="center")
    for i in range(G):
        ax.add_patch(plt.Rectangle((i * cell, 1.0), cell * 0.9, 0.8, color=colours[(i % W) % len(colours)]))
        ax.text(i * cell + cell * 0.45, 1.4, str(i), ha="center", va="center", fontsize=7, color="white")
    ax.text(62, 1.4, "position i of this step's batch goes to rank i % W\n(DistributedSampler, drop_last)",
            fontsize=8, va="center")

    def box(x, y, w, text, colour, alpha=0.18):
        ax.add_patch(plt.Rectangle((x, y - 0.45), w, 0.9, facecolor=colour, alpha=alpha, edgecolor=colour))
        ax.text(x + w / 2, y, text, ha="center", va="center", fontsize=8.5)

    for r in range(W):
        y = -0.2 - 1.4 * r
        c = colours[r % len(colours)]
        ax.text(0, y, f"rank {r}", fontsize=10, va="center", color=c, weight="bold")
        box(8, y, 22, f"forward: its {G // W} samples\n-> loss (mean over them)", c)
        box(32, y, 20, "backward: local grads\n(bucket by bucket)", c)
        box(72, y, 26, "optimizer.step()\nsame grads -> same params", c)
    top, bottom = 0.25, -0.65 - 1.4 * (W - 1)
    ax.add_patch(plt.Rectangle((54, bottom), 16, top - bottom, facecolor="#999999", alpha=0.25, edgecolor="#555"))
    ax.text(62, (top + bottom) / 2, "all-reduce\nSUM of grads,\neach / W\n(runs during\nbackward)",
            ha="center", va="center", fontsize=8.5)
    for r in range(W):
        y = -0.2 - 1.4 * r
        ax.annotate("", (32, y), (30, y), arrowprops={"arrowstyle": "->"})
        ax.annotate("", (54, y), (52, y), arrowprops={"arrowstyle": "->"})
        ax.annotate("", (72, y), (70, y), arrowprops={"arrowstyle": "->"})
    ax.text(0, bottom - 0.75, "Before the first step, DDP(model) broadcasts rank 0's parameters and buffers, "
            "so every rank starts equal and, getting the same averaged gradient, stays equal.", fontsize=8.5)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def smi_reading(smi: dict, nproc: int) -> dict:
    """The article's nvidia-smi check (§6.3) read from `preflight.gpu_processes_during`'s result: {"text",
    "verdict"}. The verdict is "right" only when nvidia-smi listed at least one compute process per rank. When it
    listed none, nothing was measured: in a container nvidia-smi often lists no processes at all (or host pids),
    so an empty list says nothing about the ranks and must not mark the article wrong. "wrong" is kept for a list
    that shows processes but fewer than the ranks that trained (the check would point at a healthy run)."""
    if not smi["checked"]:
        return {"text": "not checked on this machine: there is no nvidia-smi (no NVIDIA GPU here).", "verdict": ""}
    heartbeats = smi["result"].heartbeats if smi.get("result") is not None else {}
    rank_pids = {b["pid"] for b in heartbeats.values()}
    seen = smi["seen"]
    if not seen:
        return {"text": f"not measurable here: nvidia-smi listed no compute process while {nproc} ranks trained "
                        f"(common inside a container, where it cannot see the container's processes); the "
                        f"ranks' own heartbeats ({len(heartbeats)} ranks) are the evidence instead.", "verdict": ""}
    text = (f"nvidia-smi listed {len(seen)} compute process(es) while {nproc} ranks trained; "
            f"{len(set(seen) & rank_pids)} of them are rank pids (inside a container nvidia-smi may show host pids).")
    return {"text": text, "verdict": "right" if len(seen) >= nproc else "wrong"}
