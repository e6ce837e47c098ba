"""The one training script of DDP Parity Lab.

    python scripts/train.py key=value ...                          # one process
    torchrun --nproc-per-node 2 scripts/train.py key=value ...     # DDP, same keys, same results

Chapters change keys, never this loop (keys and defaults: lab_utils/config.py). Lines that exist only
because of DDP are marked `# DDP:` so a chapter can show the port as a diff. Rank 0 writes, in out_dir:
config.json (resolved keys + environment), metrics.jsonl (one line per optimizer step, loss averaged over
ALL ranks, parameter fingerprint), model.pt (final weights without the `module.` prefix) and result.json.
Every rank keeps progress/rank{r}.json up to date: the launcher reads it to name a hung rank.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from contextlib import nullcontext
from pathlib import Path

import torch
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a clone without installing
from lab_utils import config as config_mod  # noqa: E402
from lab_utils import distenv, metrics, samplers, workloads  # noqa: E402


class Heartbeat:
    """progress/rank{r}.json: the step and phase this rank is in. Written by rename, so never half-read."""

    def __init__(self, out_dir: Path, rank: int):
        self.path = out_dir / "progress" / f"rank{rank}.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.state = {"rank": rank, "pid": os.getpid()}

    def beat(self, **fields) -> None:
        self.state.update(fields, time=time.time())
        metrics.write_json(self.state, self.path)


def inject_fault(cfg: dict, rank: int, step: int) -> None:
    """fault=crash|hang|kill on `fault_rank` at the start of `fault_step`: the launcher tests' failures."""
    if cfg["fault"] == "none" or rank != cfg["fault_rank"] or step != cfg["fault_step"]:
        return
    if cfg["fault"] == "crash":
        raise RuntimeError(f"injected fault: crash on rank {rank} at step {step}")
    if cfg["fault"] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    while True:  # hang: the other ranks block in the next all-reduce, as with a real deadlock
        time.sleep(3600)


def build_optimizer(model: torch.nn.Module, cfg: dict) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg["optimizer"] == "adamw":
        return torch.optim.AdamW(params, lr=cfg["lr"], betas=(0.9, 0.95), weight_decay=cfg["weight_decay"])
    if cfg["optimizer"] == "adam":  # note: Adam's weight_decay is L2 in the gradient, not decoupled (§7.3)
        return torch.optim.Adam(params, lr=cfg["lr"], betas=(0.9, 0.95))
    return torch.optim.SGD(params, lr=cfg["lr"], momentum=0.9, weight_decay=cfg["weight_decay"])


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def micro_backward(wl, model, batch: dict, cfg: dict, world_size: int) -> torch.Tensor:
    """Forward + backward of one micro-batch; returns its detached per-element mean loss for the log.

    mean: each micro-batch's mean is divided by grad_accum_steps, and DDP averages over ranks, so the
    gradient is the mean over the global batch — as in the single run. sum: DDP still *averages* over ranks
    (it divides by world_size before its SUM all-reduce), so a sum loss needs x world_size (§3.2).
    """
    with torch.autocast(batch["x"].device.type, dtype=torch.bfloat16, enabled=cfg["amp"] == "bf16"):
        loss = wl.loss_fn(model, batch, reduction=cfg["loss_reduction"], seed=cfg["seed"])
    if cfg["loss_reduction"] == "mean":
        (loss / cfg["grad_accum_steps"]).backward()
        return loss.detach()
    scale = world_size if cfg["sum_loss_fix"] else 1  # DDP: undo DDP's division by world_size
    (loss * scale).backward()
    return loss.detach() / batch["y"].numel()


