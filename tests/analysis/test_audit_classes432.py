"""Issue 35: classes of round 432-437's first look (docs/measured/cpu2/audit_heldout_round432.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (7e22f15)."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_a_module_alias_named_batchnorm_for_a_synchronised_norm(tmp_path):
    """CCNet: `BatchNorm2d = functools.partial(InPlaceABNSync, activation='identity')` at the top of the model
    file, then `self.bn1 = BatchNorm2d(64)`: a synchronised norm under BatchNorm's name (no
    batchnorm-without-sync). The alias made of nn.BatchNorm2d is plain BatchNorm."""
    model = ("import functools, torch\nimport torch.nn as nn\nfrom inplace_abn import InPlaceABNSync\n"
             "BatchNorm2d = functools.partial(NORM)\nclass Net(nn.Module):\n    def __init__(self):\n"
             "        super().__init__()\n        self.conv = nn.Conv2d(3, 8, 3)\n        self.bn1 = BatchNorm2d(8)\n"
             "    def forward(self, x):\n        return self.bn1(self.conv(x))\n")
    train = (DDP + "from net import Net\ntorch.manual_seed(0)\ndist.init_process_group('gloo')\nmodel = DDP(Net())\n"
             "for step in range(3):\n    model(torch.ones(2, 3, 8, 8)).sum().backward()\n")
    sync = {"train.py": train, "net.py": model.replace("NORM", "InPlaceABNSync, activation='identity'")}
    assert not _rules(_project(tmp_path / "sync", sync), "batchnorm-without-sync")
    plain = {"train.py": train, "net.py": model.replace("NORM", "nn.BatchNorm2d")}
    assert _rules(_project(tmp_path / "plain", plain), "batchnorm-without-sync")


def test_a_port_from_a_json_config_handed_to_the_setup(tmp_path):
    """DisCoder: `ddp_setup(rank=rank, world_size=world_size, port=config["backend"]["master_port"])`, whose
    `os.environ["MASTER_PORT"] = str(port)`, with `"master_port": 12359` (a number) in configs/config_z.json: the
    port is fixed (hard-coded-master-port). A config without the key leaves it open."""
    train = (DDP + "import json, os, torch.multiprocessing as mp\ndef ddp_setup(rank, world_size, port):\n"
             "    os.environ['MASTER_ADDR'] = 'localhost'\n    os.environ['MASTER_PORT'] = str(port)\n"
             "    dist.init_process_group('gloo', rank=rank, world_size=world_size)\n"
             "def process(rank, world_size, config):\n"
             "    ddp_setup(rank=rank, world_size=world_size, port=config['backend']['master_port'])\n"
             "    torch.manual_seed(0)\n    model = DDP(torch.nn.Linear(2, 2))\nif __name__ == '__main__':\n"
             "    config = json.load(open('configs/config_z.json'))\n"
             "    mp.spawn(process, nprocs=2, args=(2, config))\n")
    fixed = {"train.py": train, "configs/config_z.json": '{"backend": {"master_port": 12359}, "lr": 0.1}\n'}
    assert _rules(_project(tmp_path / "fixed", fixed), "hard-coded-master-port")
    other = {"train.py": train, "configs/config_z.json": '{"backend": {"dist_backend": "nccl"}, "lr": 0.1}\n'}
    assert not _rules(_project(tmp_path / "other", other), "hard-coded-master-port")


def test_a_logging_helper_of_another_module_called_on_rank_0(tmp_path):
    """PepFlow: `if local_rank == 0: log_losses(loss, loss_dict, ...)`, whose body in pepflow/utils/train.py
    formats `loss.item()` into a text for logger.info: rank 0 logs its own micro-batch's loss (rank0-local-loss).
    With the loss all-reduced and averaged before the call it is quiet."""
    helper = ("class BlackHole:\n    def __getattr__(self, name):\n        return lambda *a, **k: None\n"
              "def log_losses(loss, it, logger=BlackHole()):\n"
              "    logstr = 'Iter %05d' % it\n    logstr += ' | loss %.4f' % loss.item()\n    logger.info(logstr)\n")
    train = (DDP + "import logging\nfrom utils.train import log_losses\nif __name__ == '__main__':\n"
             "    logger = logging.getLogger('train')\n    torch.manual_seed(0)\n    dist.init_process_group('gloo')\n"
             "    model = DDP(torch.nn.Linear(2, 2))\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
             "    def train(it):\n        loss = model(torch.ones(2)).sum()\n        loss.backward()\n"
             "        opt.step()\nREDUCE        if dist.get_rank() == 0:\n"
             "            log_losses(loss, it, logger=logger)\n"
             "    for it in range(4):\n        train(it)\n")
    local = {"train.py": train.replace("REDUCE", ""), "utils/train.py": helper}
    assert _rules(_project(tmp_path / "local", local), "rank0-local-loss")
    reduced = {"train.py": train.replace("REDUCE", "        loss = loss.detach()\n        dist.all_reduce(loss)\n"
                                         "        loss = loss / dist.get_world_size()\n"), "utils/train.py": helper}
    assert not _rules(_project(tmp_path / "reduced", reduced), "rank0-local-loss")


def test_a_progress_bar_named_like_another_functions_rank0_bar(tmp_path):
    """UVC: valid()'s `epoch_iterator = tqdm(test_loader, disable=args.local_rank not in [-1, 0])` and train()'s
    own `epoch_iterator = tqdm(train_loader, ...)`, not disabled: train's bar shows every rank's own loss
    (every-rank-prints-loss), whatever the other function's bar of that name does. Disabled there too, it is
    rank 0's alone."""
    train = (DDP + "import argparse\nfrom tqdm import tqdm\nparser = argparse.ArgumentParser()\n"
             "parser.add_argument('--local_rank', type=int, default=-1)\nargs = parser.parse_args()\n"
             "def valid(model, loader):\n"
             "    epoch_iterator = tqdm(loader, disable=args.local_rank not in [-1, 0])\n"
             "    for x in epoch_iterator:\n        epoch_iterator.set_description('Validating')\n"
             "def train(model, loader, opt):\n    epoch_iterator = tqdm(loader, BAR)\n"
             "    for x in epoch_iterator:\n        loss = model(x).sum()\n        loss.backward()\n"
             "        opt.step()\n        epoch_iterator.set_description(f'Loss: {loss.item():.3f}')\n"
             "torch.manual_seed(0)\ndist.init_process_group('gloo')\nmodel = DDP(torch.nn.Linear(2, 2))\n"
             "opt = torch.optim.SGD(model.parameters(), lr=0.1)\ntrain(model, [torch.ones(2)] * 4, opt)\n"
             "valid(model, [torch.ones(2)] * 2)\n")
    shown = train.replace("BAR", "dynamic_ncols=True")
    assert _rules(_project(tmp_path / "shown", {"train.py": shown}), "every-rank-prints-loss")
    hidden = train.replace("BAR", "disable=args.local_rank not in [-1, 0]")
    assert not _rules(_project(tmp_path / "hidden", {"train.py": hidden}), "every-rank-prints-loss")
