"""Issue 35: classes of round 450-455's first look (docs/measured/cpu2/audit_heldout_round450.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (1486cd2)."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_loss_names_looped_as_keys_and_tags_are_no_loss(tmp_path):
    """ESTRNN: `for key in losses_name: writer.add_scalar(key + '_loss_train', losses_meter[key].avg, epoch)`
    with every meter fed a reduced loss: `key` is a name in the log (a text, a dict key), not the loss; the
    meters decide. Meters fed the rank's own loss are the finding."""
    train = (DDP + "from torch.utils.tensorboard import SummaryWriter\nclass AverageMeter:\n"
             "    def __init__(self):\n        self.avg = 0\n    def update(self, v):\n        self.avg = v\n"
             "def reduce_tensor(num_gpus, ts):\n    dist.reduce(ts, dst=0)\n    ts /= num_gpus\n    return ts\n"
             "def loss_parse(spec):\n    return spec, [x.split('*')[1] for x in spec.split('|')]\n"
             "def train(rank):\n    dist.init_process_group('gloo', rank=rank, world_size=2)\n"
             "    torch.manual_seed(0)\n    model = DDP(torch.nn.Linear(2, 2))\n"
             "    writer = SummaryWriter() if rank == 0 else None\n    _, losses_name = loss_parse('1*L1|1*all')\n"
             "    losses_meter = {k: AverageMeter() for k in losses_name}\n    for epoch in range(3):\n"
             "        for step in range(10):\n            out = model(torch.ones(2))\n"
             "            losses = {'L1': out.abs().sum(), 'all': out.sum()}\n            losses['all'].backward()\n"
             "            for key in losses_name:\n                losses_meter[key].update(FED)\n"
             "        if rank == 0:\n            for key in losses_name:\n"
             "                writer.add_scalar(key + '_loss_train', losses_meter[key].avg, epoch)\n"
             "if __name__ == '__main__':\n    torch.multiprocessing.spawn(train, nprocs=2)\n")
    reduced = train.replace("FED", "reduce_tensor(2, losses[key].detach()).item()")
    assert not _rules(_project(tmp_path / "reduced", {"train.py": reduced}), "rank0-local-loss")
    own = train.replace("FED", "losses[key].item()")
    assert _rules(_project(tmp_path / "own", {"train.py": own}), "rank0-local-loss")


def test_a_wrapper_save_under_the_opposite_arm_of_the_wrap(tmp_path):
    """Coconut: `if configs.only_eval: parallel_model = DDP(model)` (FSDP otherwise), and the checkpoint
    `parallel_model.state_dict()` only `if ... and not configs.only_eval:`: no run saves the DDP wrapper. Under
    the same arm as the wrap it is the finding."""
    train = (DDP + "import argparse\nparser = argparse.ArgumentParser()\n"
             "parser.add_argument('--only_eval', action='store_true')\nparser.add_argument('--save', type=int, "
             "default=1)\nconfigs = parser.parse_args()\ndist.init_process_group('gloo')\ntorch.manual_seed(0)\n"
             "model = torch.nn.Linear(2, 2)\nif configs.only_eval:\n    parallel_model = DDP(model)\nelse:\n"
             "    parallel_model = torch.nn.Sequential(model)\nfor epoch in range(3):\n"
             "    parallel_model(torch.ones(2)).sum().backward()\n    if configs.save and TEST:\n"
             "        states = parallel_model.state_dict()\n        if dist.get_rank() == 0:\n"
             "            torch.save(states, 'ckpt.pt')\n")
    opposite = train.replace("TEST", "not configs.only_eval")
    assert not _rules(_project(tmp_path / "opposite", {"train.py": opposite}), "save-without-module")
    same = train.replace("TEST", "configs.only_eval")
    assert _rules(_project(tmp_path / "same", {"train.py": same}), "save-without-module")


def test_a_sampler_rebuilt_each_epoch_over_a_reshuffled_dataset(tmp_path):
    """Coconut: each epoch `dataset_train = get_cot_latent_dataset(..., shuffle=True)` (rank 0 shuffles it and
    broadcasts it), then `DistributedSampler(dataset_train, shuffle=True)`: its fixed permutation runs over a
    dataset whose order changes every epoch. Rebuilt without shuffling, every epoch repeats epoch 0's order."""
    train = (DDP + "import random\nfrom torch.utils.data import DataLoader, DistributedSampler\n"
             "def get_dataset(base, shuffle=False):\n    data = list(base)\n    if shuffle:\n"
             "        random.shuffle(data)\n    return data\n"
             "def main():\n    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
             "    model = DDP(torch.nn.Linear(2, 2))\n    base = [torch.ones(2)] * 64\n"
             "    for epoch in range(3):\n        dataset_train = get_dataset(base, shuffle=SHUFFLE)\n"
             "        loader = DataLoader(dataset_train, batch_size=4,\n"
             "                            sampler=DistributedSampler(dataset_train, shuffle=True))\n"
             "        for x in loader:\n            model(x).sum().backward()\nmain()\n")
    reshuffled = train.replace("SHUFFLE", "True")
    assert not _rules(_project(tmp_path / "reshuffled", {"train.py": reshuffled}), "set-epoch-missing")
    fixed = train.replace("SHUFFLE", "False")
    assert _rules(_project(tmp_path / "fixed", {"train.py": fixed}), "set-epoch-missing")


def test_a_distributed_switch_false_in_the_config_is_no_option_left_off(tmp_path):
    """SOLIDER-REID: `_C.MODEL.DIST_TRAIN = False` in the yacs defaults, and the rank-0 log of the rank's own
    loss meter under `if cfg.MODEL.DIST_TRAIN: if dist.get_rank() == 0:`: the switch a DDP run turns on, so the
    log is the finding. Under another config flag that is False (`_C.MODEL.LOG_TRAIN`), it is off."""
    config = ("from yacs.config import CfgNode as CN\n_C = CN()\n_C.MODEL = CN()\n_C.MODEL.DIST_TRAIN = False\n"
              "_C.MODEL.LOG_TRAIN = False\n")
    train = (DDP + "import logging\nfrom config.defaults import _C as cfg\nclass AverageMeter:\n"
             "    def __init__(self):\n        self.avg = 0\n    def update(self, v, n=1):\n        self.avg = v\n"
             "def do_train(model, loader, optimizer):\n    logger = logging.getLogger('train')\n"
             "    loss_meter = AverageMeter()\n    for epoch in range(3):\n"
             "        for n_iter, x in enumerate(loader):\n"
             "            loss = model(x).sum()\n            loss.backward()\n            optimizer.step()\n"
             "            loss_meter.update(loss.item(), x.shape[0])\n            if cfg.MODEL.FLAG:\n"
             "                if dist.get_rank() == 0:\n"
             "                    logger.info('Loss: {:.3f}'.format(loss_meter.avg))\n"
             "if __name__ == '__main__':\n    cfg.merge_from_list(['MODEL.DIST_TRAIN', True])\n"
             "    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
             "    model = DDP(torch.nn.Linear(2, 2))\n"
             "    do_train(model, [torch.ones(2)] * 8, torch.optim.SGD(model.parameters(), lr=0.1))\n")
    files = {"config/__init__.py": "", "config/defaults.py": config}
    switch = train.replace("FLAG", "DIST_TRAIN")
    assert _rules(_project(tmp_path / "switch", {**files, "train.py": switch}), "rank0-local-loss")
    option = train.replace("FLAG", "LOG_TRAIN")
    assert not _rules(_project(tmp_path / "option", {**files, "train.py": option}), "rank0-local-loss")
