"""The training script's keys: their types, defaults, allowed values, and the global-batch invariant.

One schema serves three callers: `scripts/train.py` (parses its argv), the launcher (validates *before*
anything is launched, so a typo never costs a torchrun start-up) and the notebooks (which show the
resolved config). Taught in notebooks/00_preflight.ipynb and notebooks/01_unchanged.ipynb.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    """A bad key or value. The message names it; the CLI prints it on one line and exits 2."""


@dataclass(frozen=True)
class Key:
    type: type
    default: Any
    help: str
    choices: tuple | None = None
    min: float | None = None
    max: float | None = None  # exclusive upper bound where `max_open`, else inclusive
    max_open: bool = False
    optional: bool = False  # None allowed (derived later)


# Names follow the glossary in README.md. Defaults are the CI/CPU size: a 2-rank run takes seconds.
KEYS: dict[str, Key] = {
    # --- the experiment
    "preset": Key(str, "cpu", "cpu: seconds on 2 cores; workshop: a bigger GPT for GPUs (keys you set win)",
                  choices=("cpu", "workshop")),
    "steps": Key(int, 40, "optimizer steps", min=1),
    "global_batch_size": Key(int, 16, "samples per optimizer step, summed over ranks and micro-batches", min=1),
    "micro_batch_size": Key(int, None, "samples per forward/backward on one rank (derived if unset)",
                            min=1, optional=True),
    "grad_accum_steps": Key(int, None, "micro-batches per optimizer step on one rank (derived if unset)",
                            min=1, optional=True),
    "seed": Key(int, 1337, "model-init seed (the same on every rank)", min=0),
    "data_seed": Key(int, 1234, "seed of the data order (samplers)", min=0),
    "seed_mode": Key(str, "lab", "lab: one init seed everywhere, data randomness keyed by sample; "
                     "article: set_seed(seed + rank) as the article's §2.2", choices=("lab", "article")),
    "sampler": Key(str, "distributed", "who gets which sample", choices=("distributed", "global", "random")),
    "sampler_mode": Key(str, "randperm", "global sampler's permutation", choices=("randperm", "feistel")),
    "set_epoch": Key(bool, True, "distributed sampler: call set_epoch(e) each epoch (false: epoch 0's order forever)"),
    "drop_last": Key(bool, False, "distributed sampler: drop the tail instead of padding with repeated samples"),
    "emulate_ranks": Key(int, 1, "single process computes each global batch as R ranks would", min=1),
    "nudge_init": Key(int, 0, "float twin: move every initial weight this many ulps up (0 = off); the same samples and "
                      "randomness, only the last bits differ (parity --noise)", min=0),
    "n_samples": Key(int, 0, "dataset size (0 = all the workload has)", min=0),
    "num_workers": Key(int, 0, "DataLoader worker processes", min=0),
    "loader_generator": Key(str, "dedicated", "dedicated: DataLoader gets its own torch.Generator; "
                            "global: none, so creating its iterator draws from the global RNG",
                            choices=("dedicated", "global")),
    # --- the model
    "model": Key(str, "gpt", "workload", choices=("gpt", "bn_net", "contrastive")),
    "block_size": Key(int, 32, "gpt: context length", min=2),
    "n_layer": Key(int, 2, "gpt: transformer blocks", min=1),
    "n_head": Key(int, 2, "gpt: attention heads", min=1),
    "n_embd": Key(int, 64, "gpt: embedding width", min=1),
    "dropout": Key(float, 0.0, "dropout probability", min=0.0, max=1.0, max_open=True),
    "dropout_mode": Key(str, "keyed", "keyed: masks keyed by (seed, sample); torch: nn.Dropout (global RNG)",
                        choices=("keyed", "torch")),
    "norm": Key(str, "batch", "bn_net: batch = BatchNorm layers, none = no normalisation", choices=("batch", "none")),
    "augment": Key(str, "none", "bn_net: augmentation randomness", choices=("none", "keyed", "article", "global")),
    "padding": Key(int, 0, "gpt: mask a keyed 0..padding trailing targets per sample (variable-length sequences)",
                   min=0),
    "contrastive_gather": Key(str, "none", "contrastive: in-batch negatives from this rank only (none), "
                              "dist.all_gather (plain, no gradient) or torch.distributed.nn.functional.all_gather "
                              "(autograd)", choices=("none", "plain", "autograd")),
    # --- the optimisation
    "loss_reduction": Key(str, "mean", "per-micro-batch loss reduction", choices=("mean", "sum")),
    "sum_loss_fix": Key(bool, True, "with loss_reduction=sum, multiply by world_size (DDP averages grads)"),
    "loss_normalization": Key(str, "per_rank", "gpt with padding: per_rank (each micro-batch's own token mean) or "
                              "global_tokens (token sum / the step's token count over all ranks)",
                              choices=("per_rank", "global_tokens")),
    "optimizer": Key(str, "adamw", "optimizer", choices=("adamw", "adam", "sgd")),
    "lr": Key(float, 3e-3, "learning rate", min=0.0, max_open=False),
    "lr_schedule": Key(str, "none", "none: lr at every step; warmup_cosine: linear warm-up over warmup_steps, then a "
                       "cosine to 10% of lr (a function of the step: core/schedule.py)",
                       choices=("none", "warmup_cosine")),
    "warmup_steps": Key(int, 10, "lr_schedule=warmup_cosine: warm-up steps", min=1),
    "lr_bug": Key(str, "none", "restart_on_resume: the schedule restarts at a resume (its state not in the checkpoint)",
                  choices=("none", "restart_on_resume")),
    "weight_decay": Key(float, 0.1, "weight decay (adamw, sgd)", min=0.0),
    "amp": Key(str, "none", "autocast dtype for forward/loss: bf16 (GPUs of compute capability >= 8.0, or CPU), "
               "fp16 (with torch.amp.GradScaler: any GPU, T4 included); its noise is judged by its float twin",
               choices=("none", "bf16", "fp16")),
    "tf32": Key(bool, False, "TF32 tensor-core matmuls and convolutions for fp32 on CUDA (faster; 10-bit mantissa "
                "inputs, so other numbers than fp32: its tier is measured by `ddp-lab bench scaling`)"),
    "compile": Key(bool, False, "nn.Module.compile() the model before the DDP wrap (CUDA only; the first steps "
                   "compile; fused kernels give other numbers than eager: `ddp-lab bench scaling` measures its tier)"),
    "grad_clip": Key(float, 0.0, "clip the global grad norm to this (0 = off)", min=0.0),
    "clip_bug": Key(str, "none", "chapter 11's clipping bugs: no_sync_window (clip each rank's local gradients "
                    "inside the no_sync window, before the all-reduce), micro_batch (clip after every micro-batch), "
                    "scaled (amp=fp16: clip before scaler.unscale_), local_shards (wrap=fsdp2: each rank clips its "
                    "own shards by their own norm, not the global norm)",
                    choices=("none", "no_sync_window", "micro_batch", "scaled", "local_shards")),
    "overflow_step": Key(int, None, "amp=fp16: multiply rank overflow_rank's loss by 2**100 at this step, so its "
                         "gradients overflow and GradScaler skips the step (chapter 11)", min=0, optional=True),
    "overflow_rank": Key(int, 0, "the rank whose loss overflows at overflow_step", min=0),
    "fused_optimizer": Key(bool, False, "torch.optim's fused=True: one kernel per update (GPU speed; other last bits "
                           "than the default, the same in every run that sets it)"),
    # --- DDP and the process group
    "backend": Key(str, "auto", "auto: nccl when every rank has its own GPU, else gloo",
                   choices=("auto", "gloo", "nccl")),
    "device": Key(str, "auto", "auto: cuda when available, else cpu", choices=("auto", "cpu", "cuda")),
    "no_sync": Key(bool, True, "skip the all-reduce on all but the last micro-batch of a step"),
    "find_unused_parameters": Key(bool, False, "DDP(find_unused_parameters=...)"),
    "broadcast_buffers": Key(bool, True, "rank 0's buffers copied to every rank before each synchronising "
                             "forward: DDP(forward_sync_buffers=...) where torch has it (2.13+; the buffers are "
                             "then copied at the wrap either way), else the older DDP(broadcast_buffers=...)"),
    "sync_bn": Key(str, "none", "BatchNorm statistics over all ranks: none (each rank its own micro-batch), "
                   "lab (lab_utils/core/sync_bn.py, any device), torch (nn.SyncBatchNorm, CUDA only)",
                   choices=("none", "lab", "torch")),
    "gradient_as_bucket_view": Key(bool, False, "DDP(gradient_as_bucket_view=...)"),
    "bucket_cap_mb": Key(float, 25.0, "DDP(bucket_cap_mb=...): gradient bucket size in MiB", min=0.01),
    "overlap": Key(str, "bucketed", "bucketed: DDP's default, each bucket's all-reduce overlaps the rest of the "
                   "backward; none: each bucket's all-reduce blocks the backward until it is done (the same sums; "
                   "lab_utils/core/speed.py, chapter 15)", choices=("bucketed", "none")),
    "wrap": Key(str, "ddp", "how the ranks share the model: ddp (a full copy each, gradients all-reduced) or "
                "fsdp2 (torch's fully_shard: each rank keeps 1/W of every weight, gradients reduce-scattered; "
                "lab_utils/core/fsdp2.py)", choices=("ddp", "fsdp2")),
    "fsdp2_bug": Key(str, "none", "wrap=fsdp2's port bugs: optimizer_before_wrap (the optimizer built on the "
                     "parameters fully_shard replaces), root_not_wrapped (fully_shard on the blocks only), "
                     "sync_left_off (set_requires_gradient_sync(False) never turned back on), rank0_saves_sharded "
                     "(checkpoint_format=sharded: rank 0 alone torch.saves its own shards, DDP's rule kept)",
                     choices=("none", "optimizer_before_wrap", "root_not_wrapped", "sync_left_off",
                              "rank0_saves_sharded")),
    "fsdp2_mp": Key(str, "none", "wrap=fsdp2's MixedPrecisionPolicy: bf16 = param_dtype=bfloat16 (the gathered "
                    "weights, the forward and backward in bf16) and reduce_dtype=float32 (gradients reduce-scattered "
                    "in fp32); the sharded weights and the optimizer stay fp32 (lab_utils/core/fsdp2.py)",
                    choices=("none", "bf16")),
    "grad_reduction": Key(str, "allreduce", "allreduce: DDP's stock hook (the backend picks the summation order); "
                          "ordered: all-gather and sum in rank order, bitwise equal to emulate_ranks=W at any W; "
                          "tree: each micro-batch's gradient apart, summed in one binary tree over the global "
                          "batch's chunks, the same bits at any world size (chapter 13)",
                          choices=("allreduce", "ordered", "tree")),
    "tree_comm": Key(str, "allgather", "grad_reduction=tree's top levels over ranks: allgather (the W subtree roots, "
                     "(W-1)x the gradient bytes) or halving (recursive-halving reduce-scatter + all-gather, the ring's "
                     "2(W-1)/W; the same bits)", choices=("allgather", "halving")),
    "deterministic": Key(bool, True, "torch.use_deterministic_algorithms (+ CUBLAS_WORKSPACE_CONFIG on CUDA)"),
    "threads": Key(int, 1, "intra-op threads per process (the same in every run, so kernels split work alike)",
                   min=1),
    "pg_timeout": Key(float, 300.0, "seconds a collective may wait before the process group gives up", min=1.0),
    # --- output and fault injection (the reliability chapters and the launcher tests)
    "out_dir": Key(str, "runs/default", "where config.json, metrics.jsonl and model.pt go"),
    "fingerprint": Key(bool, True, "hash all parameters after every step (off for throughput benchmarks)"),
    "log_every": Key(int, 10, "rank 0 prints a line every N steps", min=1),
    "log_sync_every": Key(int, 1, "rank 0 copies the logged numbers to the host every N steps (one device "
                          "sync per N steps; every step is still recorded in metrics.jsonl)", min=1),
    "checkpoint_every": Key(int, 0, "rank 0 saves out_dir/checkpoints/step_NNNNNN.pt every N optimizer steps "
                            "(0 = off)", min=0),
    "window_every": Key(int, 10, "rank 0 saves the full state to out_dir/windows/ every N optimizer steps, so "
                        "compare/doctor judge a port window by window from a shared state, where float noise never "
                        "grows (0 = off: past the float twins' blind step the report says 'not judged'); at most 64 "
                        "states a run (longer runs get longer windows: core/windows.py)", min=0),
    "replay_from": Key(str, None, "a run folder with windows/: run this program from that run's window states, one "
                       "window at a time (what compare/doctor launch; lab_utils/core/windows.py)", optional=True),
    "checkpoint_style": Key(str, "lab", "lab: model, optimizer, step (= data position) for exact resume; "
                            "article: model, optimizer, epoch as the article's §5.2", choices=("lab", "article")),
    "checkpoint_format": Key(str, "full", "full: the full state gathered, rank 0 writes step_NNNNNN.pt; sharded "
                             "(wrap=fsdp2): every rank writes its own shards with torch.distributed.checkpoint into "
                             "step_NNNNNN/, resharded on load at any world size (core/sharded_checkpoint.py)",
                             choices=("full", "sharded")),
    "checkpoint_write": Key(str, "atomic", "atomic: temp file + os.replace; naive: torch.save(path) in place",
                            choices=("atomic", "naive")),
    "resume": Key(str, None, "unset = fresh; auto = newest checkpoint in out_dir/checkpoints (else fresh); "
                  "or a checkpoint file / run folder", optional=True),
    "fault": Key(str, "none", "inject a failure (kill_in_save: rank 0 dies halfway through the checkpoint "
                 "write after step fault_step)",
                 choices=("none", "crash", "hang", "kill", "abort", "ignore_term", "kill_in_save")),
    "fault_rank": Key(int, 0, "rank that fails", min=0),
    "fault_step": Key(int, 0, "step at whose start it fails", min=0),
}

# The `# --- ` groups above, by title and first key: a key belongs to the group whose first key precedes it
# in KEYS, so a key added inside a group needs no second edit. Used by `ddp-lab keys`.
GROUPS: dict[str, str] = {"the experiment": "preset", "the model": "model", "the optimisation": "loss_reduction",
                          "DDP and the process group": "backend", "output and fault injection": "out_dir"}


def grouped() -> dict[str, list[str]]:
    """{group title: [key, ...]} in KEYS order."""
    first = {key: title for title, key in GROUPS.items()}
    out: dict[str, list[str]] = {}
    title = None
    for name in KEYS:
        title = first.get(name, title)
        if title is None:
            raise ValueError(f"key {name!r} comes before the first group's first key")
        out.setdefault(title, []).append(name)
    return out


# The GPU workshop size of the tiny GPT (19.2 M parameters). Applied under keys the user did not set.
# n_embd 512 / n_head 8: on two H200s (docs/measured/h200x2/scaling_2gpu_n512*.txt) 2 GPUs ran 1.90x, 1.91x,
# 1.91x and 1.91x the tokens/s of one (tier 2 vs 1 GPU, tier 3 vs the emulated run); the 384-wide preset
# before it ran 1.89x and 1.90x (at a fixed global batch each GPU's matmuls are half the size and less
# efficient; a wider model's matmuls are bigger). 768 wide ran 1.93x once but left tier 2 (max |dloss| 1.9e-6 >
# loss_tol 1e-6), so it would break the workshop's other promise.
# global_batch_size 256: each of 2 GPUs computes 128 samples per step. Measured on an H200 (ddp-lab bench
# profile, docs/measured/h200/): at 16 samples per micro-batch the step is host-bound (the GPU waits for
# Python and kernel launches) and a second GPU cannot halve it; at 128 the GPU is busy for the whole step
# (100% at 512 wide too: docs/measured/h200x2/profile_1gpu_n512.txt).
# n_samples 1792 = 7 x 256: the text holds 1809 blocks of 256 tokens, an odd count, so DistributedSampler pads
# 2 ranks with a repeated sample and the epoch-boundary step's batch differs from the single run's (measured on
# an H200: tier 1 from step 7 = the first boundary; docs/measured/h200/workshop_tiers.txt). A multiple of the
# world size (and of the global batch) keeps every step's samples identical at 1, 2, 4 or 8 ranks.
# log_sync_every 10: the logged numbers (and the fingerprints) reach the host in one copy per 10 steps, so the
# host is not made to wait for the GPU at every step's end (chapter 08; cost measured by `ddp-lab bench scaling`).
WORKSHOP = {"block_size": 256, "n_layer": 6, "n_head": 8, "n_embd": 512, "global_batch_size": 256,
            "n_samples": 1792, "lr": 1e-3, "steps": 100, "log_every": 20, "log_sync_every": 10}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _convert(name: str, key: Key, raw: Any) -> Any:
    """Turn a CLI string (or a Python value from a notebook) into the key's type, or raise naming it."""
    # "none" means "unset" only for keys that can be unset; norm=none, fault=none, amp=none are choices.
    if raw is None or (key.optional and isinstance(raw, str) and raw.lower() in ("none", "")):
        if key.optional:
            return None
        raise ConfigError(f"{name}: a value is required")
    if isinstance(raw, str) and raw == "":
        raise ConfigError(f"{name}: a value is required")
    if key.type is bool:
        if isinstance(raw, bool):
            return raw
        s = str(raw).lower()
        if s in _TRUE:
            return True
        if s in _FALSE:
            return False
        raise ConfigError(f"{name}={raw!r} is not a boolean (use true/false)")
    if key.type is int:
        if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
            raise ConfigError(f"{name}={raw!r} is not an integer")
        try:
            value = int(raw) if not isinstance(raw, str) else int(raw.replace("_", ""))
        except ValueError:
            raise ConfigError(f"{name}={raw!r} is not an integer") from None
    elif key.type is float:
        try:
            value = float(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}={raw!r} is not a number") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise ConfigError(f"{name}={raw!r} must be finite")
    else:
        value = str(raw)
    if key.choices is not None and value not in key.choices:
        raise ConfigError(f"{name}={value!r} is not one of: {', '.join(key.choices)}")
    if key.min is not None and value < key.min:
        raise ConfigError(f"{name}={value!r} must be >= {key.min}")
    if key.max is not None and (value >= key.max if key.max_open else value > key.max):
        raise ConfigError(f"{name}={value!r} must be {'<' if key.max_open else '<='} {key.max}")
    return value


