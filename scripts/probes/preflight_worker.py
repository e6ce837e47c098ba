"""A real all-reduce across the launched ranks: the last step of `ddp-lab preflight` (chapter 00).

Each rank contributes rank + 1; every rank must end with world_size * (world_size + 1) / 2. Rank 0 writes
preflight.json with what each rank saw, the backend and the device, so "did DDP really run?" has an answer
made of evidence rather than log lines (torchrun prints no "Initializing process group" line, §6.3).
"""

import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lab_utils.core import config, distenv, runfiles  # noqa: E402

cfg = config.resolve(sys.argv[1:], int(os.environ.get("WORLD_SIZE", "1")))
env = distenv.setup(cfg)
try:
    value = torch.tensor([float(env.rank + 1)], device=env.device)
    if env.distributed:
        dist.all_reduce(value)
        seen = [None] * env.world_size
        dist.all_gather_object(seen, {"rank": env.rank, "pid": os.getpid(), "host": socket.gethostname(),
                                      "device": str(env.device), "sum": value.item()})
    else:
        seen = [{"rank": 0, "pid": os.getpid(), "host": socket.gethostname(), "device": str(env.device),
                 "sum": value.item()}]
    expected = env.world_size * (env.world_size + 1) / 2
    if env.is_main:
        Path(cfg["out_dir"]).mkdir(parents=True, exist_ok=True)
        runfiles.write_json({"backend": env.backend, "world_size": env.world_size, "expected": expected,
                            "ranks": seen, "ok": all(s["sum"] == expected for s in seen)},
                           Path(cfg["out_dir"]) / "preflight.json")
        print(f"[preflight] all-reduce over {env.world_size} ranks ({env.backend}): {value.item()} "
              f"(expected {expected})", flush=True)
finally:
    distenv.teardown(env)
distenv.exit_process(0)  # the gloo exit race: see lab_utils/distenv.exit_process
