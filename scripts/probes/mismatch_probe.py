"""Mismatched collectives (chapter 09): what each rank sees when the ranks do not call the same collectives.

LAB_MISMATCH picks the bug, on rank 1 only (rank 0 runs the correct sequence: all_reduce of 4 floats, then
a barrier):
- `shape`: rank 1 all-reduces 5 floats instead of 4 (a tensor built from rank-local data);
- `extra`: rank 1 calls one extra all_reduce first (a `if rank == 1: log(all_reduce(...))` kind of bug);
- `stuck`: rank 1 never reaches the all_reduce (it sleeps: a rank stuck in its data loader, or in a branch
  only it takes), so rank 0 waits in it until pg_timeout;
- `none`: no bug.
Launched with TORCH_DISTRIBUTED_DEBUG=DETAIL, torch wraps the process group and checks every collective's
kind and shapes across the ranks before running it, so the bug becomes an error naming both calls; without
it the ranks wait for each other until the process group's timeout (key pg_timeout). Each rank writes
probe/rank{r}.json when it gets through.
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

MODES = ("none", "shape", "extra", "stuck")


@record
def main(argv: list[str]) -> None:
    mode = os.environ.get("LAB_MISMATCH", "none")
    if mode not in MODES:
        raise SystemExit(f"LAB_MISMATCH={mode!r} is not one of {MODES}")
    cfg = config.resolve(argv, int(os.environ.get("WORLD_SIZE", "1")))
    env = distenv.setup(cfg)
    heart = runfiles.Heartbeat(Path(cfg["out_dir"]), env.rank)  # pid and phase for a hang's report
    heart.beat(step=-1, phase="setup")
    if not env.distributed:
        raise SystemExit("the mismatch probe needs torchrun with nproc >= 2")
    n = 5 if (mode == "shape" and env.rank == 1) else 4
    if mode == "extra" and env.rank == 1:
        dist.all_reduce(torch.ones(1, device=env.device))  # the extra collective: only rank 1 calls it
    if mode == "stuck" and env.rank == 1:
        time.sleep(3600)  # rank 1 is stuck here, before the collective below
    value = torch.full((n,), float(env.rank + 1), device=env.device)
    dist.all_reduce(value)  # the collective every rank calls
    dist.barrier()
    out = Path(cfg["out_dir"]) / "probe"
    out.mkdir(parents=True, exist_ok=True)
    runfiles.write_json({"rank": env.rank, "mode": mode, "sum": value.tolist()}, out / f"rank{env.rank}.json")
    heart.beat(phase="finished")
    distenv.finish(env)  # teardown, then the process ends here (see distenv.finish)


if __name__ == "__main__":
    main(sys.argv[1:])
    distenv.exit_process(0)  # the gloo exit race: see lab_utils/distenv.exit_process
