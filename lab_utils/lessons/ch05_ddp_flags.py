"""Chapter 05's lesson logic: DDP's flags (find_unused_parameters, the buffer sync, gradient_as_bucket_view)
measured by scripts/probes/flags_probe.py on every rank, and the loss-reduction lessons read from runs'
own files (sum vs mean, token-count normalisation, in-batch negatives). Used by notebooks/05_ddp_flags.ipynb.
"""

from __future__ import annotations

from lab_utils.core import runfiles


def first_error_line(traceback: str) -> str:
    """The exception line of a failing rank's traceback (e.g. the RuntimeError DDP raised)."""
    lines = [ln.strip() for ln in traceback.splitlines() if ln.strip()]
    return next((ln for ln in lines if ln.startswith(("RuntimeError", "torch."))), lines[-1] if lines else "")


def same_on_all_ranks(records: dict[int, dict], *path) -> bool | list[bool]:
    """Whether a value (or each element of a list value) is the same on every rank."""
    values = []
    for rec in records.values():
        for k in path:
            rec = rec[k]
        values.append(rec)
    if isinstance(values[0], list):
        return [len({v[i] for v in values}) == 1 for i in range(len(values[0]))]
    return len({str(v) for v in values}) == 1


BUFFER_ARGUMENTS = ("broadcast_buffers=", "forward_sync_buffers=")


def buffer_table(records: dict[int, dict]) -> dict[str, dict[str, list[bool]]]:
    """{"argument=flag": {"before_forward": [equal on all ranks, per step], "after_step": [...]}}, for the
    deprecated `broadcast_buffers` and, where the probe's torch has it, `forward_sync_buffers`."""
    flags = [k for k in records[0] if k.startswith(BUFFER_ARGUMENTS)]
    return {f: {when: same_on_all_ranks(records, f, when) for when in ("before_forward", "after_step")}
            for f in flags}


def buffer_schedule(records: dict[int, dict]) -> list[dict]:
    """Per forward of the probe's schedule: what it was, and whether the buffers were equal on all ranks right
    before it (after any broadcast DDP made). Each rank trains on its own batches, so "equal" means "DDP
    broadcast rank 0's buffers before this forward" (or, for the first, that they started equal)."""
    sched = records[0]["schedule"]
    equal = same_on_all_ranks(records, "schedule", "before_forward")
    return [{"forward": f, "kind": k, "equal_before": e} for f, k, e in zip(sched["forwards"], sched["kinds"], equal,
                                                                         strict=True)]


def unused_cost(records: dict[int, dict]) -> dict[str, float]:
    """Median seconds per step of each copy, the slowest rank's (every rank waits for it in the all-reduce)."""
    copies = records[0]["step_seconds_median"]
    return {k: max(r["step_seconds_median"][k] for r in records.values()) for k in copies}


def unused_cost_spread(records: dict[int, dict], copy: str = "find_unused_parameters") -> dict:
    """The paired per-step ratio copy/plain (the copies alternate step by step, so step i of each ran under the
    same load), the slowest rank's time per step: its median and quartiles, and a sentence computed from them.
    The slowdown is called measured only when even the lower quartile is above 1 (or a speed-up when the upper
    quartile is below 1); otherwise the ratio was within this box's step-to-step spread."""
    import statistics

    steps = {k: [max(r["step_seconds"][k][i] for r in records.values())
                 for i in range(len(records[0]["step_seconds"][k]))] for k in ("plain", copy)}
    ratios = sorted(c / p for c, p in zip(steps[copy], steps["plain"], strict=True))
    q1, med, q3 = statistics.quantiles(ratios, n=4)
    if q1 > 1:
        verdict = f"slower: the {copy} step took {med:.2f}x plain, and over 3/4 of paired steps were above 1x"
    elif q3 < 1:
        verdict = f"faster ({med:.2f}x plain): below 1x in over 3/4 of paired steps, which no graph walk explains"
    else:
        verdict = (f"not measurable here: the paired ratio's interquartile range [{q1:.2f}x, {q3:.2f}x] contains 1x "
                   f"(median {med:.2f}x)")
    return {"n": len(ratios), "q1": q1, "median": med, "q3": q3, "measured": q1 > 1 or q3 < 1, "sentence": verdict}


def bucket_memory(records: dict[int, dict]) -> dict[str, dict]:
    """Rank 0's memory record per flag value ("False"/"True"), plus the byte saving of True."""
    mem = records[0]["memory"]
    saved = {k: mem["False"][k] - mem["True"][k] for k in ("rss_bytes", "cuda_allocated_bytes") if k in mem["True"]}
    return {**mem, "saved": saved}


def bucket_semantics(records: dict[int, dict]) -> list[dict]:
    """Per gradient action: the error (if any) and whether the flag changed the final parameters, per rank 0."""
    rows = []
    for action, by_flag in records[0]["semantics"].items():
        off, on = by_flag["False"], by_flag["True"]
        rows.append({"action": action, "error_off": off["error"], "error_on": on["error"],
                     "same_params": off["fingerprint"] == on["fingerprint"],
                     "kept_changed_off": off["kept_reference_changed"],
                     "kept_changed_on": on["kept_reference_changed"],
                     "grad_storages_off": off["grad_storages_last_step"],
                     "grad_storages_on": on["grad_storages_last_step"]})
    return rows


