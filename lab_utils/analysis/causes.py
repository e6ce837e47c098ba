"""The cause engine: why run B left run A, judged from the two run folders only. One rule per cause, used by both
the parity report (`first`: the cause it names, in a fixed priority) and the doctor (`ranked`: every cause the
files support, by the strength of its evidence). Taught in notebooks/10_workflow.ipynb.

Each check reads an `Evidence` (the parity report's numbers, both runs' metrics.jsonl and config.json, A's final
weights, each rank's initial fingerprint) and returns Candidates: a cause code, a strength and the evidence in
words. A candidate marked `decisive` is one the report may name on its own; `first` returns the first decisive
one in CHECKS order, the order in which a difference explains the others (a different global batch also moves
the gradient norm and the loss from step 0, so it is checked first). The engine starts where B leaves what A's
float noise allows (the report's first step over its bound: fixed tolerances, or the float twins' envelope,
lab_utils/analysis/noise.py); with twins, float order is never the cause of a run outside their envelope.

Analysis side: reads run folders (runfiles) and never the training code or the launcher.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lab_utils.core import runfiles

# The causes the report can name (code -> what it means). portbugs.SUITE's expected causes use these codes.
CAUSES = {
    "global_batch": "the global batch differs: a different number of samples per optimizer step",
    "reduction_scale": "the gradient is scaled by world_size or 1/world_size: the loss reduction",
    "sampler_epoch": "the data order differs from an epoch boundary on: set_epoch forgotten, RandomSampler",
    "per_rank_rng": "randomness that depends on the rank: per-rank seeds, global-RNG dropout or augmentation",
    "batch_norm": "BatchNorm statistics of each rank's own micro-batch: a different number of ranks",
    "data_or_init": "the first batch or the initial weights differ: batch size, sample set or init",
    "float_order": "nothing but the float order of the sums differs (another batch split), amplified by training",
    "loss_normalization": "each rank averages its loss over its own tokens: the mean of means is not the global mean",
    "cross_sample": "a loss that mixes samples (in-batch negatives) sees only this rank's part of the batch",
    "resume": "the run resumed from a checkpoint that did not hold its whole state: the data position, the "
              "optimizer, the learning-rate schedule or the loss scale",
    "grad_clip": "the gradients are clipped at the wrong point: per rank before the all-reduce, per micro-batch, "
                 "or still multiplied by GradScaler's loss scale",
    "no_update": "the optimizer never changed the weights: it holds other tensors than the model's parameters, "
                 "or no gradient reached them",
    "replicas": "the ranks' copies of the weights parted: a parameter updated from each rank's own gradient, "
                "never reduced over ranks",
    "fsdp2_setup": "FSDP2 set up wrong: the optimizer built before fully_shard, the root module not sharded, "
                   "the gradient sync left off, or a checkpoint of rank 0's shards only",
}
CLIP_RATIO_SPREAD = 0.05  # grad_norm B/A moving by more than this over 10 steps is no constant factor
SCALE_RTOL = 0.01  # how close grad_norm_B / grad_norm_A must be to world_size or 1/world_size
# Evidence strength, for the doctor's ranking (the cause the report names always comes first).
NAMED, STRONG, MEDIUM, WEAK = 100, 80, 50, 10


@dataclass(frozen=True)
class Cause:
    code: str  # a key of CAUSES
    text: str  # the evidence, with numbers from the two runs

    def __post_init__(self):
        if self.code not in CAUSES:
            raise ValueError(f"cause code {self.code!r} is not one of {', '.join(CAUSES)}")


@dataclass(frozen=True)
class Candidate:
    code: str       # a key of CAUSES
    strength: int   # NAMED > STRONG > MEDIUM > WEAK
    evidence: str   # what in the two folders points to it, with numbers
    decisive: bool = False  # the report may name it on its own

    @property
    def meaning(self) -> str:
        return CAUSES[self.code]


@dataclass
class Evidence:
    """What the checks read: the report (duck-typed ParityReport), the metrics, config.json, A's weights."""
    report: object
    ma: list[dict]
    mb: list[dict]
    ca: dict
    cb: dict
    weights_a: dict | None = None
    init_a: dict[int, str] = field(default_factory=dict)  # rank -> fingerprint of its weights before the wrap
    init_b: dict[int, str] = field(default_factory=dict)
    replica_a: dict[int, str] = field(default_factory=dict)  # rank -> fingerprint of the weights it holds whole,
    replica_b: dict[int, str] = field(default_factory=dict)  # at the end (train.py's last heartbeat)

    @property
    def ka(self) -> dict:
        return _keys(self.ca)

    @property
    def kb(self) -> dict:
        return _keys(self.cb)

    @property
    def first_out(self) -> int | None:
        """The first step B leaves A's allowed noise (loss or grad norm): where the engine starts."""
        r = self.report
        starts = [s for s in (r.first_step_over_tol, r.first_step_over_grad_rtol) if s is not None]
        return min(starts) if starts else None


