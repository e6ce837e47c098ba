"""Issue 35: classes of round 560-565's first look (docs/measured/cpu2/audit_heldout_round560.txt), fixed after
it, quiet and loud; each test fails at the first look's code (1b2c537). The round's other false alarms and misses
are left, said in docs/results.md."""

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


def test_a_validation_loss_over_a_sharded_loader_is_rank_0s_shard(tmp_path):
    """Context-Aware-Consistency: the data class builds `DistributedSampler(self.dataset, shuffle=shuffle)` for
    either split; `_valid_epoch` runs under no_grad over `tbar = tqdm(self.val_loader)` and rank 0 writes
    `total_loss_val.average` to TensorBoard: half the set's loss (rank0-local-loss). A validation loader built
    without a sampler covers the whole set on every rank."""
    data = ("import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\nclass Loader(DataLoader):\n"
            "    def __init__(self, dataset, shuffle):\n"
            "        super().__init__(dataset, batch_size=2, sampler=DistributedSampler(dataset, shuffle=shuffle))\n")
    trainer = (DDP + "from tqdm import tqdm\nclass Avg:\n    def update(self, v):\n        self.average = v\n"
               "class Trainer:\n    def __init__(self, model, val_loader, gpu):\n"
               "        self.model, self.val_loader, self.gpu = model, val_loader, gpu\n"
               "    def _valid_epoch(self, epoch):\n        total_loss_val = Avg()\n"
               "        tbar = tqdm(self.val_loader)\n"
               "        with torch.no_grad():\n            for x in tbar:\n"
               "                loss = self.model(x).sum()\n                total_loss_val.update(loss.item())\n"
               "            if self.gpu == 0:\n                print('val loss', total_loss_val.average)\n")
    main = (DDP + "from data import Loader\nfrom trainer import Trainer\nif __name__ == '__main__':\n"
            "    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n    model = DDP(torch.nn.Linear(2, 2))\n"
            "    Trainer(model, VAL, dist.get_rank())._valid_epoch(0)\n")
    sharded = _project(tmp_path / "sharded", {"data.py": data, "trainer.py": trainer, "main.py": main.replace(
        "VAL", "Loader([torch.ones(2)] * 5, shuffle=False)")})
    assert [f.path.rsplit("/", 1)[-1] for f in _rules(sharded, "rank0-local-loss")] == ["trainer.py"]
    whole = _project(tmp_path / "whole", {"data.py": data, "trainer.py": trainer, "main.py": main.replace(
        "VAL", "val_loader").replace("    Trainer(", "    val_loader = torch.utils.data.DataLoader([torch.ones(2)] "
                                     "* 5, batch_size=2)\n    Trainer(")})
    assert not _rules(whole, "rank0-local-loss")