def kept_reference_grid(records: dict[int, dict]) -> list[dict]:
    """Rank 0's gradient_as_bucket_view x zero_grad(set_to_none) grid: whether a kept `.grad` reference changed at
    the next backward, and whether autograd accumulated the gradients into the bucket itself (the flag on, and
    the storages autograd wrote are the ones the gradients live in after backward)."""
    rows = []
    for key, rec in records[0]["set_to_none_grid"].items():
        flag, stn = (v == "True" for v in key.split("/"))
        rows.append({"gradient_as_bucket_view": flag, "set_to_none": stn,
                     "kept_reference_changed": rec["kept_reference_changed"],
                     "written_into_bucket": flag and rec["accumulated_into_final_grads"],
                     "accumulated_into_storages": rec["accumulated_into_storages"],
                     "grad_storages_after_backward": rec["grad_storages_after_backward"]})
    return rows


def grad_norm_ratio(run_a: str, run_b: str) -> list[float]:
    """grad_norm_B / grad_norm_A at every step, from both runs' metrics.jsonl (what parity reports as a median)."""
    ma, mb = (runfiles.read_metrics(runfiles.runs_dir() / r) for r in (run_a, run_b))
    return [b["grad_norm"] / a["grad_norm"] for a, b in zip(ma, mb, strict=False)]


def token_counts(cfg_keys: dict, nproc: int, steps: int = 1) -> list[list[int]]:
    """Real (unpadded) target tokens per rank at each of the first `steps` steps, from the loader the runs use."""
    from lab_utils.core import config, samplers, token_norm, workloads

    cfg = config.resolve(cfg_keys, nproc)
    wl = workloads.build(cfg)
    iters = [iter(samplers.make_loader(wl.dataset, r, nproc, cfg)) for r in range(nproc)]
    return [[sum(token_norm.real_tokens(token_norm.mask_padding(next(it), cfg)) for _ in range(cfg["grad_accum_steps"]))
             for it in iters] for _ in range(steps)]


def plot_reduction(runs: dict[str, str], title: str):
    """Loss curves (left) and grad_norm relative to the single run (right) of {label: run name}; the first
    entry is the reference. Returns the figure."""
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.6), constrained_layout=True)
    ref = next(iter(runs.values()))
    for label, name in runs.items():
        m = runfiles.read_metrics(runfiles.runs_dir() / name)
        ax1.plot([r["step"] for r in m], [r["loss"] for r in m], marker=".", label=label)
        ax2.plot([r["step"] for r in m], grad_norm_ratio(ref, name), marker=".", label=label)
    ax1.set(xlabel="step", ylabel="loss (all ranks)", title="loss")
    ax2.set(xlabel="step", ylabel="grad_norm / reference's", title="gradient norm vs the reference")
    for ax in (ax1, ax2):
        ax.legend(loc="best", fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    return fig


def split_losses(world_size: int = 2, seed: int = 0) -> list[dict]:
    """Exercise 3: which losses DDP's average of per-rank losses reproduces, and which need a global count.

    One fixed batch is computed whole (the single run) and as `world_size` equal shards of samples (the ranks);
    DDP's gradient is the mean over ranks of each rank's gradient, i.e. the gradient of the mean of the per-rank
    losses, so comparing the loss values decides it. The shards hold the same number of samples but, as in a
    real batch, different numbers of real tokens, weights and positives. A loss whose every term is divided by
    a count shared by the whole batch differs; a mean over samples does not."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(seed)
    n, t, c = 4 * world_size, 6, 5  # samples, tokens per sample, classes
    logits = torch.randn(n, t, c, generator=g, dtype=torch.float64)
    target = torch.randint(0, c, (n, t), generator=g)
    lengths = torch.arange(n) % t + 1  # real tokens per sample: 1..t, so the shards hold different counts
    tokens = target.masked_fill(torch.arange(t)[None, :] >= lengths[:, None], -100)  # padding: ignore_index
    weight = torch.rand(n, generator=g, dtype=torch.float64) + torch.arange(n, dtype=torch.float64) / n
    positive = (torch.arange(n) % 3 == 0) | (torch.arange(n) < world_size)  # 3 positives in shard 0, 1 in shard 1

    def focal(lg, y, gamma=2.0):  # per-sample focal loss on each sample's first token
        logp = F.log_softmax(lg[:, 0], -1).gather(1, y[:, :1]).squeeze(1)
        return -((1 - logp.exp()) ** gamma) * logp

    losses = {
        "label-smoothed cross entropy, mean over samples":
            lambda s: F.cross_entropy(logits[s, 0], target[s, 0], label_smoothing=0.1),
        "per-sample weighted loss, divided by the sum of the weights":
            lambda s: (weight[s] * F.cross_entropy(logits[s, 0], target[s, 0], reduction="none")).sum()
            / weight[s].sum(),
        "token-mean LM loss with padding/packing (ignore_index)":
            lambda s: F.cross_entropy(logits[s].reshape(-1, c), tokens[s].reshape(-1), ignore_index=-100),
        "focal loss, mean over samples":
            lambda s: focal(logits[s], target[s]).mean(),
        "focal loss, divided by the number of positives (RetinaNet)":
            lambda s: (focal(logits[s], target[s]) * positive[s]).sum() / positive[s].sum(),
    }
    shards = [slice(r * n // world_size, (r + 1) * n // world_size) for r in range(world_size)]
    rows = []
    for name, fn in losses.items():
        whole = float(fn(slice(None)))
        ddp = sum(float(fn(s)) for s in shards) / world_size
        rows.append({"loss": name, "single": whole, "ddp_mean": ddp, "abs_diff": abs(whole - ddp),
                     "needs_global_count": abs(whole - ddp) > 1e-9 * max(1.0, abs(whole))})
    return rows
