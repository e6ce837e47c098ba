"""Issue 35: classes of round 408-413's first look (docs/measured/cpu2/audit_heldout_round408.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (802da55)."""

from test_audit import _project
from test_audit_classes246 import _rules


def test_a_runner_picked_by_a_config_string_whose_call_seeds(tmp_path):
    """Versatile Diffusion: `trainer = get_obj_from_str(cfg.train.main)(cfg)`, then `mp.spawn(trainer, ...)` or
    `trainer(0)`: the class is named by a string the audit cannot follow, and a project class's __call__ seeds
    torch before it wraps the model: whether the run is seeded is not known here (no no-seed). With no project
    __call__ that seeds, nothing does: found."""
    utils = ("import importlib, torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
             "def get_obj_from_str(s):\n    mod, cls = s.rsplit('.', 1)\n"
             "    return getattr(importlib.import_module(mod), cls)\nclass exec_container:\n"
             "    def __init__(self, cfg):\n        self.cfg = cfg\n    def __call__(self, rank):\n"
             "        torch.distributed.init_process_group('gloo', rank=rank, world_size=2)\nSEED"
             "        model = DDP(torch.nn.Linear(2, 2))\n        model(torch.ones(2)).sum().backward()\n")
    main = ("import torch.multiprocessing as mp\nfrom utils import get_obj_from_str\nif __name__ == '__main__':\n"
            "    cfg = {'main': 'utils.exec_container'}\n    trainer = get_obj_from_str(cfg['main'])(cfg)\n"
            "    if cfg.get('gpus', 2) == 1:\n        trainer(0)\n    else:\n        mp.spawn(trainer, nprocs=2)\n")
    seeded = {"main.py": main, "utils.py": utils.replace("SEED", "        torch.manual_seed(0)\n")}
    assert not _rules(_project(tmp_path / "seeded", seeded), "no-seed")
    unseeded = {"main.py": main, "utils.py": utils.replace("SEED", "")}
    assert _rules(_project(tmp_path / "unseeded", unseeded), "no-seed")


def test_a_runner_class_taken_from_a_package_by_getattr(tmp_path):
    """HIRL's tools/train.py: `runner = getattr(runners, config.get('runner'))(config)`, then `runner.run()`: any
    runner class of that package may run, so BaseRunner.run's unguarded `self.save_model(...)`, which torch.saves,
    runs on every rank (save-on-every-rank). The same save under a rank-0 test is quiet."""
    base = ("import torch\nimport torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel "
            "as DDP\nclass BaseRunner:\n    def __init__(self, config):\n        self.config = config\n"
            "    def save_model(self, state, epoch):\n        torch.save(state, 'latest.pth')\n"
            "    def run(self):\n        dist.init_process_group('gloo')\n"
            "        model = DDP(torch.nn.Linear(2, 2))\n        for epoch in range(2):\nGUARD"
            "            self.save_model(model.module.state_dict(), epoch)\n")
    init = "from runners.base import BaseRunner\n"
    train = ("import torch\nimport runners\ntorch.manual_seed(0)\nconfig = {'runner': 'BaseRunner'}\n"
             "runner = getattr(runners, config.get('runner'))(config)\nrunner.run()\n")
    loud = {"train.py": train, "runners/__init__.py": init, "runners/base.py": base.replace("GUARD", "")}
    assert _rules(_project(tmp_path / "loud", loud), "save-on-every-rank")
    quiet = {**loud, "runners/base.py": base.replace("GUARD", "          if dist.get_rank() == 0:\n").replace(
        "            self.save_model(model", "              self.save_model(model")}
    assert not _rules(_project(tmp_path / "quiet", quiet), "save-on-every-rank")


def test_an_option_declared_with_configargparse_add(tmp_path):
    """OpenNMT-py's opts.py: `group.add('--seed', '-seed', type=int, default=-1)` (configargparse), then
    `if opt.seed > 0: torch.manual_seed(opt.seed)`: the default run never seeds (no-seed). A default of 3435 is
    quiet."""
    train = ("import configargparse, torch, torch.distributed as dist\n"
             "from torch.nn.parallel import DistributedDataParallel as DDP\n"
             "parser = configargparse.ArgumentParser()\ngroup = parser.add_argument_group('General')\n"
             "group.add('--seed', '-seed', type=int, default=SEED)\nopt = parser.parse_args()\n"
             "if opt.seed > 0:\n    torch.manual_seed(opt.seed)\ndist.init_process_group('gloo')\n"
             "model = DDP(torch.nn.Linear(2, 2))\n")
    assert _rules(_project(tmp_path / "off", {"train.py": train.replace("SEED", "-1")}), "no-seed")
    assert not _rules(_project(tmp_path / "on", {"train.py": train.replace("SEED", "3435")}), "no-seed")