def rank_step(wl, model, loader_iter, cfg: dict, env, world_size: int, before_forward=None) -> torch.Tensor:
    """One rank's share of a step: grad_accum_steps micro-batches, gradients accumulated locally.

    With no_sync, DDP's all-reduce runs only in the last micro-batch's backward (article §3.3 omits this:
    without it every micro-batch pays a full all-reduce, and the sum is formed in another float order).
    """
    acc = cfg["grad_accum_steps"]
    loss_sum = torch.zeros((), device=env.device)
    for a in range(acc):
        batch = to_device(next(loader_iter), env.device)
        last = a == acc - 1
        if before_forward is not None:
            before_forward(a, sync=last or not cfg["no_sync"])
        skip_sync = isinstance(model, DDP) and cfg["no_sync"] and not last
        with model.no_sync() if skip_sync else nullcontext():  # DDP: no all-reduce before the last one
            loss_sum += micro_backward(wl, model, batch, cfg, world_size) / acc
    return loss_sum


def emulated_step(wl, model, loader_iters: list, cfg: dict, env, rank_buffers: list) -> torch.Tensor:
    """emulate_ranks=R in one process: each "rank" computes its micro-batches into fresh gradients, then
    they are reduced exactly as DDP does — each divided by R, summed in rank order. For R=2 a sum of two
    operands has one possible order, so this matches a real 2-rank run bit for bit (chapter 01).

    Buffers (BatchNorm running stats) follow DDP too: each rank keeps its own (`rank_buffers[r]`), and with
    broadcast_buffers every synchronising forward first takes rank 0's buffers as they were at that point.
    """
    R = len(loader_iters)
    params = [p for p in model.parameters() if p.requires_grad]
    buffers = list(model.buffers())
    rank0_at_sync: dict[int, list] = {}

    def load(states):
        with torch.no_grad():
            for b, s in zip(buffers, states, strict=True):
                b.copy_(s)

    grads, losses = [], []
    for r, it in enumerate(loader_iters):
        def before_forward(a, sync, r=r):  # DDP's _sync_buffers: broadcast from rank 0 before the forward
            if sync and cfg["broadcast_buffers"]:
                if r == 0:
                    rank0_at_sync[a] = [b.clone() for b in buffers]
                else:
                    load(rank0_at_sync[a])

        for p in params:
            p.grad = None
        load(rank_buffers[r])
        losses.append(rank_step(wl, model, it, cfg, env, world_size=R, before_forward=before_forward))
        rank_buffers[r] = [b.clone() for b in buffers]
        grads.append([p.grad if p.grad is not None else torch.zeros_like(p) for p in params])
    load(rank_buffers[0])  # the model this process saves is rank 0's, as in DDP
    for i, p in enumerate(params):
        total = grads[0][i] / R
        for r in range(1, R):
            total = total + grads[r][i] / R
        p.grad = total
    loss = losses[0]
    for r in range(1, R):
        loss = loss + losses[r]
    return loss / R  # what all_reduce_mean gives: SUM over ranks, then / world_size


def describe(cfg: dict, env) -> dict:
    return {
        "config": cfg, "world_size": env.world_size, "backend": env.backend, "device": str(env.device),
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
        "env": {k: v for k, v in os.environ.items()
                if k.startswith(("NCCL_", "TORCH_", "OMP_", "MASTER_", "CUBLAS_")) or k == "WORLD_SIZE"},
    }


