"""A training script the lab's train.py does not run, made the same bits at any world size with the chunk tree
(lab_utils/core/tree_reduce.py, chapter 13). The lab's own code, written as a user would (not a public copy).

    python tests/outside/tree_outside_example.py out_dir=runs/tree_out_1             # one process
    torchrun --nproc-per-node 2 tests/outside/tree_outside_example.py out_dir=runs/tree_out_2
    ddp-lab compare runs/tree_out_1 runs/tree_out_2                                  # tier 3 (bitwise)

key=value arguments, as `ddp-lab run` / lab_utils.launch.launcher pass them: out_dir, steps (others ignored).

The lines the tree needs are marked `# TREE:`; the recorder's (lab_utils/core/record.py) `# RECORD:`. The rule a
script must keep: every rank gets its contiguous share of the same global batch, in chunks of a fixed size.
"""

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lab_utils.core import record  # noqa: E402  # RECORD:
from lab_utils.core.tree_reduce import TreeAccumulator  # noqa: E402  # TREE:

GLOBAL_BATCH, CHUNK = 16, 2  # C = 8 chunks: 1, 2, 4 or 8 ranks


def main(out_dir: str, steps: int) -> None:
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    g = torch.Generator().manual_seed(0)  # the data: the same tensors on every rank
    x, y = torch.randn(steps * GLOBAL_BATCH, 20, generator=g), torch.randn(steps * GLOBAL_BATCH, 1, generator=g)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    rec = record.Recorder(out_dir, model, {"lr": 1e-2}, global_batch_size=GLOBAL_BATCH)  # RECORD:
    if world > 1:
        model = DDP(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    chunks = GLOBAL_BATCH // CHUNK
    tree = TreeAccumulator(model, chunks)  # TREE: registers the comm hook under DDP
    per_rank = GLOBAL_BATCH // world
    for step in range(steps):
        first = step * GLOBAL_BATCH + rank * per_rank  # this rank's contiguous share of the global batch
        mine = [(x[i:i + CHUNK], y[i:i + CHUNK]) for i in range(first, first + per_rank, CHUNK)]
        loss = tree.accumulate(mine, lambda mb: torch.nn.functional.mse_loss(model(mb[0]), mb[1]))  # TREE:
        optimizer.step()
        # RECORD: the recorder averages the loss over ranks; the tree's loss is the same number on every rank,
        # and the mean of 2 equal numbers is exact (of 4 it may round: 3x is not always a float)
        rec.step(step, loss, model, lr=optimizer.param_groups[0]["lr"])
        optimizer.zero_grad(set_to_none=True)
    rec.close(model)  # RECORD:
    if world > 1:
        dist.destroy_process_group()
    # End here, with main's objects (the DDP model, which holds the gloo group) still alive, and without interpreter
    # finalization, as scripts/train.py does (lab_utils.core.distenv.exit_process). Returning first hung a rank
    # at exit: releasing those objects after destroy_process_group races gloo's run-loop thread (seen here:
    # rank 1 idle at the `main(...)` line for 300 s; the same script shape hung 5 of 64 2-rank launches,
    # tests/outside/multigpu_torchrun_recorded.py's exit_now).
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    keys = dict(a.split("=", 1) for a in sys.argv[1:])
    main(keys["out_dir"], int(keys.get("steps", 10)))