def parse_overrides(items: list[str] | dict[str, Any]) -> dict[str, Any]:
    """`["steps=40", "lr=1e-3"]` or `{"steps": 40}` -> typed dict. Unknown keys are errors (with a guess)."""
    pairs: list[tuple[str, Any]] = []
    if isinstance(items, dict):
        pairs = list(items.items())
    else:
        for item in items:
            if "=" not in item:
                raise ConfigError(f"{item!r}: expected key=value")
            k, v = item.split("=", 1)
            pairs.append((k.strip(), v.strip()))
    out: dict[str, Any] = {}
    for name, raw in pairs:
        if name not in KEYS:
            guess = difflib.get_close_matches(name, KEYS, n=1)
            hint = f" (did you mean {guess[0]}?)" if guess else ""
            raise ConfigError(f"unknown key {name!r}{hint}")
        out[name] = _convert(name, KEYS[name], raw)
    return out


def resolve(overrides: list[str] | dict[str, Any], world_size: int) -> dict[str, Any]:
    """Defaults + overrides, with the batch sizes derived for `world_size` and every invariant checked.

    The user sets `global_batch_size` and at most one of `micro_batch_size` / `grad_accum_steps`; the other
    is derived, so the *same* keys describe the single run and the N-rank run. Setting all three only checks.
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"nproc/world_size={world_size!r} must be a positive integer")
    cfg = {name: key.default for name, key in KEYS.items()}
    given = parse_overrides(overrides)
    if given.get("preset") == "workshop":
        cfg.update(WORKSHOP)
    cfg.update(given)
    # emulate_ranks plays the role of the world size for the data layout of a single process.
    ranks = cfg["emulate_ranks"] if world_size == 1 else world_size
    if cfg["emulate_ranks"] > 1 and world_size > 1:
        raise ConfigError(f"emulate_ranks={cfg['emulate_ranks']} only makes sense with one process "
                          f"(world_size is {world_size})")
    if cfg["replay_from"] is not None and world_size > 1:
        raise ConfigError(f"replay_from replays the reference's program in one process (world_size is {world_size})")
    if cfg["compile"] and cfg["emulate_ranks"] > 1:  # the emulated ranks share one model from threads
        raise ConfigError(f"compile=true is not supported with emulate_ranks={cfg['emulate_ranks']}: the lab "
                          f"does not compile a model that several threads call at once")
    gbs, mbs, acc = cfg["global_batch_size"], cfg["micro_batch_size"], cfg["grad_accum_steps"]
    _check_tree(cfg, world_size)  # before the sizes are derived: the tree's own words for a bad C
    if mbs is None and acc is None:
        acc = 1
    if mbs is None:
        if gbs % (acc * ranks):
            raise ConfigError(f"global_batch_size={gbs} is not divisible by grad_accum_steps*world_size="
                              f"{acc}*{ranks}")
        mbs = gbs // (acc * ranks)
    elif acc is None:
        if gbs % (mbs * ranks):
            raise ConfigError(f"global_batch_size={gbs} is not divisible by micro_batch_size*world_size="
                              f"{mbs}*{ranks}")
        acc = gbs // (mbs * ranks)
    if mbs * acc * ranks != gbs:
        raise ConfigError(f"global_batch_size={gbs} != micro_batch_size*grad_accum_steps*world_size="
                          f"{mbs}*{acc}*{ranks}={mbs * acc * ranks}")
    cfg["micro_batch_size"], cfg["grad_accum_steps"] = mbs, acc
    if cfg["fault"] != "none" and cfg["fault_rank"] >= ranks and world_size > 1:
        raise ConfigError(f"fault_rank={cfg['fault_rank']} but world_size is {world_size}")
    _check_checkpoints(cfg, world_size)
    if cfg["model"] == "gpt" and cfg["n_embd"] % cfg["n_head"]:
        raise ConfigError(f"n_embd={cfg['n_embd']} is not divisible by n_head={cfg['n_head']}")
    if cfg["augment"] != "none" and cfg["model"] != "bn_net":
        raise ConfigError(f"augment={cfg['augment']!r} needs model=bn_net (gpt has no augmentation)")
    if cfg["sync_bn"] != "none" and (cfg["model"] != "bn_net" or cfg["norm"] != "batch"):
        raise ConfigError(f"sync_bn={cfg['sync_bn']} needs model=bn_net norm=batch (nothing else has BatchNorm)")
    _check_chapter05(cfg)
    _check_amp(cfg, ranks)
    _check_fsdp2(cfg)
    if cfg["sync_bn"] == "torch" and world_size > 1 and not _on_cuda(cfg["device"]):
        raise ConfigError("sync_bn=torch: nn.SyncBatchNorm accepts only GPU tensors and these ranks run on CPU "
                          "(torch raises ValueError at the first forward, even with gloo); use sync_bn=lab")
    return cfg


def _check_fsdp2(cfg: dict) -> None:
    """wrap=fsdp2 (lab_utils/core/fsdp2.py): what the lab has built and measured for it so far. Each refusal
    names the key, before anything launches."""
    if cfg["wrap"] != "fsdp2":
        for key in ("fsdp2_bug", "fsdp2_mp"):
            if cfg[key] != "none":
                raise ConfigError(f"{key}={cfg[key]} needs wrap=fsdp2")
        return
    if cfg["fsdp2_mp"] != "none" and cfg["amp"] != "none":
        raise ConfigError(f"wrap=fsdp2 with fsdp2_mp={cfg['fsdp2_mp']} and amp={cfg['amp']}: one mixed precision at "
                          f"a time (the policy casts the weights, autocast the ops): set amp=none")
    if cfg["fsdp2_mp"] == "bf16" and _on_cuda(cfg["device"]):
        import torch

        problem = bf16_refusal([torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())])
        if problem:
            raise ConfigError(problem.replace("amp=bf16", "fsdp2_mp=bf16", 1))
    if cfg["fsdp2_bug"] == "sync_left_off" and cfg["grad_accum_steps"] < 2:
        raise ConfigError("wrap=fsdp2 with fsdp2_bug=sync_left_off: needs grad_accum_steps >= 2 (the sync is "
                          "turned off for all but the last micro-batch, and this bug never turns it back on)")
    refused = {"model": (cfg["model"] != "gpt", "the blocks it shards are the GPT's (model=gpt)"),
               "grad_reduction": (cfg["grad_reduction"] == "tree" and (cfg["fsdp2_mp"] != "none"
                                                                      or cfg["fsdp2_bug"] == "sync_left_off"),
                                  "fsdp2_mp=none and no fsdp2_bug=sync_left_off (the tree promises the fp32 "
                                  "single run's bits, and it reduce-scatters every chunk: there is no sync to "
                                  "leave off)"),
               "amp": (cfg["amp"] == "fp16", "none or bf16 (no sharded GradScaler here)"),
               "compile": (cfg["compile"], "false"),
               "seed_mode": (cfg["seed_mode"] != "lab", "lab: fully_shard does not broadcast rank 0's weights, "
                             "so every rank must build the same initial model")}
    for key, (bad, wanted) in refused.items():
        if bad:
            raise ConfigError(f"wrap=fsdp2 with {key}={cfg[key]!r}: needs {wanted}")


def _check_chapter05(cfg: dict) -> None:
    """padding, loss_normalization, contrastive_gather (chapter 05): only where they mean something."""
    if cfg["padding"] and (cfg["model"] != "gpt" or cfg["padding"] >= cfg["block_size"]):
        raise ConfigError(f"padding={cfg['padding']} needs model=gpt and padding < block_size={cfg['block_size']}")
    if cfg["loss_normalization"] == "global_tokens" and (cfg["model"] != "gpt" or cfg["loss_reduction"] != "mean"):
        raise ConfigError("loss_normalization=global_tokens needs model=gpt and loss_reduction=mean")
    if cfg["contrastive_gather"] != "none" and cfg["model"] != "contrastive":
        raise ConfigError(f"contrastive_gather={cfg['contrastive_gather']} needs model=contrastive")
    if cfg["contrastive_gather"] != "none" and cfg["emulate_ranks"] > 1:
        raise ConfigError(f"contrastive_gather={cfg['contrastive_gather']} gathers over a process group; "
                          f"emulate_ranks={cfg['emulate_ranks']} has none")


def _check_tree(cfg: dict, world_size: int) -> None:
    """grad_reduction=tree (chapter 13, lab_utils/core/tree_reduce.py): the tree needs a fixed chunk size and
    C = global_batch_size / micro_batch_size chunks, a power of two that the world size divides."""
    if cfg["grad_reduction"] != "tree":
        return
    gbs, mbs = cfg["global_batch_size"], cfg["micro_batch_size"]
    if mbs is None and world_size > 1:  # at one process a derived size is W-free (a float twin drops the key)
        raise ConfigError(f"grad_reduction=tree at world size {world_size} needs micro_batch_size set (the chunk "
                          f"size): derived from the world size it would give another tree at every world size")
    if mbs is not None and gbs % mbs:
        raise ConfigError(f"grad_reduction=tree: global_batch_size={gbs} is not a multiple of micro_batch_size="
                          f"{mbs}, so C = global_batch_size / micro_batch_size is no whole number of chunks")
    chunks = gbs // mbs if mbs is not None else (cfg["grad_accum_steps"] or 1)
    if chunks & (chunks - 1):
        raise ConfigError(f"grad_reduction=tree: C = global_batch_size / micro_batch_size = {gbs}/{mbs} = {chunks} "
                          f"is not a power of two (the binary tree over the chunks needs one)")
    if chunks % world_size:
        raise ConfigError(f"grad_reduction=tree: C = global_batch_size / micro_batch_size = {chunks} is not a "
                          f"multiple of the world size {world_size} (each rank owns C/W whole chunks)")
    if cfg["amp"] == "fp16":  # the chunk step has no GradScaler (fp16 chunk gradients would underflow)
        raise ConfigError("grad_reduction=tree supports amp=none or amp=bf16, not amp=fp16")
    needs = {"sampler": "global", "no_sync": True, "gradient_as_bucket_view": False, "sync_bn": "none",
             "emulate_ranks": 1, "loss_reduction": "mean", "loss_normalization": "per_rank"}
    for key, value in needs.items():  # the global sampler hands rank r its contiguous chunks; the others
        if cfg[key] != value:        # would mix chunks across ranks or change a chunk's arithmetic with W
            shown = str(value).lower() if isinstance(value, bool) else value
            raise ConfigError(f"grad_reduction=tree needs {key}={shown} (got {key}={cfg[key]})")


def _check_amp(cfg: dict, ranks: int) -> None:
    """amp, clip_bug, overflow_step (chapter 11), and bf16 on this box's GPUs (before anything launches)."""
    bug, clip = cfg["clip_bug"], cfg["grad_clip"]
    if bug != "none" and not clip:
        raise ConfigError(f"clip_bug={bug} needs grad_clip > 0 (it is a bug in where the clipping happens)")
    if bug in ("no_sync_window", "micro_batch") and cfg["grad_accum_steps"] < 2:
        raise ConfigError(f"clip_bug={bug} needs grad_accum_steps >= 2 (with one micro-batch there is no window)")
    if bug == "local_shards" and cfg["wrap"] != "fsdp2":
        raise ConfigError("clip_bug=local_shards needs wrap=fsdp2 (only FSDP2 ranks hold shards of the gradients)")
    if bug == "scaled" and cfg["amp"] != "fp16":
        raise ConfigError("clip_bug=scaled needs amp=fp16 (only GradScaler scales the gradients)")
    if cfg["overflow_step"] is not None and cfg["amp"] != "fp16":
        raise ConfigError("overflow_step needs amp=fp16: without GradScaler an overflowed step is not skipped")
    if cfg["overflow_step"] is not None and cfg["overflow_rank"] >= ranks:
        raise ConfigError(f"overflow_rank={cfg['overflow_rank']} but the run has {ranks} rank(s)")
    if cfg["amp"] == "fp16" and cfg["grad_reduction"] == "tree":
        raise ConfigError("amp=fp16 with grad_reduction=tree: the tree step has no GradScaler; use amp=bf16 or none")
    if cfg["amp"] == "fp16" and cfg["checkpoint_every"]:
        raise ConfigError("amp=fp16 with checkpoint_every: the GradScaler's scale is not checkpointed, so a resume "
                          "would not continue the same run")
    if cfg["amp"] == "bf16" and _on_cuda(cfg["device"]):
        import torch

        caps = [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]
        problem = bf16_refusal(caps)
        if problem:
            raise ConfigError(problem)


