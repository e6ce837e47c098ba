"""The one training script of DDP Parity Lab.

    python scripts/train.py key=value ...                          # one process
    torchrun --nproc-per-node 2 scripts/train.py key=value ...     # DDP, same keys, same results

Chapters change keys, never this loop (keys and defaults: lab_utils/core/config.py). Lines that exist only
because of DDP are marked `# DDP:` (`# DDP guard:` on a condition one process does not need), so chapter 00
can show the port as a diff generated from this file (lab_utils/lessons/ch00_preflight.py). The mechanics live one hop
away: lab_utils/core/step.py (one rank's step), emulate.py (the tier-3 reference), ddp.py (the wrap),
checkpoint.py (what is saved). What this script writes is the run-folder contract in lab_utils/core/runfiles.py;
every rank keeps progress/rank{r}.json up to date so the launcher can name a hung rank.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path

import torch
from torch.distributed.elastic.multiprocessing.errors import record  # DDP: torchrun's per-rank error file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a clone without installing
from lab_utils.core import checkpoint, ddp, distenv, fsdp2, resume, runfiles, samplers, steplog, sync_bn, workloads  # noqa: E402
from lab_utils.core import config as config_mod  # noqa: E402
from lab_utils.core import windows as window_states  # noqa: E402
from lab_utils.core.emulate import emulated_step  # noqa: E402
from lab_utils.core.faults import inject_fault, kills_in_save, overflow_factors  # noqa: E402
from lab_utils.core.schedule import lr_at  # noqa: E402
from lab_utils.core.step import rank_step, tree_step  # noqa: E402
from lab_utils.core.tree_reduce import TreeAccumulator  # noqa: E402


def build_optimizer(model: torch.nn.Module, cfg: dict) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    # fused_optimizer: one kernel for the whole update instead of ~a dozen per parameter group (GPU speed;
    # other last bits than the default, so compare runs that both set it or both do not)
    fused = {"fused": True} if cfg["fused_optimizer"] else {}
    if cfg["optimizer"] == "adamw":
        return torch.optim.AdamW(params, lr=cfg["lr"], betas=(0.9, 0.95), weight_decay=cfg["weight_decay"], **fused)
    if cfg["optimizer"] == "adam":  # note: Adam's weight_decay is L2 in the gradient, not decoupled (§7.3)
        return torch.optim.Adam(params, lr=cfg["lr"], betas=(0.9, 0.95), **fused)
    return torch.optim.SGD(params, lr=cfg["lr"], momentum=0.9, weight_decay=cfg["weight_decay"], **fused)


def describe(cfg: dict, env, dataset_size: int) -> dict:
    return {
        "format_version": runfiles.FORMAT_VERSION, "config": cfg, "dataset_size": dataset_size,
        "world_size": env.world_size, "backend": env.backend, "device": str(env.device),
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
        "env": {k: v for k, v in os.environ.items()
                if k.startswith(("NCCL_", "TORCH_", "OMP_", "MASTER_", "CUBLAS_")) or k == "WORLD_SIZE"},
    }


def train(cfg: dict, env: distenv.DistEnv) -> None:
    out = Path(cfg["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    heart = runfiles.Heartbeat(out, env.rank, step_beats=os.environ.get("LAB_STEP_HEARTBEATS") != "off")
    # Where torchrun placed this rank, as its agent set it (chapter 09 draws the launch from these)
    heart.beat(step=-1, phase="setup", torchrun={k: os.environ.get(k) for k in (
        "RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")})

    # Seeds (§2.1-2.2). lab: one init seed on every rank; data order comes from data_seed via the samplers,
    # per-sample randomness is keyed by the sample. article: set_seed(42 + rank) for everything.
    torch.manual_seed(cfg["seed"] + (env.rank if cfg["seed_mode"] == "article" else 0))
    wl = workloads.build(cfg)
    model = wl.model.to(env.device)
    # Resume (chapter 08): every rank loads the same checkpoint onto its own device. No RNG state: with
    # seed_mode=lab nothing in training draws from a generator (randomness is keyed by sample, chapter 04).
    ckpt_path = resume.find(cfg["resume"], out)
    state = checkpoint.load_checkpoint(ckpt_path, env.device) if ckpt_path else None
    start = resume.step_of(ckpt_path, state) if state else 0
    if state:
        resume.check(state, cfg, ckpt_path)
        # before the wrap: DDP then broadcasts what rank 0 loaded (checkpoint_format=sharded: after the wrap)
        checkpoint.load_model_state(model, state, ckpt_path, sharded_run=env.distributed and cfg["wrap"] == "fsdp2")
    if cfg["nudge_init"] and not state:  # a float twin (parity --noise): the last bits of the initial weights
        workloads.nudge(model, cfg["nudge_init"])
    heart.beat(init_param_hash=runfiles.fingerprint(model))
    if cfg["compile"]:  # in place: the module keeps its type and state_dict keys; DDP then calls the compiled one
        model.compile()
    # BUG (fsdp2_bug=optimizer_before_wrap): an optimizer over the parameters fully_shard is about to replace
    early = build_optimizer(model, cfg) if cfg["fsdp2_bug"] == "optimizer_before_wrap" else None
    if env.distributed:  # DDP: wrapping broadcasts rank 0's parameters and buffers to every rank
        # (wrap=fsdp2, core/fsdp2.py: each rank keeps a shard of every weight instead, and nothing is broadcast)
        model = ddp.wrap(model, cfg, env.device) if cfg["wrap"] == "ddp" else fsdp2.wrap(model, cfg, env.device)
        heart.beat(param_hash_after_wrap=runfiles.fingerprint(model))
    optimizer = early or build_optimizer(model, cfg)
    if state:  # (FSDP2: the full state is sharded into this rank's part, or dcp.load reads this rank's shards)
        checkpoint.restore_after_wrap(model, optimizer, state)
    # grad_reduction=tree (chapter 13): C chunks per global batch in one binary tree (the comm hook under DDP)
    chunks = cfg["global_batch_size"] // cfg["micro_batch_size"]
    tree = TreeAccumulator(model, chunks, comm=cfg["tree_comm"]) if cfg["grad_reduction"] == "tree" else None

    # amp=fp16 (chapter 11): GradScaler multiplies the loss so that small fp16 gradients do not flush to 0, and
    # skips a step whose gradients hold inf/NaN. It checks the all-reduced gradients, so every rank skips alike.
    scaler = torch.amp.GradScaler(env.device.type) if cfg["amp"] == "fp16" else None
    skipped: list[int] = []  # the steps GradScaler skipped on this rank (its heartbeat records them)
    # replay_from=B (compare/doctor): this program, set to B's window state at each window start (core/windows.py)
    replay = cfg["replay_from"] and window_states.Replay(cfg["replay_from"], out, env.device, cfg["nudge_init"])

    # Which data this process computes: its own rank's stream, or all R emulated ranks' streams.
    R = cfg["emulate_ranks"]
    layout_ranks = [env.rank] if env.distributed else list(range(R))
    layout_world = env.world_size if env.distributed else R
    loaders = [iter(samplers.make_loader(wl.dataset, r, layout_world, cfg)) for r in layout_ranks]
    rank_buffers = [[b.detach().clone() for b in model.buffers()] for _ in range(R)]  # emulated ranks' own
    if state:  # the samplers are deterministic streams: skip what the checkpointed steps consumed
        resume.fast_forward(loaders, resume.skip_micro_batches(state, start, cfg, len(wl.dataset), layout_world))
        if state.get("rank_buffers") and len(state["rank_buffers"]) == R:
            rank_buffers = state["rank_buffers"]

    log = None
    if env.is_main:
        runfiles.write_json(describe(cfg, env, len(wl.dataset)), out / runfiles.CONFIG)
        log = steplog.StepLog(out / runfiles.METRICS, cfg["log_sync_every"], cfg["log_every"], cfg["steps"],
                              kept=resume.kept_metrics(ckpt_path, start, redone_to=out) if state else [],
                              attempt=resume.attempt())
        print(f"[train] world_size={env.world_size} backend={env.backend} device={env.device} "
              f"global_batch_size={cfg['global_batch_size']} micro_batch_size={cfg['micro_batch_size']} "
              f"grad_accum_steps={cfg['grad_accum_steps']} emulate_ranks={R}"
              + (f" resumed from {ckpt_path} (step {start})" if state else ""), flush=True)
    params = [p for p in model.parameters() if p.requires_grad]
    t0 = time.time()
    for step in range(start, cfg["steps"]):
        heart.beat(step=step, phase="step start")
        inject_fault(cfg, env.rank, step)  # fault= (core/faults.py): the launcher's failures, for real
        if replay:
            replay.snap(step, model, optimizer, scaler, rank_buffers)
        for group in optimizer.param_groups:  # the schedule is a function of the step (core/schedule.py)
            group["lr"] = lr_at(cfg, step, start if state else None)
        heart.beat(phase="forward/backward")  # under DDP the gradient all-reduce runs inside backward
        model.train()
        optimizer.zero_grad(set_to_none=True)
        local_loss = None
        factors = overflow_factors(cfg, step, max(R, env.world_size))  # overflow_step (chapter 11)
        if tree is not None:  # each chunk's gradient apart, one tree over all C: the same bits at any W
            loss = tree_step(wl, model, loaders[0], cfg, env.device, tree)
        elif R > 1:
            loss = emulated_step(wl, model, loaders, cfg, env.device, rank_buffers, scaler, factors)
        else:
            local_loss = rank_step(wl, model, loaders[0], cfg, env.device, env.world_size, scaler=scaler,
                                   loss_factor=factors[env.rank])
            heart.beat(phase="all-reduce loss")
            loss = distenv.all_reduce_mean(local_loss, env)  # DDP: log the loss of ALL ranks, not rank 0's
        # Clip once per step, after the all-reduce (identical on every rank), on unscaled gradients: under
        # amp=fp16 scaler.unscale_ comes first (clip_bug=scaled leaves it out). max_norm=inf only measures the
        # norm (also for the clip_bugs that already clipped inside rank_step).
        if scaler is not None and cfg["clip_bug"] != "scaled":
            scaler.unscale_(optimizer)
        clipped_inside = cfg["clip_bug"] in ("no_sync_window", "micro_batch")
        max_norm = cfg["grad_clip"] if cfg["grad_clip"] > 0 and not clipped_inside else float("inf")
        grad_norm = fsdp2.clip_grad_norm_(params, max_norm, ordered=cfg["grad_reduction"] in ("ordered", "tree"),
                                          local_bug=cfg["clip_bug"] == "local_shards")
        amp_log = {}
        if scaler is None:
            optimizer.step()
        else:  # one host sync per step for the scale: amp=fp16 only
            scale = scaler.get_scale()
            scaler.step(optimizer)  # no optimizer.step() when the unscaled gradients hold inf/NaN
            scaler.update()  # a skipped step halves the scale
            amp_log = {"loss_scale": scale, "skipped": scaler.get_scale() < scale}
            skipped += [step] if amp_log["skipped"] else []
        heart.beat(phase="step done")
        # env.sharded (FSDP2): the fingerprint reads the full weights, a collective every rank joins
        param_hash = runfiles.pending_fingerprint(model) if cfg["fingerprint"] and (log or env.sharded) else None
        if log:  # numbers stay on the device; StepLog copies them to the host every log_sync_every steps
            log.add(step, {"loss": loss, "local_loss": local_loss, "grad_norm": grad_norm},
                    lr=optimizer.param_groups[0]["lr"], samples=(step + 1) * cfg["global_batch_size"],
                    param_hash=param_hash, **amp_log)
        if cfg["checkpoint_every"] and (step + 1) % cfg["checkpoint_every"] == 0:
            if env.is_main:  # DDP guard: rank 0 keeps the log
                log.flush()  # the records up to the checkpoint reach the disk with it: a resume keeps them
            if cfg["checkpoint_format"] == "sharded":  # FSDP2: every rank writes its own shards (dcp.save)
                checkpoint.save_training_checkpoint(model, optimizer, out, step + 1, cfg, rank_buffers, env.is_main)
            else:  # env.sharded (FSDP2): every rank gathers the full state (a collective), rank 0 writes it
                ckpt = checkpoint.training_state(model, optimizer, step + 1, cfg, len(wl.dataset), rank_buffers,
                                                 style=cfg["checkpoint_style"]) if env.is_main or env.sharded else None
                if env.is_main:  # DDP guard: one writer, the .module's state (§5.2); the others wait below
                    checkpoint.write_checkpoint(ckpt, checkpoint.checkpoint_path(out, step + 1),
                                                cfg["checkpoint_write"], die_midway=kills_in_save(cfg, step))
            if env.distributed:  # DDP: nobody starts step k+1 before checkpoint k is on disk
                torch.distributed.barrier()
        if window_states.due(cfg, step + 1):  # compare/doctor judge a port window by window from these
            if env.is_main or env.sharded:  # DDP guard: one writer (FSDP2: every rank gathers, rank 0 writes)
                window_states.save(out, step + 1, model, optimizer, cfg, len(wl.dataset), rank_buffers, scaler,
                                   writer=env.is_main)

    heart.beat(buffer_hash=runfiles.buffer_fingerprint(model), running_stats=sync_bn.running_stats(model),
               skipped_steps=skipped, state_bytes=fsdp2.local_state_bytes(model, optimizer),
               replica_hash=runfiles.replica_fingerprint(model))
    # env.sharded (FSDP2): gathering the full weights and the probe's forward are collectives every rank joins
    final = checkpoint.cpu_state(model) if env.sharded else None
    probe = workloads.probe_outputs(ddp.unwrap(model), wl.dataset, env.device) if env.is_main or env.sharded \
        else None
    if env.is_main:  # DDP guard: only rank 0 writes; .module drops the `module.` prefix (§5.2)
        log.close()
        checkpoint.save_final(model, out, probe, state=final)
        runfiles.write_json({"steps": cfg["steps"], "final_loss": log.last["loss"] if log.last else None,
                             "seconds": time.time() - t0, "resumed_from": start if state else None,
                             "attempt": resume.attempt()}, out / runfiles.RESULT)
    heart.beat(phase="finished")


@record  # DDP: a crash writes this rank's traceback to torchrun's error file; the launcher shows it
def main(argv: list[str]) -> None:
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        cfg = config_mod.resolve(argv, world_size)
    except config_mod.ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    env = distenv.setup(cfg)
    train(cfg, env)
    # Teardown only on success. A failing rank must not enter the barrier: its peers are blocked in a
    # different collective, so both would wait forever; torchrun stops the peers once this rank exits.
    distenv.teardown(env)  # DDP: barrier, then leave the process group


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except SystemExit as e:
        distenv.exit_process(e.code if isinstance(e.code, int) else 1)
    except BaseException:
        traceback.print_exc()  # @record has written the error file; this copy goes to the rank's log
        distenv.exit_process(1)
    distenv.exit_process(0)  # skip interpreter finalization: see exit_process for the gloo exit crash