# ------------------------------------------------------------------ helpers over config.json
def _keys(c: dict) -> dict:
    return c.get("config", {})


def ranks(c: dict) -> int | None:
    """The world size a run's data layout used: its process count, or emulate_ranks for one process."""
    if not c:
        return None
    return max(int(c.get("world_size", 1)), int(_keys(c).get("emulate_ranks", 1)))


def _near(x: float | None, target: float) -> bool:
    return x is not None and math.isfinite(x) and abs(x / target - 1) <= SCALE_RTOL


def fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def epoch_starts(n_samples: int, global_batch_size: int, world_sizes, steps: int) -> dict[int, int]:
    """{step: epoch} for the steps where a later epoch's first sample can appear (epoch >= 1).

    A DistributedSampler pads each epoch to a multiple of world_size (drop_last=False); the epoch starts
    in step e * n / global_batch_size (floor: a step that straddles the boundary; ceil: the first step
    wholly in epoch e), with n the dataset size or its padded size.
    """
    starts: dict[int, int] = {}
    sizes = {n_samples} | {w * math.ceil(n_samples / w) for w in world_sizes if w}
    for size in sizes:
        for epoch in range(1, steps * global_batch_size // size + 2):
            for s in (epoch * size // global_batch_size, -(-epoch * size // global_batch_size)):
                if 0 < s < steps:
                    starts.setdefault(s, epoch)
    return starts


def randomness(c: dict) -> str | None:
    """What a multi-rank run draws from the global RNG (so it depends on the rank and batch layout), if any."""
    k = _keys(c)
    if not c or (ranks(c) or 1) < 2:
        return None
    what = []
    if k.get("dropout", 0) > 0 and k.get("dropout_mode") == "torch":
        what.append("dropout masks (dropout_mode=torch)")
    if k.get("augment") in ("article", "global"):
        what.append(f"augmentation (augment={k['augment']})")
    if not what:
        return None
    seeds = " with per-rank seeds (seed_mode=article: seed + rank)" if k.get("seed_mode") == "article" else ""
    return " and ".join(what) + seeds


# Keys whose difference says nothing about the first batch or the initial weights.
# Keys that cannot change what is trained, only how it is run, logged or saved (a lab resume is exact, chapter 08;
# a lossy one shows as checkpoint_style), or only the float order of its sums (the float twins measure that).
# Every other key that differs changes training: the doctor never says "no bug" while one does.
BOOKKEEPING = {"out_dir", "log_every", "log_sync_every", "fingerprint", "backend", "device", "threads", "pg_timeout",
               "emulate_ranks", "micro_batch_size", "grad_accum_steps", "no_sync", "steps", "nudge_init",
               "window_every", "replay_from", "checkpoint_every", "checkpoint_write", "checkpoint_format", "resume",
               "fault", "fault_rank", "fault_step", "grad_reduction", "tree_comm", "bucket_cap_mb",
               "gradient_as_bucket_view", "find_unused_parameters",
               "wrap"}  # ddp or fsdp2: the same mean of the same gradients, in another float order


# Keys that change nothing in a one-rank layout (one process, emulate_ranks=1): the fixes a port needs on its
# DDP side only (a synced BatchNorm, a global token count, an autograd all-gather, the sum loss's x world_size).
# Where either run is one rank, a difference in one of them is not a difference in what that run computes.
WORLD_ONLY = {"sync_bn", "loss_normalization", "contrastive_gather", "sum_loss_fix", "broadcast_buffers"}


def _neutral(ca: dict, cb: dict) -> set[str]:
    single = 1 in (ranks(ca), ranks(cb))
    return BOOKKEEPING | (WORLD_ONLY if single else set())


def config_differences(ca: dict, cb: dict) -> list[str]:
    """"key=A vs B" for every key both config.json have that can change the results (bookkeeping left out)."""
    ka, kb, neutral = _keys(ca), _keys(cb), _neutral(ca, cb)
    return [f"{k}={ka[k]} vs {kb[k]}" for k in sorted(set(ka) & set(kb)) if ka[k] != kb[k] and k not in neutral]


def neutral_differences(ca: dict, cb: dict) -> list[str]:
    """"key=A vs B" for the keys that differ but change only the float order, or nothing (BOOKKEEPING, and the
    DDP-side fixes where one run is one rank)."""
    ka, kb, neutral = _keys(ca), _keys(cb), _neutral(ca, cb)
    return [f"{k}={ka[k]} vs {kb[k]}" for k in sorted(set(ka) & set(kb))
            if ka[k] != kb[k] and k in neutral - {"out_dir", "replay_from"}]


def init_hashes(run: Path, config: dict) -> dict[int, str]:
    """{rank: fingerprint of the initial weights before the DDP wrap}: train.py's heartbeats, or record's
    config.json (`init_param_hash_by_rank`)."""
    by_rank = config.get("init_param_hash_by_rank")
    if by_rank:
        return {int(r): h for r, h in enumerate(by_rank)}
    return {r: b["init_param_hash"] for r, b in runfiles.read_heartbeats(run).items() if b.get("init_param_hash")}


def replica_hashes(run: Path) -> dict[int, str]:
    """{rank: fingerprint of the parameters it held whole at the end}: train.py's last heartbeat."""
    return {r: b["replica_hash"] for r, b in runfiles.read_heartbeats(run).items() if b.get("replica_hash")}


def _step0_out(e: Evidence) -> bool:
    r = e.report
    return bool(r.loss_diffs) and not r.loss_diffs[0] <= r.loss_bound(0)


# ------------------------------------------------------------------ the checks, in priority order
def global_batch(e: Evidence) -> list[Candidate]:
    ka, kb, ga, gb = e.ka, e.kb, e.ka.get("global_batch_size"), e.kb.get("global_batch_size")
    if ga is not None and gb is not None and ga != gb:
        return [Candidate("global_batch", STRONG, f"global batch differs: {ga} vs {gb} samples per optimizer step "
                          f"(global_batch_size = micro_batch_size x grad_accum_steps x world_size: "
                          f"{ka.get('micro_batch_size')}x{ka.get('grad_accum_steps')}x{ranks(e.ca)} vs "
                          f"{kb.get('micro_batch_size')}x{kb.get('grad_accum_steps')}x{ranks(e.cb)})", True)]
    sa, sb = e.ma[0].get("samples"), e.mb[0].get("samples")
    if sa and sb and sa != sb:  # what lab_utils.core.record counts for any script
        return [Candidate("global_batch", STRONG, f"metrics.jsonl: {sa} vs {sb} samples in step 0", True)]
    return []


def reduction_scale(e: Evidence) -> list[Candidate]:
    r, ka, kb = e.report, e.ka, e.kb
    g0a, g0b = e.ma[0].get("grad_norm"), e.mb[0].get("grad_norm")
    ratio0 = g0b / g0a if g0a and g0b is not None else None
    ra, rb = ka.get("loss_reduction"), kb.get("loss_reduction")
    if ra and rb and ra != rb:
        return [Candidate("reduction_scale", STRONG, f"loss_reduction differs: {ra} vs {rb} (grad_norm B/A "
                          f"{fmt(ratio0)} at step 0): a sum loss scales the gradient by the number of loss elements",
                          True)]
    world = max(ranks(e.ca) or 1, ranks(e.cb) or 1)
    for w in [world] if e.ca and e.cb and world > 1 else range(2, 65):
        for target, word in ((1 / w, "1/world_size"), (w, "world_size")):
            if _near(ratio0, target) or _near(r.grad_norm_ratio_median, target):
                how = ("a sum loss without x world_size (DDP averages the gradients)" if target < 1
                       else "a loss scaled by world_size twice, or a mean loss multiplied by world_size")
                sure = " (loss_reduction=sum, sum_loss_fix=false)" if (
                    kb.get("loss_reduction") == "sum" and kb.get("sum_loss_fix") is False) else ""
                return [Candidate("reduction_scale", STRONG, f"grad_norm B/A is {fmt(ratio0)} at step 0 and "
                                  f"{fmt(r.grad_norm_ratio_median)} in the median = {word} ({w}): the gradient is "
                                  f"scaled, the data are not — {how}{sure}", True)]
    return []


def sample_ids(e: Evidence) -> list[Candidate]:
    """lab_utils.core.record's sample_ids: which step first sees other samples (any script)."""
    if any(m.get("sample_ids") is None for m in e.ma + e.mb) or not e.ma or not e.mb:
        return []
    sa, sb = [frozenset(m["sample_ids"]) for m in e.ma], [frozenset(m["sample_ids"]) for m in e.mb]
    part = next((i for i in range(min(len(sa), len(sb))) if sa[i] != sb[i]), None)
    if part == 0 and len(sa[0]) == len(sb[0]):
        return [Candidate("data_or_init", STRONG, f"sample_ids: step 0 holds other samples ({len(sa[0] - sb[0])} "
                          f"of {len(sa[0])} differ) — the sample set or the data order differs", True)]
    if part:
        return [Candidate("sampler_epoch", STRONG, f"sample_ids: the same samples at steps 0-{part - 1}, other "
                          f"samples from step {part} on — the data order changes there (an epoch boundary reached "
                          f"without set_epoch, or a RandomSampler)", True)]
    return []


def epoch_boundary(e: Evidence) -> list[Candidate]:
    r, ka, kb, first = e.report, e.ka, e.kb, e.first_out
    ga = ka.get("global_batch_size") or kb.get("global_batch_size")
    # The dataset size: the n_samples key, else what the runs recorded (config.json "dataset_size").
    n = ka.get("n_samples") or kb.get("n_samples") or e.ca.get("dataset_size") or e.cb.get("dataset_size")
    if not (first and n and ga and ka.get("n_samples") == kb.get("n_samples")):
        return []
    boundary = epoch_starts(n, ga, {ranks(e.ca), ranks(e.cb)}, r.steps_compared)
    if first not in boundary:
        return []
    hint = [f"{nm} has set_epoch=false" for nm, k in ((r.run_a, ka), (r.run_b, kb)) if k.get("set_epoch") is False]
    hint += [f"{nm} has sampler=random" for nm, k in ((r.run_a, ka), (r.run_b, kb)) if k.get("sampler") == "random"]
    # DistributedSampler pads each epoch to a multiple of world_size with repeated samples: if the two runs pad
    # differently, the batch that straddles the boundary holds other samples (the H200 workshop case: 1809
    # samples, 1 vs 2 ranks, step 7).
    pads = {ranks(c) or 1: (-n) % (ranks(c) or 1) for c, k in ((e.ca, ka), (e.cb, kb))
            if k.get("sampler", "distributed") == "distributed" and not k.get("drop_last")}
    if len(set(pads.values())) > 1:
        hint.append(f"DistributedSampler pads {n} samples with " + " vs ".join(
            f"{p} repeated sample(s) at {w} rank(s)" for w, p in sorted(pads.items()))
            + ": make n_samples a multiple of the world size")
    return [Candidate("sampler_epoch", STRONG if hint else MEDIUM,
                      f"the runs agree until step {first}, the start of epoch {boundary[first]} (n_samples={n}, "
                      f"global_batch_size={ga}: {n / ga:g} steps per epoch): the data order of later epochs differs "
                      f"— sampler.set_epoch(epoch) forgotten, a RandomSampler, or padding"
                      + (f" ({', '.join(hint)})" if hint else ""), True)]


def resumed(e: Evidence) -> list[Candidate]:
    """B resumed at step k (its result.json) and leaves A's program at k or later: the checkpoint lost state."""
    at, first = e.cb.get("resumed_from"), e.first_out
    if at is None or first is None or first < at:
        return []
    style = e.kb.get("checkpoint_style")
    return [Candidate("resume", STRONG, f"{e.report.run_b} resumed at step {at} from a checkpoint"
                      + (f" written with checkpoint_style={style}" if style else "")
                      + f", and leaves A's program from step {first}"
                      + (" (the article's checkpoint keeps the epoch only: the data restarts at the epoch's start)"
                         if style == "article" else ""), True)]


def rank_randomness(e: Evidence) -> list[Candidate]:
    r = e.report
    for nm, c in ((r.run_b, e.cb), (r.run_a, e.ca)):
        what = randomness(c)
        if what:
            return [Candidate("per_rank_rng", STRONG, f"{nm} draws {what} from the global RNG on {ranks(c)} ranks: "
                              f"the draws depend on the rank and the batch layout, so no single run reproduces them "
                              f"— key them by sample (dropout_mode=keyed, augment=keyed)", True)]
    return []


def batch_wide_loss(e: Evidence) -> list[Candidate]:
    r = e.report
    for nm, k, c in ((r.run_b, e.kb, e.cb), (r.run_a, e.ka, e.ca)):
        multi = (ranks(c) or 1) > 1
        if multi and k.get("padding", 0) > 0 and k.get("loss_normalization", "per_rank") == "per_rank":
            return [Candidate("loss_normalization", STRONG, f"{nm} pads up to {k['padding']} tokens per sample and "
                              f"each rank divides by its own token count (loss_normalization=per_rank): DDP then "
                              f"averages the ranks' means, which is not the mean over the global batch's tokens — "
                              f"all-reduce the token count (loss_normalization=global_tokens)", True)]
        if multi and k.get("model") == "contrastive" and k.get("contrastive_gather", "none") != "autograd":
            how = "no gather" if k.get("contrastive_gather", "none") == "none" else "dist.all_gather (no gradient)"
            return [Candidate("cross_sample", STRONG, f"{nm} computes in-batch negatives on {ranks(c)} ranks with "
                              f"{how}: each rank's loss sees another set of negatives, or none of their gradients — "
                              f"gather with torch.distributed.nn.functional.all_gather (contrastive_gather=autograd)",
                              True)]
    return []


def batch_norm(e: Evidence) -> list[Candidate]:
    """BatchNorm (the keys say so, or A's model.pt holds running statistics) on another number of ranks, with no
    synchronised BatchNorm in the multi-rank run: each rank normalises with its own micro-batch's statistics."""
    keyed = any(k.get("model") == "bn_net" and k.get("norm") == "batch" for k in (e.ka, e.kb))
    stats = bool(e.weights_a) and any(name.endswith("running_mean") for name in e.weights_a)
    ra, rb = ranks(e.ca), ranks(e.cb)
    synced = any(k.get("sync_bn", "none") != "none" and (ranks(c) or 1) > 1 for k, c in ((e.ka, e.ca), (e.kb, e.cb)))
    if not (keyed or stats) or ra == rb or synced:
        return []
    d0 = e.report.loss_diffs[0] if e.report.loss_diffs else math.nan
    return [Candidate("batch_norm", STRONG if _step0_out(e) else MEDIUM,
                      f"BatchNorm on {ra} vs {rb} ranks without sync_bn ({'the keys' if keyed else 'model.pt'}: "
                      f"running statistics; step-0 |dloss| {d0:.2e}): in training mode each rank normalises with its "
                      f"own micro-batch's mean and variance, so the forward differs from step 0 — compare with the "
                      f"emulated reference (emulate_ranks), or use SyncBatchNorm", True)]


CLIP_BUGS = {  # config key clip_bug (chapter 11) -> what the run did, and the fix
    "no_sync_window": "clip_grad_norm_ inside the no_sync window: each rank clipped its own local gradients by "
                      "their own norm before the all-reduce — clip once, after the last micro-batch's backward",
    "micro_batch": "clip_grad_norm_ after every micro-batch: partial sums clipped, then added — clip once per "
                   "optimizer step, after the last backward",
    "local_shards": "FSDP2: each rank clipped its own gradient shards by their own norm (the norm of "
                    "p.grad.to_local()) — call torch.nn.utils.clip_grad_norm_ on the DTensor parameters, which "
                    "reduces the norm over every rank's shards",
    "scaled": "clip_grad_norm_ before scaler.unscale_(optimizer): the threshold met gradients x the loss scale — "
              "unscale_ first, then clip",
}


def grad_clipping(e: Evidence) -> list[Candidate]:
    """Clipping at the wrong point (chapter 11), judged from the metrics: a step-0 grad_norm ratio that is a large
    power of two (GradScaler's scale: the norm, and the clipping, of the still-scaled gradients), or a gradient that
    departs while the loss, the data and the replicas agree (the clip acted on other gradients than the all-reduced
    whole). The clip_bug key only names the placement once the data have shown the effect."""
    g0a, g0b = (e.ma[0].get("grad_norm") if e.ma else None), (e.mb[0].get("grad_norm") if e.mb else None)
    if g0a and g0b and math.isfinite(g0a) and math.isfinite(g0b):
        power = math.log2(max(g0a, g0b) / min(g0a, g0b))
        if power >= 8 and abs(power - round(power)) < 1e-3:
            return [Candidate("grad_clip", STRONG, f"grad_norm B/A at step 0 is {fmt(g0b / g0a)} = 2^"
                              f"{round(math.log2(g0b / g0a))}, a power of two like GradScaler's loss scale: one run "
                              f"measures (and clips) the still-scaled gradients — {CLIP_BUGS['scaled']}"
                              + _clip_key(e), True)]
    step = _gradient_first(e)
    if step is None:
        return [Candidate("grad_clip", WEAK, f"config.json sets clip_bug={bug}, but the metrics show no gradient "
                          f"that departs before the loss", False) for bug in _clip_bugs(e)]
    ga, gb = e.ma[step]["grad_norm"], e.mb[step]["grad_norm"]
    clip = e.ka.get("grad_clip", e.kb.get("grad_clip"))
    active = (f"; A clips at max_norm={clip:g}, below its norm {ga:.4g}, so the clip acts" if clip
              else "; B/A varies from step to step, as a clip's factor does")
    return [Candidate("grad_clip", STRONG, f"step {step}: the loss agrees (|dloss| {e.report.loss_diffs[step]:.1e}, "
                      f"within its bound) but grad_norm B/A is {fmt(gb / ga)}, neither world_size nor a power of two, "
                      f"and the ranks' weights stay one copy: the same data and weights gave another gradient after "
                      f"the backward — clipped before the all-reduce finished (inside no_sync, per micro-batch, on "
                      f"local shards), not once on the reduced gradients{active}" + _clip_key(e), True)]


def _clip_bugs(e: Evidence) -> list[str]:
    return [k["clip_bug"] for k in (e.kb, e.ka) if k.get("clip_bug", "none") in CLIP_BUGS]


def _clip_key(e: Evidence) -> str:
    bugs = _clip_bugs(e)
    return f" (config.json: clip_bug={bugs[0]}: {CLIP_BUGS[bugs[0]]})" if bugs else ""


def _gradient_first(e: Evidence) -> int | None:
    """The step where B's gradient norm leaves A's noise while the loss there, the samples, the sample count and
    the replicas agree: something between the backward and the norm changed the gradient. None otherwise."""
    r, step = e.report, e.report.first_step_over_grad_rtol
    if step is None or step >= len(r.loss_diffs) or step >= min(len(e.ma), len(e.mb)):
        return None
    if (r.first_step_over_tol is not None and r.first_step_over_tol <= step) or not r.loss_diffs[step] <= \
            r.loss_bound(step):
        return None  # the loss moved first (or with it): the forward saw other data or weights
    a, b = e.ma[step], e.mb[step]
    if not (a.get("grad_norm") and b.get("grad_norm")) or not all(map(math.isfinite, (a["grad_norm"], b["grad_norm"]))):
        return None  # no gradient at all (sync left off) is frozen_weights' case
    ids_a, ids_b = a.get("sample_ids"), b.get("sample_ids")  # recorded scripts: the samples the step drew
    if a.get("samples") != b.get("samples") or (ids_a is not None and ids_b is not None
                                                 and frozenset(ids_a) != frozenset(ids_b)):
        return None
    if any(len(set(h.values())) > 1 for h in (e.replica_a, e.replica_b)):
        return None  # an unreduced parameter also changes the norm: replicas_parted's case
    return step if _clipping_acts(e, step) else None


def _clipping_acts(e: Evidence, step: int) -> bool:
    """Clipping can be what changed the gradient: A clips there (its grad_clip is below its norm), or, where the
    folders do not say (a recorded script), B/A varies from step to step. A constant factor (a loss divided
    twice by the accumulation steps, say) is a scale, not a clip."""
    clip = e.ka.get("grad_clip", e.kb.get("grad_clip"))
    if clip is not None:
        return 0 < clip < e.ma[step]["grad_norm"]
    ratios = [b["grad_norm"] / a["grad_norm"] for a, b in zip(e.ma[step:step + 10], e.mb[step:step + 10], strict=False)
              if a.get("grad_norm") and b.get("grad_norm")]
    return len(ratios) >= 2 and max(ratios) / min(ratios) > 1 + CLIP_RATIO_SPREAD


def replicas_parted(e: Evidence) -> list[Candidate]:
    """A run whose ranks ended holding different copies of the weights each holds whole (their heartbeats'
    replica fingerprints): some parameter's gradient was never reduced over ranks."""
    r = e.report
    for nm, hashes in ((r.run_b, e.replica_b), (r.run_a, e.replica_a)):
        if len(set(hashes.values())) > 1:
            shown = ", ".join(f"rank {k} {v}" for k, v in sorted(hashes.items()))
            return [Candidate("replicas", STRONG, f"{nm}'s ranks ended with different copies of the weights each "
                              f"holds whole ({shown}): a parameter was updated from each rank's own gradient, never "
                              f"reduced over ranks — under FSDP2 one outside every fully_shard (shard the root "
                              f"module last); under DDP one updated outside the wrap", True)]
    return []


def frozen_weights(e: Evidence) -> list[Candidate]:
    """One run's parameter fingerprint is the same after every step while the other run's moves: nothing
    updated its weights (read from the metrics, whatever the keys say)."""
    r = e.report

    def frozen(m: list[dict]) -> bool:
        hashes = [x.get("param_hash") for x in m]
        return len(hashes) >= 2 and None not in hashes and len(set(hashes)) == 1

    for nm, mine, other in ((r.run_b, e.mb, e.ma), (r.run_a, e.ma, e.mb)):
        if frozen(mine) and not frozen(other):
            return [Candidate("no_update", STRONG, f"{nm}'s weights never changed in {len(mine)} steps (one parameter "
                              f"fingerprint throughout) while the other run's did: its optimizer holds other tensors "
                              f"than the model's parameters (built before a wrap that replaces them, as FSDP2's "
                              f"fully_shard does: build it after), or no gradient reached them (FSDP2's gradient "
                              f"sync left off)", True)]
    return []


FSDP2_BUGS = {  # config key fsdp2_bug -> what the run did, and the fix
    "optimizer_before_wrap": "the optimizer was built before fully_shard, which replaces every parameter with a "
                             "sharded one: it steps tensors the model no longer uses — build it after fully_shard",
    "root_not_wrapped": "fully_shard on the blocks only: the root's own parameters (embeddings, final norm, head) "
                        "stay plain tensors whose gradients no rank reduces — call fully_shard(model) last",
    "sync_left_off": "set_requires_gradient_sync(False) for accumulation, never set back to True before the last "
                     "micro-batch: no gradient is ever reduce-scattered — turn it on for the last backward",
    "rank0_saves_sharded": "only rank 0 saved the checkpoint (DDP's rule), but under FSDP2 rank 0 holds 1/W of "
                           "the state: a resume from it cannot load the full weights — save with every rank "
                           "(checkpoint_format=sharded: dcp.save) or gather the full state first",
}


def fsdp2_setup(e: Evidence) -> list[Candidate]:
    """The fsdp2_bug key (lab_utils/core/fsdp2.py's port bugs), with the fix."""
    r = e.report
    for nm, k in ((r.run_b, e.kb), (r.run_a, e.ka)):
        bug = k.get("fsdp2_bug", "none")
        if bug in FSDP2_BUGS:
            return [Candidate("fsdp2_setup", STRONG, f"{nm} has fsdp2_bug={bug}: {FSDP2_BUGS[bug]}", True)]
    return []


def initial_weights(e: Evidence) -> list[Candidate]:
    r, found = e.report, []
    ha, hb = e.init_a, e.init_b
    if ha.get(0) and hb.get(0) and ha[0] != hb[0]:
        found.append(Candidate("data_or_init", STRONG, f"rank 0 built other initial weights (init fingerprints "
                               f"{ha[0]} vs {hb[0]}): another init seed or model code", True))
    if _step0_out(e):
        differ = config_differences(e.ca, e.cb)
        found.append(Candidate("data_or_init", MEDIUM, f"the loss differs from step 0 (|dloss| {r.loss_diffs[0]:.2e}):"
                               f" the first batch or the initial weights differ — batch size, sample set or init"
                               + (f"; config.json differs in {', '.join(differ)}" if differ else ""), True))
    for nm, hashes in ((r.run_b, hb), (r.run_a, ha)):
        if len(set(hashes.values())) > 1:
            found.append(Candidate("per_rank_rng", MEDIUM, f"{nm}'s ranks built different initial weights before "
                                   f"the wrap ({', '.join(f'rank {k} {v}' for k, v in sorted(hashes.items()))}): "
                                   f"seeded per rank; the wrap copies rank 0's weights, but every later draw "
                                   f"(dropout, augmentation) still depends on the rank"))
    return found


def after_the_first_update(e: Evidence) -> list[Candidate]:
    """The loss agrees at step 0, the weights differ after the first update, the loss leaves A's noise later."""
    r = e.report
    late = (r.first_step_over_tol or 0) >= 1 and e.ma[0].get("param_hash") != e.mb[0].get("param_hash") \
        and not config_differences(e.ca, e.cb)
    if late and any(k.get("seed_mode") == "article" for k in (e.ka, e.kb)):
        return [Candidate("per_rank_rng", STRONG, f"the loss agrees at step 0 but the weights differ after the first "
                          f"update and the loss diverges from step {r.first_step_over_tol}: the same data and weights "
                          f"gave another update — randomness seeded per rank (seed_mode=article)", True)]
    if r.calibrated and r.tier < 2:
        return []  # outside the float twins' envelope: float order alone does not explain it
    if late:
        # Same keys, no per-rank randomness: the only difference left is how the batch is split, i.e. the float
        # order of the sums (on GPUs matmul kernels are also chosen by shape). (The H200 workshop jump once filed
        # here, docs/measured/h200/workshop_tiers.txt, was the sampler's padding: `epoch_boundary`.)
        return [Candidate("float_order", WEAK, f"same keys and no per-rank randomness, yet the loss diverges from "
                          f"step {r.first_step_over_tol}: the batch is split differently, so sums run in another "
                          f"float order and training amplified the last-bit differences — compare with the emulated "
                          f"reference (emulate_ranks), or judge against a float twin (--noise)", True)]
    if r.loss_diffs:
        first = f"first diverging step {e.first_out}" if e.first_out is not None else "no step over the bound"
        return [Candidate("float_order", WEAK, f"step-0 |dloss| {r.loss_diffs[0]:.1e}; {first}; max |dloss| "
                          f"{r.max_abs_loss_diff:.1e}")]
    return []


CHECKS: list[Callable[[Evidence], list[Candidate]]] = [
    global_batch, reduction_scale, sample_ids, resumed, epoch_boundary, rank_randomness, batch_wide_loss, batch_norm,
    grad_clipping, frozen_weights, replicas_parted, fsdp2_setup, initial_weights, after_the_first_update]


def candidates(e: Evidence) -> list[Candidate]:
    """Every candidate of every check, in CHECKS order."""
    return [c for check in CHECKS for c in check(e)]


def first(e: Evidence) -> Cause | None:
    """The cause the parity report names: the first decisive candidate in CHECKS order, or None."""
    c = next((c for c in candidates(e) if c.decisive), None)
    return Cause(c.code, c.evidence) if c else None


def ranked(e: Evidence, named: Cause | None = None) -> list[Candidate]:
    """Every cause the files support, once each (its evidence merged): `named` first, the rest by strength."""
    merged: dict[str, Candidate] = {}
    for c in sorted(candidates(e), key=lambda c: -c.strength):
        if c.code in merged:
            old = merged[c.code]
            merged[c.code] = Candidate(c.code, old.strength, f"{old.evidence}; {c.evidence}", old.decisive)
        else:
            merged[c.code] = c
    if named is None:
        return sorted(merged.values(), key=lambda c: -c.strength)
    merged.pop(named.code, None)
    more = [c.evidence for c in candidates(e) if c.code == named.code and c.evidence != named.text]
    head = Candidate(named.code, NAMED, named.text + (f" [also: {'; '.join(more)}]" if more else ""), True)
    return [head, *sorted(merged.values(), key=lambda c: -c.strength)]
