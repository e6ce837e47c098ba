"""Issue 35: classes of round 656-661's first look (docs/measured/cpu2/audit_heldout_round656.txt), fixed after
it, quiet and loud; each test fails at the first look's code (1d35d348). The round's other false alarms and misses
are left, said in docs/results.md."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_a_schedules_milestones_scaled_by_the_step_count_are_no_lr(tmp_path):
    """LeReS: `cfg.TRAIN.LR_SCHEDULER_MULTISTEPS = np.array(epochs) * math.ceil(n / (world_size * batch))`, the
    milestones in steps: no lr-grows-with-world-size. The base lr times the world size is one."""
    src = (DDP + "import math\nclass C:\n    pass\ncfg = C()\nif __name__ == '__main__':\n"
           "    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n    world_size = dist.get_world_size()\n"
           "    TARGET = 0.1 * math.ceil(1000 / (world_size * 8))\n    model = DDP(torch.nn.Linear(2, 2))\n"
           "    model(torch.ones(2)).sum().backward()\n")
    assert not _rules(_project(tmp_path / "steps", {"t.py": src.replace("TARGET", "cfg.LR_SCHEDULER_MULTISTEPS")}),
                      "lr-grows-with-world-size")
    grows = src.replace("TARGET = 0.1 * math.ceil(1000 / (world_size * 8))", "cfg.BASE_LR = 0.1 * world_size")
    assert _rules(_project(tmp_path / "lr", {"t.py": grows}), "lr-grows-with-world-size")


def test_a_warmup_schedulers_multiplier_set_to_the_world_size(tmp_path):
    """SeLaVi: `GradualWarmupScheduler(optimizer, multiplier=args.world_size, ...)`: at 2 ranks the lr warms up to
    twice the single run's (lr-grows-with-world-size). A multiplier of 1 is quiet."""
    src = (DDP + "from warmup_scheduler import GradualWarmupScheduler\nif __name__ == '__main__':\n"
           "    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n    model = DDP(torch.nn.Linear(2, 2))\n"
           "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
           "    sched = GradualWarmupScheduler(opt, multiplier=MULT, total_epoch=5)\n"
           "    model(torch.ones(2)).sum().backward()\n")
    assert _rules(_project(tmp_path / "ws", {"t.py": src.replace("MULT", "dist.get_world_size()")}),
                  "lr-grows-with-world-size")
    assert not _rules(_project(tmp_path / "one", {"t.py": src.replace("MULT", "1")}), "lr-grows-with-world-size")


def test_a_rank_seed_under_the_switch_that_keeps_rank_0s_seed(tmp_path):
    """DRAGON: `_seed = args.seed`, then `if args.local_rank != -1: _seed = args.seed + (2 ** args.local_rank - 1)`,
    then `torch.manual_seed(_seed)`: rank 0 seeds args.seed, as the single run does (no seed-per-rank). `args.seed
    + args.local_rank + 1` there moves rank 0's."""
    src = (DDP + "import argparse\nif __name__ == '__main__':\n    p = argparse.ArgumentParser()\n"
           "    p.add_argument('--seed', type=int, default=0)\n"
           "    p.add_argument('--local_rank', type=int, default=-1)\n"
           "    args = p.parse_args()\n    _seed = args.seed\n    if args.local_rank != -1:\n"
           "        dist.init_process_group('gloo')\n        _seed = RANKED\n    torch.manual_seed(_seed)\n"
           "    model = torch.nn.Linear(2, 2)\n    if args.local_rank != -1:\n        model = DDP(model)\n"
           "    model(torch.ones(2)).sum().backward()\n")
    assert not _rules(_project(tmp_path / "kept", {"t.py": src.replace(
        "RANKED", "args.seed + (2 ** args.local_rank - 1)")}), "seed-per-rank")
    assert _rules(_project(tmp_path / "moved", {"t.py": src.replace("RANKED", "args.seed + args.local_rank + 1")}),
                  "seed-per-rank")