def train(cfg: dict, env: distenv.DistEnv) -> None:
    out = Path(cfg["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    heart = Heartbeat(out, env.rank)
    heart.beat(step=-1, phase="setup")

    # Seeds (§2.1-2.2). lab: one init seed on every rank; data order comes from data_seed via the samplers,
    # per-sample randomness is keyed by the sample. article: set_seed(42 + rank) for everything.
    torch.manual_seed(cfg["seed"] + (env.rank if cfg["seed_mode"] == "article" else 0))
    wl = workloads.build(cfg)
    model = wl.model.to(env.device)
    heart.beat(init_param_hash=metrics.fingerprint(model)[0])
    if env.distributed:  # DDP: wrapping broadcasts rank 0's parameters and buffers to every rank
        model = DDP(model, device_ids=[env.device.index] if env.device.type == "cuda" else None,
                    find_unused_parameters=cfg["find_unused_parameters"],
                    broadcast_buffers=cfg["broadcast_buffers"],
                    gradient_as_bucket_view=cfg["gradient_as_bucket_view"])
        heart.beat(param_hash_after_wrap=metrics.fingerprint(model)[0])
    optimizer = build_optimizer(model, cfg)

    # Which data this process computes: its own rank's stream, or all R emulated ranks' streams.
    R = cfg["emulate_ranks"]
    layout_ranks = [env.rank] if env.distributed else list(range(R))
    layout_world = env.world_size if env.distributed else R
    loaders = [iter(samplers.make_loader(wl.dataset, r, layout_world, cfg)) for r in layout_ranks]
    rank_buffers = [[b.detach().clone() for b in model.buffers()] for _ in range(R)]  # emulated ranks' own

    writer = metrics.MetricsWriter(out / "metrics.jsonl") if env.is_main else None
    if env.is_main:
        metrics.write_json(describe(cfg, env), out / "config.json")
        print(f"[train] world_size={env.world_size} backend={env.backend} device={env.device} "
              f"global_batch_size={cfg['global_batch_size']} micro_batch_size={cfg['micro_batch_size']} "
              f"grad_accum_steps={cfg['grad_accum_steps']} emulate_ranks={R}", flush=True)
    params = [p for p in model.parameters() if p.requires_grad]
    t0 = time.time()
    for step in range(cfg["steps"]):
        heart.beat(step=step, phase="step start")
        inject_fault(cfg, env.rank, step)
        heart.beat(phase="forward/backward")  # DDP: the gradient all-reduce runs inside backward
        model.train()
        optimizer.zero_grad(set_to_none=True)
        if R > 1:
            loss = emulated_step(wl, model, loaders, cfg, env, rank_buffers)
        else:
            local = rank_step(wl, model, loaders[0], cfg, env, env.world_size)
            heart.beat(phase="all-reduce loss")
            loss = distenv.all_reduce_mean(local, env)  # DDP: log the loss of ALL ranks, not rank 0's
        # Total grad norm after the all-reduce (identical on every rank); max_norm=inf leaves grads as is.
        max_norm = cfg["grad_clip"] if cfg["grad_clip"] > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        optimizer.step()
        heart.beat(phase="step done")
        if writer:
            # .item() waits for the device: fine at this size, and the log needs real numbers (chapter 08).
            param_hash, param_sum = metrics.fingerprint(model) if cfg["fingerprint"] else (None, None)
            loss_value = loss.item()  # one device sync per step, on rank 0 only
            writer.write({"step": step, "loss": loss_value, "lr": optimizer.param_groups[0]["lr"],
                          "grad_norm": grad_norm.item(), "samples": (step + 1) * cfg["global_batch_size"],
                          "param_hash": param_hash, "param_sum": param_sum,
                          "elapsed": round(time.time() - t0, 4)})
            if step % cfg["log_every"] == 0 or step == cfg["steps"] - 1:
                print(f"[train] step {step + 1}/{cfg['steps']} loss {loss_value:.6f}", flush=True)

    if env.is_main:  # DDP: only rank 0 writes; .module drops the `module.` prefix (§5.2)
        state = {k: v.detach().cpu() for k, v in metrics.unwrap(model).state_dict().items()}
        metrics.save_atomic(state, out / "model.pt")
        metrics.write_json({"steps": cfg["steps"], "final_loss": loss_value, "seconds": time.time() - t0},
                           out / "result.json")
        writer.close()
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
    # DDP: teardown only on success. A failing rank must not enter the barrier: its peers are blocked in a
    # different collective, so both would wait forever; torchrun stops the peers once this rank exits.
    distenv.teardown(env)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except SystemExit as e:
        distenv.exit_process(e.code if isinstance(e.code, int) else 1)
    except BaseException:
        traceback.print_exc()  # @record has written the error file; this copy goes to the rank's log
        distenv.exit_process(1)
    distenv.exit_process(0)  # skip interpreter finalization: see exit_process for the gloo exit crash
