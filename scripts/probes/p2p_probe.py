"""A tiny NCCL send/recv between GPU 0 and GPU 1: `ddp-lab preflight`'s P2P check (chapter 11, docs/workshop.md).

On some PCIe boxes (two T4s on a hosted notebook among them) NCCL's peer-to-peer path hangs instead of failing.
Rank 0 sends 1 MiB to rank 1 and rank 1 sends it back, under the process group's timeout (pg_timeout): a hang
becomes an error in seconds, and the launcher's own timeout stops what is left. Rank 0 writes p2p.json.
"""

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lab_utils.core import config, distenv, runfiles  # noqa: E402

cfg = config.resolve(sys.argv[1:], int(os.environ.get("WORLD_SIZE", "1")))
env = distenv.setup(cfg)
try:
    n = 1 << 18  # 1 MiB of float32
    t0 = time.time()
    if env.rank == 0:
        sent = torch.arange(n, dtype=torch.float32, device=env.device)
        dist.send(sent, dst=1)
        back = torch.empty_like(sent)
        dist.recv(back, src=1)
        ok = torch.equal(sent, back)
    elif env.rank == 1:
        got = torch.empty(n, dtype=torch.float32, device=env.device)
        dist.recv(got, src=0)
        dist.send(got, dst=0)
    if env.device.type == "cuda":
        torch.cuda.synchronize(env.device)
    if env.is_main:
        Path(cfg["out_dir"]).mkdir(parents=True, exist_ok=True)
        runfiles.write_json({"ok": bool(ok), "backend": env.backend, "seconds": round(time.time() - t0, 3),
                             "nccl_p2p_disable": os.environ.get("NCCL_P2P_DISABLE")},
                            Path(cfg["out_dir"]) / "p2p.json")
finally:
    distenv.teardown(env)
distenv.exit_process(0)
