"""Issue 35: classes of round 402-407's first look (docs/measured/cpu2/audit_heldout_round402.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (e69cc67)."""

from test_audit import _project
from test_audit_classes246 import SEED_ONLY, _rules

SETUP = ("dist.init_process_group('gloo')\nrank = dist.get_rank()\n"
         "model = DDP(torch.nn.Linear(2, 2))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n")


def test_a_meter_synced_before_a_fresh_one_of_the_same_name(tmp_path):
    """ST-Adapter: the evaluation syncs its `metric_logger` (`synchronize_between_processes()`), then the epoch
    loop binds a fresh `metric_logger = MetricLogger()`, feeds it `loss.item()` and prints it on rank 0's console
    without syncing: the old sync does not reduce the new meter (rank0-local-loss). Syncing the new one is quiet."""
    utils = ("import builtins\nclass MetricLogger:\n    def __init__(self):\n        self.meters = {}\n"
             "    def update(self, **kw):\n        self.meters.update(kw)\n"
             "    def synchronize_between_processes(self):\n        pass\n"
             "def setup_for_distributed(is_master):\n    builtin_print = builtins.print\n"
             "    def print(*args, **kwargs):\n        if is_master:\n            builtin_print(*args, **kwargs)\n"
             "    builtins.print = print\n")
    train = SEED_ONLY + ("from utils import MetricLogger, setup_for_distributed\ndef main():\n"
                         "    dist.init_process_group('gloo')\n    setup_for_distributed(dist.get_rank() == 0)\n"
                         "    model = DDP(torch.nn.Linear(2, 2))\n"
                         "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                         "    metric_logger = MetricLogger()\n    metric_logger.update(acc1=1.0)\n"
                         "    metric_logger.synchronize_between_processes()\n    for epoch in range(2):\n"
                         "        metric_logger = MetricLogger()\n        for step in range(3):\n"
                         "            loss = model(torch.ones(2)).sum()\n            opt.zero_grad()\n"
                         "            loss.backward()\n            opt.step()\n"
                         "            metric_logger.update(loss=loss.item())\nSYNC"
                         "        print('Averaged stats:', metric_logger)\nmain()\n")
    fresh = _project(tmp_path / "fresh", {"train.py": train.replace("SYNC", ""), "utils.py": utils})
    assert _rules(fresh, "rank0-local-loss")
    synced = train.replace("SYNC", "        metric_logger.synchronize_between_processes()\n")
    assert not _rules(_project(tmp_path / "synced", {"train.py": synced, "utils.py": utils}), "rank0-local-loss")


def test_an_lr_scaled_by_a_project_helper(tmp_path):
    """asv-subtools: `optimizer_params['learn_rate'] = utils.auto_scale_lr(optimizer_params['learn_rate'])`, whose
    DDP arm returns `lr * dist.get_world_size()`: the 2-rank run steps at twice the lr (lr-grows-with-world-size).
    A helper that returns the lr as it is leaves it: quiet."""
    utils = ("import torch.distributed as dist\ndef auto_scale_lr(lr):\n    if dist.is_initialized():\n"
             "        return SCALED\n    return lr\n")
    train = SEED_ONLY + ("import utils\ndist.init_process_group('gloo')\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                         "optimizer_params = {'learn_rate': 0.01}\n"
                         "optimizer_params['learn_rate'] = utils.auto_scale_lr(optimizer_params['learn_rate'])\n"
                         "opt = torch.optim.SGD(model.parameters(), lr=optimizer_params['learn_rate'])\n")
    scaled = {"train.py": train, "utils.py": utils.replace("SCALED", "lr * dist.get_world_size()")}
    assert _rules(_project(tmp_path / "scaled", scaled), "lr-grows-with-world-size")
    kept = {"train.py": train, "utils.py": utils.replace("SCALED", "lr")}
    assert not _rules(_project(tmp_path / "kept", kept), "lr-grows-with-world-size")
