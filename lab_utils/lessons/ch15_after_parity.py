"""Chapter 15's lesson logic: each speed-up's time and tier against eager fp32, on this box and (read from
docs/measured/h200/speed.json) on one H200, and the chapter's picture of both. Taught in
notebooks/15_after_parity.ipynb.

The runs are `scripts/train.py` with one speed key each (lab_utils/core/speed.py says what each key does); the
judgement is `ddp-lab bench speed`'s (lab_utils/drivers/bench_speed.py: `judge`, `table`), so the chapter and the
bench read the same runs the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

from lab_utils.core import float_twin, runfiles
from lab_utils.drivers import bench_speed

MEASURED = runfiles.REPO / "docs" / "measured" / "h200" / "speed.json"
SMALL_MB = bench_speed.SMALL_BUCKET_MB["cpu"]
# The variants that mean something on CPU (tf32 and compile are CUDA only: config refuses them here), at 2 ranks.
CPU_VARIANTS = {"fused": {"fused_optimizer": True}, "small_buckets": {"bucket_cap_mb": SMALL_MB},
                "no_overlap": {"overlap": "none"}}


def specs(twin_suffix: str, twin_keys: dict) -> dict[str, tuple[str, int, dict]]:
    """chapter.run_many's specs: eager fp32 at 2 ranks (the reference) and its float twin, one run per CPU
    variant, and the fused optimizer's own reference (one process emulating 2 ranks, fused too)."""
    out = {"eager": ("ch15_eager", 2, {}),
           "twin": (f"ch15_eager{float_twin.SEPARATOR}{twin_suffix}", 2, twin_keys),
           "fused_emul": ("ch15_fused_emul2", 1, {"fused_optimizer": True, "emulate_ranks": 2})}
    out.update({name: (f"ch15_{name}", 2, keys) for name, keys in CPU_VARIANTS.items()})
    return out


def rows(runs: dict, warmup: int) -> list[dict]:
    """One row per 2-rank run (eager first), as `ddp-lab bench speed` makes them: ms/step, speed-up, tier and
    max |Δparam| against the eager run and its twin."""
    ref, twin = runs["eager"].run_dir, runs["twin"].run_dir
    return [{"ranks": 2, "variant": name, **bench_speed.judge(ref, twin, runs[name].run_dir, warmup)}
            for name in ("eager", *CPU_VARIANTS)]


def measured(path: Path = MEASURED) -> dict | None:
    """The H200's `ddp-lab bench speed` output ({"meta", "rows"}), or None where it has not been measured yet."""
    return json.loads(path.read_text()) if path.exists() else None


def by_variant(rows_: list[dict], ranks: int) -> dict[str, dict]:
    """{variant: row} of the rows measured at `ranks` (skipped rows left out)."""
    return {r["variant"]: r for r in rows_ if r["ranks"] == ranks and r.get("ms_per_step") is not None}


TIER_COLOURS = {3: "#1a9850", 2: "#91cf60", 1: "#fc8d59", 0: "#d73027"}


def plot_speed(panels: dict[str, list[dict]], path=None, title: str = "speed-up over eager fp32, coloured by tier"):
    """One panel per machine ({title: rows}): a bar per (ranks, variant) = its speed-up over eager fp32 at the
    same world size, coloured by its tier against it, the tier written on the bar."""
    from lab_utils.analysis.plotting import _save, plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.8), squeeze=False)
    for ax, (name, rs) in zip(axes[0], panels.items(), strict=True):
        shown = [r for r in rs if r.get("ms_per_step") is not None and r["variant"] != bench_speed.REFERENCE]
        labels = [f"{r['variant']} ({r['ranks']}r)" for r in shown]
        ax.barh(labels, [r["speedup"] for r in shown], color=[TIER_COLOURS[r["tier"]] for r in shown])
        for y, r in enumerate(shown):
            ax.text(r["speedup"], y, f" {r['speedup']:.2f}x, tier {r['tier']}", va="center", fontsize=8)
        ax.axvline(1.0, color="grey", lw=1, ls="--")
        ax.set_xlim(0, max([1.0] + [r["speedup"] for r in shown]) * 1.45)
        ax.invert_yaxis()
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("speed-up (eager ms/step ÷ variant's)")
    fig.suptitle(title)
    fig.tight_layout()
    _save(fig, path)
    return fig
