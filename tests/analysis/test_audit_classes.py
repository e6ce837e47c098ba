"""Issue 35, held-out batch 3 (tests/outside/heldout_labels.json, batch 3): each class of mistake the first look
showed, fixed as a class, with a script where the rule must stay quiet and one where it must fire (the same
style as test_audit.CLASS_CASES); and the project-level classes (a helper behind a package re-export, a logger
whose console is rank 0's) on small projects."""

import pytest
from test_audit import _project, rules

from lab_utils.analysis import audit

LOOP = ("for i, (x, y) in enumerate(loader):\n    out = model(x)\n    loss = crit(out, y)\n"
        "    opt.zero_grad()\n    loss.backward()\n    opt.step()\n")

# (rule, quiet, loud)
CASES = [
    # a helper that only synchronises (a barrier, a broadcast) reduces nothing: what it returns is no average, and
    # a loss that mixes a reduced value with this rank's own activations is this rank's own
    ("rank0-local-loss",
     "mloss = 0\n" + LOOP + "    mloss = reduce_mean(loss.item())\n    if rank == 0:\n"
     "        print('loss', mloss)\n",
     "def zero_first():\n    dist.barrier()\n    return make_loader()\nloader = zero_first()\nnb = len(loader)\n"
     "mloss = 0\n" + LOOP + "    ni = i + nb * epoch\n    mloss = (mloss * ni + loss.item()) / (ni + 1)\n"
     "    if rank == 0:\n        print('loss', mloss)\n"),
    ("rank0-local-loss",
     "def sinkhorn(o):\n    s = o.sum()\n    dist.all_reduce(s)\n    return o / s\nmodel = DDP(Net())\n"
     "for x in loader:\n    out = model(x)\n    q = sinkhorn(out.detach())\n"
     "    loss = -(q * out.log_softmax(1)).mean()\n"
     "    loss.backward()\n    loss = reduce_mean(loss)\n    if rank == 0:\n        print('loss', loss.item())\n",
     "def sinkhorn(o):\n    s = o.sum()\n    dist.all_reduce(s)\n    return o / s\nmodel = DDP(Net())\n"
     "for x in loader:\n    out = model(x)\n    q = sinkhorn(out.detach())\n"
     "    loss = -(q * out.log_softmax(1)).mean()\n"
     "    loss.backward()\n    if rank == 0:\n        print('loss', loss.item())\n"),
    # a meter reaches the log through a holder built from it (ProgressMeter), under the print override
    ("rank0-local-loss",
     "import builtins\nbuiltins.print = quiet\nlosses = Meter()\nprogress = Progress([losses, top1])\n" + LOOP +
     "    losses.update(reduce_mean(loss).item())\n    progress.display(i)\n",
     "import builtins\nbuiltins.print = quiet\nclass Progress:\n    def __init__(self, meters): self.m = meters\n"
     "    def display(self, i): print(self.m)\nlosses = Meter()\nprogress = Progress([losses, top1])\n" + LOOP +
     "    losses.update(loss.item())\n    progress.display(i)\n"),
    # the rank-0 part of a seed is judged with the world size too: `seed * world_size + rank`
    ("seed-per-rank",
     "torch.manual_seed(args.seed + dist.get_rank())\nmodel = Net()\n",
     "torch.manual_seed(args.seed * dist.get_world_size() + dist.get_rank())\nmodel = Net()\n"),
    # a per-rank EMA copy made before the wrap has no consequence when only rank 0 ever reads it
    ("seed-per-rank",
     "import copy\ntorch.manual_seed(args.seed + rank)\nmodel = Net()\nema = copy.deepcopy(model)\n"
     "requires_grad(ema, False)\nmodel = DDP(model)\nupdate_ema(ema, model.module)\nif rank == 0:\n"
     "    torch.save(ema.state_dict(), 'ema.pt')\n",
     "import copy\ntorch.manual_seed(args.seed + rank)\nmodel = Net()\nema = copy.deepcopy(model)\n"
     "requires_grad(ema, False)\nmodel = DDP(model)\nupdate_ema(ema, model.module)\nsample(ema, 'out.png')\n"),
    # a step gated by a comparison with the accumulation count, not only by a modulo
    ("accumulation-without-no-sync",
     "last = 0\nfor ni, (x, y) in enumerate(loader):\n    scaler.scale(crit(model(x), y)).backward()\n"
     "    if ni - last >= 1:\n        scaler.step(opt)\n        last = ni\n",
     "last = 0\nfor ni, (x, y) in enumerate(loader):\n    scaler.scale(crit(model(x), y)).backward()\n"
     "    if ni - last >= accumulate:\n        scaler.step(opt)\n        last = ni\n"),
    # a checkpoint is what goes into load_state_dict, whatever its file is called; not when the project saves
    # CPU tensors
    ("load-without-map-location",
     "def save(net, p):\n    sd = {k: v.cpu() for k, v in net.state_dict().items()}\n    torch.save(sd, p)\n"
     "def load(net, p):\n    sd = torch.load(p)\n    net.load_state_dict(sd)\n",
     "def load(net, opt, chkpt_path):\n    c = torch.load(chkpt_path)\n    net.load_state_dict(c['g'])\n"
     "    opt.load_state_dict(c['opt'])\n"),
    # a conversion under a switch that is off by default is no conversion in the default run
    ("batchnorm-without-sync",
     "import argparse\np = argparse.ArgumentParser()\np.add_argument('--sync-bn', action='store_true', default=True)\n"
     "opt = p.parse_args()\nif opt.sync_bn:\n    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\n"
     "model = DDP(model)\n",
     "import argparse\np = argparse.ArgumentParser()\np.add_argument('--sync-bn', action='store_true')\n"
     "opt = p.parse_args()\nif opt.sync_bn:\n    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\n"
     "model = DDP(model)\n"),
]