def test_an_unwrap_for_data_parallel_only_leaves_the_ddp_prefix(tmp_path):
    """LeReS's save_ckpt: `if isinstance(model, nn.DataParallel): model = model.module`, then
    `torch.save({'model_state_dict': model.state_dict()}, ...)`, handed the DDP wrapper, which is no DataParallel:
    the file keeps `module.` keys (save-without-module). A test that names DistributedDataParallel too unwraps."""
    tools = ("import torch, torch.nn as nn\nfrom torch.nn.parallel import DistributedDataParallel\n"
             "def save_ckpt(step, model):\n    if isinstance(model, KINDS):\n        model = model.module\n"
             "    torch.save({'step': step, 'model_state_dict': model.state_dict()}, 'ckpt.pth')\n")
    main = (DDP + "from net_tools import save_ckpt\nif __name__ == '__main__':\n    dist.init_process_group('gloo')\n"
            "    torch.manual_seed(0)\n    model = DDP(torch.nn.Linear(2, 2))\n"
            "    model(torch.ones(2)).sum().backward()\n    if dist.get_rank() == 0:\n        save_ckpt(1, model)\n")
    only = _project(tmp_path / "dp", {"net_tools.py": tools.replace("KINDS", "nn.DataParallel"), "train.py": main})
    assert _rules(only, "save-without-module")
    both = _project(tmp_path / "both", {"net_tools.py": tools.replace(
        "KINDS", "(nn.DataParallel, DistributedDataParallel)"), "train.py": main})
    assert not _rules(both, "save-without-module")


def test_an_uncalled_builder_beside_another_modules_build_call(tmp_path):
    """PROB: `model, criterion, ... = build_model(args)` from a models/__init__.py these copies lack, and
    models/prob_deformable_detr.py's `def build(args)` (BatchNorm1d in its objectness head): the only `build(...)`
    call is `datasets.coco.build('val', args)`, another module's, so the builder is still uncalled here and its
    BatchNorm is the likely model's (batchnorm-without-sync, check by hand)."""
    model = ("import torch.nn as nn\nclass Head(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
             "        self.bn = nn.BatchNorm1d(4)\nclass DETR(nn.Module):\n    def __init__(self):\n"
             "        super().__init__()\n        self.head = Head()\nclass Criterion(nn.Module):\n    pass\n"
             "def build(args):\n    return DETR(), Criterion()\n")
    main = (DDP + "import datasets\nfrom models import build_model\nif __name__ == '__main__':\n"
            "    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n    model, criterion = build_model(None)\n"
            "    val = datasets.coco.build('val', None)\n    model = DDP(model)\n"
            "    model(torch.ones(2, 4)).sum().backward()\n")
    found = _rules(_project(tmp_path, {"models/prob_deformable_detr.py": model, "main.py": main}),
                   "batchnorm-without-sync")
    assert [f.line for f in found] == [10]


SCRIPT = (DDP + "import yaml\nfrom models import create_model\nif __name__ == '__main__':\n"
          "    opt = yaml.safe_load(open('train.yml'))\n    seed = opt['train']['manual_seed']\n"
          "    dist.init_process_group('gloo')\n    SEEDING\n    model = create_model(opt)\n"
          "    for step in range(10):\n        model.optimize_parameters(step)\n        if step % 5 == 0:\n"
          "            model.eval()\n")


def test_a_model_objects_own_step_trains_and_an_unused_seed_is_where_the_fix_goes(tmp_path):
    """DA-CLIP's train.py: `model.optimize_parameters(current_step)` (BasicSR style, its model file absent) is a
    training step, so the script is no evaluation script; `seed = opt["train"]["manual_seed"]` is read and its
    `util.set_random_seed(seed)` commented out: no-seed, shown at the seed's line. Seeding torch with it is quiet."""
    unused = _rules(_project(tmp_path / "unused", {"train.py": SCRIPT.replace("SEEDING", "pass")}), "no-seed")
    assert [f.line for f in unused] == [7] and "`seed` is read here" in unused[0].message
    assert not _rules(_project(tmp_path / "used", {"train.py": SCRIPT.replace("SEEDING", "torch.manual_seed(seed)")}),
                      "no-seed")
