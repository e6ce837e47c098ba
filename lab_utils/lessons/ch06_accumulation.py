"""Chapter 06's measurements, one hop from the notebook: the article's `8 // world_size`, the accumulation
probe's files (all-reduces counted, step times, samples per window), the partial last window, and a plot.

Taught in notebooks/06_accumulation.ipynb. The runs are launched by the notebook; the probe itself is
scripts/probes/accum_probe.py (PROBE). This module reads what they wrote and computes in this process what
needs no launch (the partial-window gradients use the real `step.micro_backward` on the real tiny GPT).
"""

from __future__ import annotations

import contextlib
import statistics

import torch

from lab_utils.core import config, runfiles, step, workloads
from lab_utils.launch import forked_ranks

PROBE = runfiles.REPO / "scripts" / "probes" / "accum_probe.py"


def article_accum_steps(world_size: int, single_accum: int = 8) -> int:
    """The article's §3.3 line, verbatim: `accum_steps = 8 // world_size`."""
    return single_accum // world_size


def article_table(micro_batch_size: int, single_accum: int = 8) -> list[dict]:
    """What `8 // world_size` gives per world size when the per-card micro-batch is kept, as §3.3 does."""
    want = micro_batch_size * single_accum
    rows = []
    for w in (1, 2, 3, 4):
        acc = article_accum_steps(w, single_accum)
        rows.append({"world_size": w, "accum_steps": acc, "global_batch": micro_batch_size * acc * w,
                     "intended": want, "ok": micro_batch_size * acc * w == want})
    return rows


def config_refusal(keys: dict, world_size: int) -> str | None:
    """The one-line ConfigError `config.resolve` (and so the launcher and `ddp-lab run`) gives, or None."""
    try:
        config.resolve(keys, world_size)
    except config.ConfigError as e:
        return f"ConfigError: {e}"
    return None


# ---- the probe's files

def allreduce_summary(probe: dict[int, dict]) -> dict[str, dict]:
    """Per setting: buckets, the set of all-reduce counts per step (over every step and rank), and the
    median step time in ms of the slowest rank, skipping step 0 (DDP rebuilds its buckets after it)."""
    out = {}
    for setting in probe[0]["settings"]:
        per_rank = [rec["settings"][setting] for rec in probe.values()]
        steps = list(zip(*(s["steps"] for s in per_rank), strict=True))  # steps[i] = that step on every rank
        out[setting] = {
            "buckets": per_rank[0]["buckets"],
            "calls_per_step": sorted({s["allreduce_calls"] for ranks in steps for s in ranks}),
            "median_ms": 1000 * statistics.median(max(s["seconds"] for s in ranks) for ranks in steps[1:]),
            "step_ms": [1000 * max(s["seconds"] for s in ranks) for ranks in steps],
        }
    return out


def samples_per_step(probe: dict[int, dict], setting: str = "no_sync=true") -> list[dict]:
    """Per optimizer step: samples drawn over all ranks and micro-batches, and the epochs the window spans."""
    ranks = [rec["settings"][setting]["steps"] for rec in probe.values()]
    rows = []
    for i, per_rank in enumerate(zip(*ranks, strict=True)):
        micro = [m for s in per_rank for m in s["micro_batches"]]
        rows.append({"step": i, "samples": sum(m["samples"] for m in micro),
                     "micro_batches_per_rank": len(per_rank[0]["micro_batches"]),
                     "epochs": sorted({e for m in micro for e in m["epochs"]})})
    return rows


def plot_allreduce_traffic(summaries: dict[int, dict[str, dict]], grad_bytes: int, measured_accum: int,
                           title: str, max_accum: int = 8):
    """What `no_sync` saves, in quantities that do not change between runs: all-reduce calls (left) and bytes
    all-reduced per rank (right) per optimizer step, against grad_accum_steps 1..max_accum. The lines are the
    rule (B buckets: B per step with no_sync, B x grad_accum_steps without), drawn from the probe's bucket
    count; the dots are the calls the probe's hook counted at `measured_accum`, at each world size of
    `summaries` ({world_size: allreduce_summary(...)}). Bytes = calls x (gradient bytes / B), computed."""
    import matplotlib.pyplot as plt

    accs = list(range(1, max_accum + 1))
    first = next(iter(summaries.values()))
    buckets = first["no_sync=true"]["buckets"]
    per_call = grad_bytes / buckets
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    rules = {"no_sync on: B per step": [buckets] * len(accs),
             "no_sync off: B x grad_accum_steps": [buckets * a for a in accs]}
    for (label, calls), colour in zip(rules.items(), ("C0", "C3"), strict=True):
        ax1.plot(accs, calls, color=colour, lw=1.5, label=f"{label} (B = {buckets})")
        ax2.plot(accs, [c * per_call / 1e6 for c in calls], color=colour, lw=1.5, label=label)
    for n, summary in summaries.items():
        for setting, colour in (("no_sync=true", "C0"), ("no_sync=false", "C3")):
            got = summary[setting]["calls_per_step"]
            ax1.plot([measured_accum] * len(got), got, ls="none", marker="o", ms=8 + 3 * (n > 2), mfc="none",
                     color=colour)
    ax1.plot([], [], ls="none", marker="o", mfc="none", color="gray",
             label=f"counted by the probe's hook at grad_accum_steps={measured_accum} "
                   f"({' and '.join(str(n) for n in summaries)} ranks)")
    ax1.set(xlabel="grad_accum_steps", ylabel="all-reduce calls per optimizer step", title="all-reduce calls")
    ax2.set(xlabel="grad_accum_steps", ylabel="MB all-reduced per rank per step",
            title=f"bytes (computed: calls x {grad_bytes / 1e6:.2f} MB of gradients / B)")
    for ax in (ax1, ax2):
        ax.set_xticks(accs)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


