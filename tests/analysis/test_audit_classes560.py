"""Issue 35: classes of round 560-565's first look (docs/measured/cpu2/audit_heldout_round560.txt), fixed after
it, quiet and loud; each test fails at the first look's code (1b2c537). The round's other false alarms and misses
are left, said in docs/results.md. (A third class, a validation loss over a loader the project shards, was built
and measured over every held-out project: +2 labels for +19 false alarms, so it was taken out again.)"""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"

LOCA = (DDP + "def criterion(out, target, num):\n    return ((out - target) ** 2).sum() / num\n"
        "def main():\n    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
        "    model = DDP(torch.nn.Linear(2, 2))\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    train_loss = torch.zeros(1)\n    for x in [torch.ones(2)] * 4:\n        out = model(x)\n"
        "        with torch.no_grad():\n            num_objects = x.sum()\n            REDUCE\n"
        "        main_loss = criterion(out, x, num_objects)\n        opt.zero_grad()\n        main_loss.backward()\n"
        "        opt.step()\n        train_loss += main_loss\n    dist.all_reduce_multigpu([train_loss])\n"
        "    if dist.get_rank() == 0:\n        print(f'Train loss: {train_loss.item():.3f}')\n"
        "if __name__ == '__main__':\n    main()\n")


def test_a_loss_over_a_count_summed_over_ranks_is_a_step_too_small(tmp_path):
    """LOCA: `num_objects = density_map.sum(); dist.all_reduce_multigpu([num_objects])`, then `main_loss =
    criterion(out, density_map, num_objects)`: each rank's loss is its sum over the global count, and DDP averages
    on top, 1/world_size of the single run's step (sum-loss-unscaled), once for the function. DETR's
    `num_objects / get_world_size()` after the reduction is the fix, and quiet."""
    reduced = LOCA.replace("REDUCE", "dist.all_reduce_multigpu([num_objects])")
    found = _rules(_project(tmp_path / "reduced", {"train.py": reduced}), "sum-loss-unscaled")
    assert [f.line for f in found] == [15]
    fixed = LOCA.replace("REDUCE", "dist.all_reduce(num_objects)\n"
                         "            num_objects = num_objects / dist.get_world_size()")
    assert not _rules(_project(tmp_path / "fixed", {"train.py": fixed}), "sum-loss-unscaled")
    averaged = LOCA.replace("REDUCE", "dist.all_reduce(num_objects, op=dist.ReduceOp.AVG)")
    assert not _rules(_project(tmp_path / "averaged", {"train.py": averaged}), "sum-loss-unscaled")


def test_a_loss_reduced_by_the_old_multigpu_collective_is_reduced(tmp_path):
    """LOCA: `dist.all_reduce_multigpu([train_loss])` before rank 0 prints it: the global sum, not rank 0's own
    (no rank0-local-loss). Without the reduction rank 0 prints its own."""
    fixed = LOCA.replace("REDUCE", "dist.all_reduce(num_objects)\n"
                         "            num_objects = num_objects / dist.get_world_size()")
    assert not _rules(_project(tmp_path / "reduced", {"train.py": fixed}), "rank0-local-loss")
    local = fixed.replace("    dist.all_reduce_multigpu([train_loss])\n", "")
    assert _rules(_project(tmp_path / "local", {"train.py": local}), "rank0-local-loss")
