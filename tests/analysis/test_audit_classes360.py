"""Issue 35: classes of round 360-365's first look (docs/measured/cpu2/audit_heldout_round360.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (4b2be88)."""

from test_audit import _project
from test_audit_classes189 import _line
from test_audit_classes246 import HEAD, SEED_ONLY, _rules

LOOP = ("opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor step in range(3):\n"
        "    loss = model(torch.ones(2)).sum()\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n")


def test_a_trainer_built_by_name_whose_base_seeds(tmp_path):
    """FGT: `pkg = import_module('networks.' + opt['network'])`, `trainer = pkg.Network(opt, rank)`,
    `trainer.train()`: Network's base Trainer.__init__ calls setSeed(), which seeds torch, so the run is seeded
    (no no-seed). A base that never seeds leaves it unseeded: found."""
    trainer = ("import torch\nclass Trainer:\n    def __init__(self, opt, rank):\n        self.opt = opt\n"
               "SEED        self.model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))\n"
               "    def set_seed(self):\n        torch.manual_seed(0)\n")
    network = "from trainer import Trainer\nclass Network(Trainer):\n    def train(self):\n        pass\n"
    train = HEAD + ("from importlib import import_module\ndef main_worker(rank, opt):\n"
                    "    dist.init_process_group('gloo', rank=rank, world_size=2)\n"
                    "    pkg = import_module('networks.{}'.format(opt['network']))\n"
                    "    trainer = pkg.Network(opt, rank)\n    trainer.train()\n"
                    "if __name__ == '__main__':\n    torch.multiprocessing.spawn(main_worker, args=({},), nprocs=2)\n")
    seeded = {"train.py": train, "networks/network.py": network,
              "trainer.py": trainer.replace("SEED", "        self.set_seed()\n")}
    assert not _rules(_project(tmp_path / "seeded", seeded), "no-seed")
    unseeded = {**seeded, "trainer.py": trainer.replace("SEED", "")}
    assert _rules(_project(tmp_path / "unseeded", unseeded), "no-seed")


def test_set_epoch_in_an_arm_no_caller_takes(tmp_path):
    """SEDD: `def cycle_loader(dataloader, sampler=None): ... if sampler is not None: sampler.set_epoch(...)`,
    called as `cycle_loader(DataLoader(..., sampler=train_sampler))` without the sampler: set_epoch never runs
    (set-epoch-missing). Handing it the sampler is quiet."""
    data = ("import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\n"
            "def cycle_loader(dataloader, sampler=None):\n    epoch = 0\n    while True:\n"
            "        if sampler is not None:\n            sampler.set_epoch(epoch)\n"
            "        for data in dataloader:\n            yield data\n        epoch += 1\n"
            "def get_loader(ds):\n    train_sampler = DistributedSampler(ds, shuffle=True)\n"
            "    return cycle_loader(DataLoader(ds, batch_size=4, sampler=train_sampler)HANDED)\n")
    train = SEED_ONLY + ("import data\ndist.init_process_group('gloo')\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                         "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                         "it = data.get_loader(torch.ones(16, 2))\nfor step in range(8):\n"
                         "    loss = model(next(it)).sum()\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n")
    left = data.replace("HANDED", "")
    assert _rules(_project(tmp_path / "left", {"train.py": train, "data.py": left}), "set-epoch-missing")
    handed = data.replace("HANDED", ", sampler=train_sampler")
    assert not _rules(_project(tmp_path / "handed", {"train.py": train, "data.py": handed}), "set-epoch-missing")


def test_a_class_named_only_in_a_bare_string_is_not_built(tmp_path):
    """Mellotron's distributed.py: a bare string "This version of DistributedDataParallel is designed ..." above
    `class DistributedDataParallel(Module)`, whose __init__ broadcasts; train.py imports only
    apply_gradient_allreduce: the class is never built, so its broadcast is no collective-outside-switch. A script
    that builds it when distributed, and broadcasts outside the switch, is found."""
    dist_py = ("import torch.distributed as dist\nfrom torch.nn import Module\n\"\"\"\nThis version of "
               "DistributedDataParallel is designed for multiproc.py.\n\"\"\"\nclass DistributedDataParallel(Module):\n"
               "    def __init__(self, module):\n        super().__init__()\n        self.module = module\n"
               "        for p in module.state_dict().values():\n            dist.broadcast(p, 0)\n"
               "def apply_gradient_allreduce(module):\n    return module\n")
    train = ("import argparse, torch, torch.distributed as dist\nfrom distributed import apply_gradient_allreduce\n"
             "parser = argparse.ArgumentParser()\nparser.add_argument('--distributed_run', action='store_true')\n"
             "args = parser.parse_args()\ntorch.manual_seed(0)\nif args.distributed_run:\n"
             "    dist.init_process_group('gloo')\nmodel = torch.nn.Linear(2, 2)\nif args.distributed_run:\n"
             "    model = apply_gradient_allreduce(model)\n" + LOOP)
    assert not _rules(_project(tmp_path / "unbuilt", {"train.py": train, "distributed.py": dist_py}),
                      "collective-outside-switch")
    built = train.replace("from distributed import apply_gradient_allreduce",
                          "from distributed import DistributedDataParallel") + "DistributedDataParallel(model)\n"
    assert _rules(_project(tmp_path / "built", {"train.py": built, "distributed.py": dist_py}),
                  "collective-outside-switch")


def test_a_print_of_the_loss_dicts_key_set(tmp_path):
    """Sparse DETR's check_unused_parameters: `print(f"set(loss_dict) - set(weight_dict) = {set(loss_dict.keys()) -
    set(weight_dict.keys())}")` on rank 0's console prints names, no loss (no rank0-local-loss). Printing
    `loss_dict['loss_ce'].item()` there is rank 0's own loss: found."""
    train = SEED_ONLY + ("import builtins\ndef setup_for_distributed(is_master):\n    builtin_print = builtins.print\n"
                         "    def print(*args, **kwargs):\n        if is_master:\n"
                         "            builtin_print(*args, **kwargs)\n    builtins.print = print\n"
                         "def check(loss_dict, weight_dict):\n    print(SHOWN)\n"
                         "dist.init_process_group('gloo')\nsetup_for_distributed(dist.get_rank() == 0)\n"
                         "model = DDP(torch.nn.Linear(2, 2))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                         "for step in range(3):\n    out = model(torch.ones(2))\n"
                         "    loss_dict = {'loss_ce': out.sum(), 'loss_bbox': out.mean()}\n"
                         "    loss = sum(loss_dict.values())\n    opt.zero_grad()\n    loss.backward()\n"
                         "    opt.step()\n"
                         "    check(loss_dict, {'loss_ce': 1.0})\n")
    keys = train.replace("SHOWN", "f'{set(loss_dict.keys()) - set(weight_dict.keys())}'")
    assert not _rules(_project(tmp_path / "keys", {"train.py": keys}), "rank0-local-loss")
    values = train.replace("SHOWN", "loss_dict['loss_ce'].item()")
    hits = _rules(_project(tmp_path / "values", {"train.py": values}), "rank0-local-loss")
    assert [h.line for h in hits] == [_line(values, "    print(loss_dict")]