@pytest.mark.parametrize("rule,quiet,loud", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_batch3_classes(rule, quiet, loud):
    assert rule not in rules(quiet), rules(quiet)
    assert rule in rules(loud), rules(loud)


INFINITE = """
import torch
from torch.utils.data import DataLoader, DistributedSampler
class InfiniteDataLoader(DataLoader):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.iterator = super().__iter__()
    def __iter__(self):
        for _ in range(len(self)):
            yield next(self.iterator)
def make(ds):
    return {cls}(ds, sampler=DistributedSampler(ds), num_workers=8)
"""
TRAIN = """
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from loaders import make
dist.init_process_group('nccl')
torch.manual_seed(0)
model = DDP(Net())
loader = make(ds)
for epoch in range(3):
    loader.sampler.set_epoch(epoch)
    for x in loader:
        model(x).sum().backward()
"""


def test_set_epoch_on_a_loader_that_makes_its_iterator_once(tmp_path):
    """A DataLoader subclass that makes its iterator in __init__ (YOLOv5's InfiniteDataLoader): its workers
    prefetch the next epoch's indices before set_epoch (measured: epoch 1 repeats epoch 0 with 2 workers)."""
    late = _project(tmp_path / "late", {"loaders.py": INFINITE.format(cls="InfiniteDataLoader"), "train.py": TRAIN})
    fine = _project(tmp_path / "fine", {"loaders.py": INFINITE.format(cls="DataLoader"), "train.py": TRAIN})
    assert "set-epoch-late" in [f.rule for f in audit.audit_paths([late])]
    assert "set-epoch-late" not in [f.rule for f in audit.audit_paths([fine])]


def test_a_helper_behind_a_package_reexport_and_a_rank0_console_logger(tmp_path):
    """`from data import build_loader` (a package that re-exports data/build.py, or a folder without the
    __init__.py) reaches the sampler's module, so main.py's set_epoch counts; a logger whose helper adds the
    console handler on rank 0 alone logs rank 0's own loss."""
    files = {
        "data/build.py": "import torch\ndef build_loader(ds):\n"
                         "    s = torch.utils.data.DistributedSampler(ds)\n"
                         "    return torch.utils.data.DataLoader(ds, sampler=s)\n",
        "logger.py": "import logging, sys\ndef create_logger(out, dist_rank=0):\n    lg = logging.getLogger()\n"
                     "    if dist_rank == 0:\n        lg.addHandler(logging.StreamHandler(sys.stdout))\n"
                     "    lg.addHandler(logging.FileHandler(out))\n    return lg\n",
        "main.py": "import torch, torch.distributed as dist\n"
                   "from torch.nn.parallel import DistributedDataParallel as DDP\nfrom data import build_loader\n"
                   "from logger import create_logger\ndist.init_process_group('nccl')\ntorch.manual_seed(0)\n"
                   "logger = create_logger('log.txt', dist_rank=dist.get_rank())\nmodel = DDP(Net())\n"
                   "loader = build_loader(ds)\nfor epoch in range(3):\n    loader.sampler.set_epoch(epoch)\n"
                   "    for x in loader:\n        loss = model(x).sum()\n        loss.backward()\n"
                   "        logger.info(f'loss {loss.item()}')\n",
    }
    bare = _project(tmp_path / "bare", files)
    package = _project(tmp_path / "package", {**files, "data/__init__.py": "from .build import build_loader\n"})
    for root in (bare, package):
        found = {f.rule for f in audit.audit_paths([root])}
        assert "set-epoch-missing" not in found and "rank0-local-loss" in found, (root, found)
