"""Chapter 10's lesson logic (notebooks/10_workflow.ipynb): the article's §7 comparison workflow, corrected.

- `first_epoch_boundary`: where a data-order bug (set_epoch forgotten) can first show, and why the article's
  "100 samples, 50 steps" check crosses it after a few steps;
- `CHECKLIST`: the article's §7.2 table, line by line, with the corrected line and the chapter that measures it;
- `delta_loss`, `plot_divergence`: per-step |Δloss| of run pairs with the first diverging step marked;
- `recorder_lines`: the lines a user adds to their own script (lab_utils.core.record), read from the patched
  public script, so the notebook never copies them by hand;
- `late_specs`: the runs of a bug that starts after the whole-run envelope has gone blind (lesson 5).

Reads run folders through runfiles only; launches nothing (the notebook does, through lab_utils.chapter and
the launcher).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

from lab_utils.core import runfiles


def first_epoch_boundary(n_samples: int, global_batch_size: int) -> int:
    """The first optimizer step that holds a sample of epoch 1 (0-based): floor(n / G). A bug in how later
    epochs are ordered (set_epoch forgotten, a RandomSampler reference) cannot show before it, and shows there."""
    if n_samples < 1 or global_batch_size < 1:
        raise ValueError(f"n_samples={n_samples} and global_batch_size={global_batch_size} must be >= 1")
    return n_samples // global_batch_size


@dataclass(frozen=True)
class Row:
    item: str        # the article's check item (Chinese, as printed)
    single: str      # the article's single-GPU setting
    article: str     # what the article says the 2-GPU run should use
    verdict: str     # right | wrong | incomplete
    corrected: str   # the line that replaces it
    chapter: str     # the notebook that measures it


CHECKLIST = [
    Row("全局 batch size", "32", "每卡 16，全局仍 32", "right",
        "keep the global batch: micro_batch_size = global_batch_size // (world_size x grad_accum_steps); "
        "check the product before launch", "01_unchanged"),
    Row("梯度累积步数", "8", "4（除以 world_size）", "incomplete",
        "right on its own (32 per GPU x 4 steps x 2 = 256), and jointly inconsistent with the row above: halve the "
        "per-GPU batch OR the accumulation steps, never both — 16 per GPU and 4 steps give 16 x 4 x 2 = 128, not "
        "32 x 8 = 256 (the batch trap); use no_sync on all but the last micro-batch", "06_accumulation"),
    Row("随机种子", "42", "模型 42，数据 42+rank", "incomplete",
        "rank 0 builds the model from the single run's seed (DDP copies rank 0's weights at the wrap); the data order "
        "comes from the sampler's seed, per-sample randomness keyed by (seed, sample visit, site) — the article's own "
        "§4.2. A per-rank seed matters only where the script draws from the global RNG: there it is what gives the "
        "ranks different draws (nanoGPT's batches), so keep it, and no single run reproduces those draws; dropout or "
        "augmentation keyed by sample does not need it", "04_per_sample_rng"),
    Row("loss 归约", "mean", "mean（DDP 自动平均）", "incomplete",
        "mean: nothing to do; sum: x world_size before backward; padded tokens: divide by the global token count; "
        "in-batch negatives: gather with autograd; check the per-step grad norm, not the loss (AdamW hides x1/2)",
        "05_ddp_flags"),
    Row("checkpoint", "直接存", "仅 rank 0 存，用 .module", "right",
        "rank 0 saves model.module.state_dict(); without sync BN the other ranks' buffers differ, so evaluate "
        "rank 0's model", "07_batchnorm"),
    Row("日志", "直接 print", "仅 rank 0 print", "incomplete",
        "rank 0 prints the loss AVERAGED over ranks (all_reduce(loss) / world_size first), plus the global grad "
        "norm and a weight fingerprint per step (lab_utils.core.record writes all three)", "01_unchanged"),
    Row("（§7.3）权重差异", "—", "最终 checkpoint 的权重差异在 1e-5 量级", "wrong",
        "no single weight threshold: per step |Δloss| and grad-norm ratio, final tensors per tensor, or the "
        "outputs on a probe batch; Adam moves a zero-gradient tensor by far more than 1e-5 in a correct port",
        "01_unchanged"),
]


def checklist_html(measured: dict[str, str] | None = None) -> str:
    """The §7.2 table, corrected, as HTML; `measured`: {item: what this notebook's runs showed}."""
    colour = {"right": "#e3f6e5", "wrong": "#fde2e1", "incomplete": "#fff4d6"}
    head = ("<tr><th>检查项 (article)</th><th>single</th><th>article: 2 GPUs</th><th>verdict</th>"
            "<th>corrected line</th><th>measured here</th><th>chapter</th></tr>")
    rows = []
    for r in CHECKLIST:
        seen = (measured or {}).get(r.item, "")
        rows.append(f'<tr style="background:{colour[r.verdict]}"><td>{html.escape(r.item)}</td>'
                    f"<td>{html.escape(r.single)}</td><td>{html.escape(r.article)}</td><td><b>{r.verdict}</b></td>"
                    f"<td style='text-align:left'>{html.escape(r.corrected)}</td><td style='text-align:left'>"
                    f"{html.escape(seen)}</td><td>{r.chapter}</td></tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def delta_loss(run_a: Path, run_b: Path) -> list[float]:
    """|loss_A - loss_B| per step, over the steps both runs logged."""
    ma, mb = runfiles.read_metrics(run_a), runfiles.read_metrics(run_b)
    return [abs(x["loss"] - y["loss"]) for x, y in zip(ma, mb, strict=False)]


def grad_norm_ratio(run_a: Path, run_b: Path) -> list[float]:
    """grad_norm_B / grad_norm_A per step, over the steps both runs logged."""
    ma, mb = runfiles.read_metrics(run_a), runfiles.read_metrics(run_b)
    return [y["grad_norm"] / x["grad_norm"] for x, y in zip(ma, mb, strict=False)]


def plot_divergence(pairs: dict[str, tuple[Path, Path]], first_steps: dict[str, int | None],
                    loss_tol: float = 1e-6, boundary: int | None = None, title: str = "",
                    grad_panel: bool = False, grad_rtol: float = 1e-4):
    """Per-step |Δloss| (log scale) of each pair, its first diverging step circled, the tier-2 tolerance as a
    dashed line and an epoch boundary (optional) as a dotted one. Exact zeros follow `plotting.plot_parity`:
    the line breaks there and a ▼ marks the step on the bottom edge. `grad_panel`: a second panel with each
    pair's grad-norm ratio B/A, its band 1 ± grad_rtol shaded: a bug that diverges by the gradient (AdamW hides
    a constant factor from the loss) shows there, not on the loss axis."""
    import matplotlib.pyplot as plt

    from lab_utils.analysis.plotting import LEGEND

    fig, axes = plt.subplots(1, 2 if grad_panel else 1, figsize=(12 if grad_panel else 8, 4.2), squeeze=False)
    ax = axes[0][0]
    diffs = {label: delta_loss(a, b) for label, (a, b) in pairs.items()}
    nonzero = [d for ds in diffs.values() for d in ds if d > 0] + [loss_tol]
    low = min(nonzero) / 100
    ax.set_yscale("log")
    ax.set_ylim(low, max(nonzero) * 30)
    for i, (label, d) in enumerate(diffs.items()):
        colour = f"C{i}"
        zeros = [k for k, x in enumerate(d) if x == 0]
        ax.plot(range(len(d)), [x if x > 0 else float("nan") for x in d], marker=".", color=colour,
                label=f"{label} ({len(zeros)} of {len(d)} steps exact 0)" if zeros else label)
        if zeros:
            ax.plot(zeros, [low * 1.6 * 2.2 ** i] * len(zeros), ls="none", marker="v", ms=6, color=colour,
                    clip_on=False)
        s = first_steps.get(label)
        if s is not None and s < len(d) and d[s] > 0:
            ax.plot([s], [d[s]], "o", ms=10, mfc="none", color=colour)
            ax.annotate(f"step {s}", (s, d[s]), textcoords="offset points", xytext=(6, 6), fontsize=8, color=colour)
    ax.axhline(loss_tol, color="grey", lw=1, ls="--", label=f"tier-2 tolerance {loss_tol:g}")
    if boundary is not None:
        ax.axvline(boundary, color="black", lw=1, ls=":", label=f"epoch 1 starts (step {boundary})")
    ax.set_xlabel("optimizer step      (▼ on the bottom edge: |Δloss| exactly 0)")
    ax.set_ylabel("|Δloss|, 2 ranks vs 1 (log scale)")
    ax.set_title(title or "loss: where the runs part")
    ax.legend(**LEGEND)
    if grad_panel:
        gx = axes[0][1]
        for i, (label, (a, b)) in enumerate(pairs.items()):
            gx.plot(grad_norm_ratio(a, b), marker=".", color=f"C{i}", label=label)
        gx.axhspan(1 - grad_rtol, 1 + grad_rtol, color="0.85", label=f"tier 2: within 1 ± {grad_rtol:g}")
        gx.axhline(1, color="grey", lw=1, ls="--")
        gx.set(xlabel="optimizer step", ylabel="grad_norm ratio, 2 ranks / 1",
               title="gradient norm: the bugs the loss hides")
        gx.legend(**LEGEND)
    fig.tight_layout()
    return fig


def recorder_lines(script: Path, patches: tuple[str, ...] = ()) -> str:
    """The lines of `script` marked `# RECORD:` (and their continuation lines, while a bracket is open): what a
    user adds to their own training script. `patches`: also the `# PATCH:` lines whose comment contains one of
    these words (the dataset returning its index, which `sample_ids` needs, is such a patch)."""
    keep, depth = [], 0
    for i, line in enumerate(Path(script).read_text().splitlines(), 1):
        code = line.split("#", 1)[0]
        comment = line.split("#", 1)[1] if "#" in line else ""
        patched = "PATCH:" in comment and any(w in comment for w in patches)
        if (("RECORD:" in line or patched) and not line.lstrip().startswith("#")) or depth > 0:
            keep.append(f"{i:4d}  {line}")
            depth = max(0, depth + sum(code.count(c) for c in "([{") - sum(code.count(c) for c in ")]}"))
    return "\n".join(keep)


# ------------------------------------------------------------------ a bug that starts late (lesson 5)
LATE_CASES = ("A", "twin", "correct", "late_set_epoch")


def late_specs(prefix: str = "ch10_late_") -> dict:
    """The runs of lesson 5 as specs (launcher.requests_from_specs makes them requests): `ddp-lab bench late
    --size toy`'s single run A with its float twin, the correct 2-rank port and the port with set_epoch=false.
    lr=0.03 with a warm-up and cosine: the tiny GPT's twins go blind (their bound past 1% of the loss) by step
    ~35, and 1280 samples at global batch 16 put the first epoch boundary at step 80, well inside that blind
    zone."""
    from lab_utils.drivers import bench_late

    return {k: (prefix + s[0], *s[1:]) for k, s in bench_late.specs("toy").items() if k in LATE_CASES}


def doctor_ops(run_a: Path, run_b: Path):
    """`ddp-lab doctor A B --ops` as a call: the diagnosis with the first differing step (or, for a correct port,
    the first step not bitwise) replayed op by op for A's program and B's (analysis/ops.py, core/op_trace.py)."""
    from lab_utils.analysis import doctor
    from lab_utils.core import op_trace

    return doctor.add_ops(doctor.diagnose_runs(run_a, run_b), op_trace.trace, op_trace.OpsUnsupported)
