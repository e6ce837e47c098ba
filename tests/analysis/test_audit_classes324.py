"""Issue 35: classes of round 324-329's first look (docs/measured/cpu2/audit_heldout_round324.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (48a459f)."""

from test_audit import _project
from test_audit_classes189 import _line
from test_audit_classes246 import HEAD, SEED_ONLY, STEP, _rules

LOOP = "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor step in range(3):\n" + STEP


def test_a_batch_size_named_for_the_lr_schedule_is_no_lr(tmp_path):
    """RF-DETR: `total_batch_size_for_lr = args.batch_size * get_world_size() * args.grad_accum_steps` sizes the
    schedule's steps per epoch, not the lr: no lr-grows-with-world-size. An lr multiplied by the world size is."""
    train = SEED_ONLY + ("import argparse\nparser = argparse.ArgumentParser()\n"
                         "parser.add_argument('--lr', type=float, default=1e-4)\n"
                         "parser.add_argument('--batch_size', type=int, default=4)\n"
                         "args = parser.parse_args()\ndist.init_process_group('gloo')\n"
                         "model = DDP(torch.nn.Linear(2, 2))\n"
                         "NAME = args.NUMBER * dist.get_world_size()\nsteps_per_epoch = 1000 // NAME\n"
                         "opt = torch.optim.SGD(model.parameters(), lr=LR)\nfor step in range(3):\n" + STEP)
    sized = train.replace("NAME", "total_batch_size_for_lr").replace("NUMBER", "batch_size").replace("LR", "args.lr")
    assert not _rules(_project(tmp_path / "sized", {"train.py": sized}), "lr-grows-with-world-size")
    scaled = train.replace("NAME", "scaled_lr").replace("NUMBER", "lr").replace("LR", "scaled_lr")
    assert _rules(_project(tmp_path / "scaled", {"train.py": scaled}), "lr-grows-with-world-size")


def test_a_switch_named_for_a_loss_is_no_loss(tmp_path):
    """RF-DETR's populate_args(aux_loss=True, use_varifocal_loss=False, ...) returns the options: `print(args)`
    through the print only rank 0's console shows (DETR's setup_for_distributed) prints no loss. The running loss
    printed there is one (rank0-local-loss)."""
    train = SEED_ONLY + ("import builtins\ndef setup_for_distributed(is_master):\n    builtin_print = builtins.print\n"
                         "    def print(*args, **kwargs):\n        if is_master:\n"
                         "            builtin_print(*args, **kwargs)\n"
                         "    builtins.print = print\n"
                         "def populate_args(lr=1e-4, aux_loss=True, use_varifocal_loss=False):\n"
                         "    return dict(lr=lr, aux_loss=aux_loss, use_varifocal_loss=use_varifocal_loss)\n"
                         "class Model:\n    def train(self, **kwargs):\n        args = populate_args(**kwargs)\n"
                         "        dist.init_process_group('gloo')\n"
                         "        setup_for_distributed(dist.get_rank() == 0)\n"
                         "        model = DDP(torch.nn.Linear(2, 2))\n"
                         "        opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                         "        total = 0.0\n        for step in range(3):\n"
                         "            loss = model(torch.ones(2)).sum()\n"
                         "            opt.zero_grad()\n            loss.backward()\n            opt.step()\n"
                         "            total += loss.item()\n        print(SHOWN)\n"
                         "if __name__ == '__main__':\n    Model().train()\n")
    options = train.replace("SHOWN", "args")
    assert not _rules(_project(tmp_path / "options", {"train.py": options}), "rank0-local-loss")
    running = train.replace("SHOWN", "total")
    assert _rules(_project(tmp_path / "running", {"train.py": running}), "rank0-local-loss")


def test_a_config_name_naming_a_class_in_another_case(tmp_path):
    """noise-xorcist: `model = build_model(config['model']['name'], ...)` from models/__init__.py, which the copies
    lack (under the repo's deep_learning/ folder), with `name: gtcrn` in the YAML config and class GTCRN, which has
    BatchNorm2d, in models/gtcrn.py: the likely model has BatchNorm (batchnorm-without-sync, check by hand). A
    config naming a class without BatchNorm says nothing."""
    gtcrn = ("import torch.nn as nn\nclass GTCRN(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
             "        self.conv = nn.Conv2d(1, 1, 3)\n        self.bn = nn.NORM(1)\n")
    train = SEED_ONLY + ("import yaml\nfrom models import build_model\n"
                         "config = yaml.safe_load(open('configs/cfg.yaml'))\n"
                         "dist.init_process_group('gloo')\nmodel = build_model(config['model']['name'])\n"
                         "model = DDP(model)\n" + LOOP)
    files = {"deep_learning/train.py": train, "deep_learning/configs/cfg.yaml": "model:\n  name: gtcrn\n"}
    bn = {**files, "deep_learning/models/gtcrn.py": gtcrn.replace("NORM", "BatchNorm2d")}
    hits = _rules(_project(tmp_path / "bn", bn), "batchnorm-without-sync")
    assert [h.line for h in hits] == [_line(train, "model = DDP(")]
    gn = {**files, "deep_learning/models/gtcrn.py": gtcrn.replace("NORM", "InstanceNorm2d")}
    assert not _rules(_project(tmp_path / "gn", gn), "batchnorm-without-sync")


def test_a_top_level_seed_and_the_ema_its_main_builds(tmp_path):
    """VMamba: the `__main__` block seeds `config.SEED + dist.get_rank()`, then calls main(), which builds
    ModelEma(model) before the DDP wrap: rank 1's EMA starts from its own init (seed-per-rank, check by hand). An
    EMA built after the wrap copies rank 0's broadcast weights."""
    train = HEAD + ("from timm.utils import ModelEma\ndef main():\n    model = torch.nn.Linear(2, 2)\nEMA1"
                    "    model = DDP(model)\nEMA2    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                    "    for step in range(3):\n        loss = model(torch.ones(2)).sum()\n        opt.zero_grad()\n"
                    "        loss.backward()\n        opt.step()\n        model_ema.update(model)\n"
                    "if __name__ == '__main__':\n    dist.init_process_group('gloo')\n    seed = 42 + dist.get_rank()\n"
                    "    torch.manual_seed(seed)\n    main()\n")
    before = train.replace("EMA1", "    model_ema = ModelEma(model, decay=0.9999)\n").replace("EMA2", "")
    hits = _rules(_project(tmp_path / "before", {"main.py": before}), "seed-per-rank")
    assert [h.line for h in hits] == [_line(before, "model_ema = ModelEma(")]
    after = train.replace("EMA1", "").replace("EMA2", "    model_ema = ModelEma(model.module, decay=0.9999)\n")
    assert not _rules(_project(tmp_path / "after", {"main.py": after}), "seed-per-rank")
