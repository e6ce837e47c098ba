"""What gradient accumulation costs under DDP, with and without `no_sync` (chapter 06). Launched by torchrun.

Every rank builds two copies of the same DDP model and trains them side by side on the same data stream,
alternating step by step: copy A with no_sync=true (all-reduce on the last micro-batch only), copy B with
no_sync=false (an all-reduce after every micro-batch). Alternating means both see the same machine load,
which matters on a shared box. Each step is the real `step.rank_step` of scripts/train.py.

How the all-reduces are counted: a DDP communication hook that adds one per gradient bucket DDP hands to
it and then does exactly what DDP does by default (torch's `default_hooks.allreduce_hook`: divide by
world_size, all-reduce SUM). The hook is called once per bucket per synchronising backward, on any
backend, so it counts what DDP *launched* — not what a profiler happened to record under a backend-specific
event name. Both copies carry the same hook, so its (microsecond) cost is in both timings.

Each rank writes runs/NAME/probe/rank{r}.json: per setting and step, the all-reduce calls, the buckets,
the step's wall time, and the size and epoch of every micro-batch it drew (read by lab_utils.lessons.ch06_accumulation).
"""

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.elastic.multiprocessing.errors import record

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lab_utils.core import config, ddp, distenv, runfiles, samplers, workloads  # noqa: E402
from lab_utils.core.step import rank_step  # noqa: E402

SETTINGS = (True, False)  # no_sync on, off


def counting_allreduce(state: dict, bucket):
    """DDP's default all-reduce, counted: one call per bucket per synchronising backward."""
    state["calls"] += 1
    state["buckets"].add(bucket.index())
    return default_hooks.allreduce_hook(None, bucket)  # None: the default (WORLD) process group


class CountingStream:
    """The loader iterator, recording each micro-batch's sample count and epochs (visit id // n)."""

    def __init__(self, it, n: int):
        self.it, self.n, self.drawn = it, n, []

    def __next__(self):
        batch = next(self.it)
        self.drawn.append({"samples": len(batch["key"]),
                           "epochs": sorted({int(k) // self.n for k in batch["key"]})})
        return batch


def make_copy(cfg: dict, env, no_sync: bool) -> dict:
    torch.manual_seed(cfg["seed"])
    wl = workloads.build(cfg)
    model = ddp.wrap(wl.model.to(env.device), cfg, env.device)
    state = {"calls": 0, "buckets": set()}
    model.register_comm_hook(state, counting_allreduce)
    params = [p for p in model.parameters() if p.requires_grad]
    stream = CountingStream(iter(samplers.make_loader(wl.dataset, env.rank, env.world_size, cfg)),
                            len(wl.dataset))
    return {"cfg": dict(cfg, no_sync=no_sync), "wl": wl, "model": model, "state": state, "stream": stream,
            "optimizer": torch.optim.AdamW(params, lr=cfg["lr"], betas=(0.9, 0.95)), "steps": []}


def timed_step(c: dict, env) -> None:
    calls_before, drawn_before = c["state"]["calls"], len(c["stream"].drawn)
    dist.barrier()  # start together, so one rank's late start is not timed as communication
    t0 = time.perf_counter()
    c["model"].train()
    c["optimizer"].zero_grad(set_to_none=True)
    rank_step(c["wl"], c["model"], c["stream"], c["cfg"], env.device, env.world_size)
    c["optimizer"].step()
    if env.device.type == "cuda":
        torch.cuda.synchronize(env.device)
    c["steps"].append({"seconds": time.perf_counter() - t0,
                       "allreduce_calls": c["state"]["calls"] - calls_before,
                       "micro_batches": c["stream"].drawn[drawn_before:]})


@record
def main(argv: list[str]) -> None:
    cfg = config.resolve(argv, int(os.environ.get("WORLD_SIZE", "1")))
    env = distenv.setup(cfg)
    heart = runfiles.Heartbeat(Path(cfg["out_dir"]), env.rank)  # pid and phase for a hang's report
    heart.beat(step=-1, phase="setup")
    if not env.distributed:
        raise SystemExit("the accumulation probe needs torchrun with nproc >= 2")
    copies = {no_sync: make_copy(cfg, env, no_sync) for no_sync in SETTINGS}
    for _ in range(cfg["steps"]):
        for no_sync in SETTINGS:
            timed_step(copies[no_sync], env)
    out = Path(cfg["out_dir"]) / "probe"
    out.mkdir(parents=True, exist_ok=True)
    runfiles.write_json({
        "rank": env.rank, "world_size": env.world_size, "backend": env.backend,
        "grad_accum_steps": cfg["grad_accum_steps"], "micro_batch_size": cfg["micro_batch_size"],
        "global_batch_size": cfg["global_batch_size"], "n_samples": len(copies[True]["wl"].dataset),
        "grad_bytes": sum(p.numel() * p.element_size() for p in copies[True]["model"].parameters()),
        "settings": {f"no_sync={str(k).lower()}": {"buckets": len(c["state"]["buckets"]), "steps": c["steps"]}
                     for k, c in copies.items()},
    }, out / f"rank{env.rank}.json")
    heart.beat(phase="finished")
    distenv.finish(env)  # on success only, as train.py; ends the process here (see distenv.finish)


if __name__ == "__main__":
    main(sys.argv[1:])
    distenv.exit_process(0)  # skip interpreter finalization (the gloo exit race; see distenv.exit_process)
