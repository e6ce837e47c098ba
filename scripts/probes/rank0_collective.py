"""A collective that only rank 0 calls: the article's §5.2 save with its `dist.barrier()` one indent too deep
(chapter 08). Launched by torchrun; the launcher's timeout stops it and names the rank that is stuck.

    LAB_RANK0_BARRIER=inside   if rank == 0: save(); dist.barrier()      <- only rank 0 waits: a hang
    LAB_RANK0_BARRIER=outside  if rank == 0: save()
                               dist.barrier()                            <- every rank waits: correct

Each step all-reduces a loss (as training does) and "saves" on rank 0 at step SAVE_STEP. With the barrier
inside the `if`, rank 0 waits in a barrier no other rank entered, while rank 1 has gone on to the next
step's all-reduce, which rank 0 never reaches: each waits for the other until the process-group timeout
(pg_timeout) or the launcher's timeout. Every rank beats its heartbeat (runfiles.Heartbeat) at every phase,
so the launcher's hang report shows where each one stopped.
"""

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lab_utils.core import config, distenv, runfiles  # noqa: E402

SAVE_STEP = 2


@record
def main() -> None:
    cfg = config.resolve(sys.argv[1:], int(os.environ.get("WORLD_SIZE", "1")))
    where = os.environ.get("LAB_RANK0_BARRIER", "inside")
    if where not in ("inside", "outside"):
        raise ValueError(f"LAB_RANK0_BARRIER={where!r}: use inside or outside")
    env = distenv.setup(cfg)
    out = Path(cfg["out_dir"])
    heart = runfiles.Heartbeat(out, env.rank)
    heart.beat(step=-1, phase="setup")
    for step in range(cfg["steps"]):
        heart.beat(step=step, phase="step start")
        loss = torch.tensor([float(env.rank + step)], device=env.device)
        heart.beat(phase="all-reduce loss")
        dist.all_reduce(loss)
        heart.beat(phase="step done")
        if step == SAVE_STEP:
            if env.rank == 0:
                runfiles.save_atomic({"step": step}, out / "ckpt.pt")
                if where == "inside":
                    dist.barrier()  # the bug: the other ranks never call this barrier
            if where == "outside":
                dist.barrier()
        time.sleep(0.05)
    heart.beat(phase="finished")
    distenv.finish(env)  # teardown, then the process ends here (see distenv.finish)


if __name__ == "__main__":
    main()
    distenv.exit_process(0)
