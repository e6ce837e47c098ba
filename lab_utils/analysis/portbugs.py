"""The port bugs the series teaches, as data: what to run, and what the parity report must say about it.

Each `PortBug` is a pair of runs: the correct single-process run (`single` keys, one process) and a port of
it (`ddp` keys, `nproc` ranks). `expected="catch"`: the parity report must put the port *below tier 2* and
name `cause` (a code of `parity.CAUSES`); `expected="pass"`: a correct port, which must reach tier 2 or 3.
Tier 2 is judged against the float-noise envelope of the single run's float twin (`twin`, lab_utils/analysis/noise.py),
so the same table holds at the toy size (`make test`) and at a real one (`SIZES["4x256"]`, 150 steps:
`ddp-lab bench portbugs`), where fixed tolerances call correct ports tier 1.
tests/analysis/test_port_bugs.py runs every entry with real processes; chapters 05-13 append their bugs to `SUITE`,
chapter 14 (FSDP2) has its own `FSDP2_SUITE` (`ddp-lab bench portbugs --suite fsdp2`),
and a `ddp-lab doctor` can run the same table. This module is data plus pure helpers: it launches nothing
(analysis side: it may import runfiles and parity, never the launcher or the training code).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from lab_utils.analysis.parity import CAUSES, ParityReport
from lab_utils.core import config, float_twin

# Every run of the suite: few steps (the bugs show from step 0, the epoch bug at step 2), default tiny GPT.
STEPS = 8
# The set_epoch case: 32 samples at global_batch_size 16 -> an epoch is 2 steps, boundaries at steps 2, 4, 6.
EPOCH_SAMPLES = 32
# Sizes the suite runs at: the keys added to every run. "toy" is make test's; "4x256" is a GPT 4 layers x 256
# wide for 150 steps, long enough that float noise alone crosses any fixed tolerance (from step ~50 on 2 cores).
SIZES = {"toy": (), "4x256": ("n_layer=4", "n_embd=256", "n_head=4", "steps=150")}


EXPECTED = ("catch", "pass", "bitwise", "not_bitwise")


@dataclass(frozen=True)
class PortBug:
    name: str
    article: str  # where the series (or the article) teaches it
    single: tuple[str, ...]  # keys of the correct single-process run
    ddp: tuple[str, ...]  # keys of the port
    expected: str  # "catch": below tier 2, with `cause`; "pass": tier >= 2; against an emulated reference
    # (chapter 12): "bitwise": tier 3; "not_bitwise": exactly tier 2 (what only the bitwise check can see)
    cause: str | None = None  # parity.CAUSES code the report must name (catch only)
    nproc: int = 2
    lesson: str = ""

    def __post_init__(self):
        if self.expected not in EXPECTED:
            raise ValueError(f"{self.name}: expected={self.expected!r} must be one of {', '.join(EXPECTED)}")
        if (self.expected == "catch") != (self.cause is not None):
            raise ValueError(f"{self.name}: a 'catch' entry names a cause, a 'pass' entry none")
        if self.cause is not None and self.cause not in CAUSES:
            raise ValueError(f"{self.name}: cause={self.cause!r} is not one of parity.CAUSES")


def _keys(*extra: str) -> tuple[str, ...]:
    return (f"steps={STEPS}", *extra)


SUM, NOFIX, SGD = "loss_reduction=sum", "sum_loss_fix=false", "optimizer=sgd"
TORCH_DROPOUT = ("seed_mode=article", "dropout=0.1", "dropout_mode=torch")
# chapter 13: C = 16 / 2 = 8 chunks, keyed dropout; the last key switches the stock reduction to the tree
TREE = ("sampler=global", "micro_batch_size=2", "dropout=0.1", "grad_reduction=tree")
CLIP, ACC2, FP16 = "grad_clip=0.25", "grad_accum_steps=2", "amp=fp16"

SUITE: list[PortBug] = [
    # ---- bugs: the report must not call these "unchanged"
    PortBug("global_batch_doubled", "ch01 (article §1.3)", _keys(), _keys("global_batch_size=32"), "catch",
            "global_batch", lesson="per-card batch kept at 16 on 2 cards: 32 samples per optimizer step"),
    PortBug("global_batch_halved", "ch06 (article §3.3 + §7.2 checklist)", _keys("grad_accum_steps=2"),
            _keys("global_batch_size=8"), "catch", "global_batch",
            lesson="per-card batch halved *and* accumulation halved: 8 samples per step instead of 16"),
    PortBug("sum_loss_unscaled_adamw", "ch05 (article §3.2)", _keys(SUM), _keys(SUM, NOFIX), "catch",
            "reduction_scale", lesson="sum loss without x world_size: gradients x 1/2; AdamW hides it in the loss"),
    PortBug("sum_loss_unscaled_sgd", "ch05 (article §3.2)", _keys(SUM, SGD), _keys(SUM, SGD, NOFIX), "catch",
            "reduction_scale", lesson="the same bug under SGD: the halved gradient halves every step"),
    PortBug("set_epoch_forgotten", "ch03 (article §2.3)", _keys(f"n_samples={EPOCH_SAMPLES}"),
            _keys(f"n_samples={EPOCH_SAMPLES}", "set_epoch=false"), "catch", "sampler_epoch",
            lesson="DistributedSampler without set_epoch(e): epoch 0's order forever, wrong from epoch 1"),
    PortBug("odd_dataset_padded", "ch03 (article §2.3)", _keys("n_samples=33"), _keys("n_samples=33"), "catch",
            "sampler_epoch", lesson="33 samples on 2 ranks: DistributedSampler repeats one to pad the epoch, so "
            "the boundary step's batch differs (the workshop preset's 1809 samples did this on two H200s)"),
    PortBug("per_rank_seed_torch_dropout", "ch02 (article §2.2)", _keys(*TORCH_DROPOUT), _keys(*TORCH_DROPOUT),
            "catch", "per_rank_rng", lesson="set_seed(42 + rank) with nn.Dropout: masks depend on the rank"),
    # ---- correct ports: the report must say "unchanged" (tier 2 or 3)
    PortBug("plain_port", "ch01", _keys(), _keys(), "pass", lesson="same keys, 2 ranks"),
    PortBug("sum_loss_fixed", "ch05 (article §3.2)", _keys(SUM), _keys(SUM), "pass",
            lesson="sum loss x world_size undoes DDP's averaging"),
    PortBug("accumulation_no_sync", "ch06 (article §3.3)", _keys("grad_accum_steps=2"),
            _keys("grad_accum_steps=2"), "pass", lesson="2 micro-batches per rank, all-reduce on the last only"),
    PortBug("accumulation_sync_every_micro_batch", "ch06 (article §3.3)", _keys("grad_accum_steps=2"),
            _keys("grad_accum_steps=2", "no_sync=false"), "pass",
            lesson="the article's loop without no_sync: an all-reduce per micro-batch costs time, not the tier"),
    PortBug("keyed_dropout", "ch02", _keys("dropout=0.1"), _keys("dropout=0.1"), "pass",
            lesson="dropout masks keyed by (seed, sample): the same on any number of ranks"),
    PortBug("plain_port_bf16", "ch01", _keys("amp=bf16"), _keys("amp=bf16"), "pass",
            lesson="bf16 autocast: the noise is bf16's, and the envelope is measured in bf16 too"),
    # ---- chapter 07 (BatchNorm). SGD: under Adam the bias before BatchNorm (~zero gradient) holds a correct
    # sync-BN port at tier 1 by its amplified float noise, which is not a port bug.
    PortBug("bn_without_sync", "ch07 (article §3.1)", _keys("model=bn_net", SGD), _keys("model=bn_net", SGD),
            "catch", "batch_norm", lesson="BatchNorm without sync: each rank normalises over its own micro-batch"),
    PortBug("lab_sync_bn", "ch07", _keys("model=bn_net", SGD), _keys("model=bn_net", SGD, "sync_bn=lab"), "pass",
            lesson="LabSyncBatchNorm: statistics all-reduced over the ranks, gloo on CPU"),
    # ---- chapter 05: losses with a batch-wide term (per-rank token means, in-batch negatives)
    PortBug("padding_per_rank_token_mean", "ch05 (article §3.2)", _keys("padding=16"), _keys("padding=16"),
            "catch", "loss_normalization", lesson="padded tokens: the mean of per-rank token means is biased"),
    PortBug("in_batch_negatives_plain_gather", "ch05 (article §1.2)", _keys("model=contrastive"),
            _keys("model=contrastive", "contrastive_gather=plain"), "catch", "cross_sample",
            lesson="dist.all_gather returns no gradient: the negatives from other ranks stop learning"),
    PortBug("padding_global_token_count", "ch05 (article §3.2)", _keys("padding=16"),
            _keys("padding=16", "loss_normalization=global_tokens"), "pass",
            lesson="padded tokens: token sum / the step's token count over all ranks, x world_size"),
    PortBug("in_batch_negatives_autograd_gather", "ch05 (article §1.2)", _keys("model=contrastive"),
            _keys("model=contrastive", "contrastive_gather=autograd"), "pass",
            lesson="InfoNCE over the global batch: torch.distributed.nn.functional.all_gather keeps the gradients"),
    # ---- chapter 12: against the emulated 4-rank reference, where only the bitwise check can tell
    PortBug("reduction_in_backend_order", "ch12 (article §1.1 tier 3)", _keys("sampler=global", "emulate_ranks=4"),
            _keys("sampler=global"), "not_bitwise", nproc=4,
            lesson="DDP's stock all-reduce at 4 ranks: the backend's summation order, last bits off (tier 2 only)"),
    PortBug("ordered_reduction", "ch12", _keys("sampler=global", "emulate_ranks=4"),
            _keys("sampler=global", "grad_reduction=ordered"), "bitwise", nproc=4,
            lesson="grad_reduction=ordered: all-gather, sum in rank order: the reference's bits at 4 ranks"),
    # ---- chapter 13: grad_reduction=tree, against the tree at ONE process (no emulation): one tree at any W
    PortBug("tree_at_2_ranks", "ch13 (article §1.1 tier 3)", _keys(*TREE), _keys(*TREE), "bitwise",
            lesson="grad_reduction=tree: 8 chunks in one binary tree; 2 ranks compute its top level"),
    PortBug("tree_at_4_ranks", "ch13 (article §1.1 tier 3)", _keys(*TREE), _keys(*TREE), "bitwise", nproc=4,
            lesson="the same tree at 4 ranks: bitwise with 1 process, hence with 2 ranks too"),
    PortBug("stock_4_ranks_vs_tree", "ch13", _keys(*TREE), _keys(*TREE[:-1]), "not_bitwise", nproc=4,
            lesson="DDP's stock all-reduce at 4 ranks, the same micro-batches: another float order (tier 2 only)"),
    # ---- chapter 11: where clip_grad_norm_ goes under DDP and GradScaler. grad_clip=0.25 is below the toy GPT's
    # gradient norm (~1 over these steps), and below half of it, so every step and every micro-batch clips.
    PortBug("clip_inside_no_sync_window", "ch11", _keys(CLIP, ACC2), _keys(CLIP, ACC2, "clip_bug=no_sync_window"),
            "catch", "grad_clip", lesson="clipped inside no_sync: each rank's local gradients, by its own norm"),
    PortBug("clip_per_micro_batch", "ch11", _keys(CLIP, ACC2), _keys(CLIP, ACC2, "clip_bug=micro_batch"), "catch",
            "grad_clip", lesson="clipped after every micro-batch: partial sums clipped, then added"),
    PortBug("clip_scaled_gradients", "ch11", _keys(FP16, CLIP), _keys(FP16, CLIP, "clip_bug=scaled"), "catch",
            "grad_clip", lesson="clipped before scaler.unscale_: the threshold met gradients x 65536"),
    PortBug("clip_once_per_step", "ch11", _keys(CLIP, ACC2), _keys(CLIP, ACC2), "pass",
            lesson="clip_grad_norm_ once, after the last micro-batch's all-reduce: the single run's clipping"),
    PortBug("clip_after_unscale_fp16", "ch11", _keys(FP16, CLIP), _keys(FP16, CLIP), "pass",
            lesson="fp16: scaler.scale(loss).backward(), scaler.unscale_, clip once, scaler.step, scaler.update"),
]


# ---- chapter 14 (FSDP2, wrap=fsdp2): FSDP2's own port bugs and its correct ports, judged exactly as DDP's.
# Two micro-batches and clipping below the norm on every run: where a sharded gradient is easiest to get wrong.
# FSDP2 ranks cannot share a GPU over gloo (distenv.check_sharded_device), so every run of this suite, its single
# runs included, is on the CPU: the same table on a laptop and on a GPU box with fewer GPUs than ranks, each pair
# compared on one device. (Chapter 14 runs FSDP2 on the GPUs where every rank has its own.)
FSDP2_DEVICE = "device=cpu"
FSDP2 = (CLIP, ACC2, "wrap=fsdp2")


def _fkeys(*extra: str) -> tuple[str, ...]:
    return _keys(*extra, FSDP2_DEVICE)


FSDP2_SUITE: list[PortBug] = [
    PortBug("fsdp2_optimizer_before_wrap", "ch14", _fkeys(CLIP, ACC2),
            _fkeys(*FSDP2, "fsdp2_bug=optimizer_before_wrap"), "catch", "no_update",
            lesson="the optimizer built before fully_shard holds the replaced parameters: "
            "the sharded ones never change"),
    PortBug("fsdp2_root_not_wrapped", "ch14", _fkeys(CLIP, ACC2), _fkeys(*FSDP2, "fsdp2_bug=root_not_wrapped"),
            "catch", "replicas", lesson="fully_shard on the blocks only: the root's own weights (embeddings, "
            "head) stay plain, their gradients never reduced, so the ranks' copies part"),
    PortBug("fsdp2_sync_left_off", "ch14", _fkeys(CLIP, ACC2), _fkeys(*FSDP2, "fsdp2_bug=sync_left_off"), "catch",
            "no_update", lesson="set_requires_gradient_sync(False) for accumulation and never True again: nothing "
            "is reduce-scattered"),
    PortBug("fsdp2_clip_local_shards", "ch14", _fkeys(CLIP, ACC2), _fkeys(*FSDP2, "clip_bug=local_shards"), "catch",
            "grad_clip", lesson="clip_grad_norm_ on p.grad.to_local(): each rank clips its shards by its own norm"),
    PortBug("fsdp2_set_epoch_forgotten", "ch03 + ch14", _fkeys(CLIP, ACC2, f"n_samples={EPOCH_SAMPLES}"),
            _fkeys(*FSDP2, f"n_samples={EPOCH_SAMPLES}", "set_epoch=false"), "catch", "sampler_epoch",
            lesson="DDP's set_epoch bug survives the move to FSDP2"),
    PortBug("fsdp2_plain_port", "ch14", _fkeys(CLIP, ACC2), _fkeys(*FSDP2), "pass",
            lesson="stock FSDP2: fully_shard per block then the root, optimizer after, sync on the last micro-batch"),
    PortBug("fsdp2_sync_every_micro_batch", "ch14", _fkeys(CLIP, ACC2), _fkeys(*FSDP2, "no_sync=false"), "pass",
            lesson="no set_requires_gradient_sync(False): a reduce-scatter per micro-batch costs time, not the tier"),
    PortBug("fsdp2_stock_4_ranks", "ch14 (article §1.1 tier 3)",
            _fkeys(CLIP, ACC2, "sampler=global", "emulate_ranks=4"),
            _fkeys(*FSDP2, "sampler=global"), "not_bitwise", nproc=4,
            lesson="stock FSDP2 at 4 ranks: the backend's reduce-scatter order, last bits off (tier 2 only)"),
    PortBug("fsdp2_ordered_4_ranks", "ch14", _fkeys(CLIP, ACC2, "sampler=global", "emulate_ranks=4"),
            _fkeys(*FSDP2, "sampler=global", "grad_reduction=ordered"), "bitwise", nproc=4,
            lesson="grad_reduction=ordered: all-to-all, sum in rank order: the emulated reference's bits"),
    PortBug("fsdp2_tree_4_ranks", "ch13 + ch14", _fkeys(CLIP, *TREE), _fkeys(CLIP, *TREE, "wrap=fsdp2"), "bitwise",
            nproc=4, lesson="grad_reduction=tree under FSDP2: a reduce-scatter per chunk, one tree, one process's "
            "bits"),
]
SUITES = {"ddp": SUITE, "fsdp2": FSDP2_SUITE}


def run_name(nproc: int, keys: tuple[str, ...]) -> str:
    """A stable run name for (nproc, keys): cases that need the same run share it (pb_ prefix)."""
    digest = hashlib.sha256(f"{nproc}|{'|'.join(sorted(keys))}".encode()).hexdigest()[:10]
    return f"pb_n{nproc}_{digest}"


def sized(keys: tuple[str, ...], size: str) -> tuple[str, ...]:
    """`keys` at one of SIZES (its keys win over the suite's, e.g. steps)."""
    extra = SIZES[size]
    names = {k.split("=", 1)[0] for k in extra}
    return tuple(k for k in keys if k.split("=", 1)[0] not in names) + extra


def twin(keys: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """(run name, keys) of the float twin of the single run with `keys` (float_twin.twin_of picks which twin)."""
    given = config.parse_overrides(list(keys))
    suffix, twin_keys = float_twin.twin_of(given, config.resolve(given, world_size=1))
    as_text = tuple(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in twin_keys.items())
    return f"{run_name(1, keys)}{float_twin.SEPARATOR}{suffix}", as_text


def runs_needed(suite: list[PortBug] = SUITE, size: str = "toy") -> dict[str, tuple[int, tuple[str, ...]]]:
    """{run name: (nproc, keys)} for every distinct run the suite compares, the single runs' twins included."""
    out: dict[str, tuple[int, tuple[str, ...]]] = {}
    for bug in suite:
        single = sized(bug.single, size)
        out.setdefault(run_name(1, single), (1, single))
        name, keys = twin(single)
        out.setdefault(name, (1, keys))
        ddp = sized(bug.ddp, size)
        out.setdefault(run_name(bug.nproc, ddp), (bug.nproc, ddp))
    return out


def problems(bug: PortBug, report: ParityReport) -> list[str]:
    """What is wrong with `report` for `bug` (empty: the report classified it as the suite expects)."""
    found = []
    if bug.expected == "catch":
        if report.tier >= 2:
            found.append(f"{bug.name}: a port bug reached tier {report.tier} ({report.tier_name})")
        got = report.cause.code if report.cause else None
        if got != bug.cause:
            found.append(f"{bug.name}: cause {got!r}, expected {bug.cause!r}")
    elif bug.expected == "bitwise":
        if report.tier != 3:
            found.append(f"{bug.name}: expected bitwise, got tier {report.tier} ({report.tier_name})")
    elif bug.expected == "not_bitwise":
        if report.tier != 2:
            found.append(f"{bug.name}: expected tier 2 and not bitwise, got tier {report.tier} ({report.tier_name})")
    elif report.tier < 2:
        found.append(f"{bug.name}: a correct port got tier {report.tier} ({report.tier_name})")
    return found


def doctor_problems(bug: PortBug, diagnosis) -> list[str]:
    """What is wrong with `ddp-lab doctor`'s diagnosis (lab_utils.analysis.doctor.Diagnosis) of `bug`'s two runs: a bug
    must rank its cause first and exit 1; a correct port must say "no bug: float order" or "unchanged:
    bitwise" and exit 0."""
    found = []
    if bug.expected == "catch":
        top = diagnosis.top.code if diagnosis.top else None
        if top != bug.cause or diagnosis.exit_code != 1:
            found.append(f"{bug.name}: doctor's top cause {top!r} (exit {diagnosis.exit_code}), expected "
                         f"{bug.cause!r} (exit 1)")
    elif bug.expected == "bitwise" and diagnosis.verdict != "unchanged: bitwise":
        found.append(f"{bug.name}: doctor says {diagnosis.verdict!r}, expected 'unchanged: bitwise'")
    elif bug.expected == "not_bitwise" and diagnosis.verdict != "no bug: float order":
        found.append(f"{bug.name}: doctor says {diagnosis.verdict!r}, expected 'no bug: float order'")
    elif diagnosis.verdict not in ("no bug: float order", "unchanged: bitwise") or diagnosis.exit_code != 0:
        found.append(f"{bug.name}: doctor says {diagnosis.verdict!r} (exit {diagnosis.exit_code}) on a correct port")
    return found
