"""Probe for the gloo exit crash (chapter 09 / bench_launch.py): a naive DDP script, with one thing varied.

    LAB_PROBE_EXIT=naive     no teardown, ordinary interpreter exit (what most DDP scripts do)
    LAB_PROBE_EXIT=teardown  barrier + destroy_process_group, ordinary exit
    LAB_PROBE_EXIT=lab       barrier + destroy_process_group, then distenv.exit_process (the lab's exit)

The naive form aborted at exit in ~1 of 10 launches here ("terminate called without an active exception");
see lab_utils/distenv.exit_process for the core dump's story. Accepts the training keys (out_dir=...).
"""

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lab_utils.core import distenv  # noqa: E402

mode = os.environ.get("LAB_PROBE_EXIT", "naive")
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(42 + rank)
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
opt = torch.optim.AdamW(model.parameters(), 1e-3)
data = TensorDataset(torch.randn(512, 32), torch.randn(512, 8))
for x, y in DataLoader(data, batch_size=16, sampler=DistributedSampler(data)):
    loss = (model(x) - y).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"rank {rank} done ({mode})", flush=True)
if mode in ("teardown", "lab"):
    dist.barrier()
    dist.destroy_process_group()
if mode == "lab":
    distenv.exit_process(0)