def bf16_refusal(capabilities: list[tuple[int, int]]) -> str | None:
    """Why amp=bf16 must not run on GPUs of these compute capabilities, or None. Native bf16 tensor cores start
    at 8.0 (Ampere). Below it torch.cuda.is_bf16_supported() may still say True (torch emulates bf16, e.g. on a
    T4 = 7.5), so the decision reads the capability, never that flag: emulated bf16 is slow and not what the
    chapters measure."""
    low = sorted({c for c in capabilities if tuple(c) < (8, 0)})
    if not low:
        return None
    return (f"amp=bf16 needs native bf16 (compute capability >= 8.0); this box has GPUs of capability "
            f"{', '.join(f'{a}.{b}' for a, b in low)}: use amp=fp16 (torch.amp.GradScaler) or amp=none")


def _check_checkpoints(cfg: dict, world_size: int) -> None:
    """checkpoint_every, checkpoint_format, resume, fault=kill_in_save (chapter 08)."""
    import os

    # a sharded checkpoint (a DCP folder, core/sharded_checkpoint.py) loads into a sharded run only
    if cfg["resume"] not in (None, "auto") and os.path.isfile(os.path.join(cfg["resume"], ".metadata")) \
            and (cfg["wrap"] != "fsdp2" or world_size < 2):
        raise ConfigError(f"resume={cfg['resume']!r} is a sharded (torch.distributed.checkpoint) checkpoint: it "
                          f"loads into wrap=fsdp2 on 2+ ranks; for this run convert it first: python -m "
                          f"torch.distributed.checkpoint.format_utils dcp_to_torch {cfg['resume']} OUT.pt")

    if cfg["resume"] not in (None, "auto") and not os.path.exists(cfg["resume"]):
        raise ConfigError(f"resume={cfg['resume']!r}: no such checkpoint file or run folder (or use auto)")
    if cfg["replay_from"] is not None and not os.path.isdir(os.path.join(cfg["replay_from"], "windows")):
        raise ConfigError(f"replay_from={cfg['replay_from']!r}: no windows/ folder there (a run recorded with "
                          f"window_every > 0)")
    if cfg["checkpoint_format"] == "sharded":
        if world_size < 2:
            raise ConfigError(f"checkpoint_format=sharded needs 2+ ranks (world_size is {world_size}): one process "
                              f"holds the full state and writes checkpoint_format=full")
        wanted = {"wrap": "fsdp2", "checkpoint_style": "lab", "checkpoint_write": "atomic"}
        for key, value in wanted.items():  # what the sharded path is built for; the rest would be ignored silently
            if cfg[key] != value:
                raise ConfigError(f"checkpoint_format=sharded with {key}={cfg[key]}: needs {key}={value} (every "
                                  f"rank writes its shards through torch.distributed.checkpoint, atomically as a "
                                  f"folder, with the lab's resume position)")
        if cfg["fault"] == "kill_in_save":  # measured once (commit 13300bf), left out: its restart cost CI 17 s
            raise ConfigError("checkpoint_format=sharded with fault=kill_in_save: the kill is built for the full "
                              "checkpoint's one file only")
    if cfg["fsdp2_bug"] == "rank0_saves_sharded" and not (cfg["checkpoint_format"] == "sharded"
                                                          and cfg["checkpoint_every"]):
        raise ConfigError("fsdp2_bug=rank0_saves_sharded is a bug of the sharded checkpoint: needs "
                          "checkpoint_format=sharded and checkpoint_every > 0")
    if cfg["fault"] == "kill_in_save" and (not cfg["checkpoint_every"]
                                           or (cfg["fault_step"] + 1) % cfg["checkpoint_every"]):
        raise ConfigError(f"fault=kill_in_save fires in the checkpoint written after step fault_step="
                          f"{cfg['fault_step']}: needs checkpoint_every > 0 dividing fault_step + 1")


def _on_cuda(device: str) -> bool:
    """Whether `device` (auto | cpu | cuda) resolves to CUDA on this machine (torch imported only when asked)."""
    if device != "auto":
        return device == "cuda"
    import torch

    return torch.cuda.is_available()


def to_argv(cfg: dict[str, Any]) -> list[str]:
    """The key=value list that reproduces `cfg` (only the keys given, in order)."""
    return [f"{k}={'' if v is None else v}" for k, v in cfg.items()]