# ---- exercise 3: where no_sync is read (2 real gloo ranks, started from this process)

def _no_sync_rank(rank: int, world_size: int, init: str, out: str, accum_steps: int) -> None:
    """One rank of `no_sync_forward_rule`: count the all-reduces DDP launches in one window, three ways."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 2))
    calls = [0]

    def counting_hook(state, bucket):  # DDP calls this once per bucket it would all-reduce
        calls[0] += 1
        return default_hooks.allreduce_hook(state, bucket)

    model.register_comm_hook(None, counting_hook)
    x = torch.randn(accum_steps, 4, 8, generator=torch.Generator().manual_seed(rank))
    counts = {}
    for loop in ("forward and backward inside no_sync", "only backward inside no_sync", "no no_sync"):
        calls[0] = 0
        for i in range(accum_steps):
            last = i == accum_steps - 1
            ctx = model.no_sync() if not last and loop != "no no_sync" else contextlib.nullcontext()
            if loop == "only backward inside no_sync":
                out_ = model(x[i])  # the forward outside the context: DDP has already armed its reducer
                with ctx:
                    out_.sum().backward()
            else:
                with ctx:
                    model(x[i]).sum().backward()
        counts[loop] = calls[0]
        model.zero_grad(set_to_none=True)
    forked_ranks.finish(out, rank, counts)  # ends the process: a returning rank can hang in gloo's teardown


def no_sync_forward_rule(accum_steps: int = 4, world_size: int = 2) -> dict[str, list[int]]:
    """All-reduce calls per window of `accum_steps` micro-batches, per rank, for the right `no_sync` loop, the
    loop that puts only `backward()` inside `no_sync()`, and no `no_sync`. Two real gloo ranks started from this
    process (launch/forked_ranks: a file rendezvous, killed and named if still running after 120 s, a few
    seconds' work); returns {loop: [calls on each rank]}."""
    ranks = forked_ranks.run(_no_sync_rank, world_size, (accum_steps,), deadline_s=120, what="no_sync_forward_rule")
    return {loop: [r[loop] for r in ranks] for loop in ranks[0]}


# ---- the partial last window

def article_loop_windows(micro_batches_per_epoch: int, accum_steps: int, epochs: int) -> list[int]:
    """Run the article's §3.3 loop, as written, once per epoch; a counter stands in for `.grad`.
    Returns how many micro-batches each `optimizer.step()` sums (the leftover of an epoch stays in .grad,
    because zero_grad() only follows a step)."""
    in_grad, per_step = 0, []
    for _ in range(epochs):
        for i, _batch in enumerate(range(micro_batches_per_epoch)):
            in_grad += 1  # loss = model(batch) / accum_steps; loss.backward()
            if (i + 1) % accum_steps == 0:
                per_step.append(in_grad)  # optimizer.step()
                in_grad = 0  # optimizer.zero_grad()
    return per_step


def partial_window_gradients(accum_steps: int = 4, window: int = 2, micro_batch_size: int = 2) -> dict:
    """A window of `window` < accum_steps micro-batches, backpropagated by the lab's `step.micro_backward`
    (which divides by grad_accum_steps), against one backward of the same samples as a single batch
    (the mean the step should use). Returns the gradient norms and the largest |difference|."""
    cfg = config.resolve({"grad_accum_steps": accum_steps, "micro_batch_size": micro_batch_size,
                          "global_batch_size": accum_steps * micro_batch_size}, 1)
    torch.manual_seed(cfg["seed"])
    wl = workloads.build(cfg)
    model = wl.model
    samples = [wl.dataset[i] for i in range(window * micro_batch_size)]
    micro = [{k: torch.stack([s[k] for s in samples[j:j + micro_batch_size]]) for k in samples[0]}
             for j in range(0, len(samples), micro_batch_size)]
    whole = {k: torch.stack([s[k] for s in samples]) for k in samples[0]}

    def grads(batches, cfg_used):
        model.zero_grad(set_to_none=True)
        for b in batches:
            step.micro_backward(wl, model, b, cfg_used, 1)
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    reference = grads([whole], dict(cfg, grad_accum_steps=1))  # the mean over the window's samples
    scaled_by_accum = grads(micro, cfg)  # what a loop that always divides by accum_steps gives
    scaled_by_count = grads(micro, dict(cfg, grad_accum_steps=len(micro)))  # divide by the actual count
    norm = lambda g: g.norm().item()  # noqa: E731
    return {"window": len(micro), "accum_steps": accum_steps,
            "norm_reference": norm(reference), "norm_by_accum": norm(scaled_by_accum),
            "norm_by_count": norm(scaled_by_count),
            "ratio_by_accum": norm(scaled_by_accum) / norm(reference),
            "max_diff_by_count": (scaled_by_count - reference).abs().max().item(),
            "max_diff_by_accum": (scaled_by_accum - reference).abs().max().item()}
