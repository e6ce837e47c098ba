"""Issue 35, held-out batch 3 (tests/outside/heldout_labels.json, batch 3): each class of mistake the first look
showed, fixed as a class, with a script where the rule must stay quiet and one where it must fire (the same
style as test_audit.CLASS_CASES); and the project-level classes (a helper behind a package re-export, a logger
whose console is rank 0's) on small projects."""

import json
from pathlib import Path

import pytest
from test_audit import DDP_HEAD, _project, rules

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


# Issue 35, held-out batch 4: the classes its first look showed (docs/measured/cpu2/audit_heldout_batch4.txt)
CASES4 = [
    # pattern without consequence: a tensor made by a constructor (the sizes gathered before an all_gather of
    # pickled objects) has no autograd history, so gathering it loses no gradient
    ("gather-without-grad",
     "def sizes(t):\n    n = torch.tensor([t.numel()], device=t.device)\n"
     "    out = [torch.zeros_like(n) for _ in range(world_size)]\n    dist.all_gather(out, n)\n"
     "    return torch.cat(out)\n",
     "def feats(t):\n    n = head(t)\n    out = [torch.zeros_like(n) for _ in range(world_size)]\n"
     "    dist.all_gather(out, n)\n    return torch.cat(out)\n"
     "for x in loader:\n    (head(x) @ feats(x).T).mean().backward()\n"),  # (a helper no one calls: batch 13)
    # narrow recogniser: the fixed port sits in an option's default on this host, handed on as init_method; a
    # remote address as default has to be replaced before anything runs
    ("hard-coded-master-port",
     "import argparse\np = argparse.ArgumentParser()\np.add_argument('--init-method', default='tcp://10.0.0.5:23456')\n"
     "args = p.parse_args()\ndef launch(url):\n    dist.init_process_group('nccl', init_method=url)\n"
     "launch(args.init_method)\n",
     "import argparse\np = argparse.ArgumentParser()\np.add_argument('--init-method', default='tcp://localhost:23456')\n"
     "args = p.parse_args()\ndef launch(url):\n    dist.init_process_group('nccl', init_method=url)\n"
     "launch(args.init_method)\n"),
    # narrow recogniser: the wrapper reaches state_dict() through an alias, one arm of a choice ...
    ("save-without-module",
     "model = DDP(net)\nkeep = model.module if hasattr(model, 'module') else model\nif rank == 0:\n"
     "    torch.save(keep.state_dict(), 'm.pt')\n",
     "model = DDP(net)\nema = Ema(net)\nkeep = ema.shadow if use_ema else model\nif rank == 0:\n"
     "    torch.save(keep.state_dict(), 'm.pt')\n"),
    # ... or an attribute copy read in another method
    ("save-without-module",
     "class T:\n    def setup(self, net):\n        model = DDP(net)\n        self.model = model\n"
     "    def save(self):\n        if rank == 0:\n            torch.save(self.model.module.state_dict(), 'm.pt')\n",
     "class T:\n    def setup(self, net):\n        model = DDP(net)\n        self.model = model\n"
     "    def save(self):\n        if rank == 0:\n            torch.save(self.model.state_dict(), 'm.pt')\n"),
    # helper not followed: the step and the loss log are two hooks of one training loop; the losses are logged one
    # by one from their container
    ("rank0-local-loss",
     "def reduce_all(d):\n    for v in d.values():\n        dist.all_reduce(v)\n    return d\n"
     "class T:\n    def step_once(self, x):\n        self.losses = self.model(x)\n"
     "        self.losses['total'].backward()\n        self.opt.step()\n"
     "    def log_after(self):\n        losses = reduce_all(self.losses)\n        if rank == 0:\n"
     "            for k, v in losses.items():\n                writer.add_scalar(k, v.item())\n"
     "    def run(self, loader):\n        for x in loader:\n            self.step_once(x)\n"
     "            self.log_after()\n",
     "class T:\n    def step_once(self, x):\n        self.losses = self.model(x)\n"
     "        self.losses['total'].backward()\n        self.opt.step()\n"
     "    def log_after(self):\n        loss_meter = self.losses\n        if rank == 0:\n"
     "            for k, v in loss_meter.items():\n                writer.add_scalar(k, v.item())\n"
     "    def run(self, loader):\n        for x in loader:\n            self.step_once(x)\n"
     "            self.log_after()\n"),
]


def test_an_audited_files_own_invalid_escapes_raise_no_warning():
    """VL-T5's `re.compile('\\d+')` written without r'': Python warns when it parses the file; the audit's parse must
    not pass that warning on to the user auditing the project (nor fail under -W error)."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        audit.audit_source('import re\npat = re.compile("\\d+")\n')


def test_a_file_with_a_byte_order_mark_is_read(tmp_path):
    """Python runs a source file saved with a UTF-8 byte-order mark; the audit read it as text that ast.parse
    rejects (U+FEFF) and stopped on the whole project."""
    (tmp_path / "train.py").write_bytes(b"\xef\xbb\xbf" + (
        b"import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
        b"dist.init_process_group('nccl')\ntorch.manual_seed(1 * dist.get_world_size() + dist.get_rank())\n"
        b"model = DDP(Net())\n"))
    assert "seed-per-rank" in {f.rule for f in audit.audit_paths([tmp_path])}


EVAL_HELPER = {
    "loaders.py": "import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\n"
                  "def make_loader(ds, split, log_interval=10):\n    s = DistributedSampler(ds)\n"
                  "    return DataLoader(ds, sampler=s, drop_last=False)\n",
    "train.py": "import torch, torch.distributed as dist\n"
                "from torch.nn.parallel import DistributedDataParallel as DDP\nfrom loaders import make_loader\n"
                "dist.init_process_group('nccl')\ntorch.manual_seed(0)\n"
                "model = DDP(Net())\ndef evaluate(loader):\n    for x, y in loader:\n"
                "        acc = (model(x).argmax(1) == y).float().mean()\n        dist.all_reduce(acc)\n"
                "train_loader = make_loader(ds, 'train', log_interval=5)\n{val}"
                "for epoch in range(3):\n    train_loader.sampler.set_epoch(epoch)\n    for x, y in train_loader:\n"
                "        model(x).sum().backward()\n    evaluate({which})\n",
}


def test_an_evaluation_sampler_made_in_a_generic_helper(tmp_path):
    """A helper makes every split's DistributedSampler; a caller asking it for 'val' makes it an evaluation
    sampler that pads (the name of the helper's variables says nothing); 'train' (with an `interval` argument,
    no evaluation word) does not."""
    def found(name, val, which):
        files = {**EVAL_HELPER, "train.py": EVAL_HELPER["train.py"].format(val=val, which=which)}
        return {(f.rule, Path(place).name) for f in audit.audit_paths([_project(tmp_path / name, files)])
                for place in (f.path, *(path for path, _ in f.related))}  # the finding or its related place
    loud = found("loud", "val_loader = make_loader(ds_val, 'val')\n", "val_loader")
    quiet = found("quiet", "", "train_loader")
    assert ("eval-padding-duplicates", "loaders.py") in loud, loud
    assert not {r for r, _ in quiet} & {"eval-padding-duplicates"}, quiet


def test_a_helper_that_builds_both_splits_and_an_evaluation_beside_the_step(tmp_path):
    """What the batch-4 fixes must not take in (batches 1-3 showed both): the training sampler of a helper that
    also builds the validation one (`sampler_train` is no evaluation sampler because its caller unpacks a
    `loader_val` too); and a rank-0 evaluation called in the epoch loop next to the training function, whose loss
    is no training loss."""
    root = _project(tmp_path, {
        "build.py": "from torch.utils.data import DataLoader, DistributedSampler\ndef build(ds_train, ds_val):\n"
                    "    sampler_train = DistributedSampler(ds_train)\n"
                    "    return DataLoader(ds_train, sampler=sampler_train), DataLoader(ds_val)\n",
        "main.py": "import torch, torch.distributed as dist\n"
                   "from torch.nn.parallel import DistributedDataParallel as DDP\nfrom build import build\n"
                   "dist.init_process_group('nccl')\ntorch.manual_seed(0)\nmodel = DDP(Net())\n"
                   "loader_train, loader_val = build(a, b)\n"
                   "def train_epoch(loader):\n    for x in loader:\n        loss = model(x).sum()\n"
                   "        loss = reduce_mean(loss)\n        loss.backward()\n        opt.step()\n"
                   "def evaluate(loader):\n    for x in loader:\n        acc = model.module(x).mean()\n"
                   "        dist.all_reduce(acc)\n        if dist.get_rank() == 0:\n"
                   "            loss = model.module(x).sum()\n            print('val loss', loss.item())\n"
                   "for epoch in range(3):\n    loader_train.sampler.set_epoch(epoch)\n"
                   "    train_epoch(loader_train)\n    evaluate(loader_val)\n",
    })
    found = {f.rule for f in audit.audit_paths([root])}
    assert not found & {"eval-padding-duplicates", "rank0-local-loss"}, found


# Issue 35, held-out batch 5: the classes its looks showed (docs/measured/cpu2/audit_heldout_batch5.txt)
STEP_LOOP = ("opt = torch.optim.SGD(params)\nwarm = PolynomialLRWarmup(optimizer=opt)\n"
             "for i, (x, y) in enumerate(loader):\n    loss = crit(model(x), y)\n    loss.backward()\n")
RANK0_EVAL = ("model = DDP(Net())\ndef evaluate(net, loader):\n    total = 0\n    for x, y in loader:\n"
              "        total += crit(net.module(x), y).item()\n    return total / len(loader)\n"
              "def main():\n    min_loss = np.inf\n{val}    for epoch in range(3):\n        for x, y in train_loader:\n"
              "            loss = reduce_mean(crit(model(x), y))\n            loss.backward()\n            opt.step()\n"
              "        if rank == 0:\n            val_loss = evaluate(model, val_loader)\n"
              "            if val_loss < min_loss:\n                min_loss = val_loss\n"
              "            print(f'val {{val_loss}} best {{min_loss}}')\nmain()\n")
HANDED = ("def evaluate(net, loader):\n    {unwrap}for x in loader:\n        out = net(x)\n    return out\n"
          "model = DDP(Net())\nfor epoch in range(3):\n    for x in loader:\n        model(x).sum().backward()\n"
          "    if rank == 0:\n        evaluate(model, val_loader)\n")
CASES5 = [
    # a name is the DDP wrapper only where its wrapping assignment has run: a rank-0 reference forward of the
    # plain model before `model = DDP(model)` broadcasts nothing (a loop that holds the wrap reaches round again)
    ("ddp-forward-under-rank0",
     "def main():\n    model = Net()\n    if rank == 0:\n        out = model(x)\n    model = DDP(model)\n"
     "    for x in loader:\n        model(x).sum().backward()\nmain()\n",
     "def main():\n    model = Net()\n    for epoch in range(3):\n        if rank == 0:\n            out = model(x)\n"
     "        model = DDP(model)\n        for x in loader:\n            model(x).sum().backward()\nmain()\n"),
    # a value rank 0 computes alone over an unsharded loader (a project function called under the rank-0 guard)
    # is the single run's number, and so is the best of it; with a DistributedSampler's loader it is rank 0's share
    ("rank0-local-loss",
     RANK0_EVAL.format(val="    val_loader = DataLoader(val_set, sampler=SequentialSampler(val_set))\n"),
     RANK0_EVAL.format(val="    vs = DistributedSampler(val_set)\n    val_loader = DataLoader(val_set, sampler=vs)\n")),
    # an lr schedule's step() outside the accumulation gate moves no parameter: the optimizer step is still gated
    ("accumulation-without-no-sync",
     STEP_LOOP + "    opt.step()\n    opt.zero_grad()\n    if i % cfg.every == 0:\n        warm.step()\n",
     STEP_LOOP + "    if i % cfg.acc == 0:\n        opt.step()\n        opt.zero_grad()\n    warm.step()\n"),
    # rank 0 alone hands the wrapper to a project function that calls it: the forward runs under rank 0's guard
    # all the same; not when the function (or the caller) unwraps it first
    ("ddp-forward-under-rank0", HANDED.format(unwrap="net = net.module\n    "), HANDED.format(unwrap="")),
    ("ddp-forward-under-rank0", HANDED.format(unwrap="").replace("evaluate(model,", "evaluate(model.module,"),
     HANDED.format(unwrap="")),
]


def test_a_wrapper_handed_on_by_every_rank_or_one_that_broadcasts_nothing():
    """What the handed-on forward (CASES5) must not take in (batch 1's glow-tts showed both): a function every
    rank calls, rank 0 in its branch with a logger and the others in the else; and a wrapper whose forward
    broadcasts no buffer (apex's DistributedDataParallel, or broadcast_buffers=False)."""
    both = HANDED.format(unwrap="") + "    else:\n        evaluate(model, None)\n"
    apex = HANDED.format(unwrap="").replace("model = DDP(Net())", "from apex.parallel import "
                                            "DistributedDataParallel as ADDP\nmodel = ADDP(Net())")
    off = HANDED.format(unwrap="").replace("DDP(Net())", "DDP(Net(), broadcast_buffers=False)")
    for quiet in (both, apex, off):
        assert "ddp-forward-under-rank0" not in rules(quiet), quiet


SUM_LOSS_FSDP = (
    "import torch, torch.distributed as dist\nfrom torch.distributed.fsdp import fully_shard\n"
    "dist.init_process_group('nccl')\nmodel = Net()\nfor block in model.layers:\n    fully_shard(block)\n"
    "fully_shard(model)\n{divide}opt = torch.optim.AdamW(model.parameters())\nfor x, y in loader:\n"
    "    loss = torch.nn.functional.cross_entropy(model(x), y, reduction='sum')\n"
    "    loss.backward()\n    opt.step()\n    opt.zero_grad()\n")


def test_a_sum_loss_under_fsdp_with_its_gradient_division_turned_off():
    """A sum loss is 1/world_size of the single run's only where the reduction over ranks averages (DDP, FSDP2 by
    default). A project that sets FSDP2's divide factor (torchtitan: set_gradient_divide_factor(1.0), the ranks'
    gradients summed) breaks that consequence: no finding; the same project without it: the finding."""
    quiet = SUM_LOSS_FSDP.format(divide="model.set_gradient_divide_factor(1.0)\n")
    assert "sum-loss-unscaled" not in rules(quiet), rules(quiet)
    assert "sum-loss-unscaled" in rules(SUM_LOSS_FSDP.format(divide="")), rules(SUM_LOSS_FSDP.format(divide=""))


# Held-out batch 6's classes (tests/outside/heldout_labels.json, batch 6; its first look 0.56 / 0.45 in
# docs/results.md): each failing before its fix, written as generic code.
GLOBAL_FORWARD = ("model = DDP(Net())\ndef estimate():\n    {local}out = []\n    for k in range(10):\n"
                  "        out.append(model(x).item())\n    return sum(out) / len(out)\n"
                  "for step in range(100):\n    loss = crit(model(x), y)\n    loss.backward()\n    opt.step()\n"
                  "    if step % 10 == 0 and rank == 0:\n        est = estimate()\n        print('estimate', est)\n")
OBJECT_GATHER = (
    "import pickle\ndef gather_list(data):\n    buf = torch.ByteTensor(list(pickle.dumps(data)))\n"
    "    dist.all_reduce(buf)\n    return [pickle.loads(bytes(buf))]\n"
    "{no_grad}def {name}(q, ctx):\n    sent = [q.detach().cpu(), ctx.detach().cpu()]\n    got = gather_list(sent)\n"
    "    all_q, all_ctx = [], []\n    for i, (rq, rctx) in enumerate(got):\n        if i != rank:\n"
    "            all_q.append(rq)\n            all_ctx.append(rctx)\n        else:\n"
    "            all_q.append(q)\n            all_ctx.append(ctx)\n"
    "    scores = torch.cat(all_q) @ torch.cat(all_ctx).T\n    return scores\n"
    "model = DDP(Net())\nfor x in loader:\n    q, ctx = model(x)\n    out = {name}(q, ctx)\n")
CASES6 = [
    # a function that reads the script's global wrapper, called by rank 0 alone, runs the wrapper on rank 0 alone
    ("ddp-forward-under-rank0", GLOBAL_FORWARD.format(local="model = Net()\n    "), GLOBAL_FORWARD.format(local="")),
    # rank 0's own estimate over its own batches is the single run's kind of number; a local of the helper that
    # happens to share the logged name is another variable
    ("rank0-local-loss",
     "def estimate():\n    losses = torch.zeros(10)\n    for k in range(10):\n        losses[k] = crit(model(x), y)\n"
     "    return losses.mean()\nmodel = DDP(Net())\nfor step in range(100):\n    loss = crit(model(x), y)\n"
     "    loss.backward()\n    opt.step()\n    if rank == 0:\n        losses = estimate()\n"
     "        print('est', losses)\n",
     "model = DDP(Net())\nfor step in range(100):\n    loss = crit(model(x), y)\n    loss.backward()\n"
     "    opt.step()\n    if rank == 0:\n        losses = loss.item()\n        print('loss', losses)\n"),
    # a port that is a parameter's default no caller replaces is a fixed port
    ("hard-coded-master-port",
     "def init(port=29500):\n    os.environ['MASTER_PORT'] = str(port)\n    dist.init_process_group('gloo')\n"
     "init(port=int(os.environ.get('PORT', 0)) or 29500 + os.getpid() % 1000)\n",
     "def init(port=29500):\n    os.environ['MASTER_PORT'] = str(port)\n    dist.init_process_group('gloo')\n"
     "init()\n"),
    # the learning rate scaled by a global batch built from the GPU count under another name; not by a per-GPU
    # batch divided from the global one
    ("lr-grows-with-world-size",
     "bs = int(args.batch_size / dist.get_world_size())\nargs.lr = args.lr * bs / 256\n",
     "num_tasks = utils.get_world_size()\ntotal = args.batch_size * num_tasks\nargs.lr = args.lr * total / 256\n"),
    # in-batch negatives exchanged as pickled, detached copies with the rank's own slot put back live
    ("gather-without-grad", OBJECT_GATHER.format(name="loss_fn", no_grad="@torch.no_grad()\n"),
     OBJECT_GATHER.format(name="loss_fn", no_grad="")),
    # a flag copied from a rank-0 test says what the test says (`log_ok = chief`), not `if local_rank:`
    ("rank0-local-loss",
     "chief = rank == 0\nlog_ok = chief\nmodel = DDP(Net())\nfor x, y in loader:\n"
     "    loss = crit(model(x), y)\n    loss.backward()\n    opt.step()\n    red = reduce_mean(loss)\n"
     "    if log_ok:\n        print('loss', red.item())\n",
     "chief = rank == 0\nlog_ok = chief\nmodel = DDP(Net())\nfor x, y in loader:\n"
     "    loss = crit(model(x), y)\n    loss.backward()\n    opt.step()\n    if log_ok:\n"
     "        print('loss', loss.item())\n"),
    # a name printed outside a loop is not the loop's loss variable of the same name elsewhere in the function
    ("every-rank-prints-loss",
     "def train(cfg):\n    print(f'training {cfg.name}')\n    for x, y in loader:\n"
     "        losses = {'ce': crit(model(x), y)}\n        losses['ce'].backward()\n        opt.step()\n"
     "        if rank == 0:\n            log({name: v.item() for name, v in losses.items()})\ntrain(cfg)\n",
     "def train(cfg):\n    print(f'training {cfg.name}')\n    for x, y in loader:\n"
     "        losses = {'ce': crit(model(x), y)}\n        losses['ce'].backward()\n        opt.step()\n"
     "        for name, l in losses.items():\n            print(name, l.item())\ntrain(cfg)\n"),
]


def test_a_seed_at_the_top_of_an_imported_helper_module(tmp_path):
    """A helper module that seeds torch at its top level seeds every process that imports it: no no-seed; the
    same project with the seed inside a function nobody calls: no-seed."""
    files = {"train.py": "import torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel "
             "as DDP\nfrom engine import run\ndist.init_process_group('gloo')\nmodel = DDP(Net())\nrun(model)\n",
             "engine.py": "import torch\ntorch.manual_seed(0)\ndef run(model):\n    pass\n"}
    assert "no-seed" not in {f.rule for f in audit.audit_paths([_project(tmp_path / "a", files)])}
    files["engine.py"] = "import torch\ndef unused():\n    torch.manual_seed(0)\ndef run(model):\n    pass\n"
    assert "no-seed" in {f.rule for f in audit.audit_paths([_project(tmp_path / "b", files)])}


def test_a_loss_a_subclass_returns_to_the_base_class_loop(tmp_path):
    """`losses = self.train_on_batch(batch)` in a base Trainer whose subclass (another file) defines it and runs
    backward: the loop trains, so rank 0's print of those losses is its own micro-batch's."""
    files = {"base.py": "class Trainer:\n    def train(self):\n        for batch in self.loader:\n"
             "            losses = self.train_on_batch(batch)\n            if self.rank == 0:\n"
             "                print('losses', losses)\n    def train_on_batch(self, batch):\n"
             "        raise NotImplementedError\n",
             "mine.py": "from base import Trainer\nclass MyTrainer(Trainer):\n    def train_on_batch(self, batch):\n"
             "        loss = self.model(batch).mean()\n        loss.backward()\n        self.opt.step()\n"
             "        return {'loss': loss}\n",
             "run.py": "import torch, torch.distributed as dist\nfrom torch.nn.parallel import "
             "DistributedDataParallel as DDP\nfrom mine import MyTrainer\ntorch.manual_seed(0)\n"
             "dist.init_process_group('gloo')\nt = MyTrainer()\nt.rank = dist.get_rank()\n"
             "t.model = DDP(Net())\nt.train()\n"}
    found = audit.audit_paths([_project(tmp_path, files)])
    assert any(f.rule == "rank0-local-loss" and f.path.endswith("base.py") for f in found), found


def test_a_meter_printed_in_the_loop_header_is_reported_where_the_loss_is_fed():
    """`for b in meter.log_every(loader)` prints what `meter.update(loss=...)` fed it: the finding names the
    update line, the one to change."""
    body = ("import builtins\nbuiltins.print = quiet\nclass MetricLogger:\n    def update(self, **kw):\n"
            "        self.kw = kw\n    def log_every(self, it, n):\n        for x in it:\n            print(self.kw)\n"
            "            yield x\nmeter = MetricLogger()\nmodel = DDP(Net())\n"
            "for x, y in meter.log_every(loader, 10):\n    loss = crit(model(x), y)\n    loss.backward()\n"
            "    opt.step()\n    meter.update(loss=loss.item())\n")
    found = [f for f in audit.audit_source(DDP_HEAD + "torch.manual_seed(0)\n" + body) if f.rule == "rank0-local-loss"]
    src = (DDP_HEAD + "torch.manual_seed(0)\n" + body).splitlines()
    assert len(found) == 1 and "meter.update(loss=" in src[found[0].line - 1], found


def test_a_helper_collective_reached_only_under_the_switch_through_another_helper():
    """`reduce()` runs dist.all_reduce; `gather()` calls it; the loss calls gather() only `if world_size > 1:`:
    no single-process run reaches it. Called unconditionally, the single-process run raises."""
    head = "import torch.distributed as dist\nif args.distributed:\n    dist.init_process_group('gloo')\n"
    body = ("def reduce(t):\n    return dist.all_reduce(t)\ndef gather(t):\n    reduce(t)\n    return t\n"
            "def loss_fn(x):\n{call}    return x.sum()\nloss_fn(x)\n")
    assert "collective-outside-switch" not in rules(body.format(call="    if world_size > 1:\n        x = gather(x)\n"),
                                                    head)
    assert "collective-outside-switch" in rules(body.format(call="    x = gather(x)\n"), head)


# Issue 35, held-out batch 7 (CMGAN, GMFlow, PyG multi-GPU, BLIP, timm, Point-MAE, CleanRL PPO): the classes its
# first look showed, each written in code of its own
SWITCHED_HEAD = """
import os, logging, argparse, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
def init_mode(args):
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        args.rank = int(os.environ["RANK"])
    elif "SLURM_PROCID" in os.environ:
        args.rank = int(os.environ["SLURM_PROCID"])
    else:
        args.distributed = False
        return
    args.distributed = True
    dist.init_process_group("nccl")
init_mode(args)
torch.manual_seed(0)
"""
# (the wrap under the switch too: an unconditional DDP(...) is itself a collective outside it)
EPOCHS = ("model = Net()\nif args.distributed:\n    model = DDP(model)\nfor epoch in range(3):\n    for x in loader:\n"
          "        model(x).sum().backward()\n")
GATHER = ("class Gather(torch.autograd.Function):\n    @staticmethod\n    def forward(ctx, x):\n"
          "        out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]\n        dist.all_gather(out, x)\n"
          "        return tuple(out)\n    @staticmethod\n    def backward(ctx, *g):\n"
          "        g = torch.stack(g)\n        dist.all_reduce(g)\n        return g[dist.get_rank()]\n"
          "def gather_with_grad(x):\n{early}    return torch.cat(Gather.apply(x))\n")
GROUP_CHECK = ("def group_up():\n    return dist.is_available() and dist.is_initialized()\n"
               "def sync_meter(t):\n{early}    dist.all_reduce(t)\n    return t\n")
PERSISTENT = ("class Forever(DataLoader):\n    def __init__(self, *a, **k):\n        super().__init__(*a, **k)\n"
              "        self.it = super().__iter__()\n"
              "def make(ds, keep_workers=False):\n    cls = DataLoader\n    if keep_workers:\n        cls = Forever\n"
              "    return cls(ds, sampler=DistributedSampler(ds), num_workers=4)\n"
              "parser.add_argument('--keep-workers', action='store_true')\n"
              "loader = make(ds, keep_workers={arg})\nmodel = DDP(Net())\nfor epoch in range(3):\n"
              "    loader.sampler.set_epoch(epoch)\n    for x in loader:\n        model(x).sum().backward()\n")
FEATURES = ("def gather(t):\n    out = [torch.zeros_like(t) for _ in range(world_size)]\n    dist.all_gather(out, t)\n"
            "    return torch.cat(out)\nmodel = DDP(Net())\n"
            "def probe(loader):\n    feats = [model.module.encode(x).detach() for x in loader]\n"
            "    return gather(torch.cat(feats))\n"
            "def fit(loader):\n    for x in loader:\n        z = {what}\n        loss = z.sum()\n"
            "        loss.backward()\n"
            "        opt.step()\n")
SYNC_FLAG = ("parser.add_argument('--sync-bn', action='store_true')\nmodel = Net()\n"
             "if args.distributed and args.sync_bn:\n    if args.apex:\n        model = convert_syncbn_model(model)\n"
             "    else:\n        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\n"
             "model = DDP(model)\n")
METER = ("class Board:\n    def __init__(self, writer):\n        self.writer, self.seen = writer, {{}}\n"
         "    def push(self, stats):\n        self.seen.update(stats)\n        self.flush()\n"
         "    def flush(self):\n        for k, v in self.seen.items():\n            print(k, v)\n"
         "board = Board(None)\nmodel = DDP(Net())\nfor x in loader:\n    loss = model(x).sum()\n    stats = {{}}\n"
         "    stats.update({{'total_loss': {value}}})\n    loss.backward()\n    opt.step()\n"
         "    if rank == 0:\n        board.push(stats)\n")
RETURNED = ("model = DDP(Net())\ndef one_epoch(loader):\n    acc = 0.0\n    for x in loader:\n"
            "        loss = model(x).mean()\n        loss.backward()\n        opt.step()\n"
            "        acc += loss.item()\n    {ret}\nfor epoch in range(3):\n    mae = one_epoch(loader)\n"
            "    if rank == 0:\n        print(f'epoch {{epoch}} train {{mae:.4f}}')\n")
LR_SCALED = ("parser.add_argument('--lr', type=float, default=None)\nif not args.lr:\n"
             "    global_batch = args.batch_size * {world}\n    ratio = global_batch / 256\n"
             "    ratio = ratio ** 0.5\n    args.lr = args.base_lr * ratio\n")
CASES7 = [
    # a switch value misread: the group is set up after a chain of launcher-environment tests whose last arm returns
    # (DeiT's init_distributed_mode), as under `if args.distributed:`; a barrier after it outside any switch raises
    # in the single-process run
    ("collective-outside-switch", EPOCHS + "    if args.distributed:\n        dist.barrier()\n",
     EPOCHS + "    dist.barrier()\n", SWITCHED_HEAD),
    # an autograd.Function's forward runs where `.apply` is called: after `if world_size == 1: return x` it is
    # switched as much as its caller
    ("collective-outside-switch",
     GATHER.format(early="    if dist.get_world_size() == 1:\n        return x\n") + EPOCHS,
     GATHER.format(early="") + EPOCHS, SWITCHED_HEAD),
    # a fact in a helper: `if not group_up(): return`, the helper asking dist.is_initialized()
    ("collective-outside-switch",
     GROUP_CHECK.format(early="    if not group_up():\n        return t\n") + EPOCHS + "    sync_meter(t)\n",
     GROUP_CHECK.format(early="") + EPOCHS + "    sync_meter(t)\n", SWITCHED_HEAD),
    # a sampler made in a helper that is only called under the switch is no sampler "built either way"
    ("set-epoch-missing",
     "def samplers(ds):\n    return [DistributedSampler(ds)]\nif args.distributed:\n    s = samplers(ds)[0]\n"
     "else:\n    s = None\nfor epoch in range(3):\n    if args.distributed:\n        s.set_epoch(epoch)\n",
     "def samplers(ds):\n    return [DistributedSampler(ds)]\ns = samplers(ds)[0]\n"
     "for epoch in range(3):\n    if args.distributed:\n        s.set_epoch(epoch)\n"),
    # a persistent loader class the default run never picks (a parameter off by default, fed a store_true flag)
    ("set-epoch-late", PERSISTENT.format(arg="args.keep_workers"), PERSISTENT.format(arg="True")),
    # consequence gating: a gather helper only evaluation code calls (no backward, no step) feeds no gradient
    ("gather-without-grad", FEATURES.format(what="model(x)"), FEATURES.format(what="gather(model(x))")),
    # a narrow recogniser: BatchNorm1d under an import alias
    ("batchnorm-without-sync",
     "from torch.nn import BatchNorm1d as Norm\nmodel = torch.nn.Sequential(torch.nn.Linear(4, 4), Norm(4))\n"
     "model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\nmodel = DDP(model)\n",
     "from torch.nn import BatchNorm1d as Norm\nmodel = torch.nn.Sequential(torch.nn.Linear(4, 4), Norm(4))\n"
     "model = DDP(model)\n"),
    # a switch read through every enclosing if: the flag gates the conversion two ifs up
    ("batchnorm-without-sync", SYNC_FLAG.replace("args.distributed and args.sync_bn", "args.distributed"),
     SYNC_FLAG),
    # the root logger: logging.info on every rank prints every rank's loss, unless its console is rank 0's
    ("every-rank-prints-loss",
     "if rank == 0:\n    logging.basicConfig(level=logging.INFO)\n" + LOOP
     + "    logging.info(f'loss {loss.item()}')\n",
     "logging.basicConfig(level=logging.INFO)\n" + LOOP + "    logging.info(f'loss {loss.item()}')\n"),
    # a fact in an object: the board prints in a method its push calls
    ("rank0-local-loss", METER.format(value="reduce_mean(loss).item()"), METER.format(value="loss.item()")),
    # meaning, not a name: what a training function returns is its running loss, whatever the caller calls it
    ("rank0-local-loss", RETURNED.format(ret="return reduce_mean(torch.tensor(acc / len(loader))).item()"),
     RETURNED.format(ret="return acc / len(loader)")),
    # a world-size factor carried through a ratio and a root (`ratio = global_batch / 256`) still scales the lr
    ("lr-grows-with-world-size", LR_SCALED.format(world="args.grad_accum"),
     LR_SCALED.format(world="args.world_size * args.grad_accum")),
    # a library's wrapper named as torch.load's maps like torch.load
    ("load-without-map-location",
     "from somelib import fs\nckpt = fs.torch_load(checkpoint_path, map_location='cpu')\n"
     "model.load_state_dict(ckpt['model'])\n",
     "from somelib import fs\nckpt = fs.torch_load(checkpoint_path)\nmodel.load_state_dict(ckpt['model'])\n"),
]


def test_a_helper_reached_through_a_package_folder_and_a_sampler_made_in_a_helper_file(tmp_path):
    """`from pkg import utils` ... `utils.reduce(x)`, the function in pkg/utils/comm.py (the package's __init__.py
    not in the copy): the helper is called only under the switch, so its all_reduce is no collective outside it.
    A shuffling DistributedSampler made in data/build.py that nothing gives set_epoch is reported in the script
    too, at the call that makes it (where the epoch loop and the fix are)."""
    files = {
        "pkg/utils/comm.py": "import torch.distributed as dist\ndef reduce(t, n):\n    t = t.clone()\n"
                             "    dist.all_reduce(t)\n    return t / n\n",
        "data/build.py": "from torch.utils.data import DataLoader, DistributedSampler\ndef build(ds):\n"
                         "    return DataLoader(ds, sampler=DistributedSampler(ds))\n",
        "train.py": "import os, torch, torch.distributed as dist\n"
                    "from torch.nn.parallel import DistributedDataParallel as DDP\nfrom pkg import utils\n"
                    "from data import build\nargs.distributed = 'RANK' in os.environ\nif args.distributed:\n"
                    "    dist.init_process_group('nccl')\n    model = DDP(Net())\ntorch.manual_seed(0)\n"
                    "loader = build(ds)\nfor epoch in range(3):\n{set_epoch}    for x in loader:\n"
                    "        loss = model(x).sum()\n        loss.backward()\n        if args.distributed:\n"
                    "            loss = utils.reduce(loss, 2)\n",
    }

    def found(name, set_epoch):
        files_ = {**files, "train.py": files["train.py"].format(set_epoch=set_epoch)}
        return {(f.rule, Path(f.path).name, f.line) for f in audit.audit_paths([_project(tmp_path / name, files_)])}
    loud = found("loud", "")
    quiet = found("quiet", "    loader.sampler.set_epoch(epoch)\n")
    assert not {r for r, _, _ in loud | quiet} & {"collective-outside-switch"}, loud
    assert ("set-epoch-missing", "train.py", 10) in loud, loud
    assert not {r for r, _, _ in quiet} & {"set-epoch-missing"}, quiet


def test_an_evaluation_sampler_chosen_by_a_switch_argument_and_batchnorm_in_a_model_file(tmp_path):
    """A loader helper that builds the training split's DistributedSampler under `if is_training:` and a padding
    one in the else: only the else is an evaluation sampler, and the script's line that asks for it (the
    `distributed=` argument that makes it distributed) is reported. The wrapped model's class holds BatchNorm in
    the blocks another file defines: the wrap is reported; with SyncBatchNorm, nothing."""
    files = {
        "loaders.py": "import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\n"
                      "class PaddedSampler(DistributedSampler):\n    pass\n"
                      "def create(ds, is_training=False, distributed=False):\n    sampler = None\n"
                      "    if distributed:\n        if is_training:\n            sampler = DistributedSampler(ds)\n"
                      "        else:\n            sampler = PaddedSampler(ds)\n"
                      "    return DataLoader(ds, sampler=sampler)\n",
        "blocks.py": "import torch.nn as nn\nclass Block(nn.Module):\n    def __init__(self, c):\n"
                     "        super().__init__()\n        self.norm = nn.BatchNorm2d(c)\n",
        "net.py": "import torch.nn as nn\nfrom blocks import Block\nclass Net(nn.Module):\n"
                  "    def __init__(self):\n        super().__init__()\n        self.body = Block(8)\n",
        "train.py": "import torch, torch.distributed as dist\n"
                    "from torch.nn.parallel import DistributedDataParallel as DDP\nfrom loaders import create\n"
                    "from net import Net\ndist.init_process_group('nccl')\ntorch.manual_seed(0)\n{sync}"
                    "model = DDP(Net().cuda())\ntrain_loader = create(ds, is_training=True, distributed=True)\n"
                    "loader_eval = create(ds_eval,\n                     is_training=False,\n"
                    "                     distributed=args.distributed)\n"
                    "def validate(loader):\n    for x, y in loader:\n"
                    "        acc = (model(x).argmax(1) == y).float().mean()\n        dist.all_reduce(acc)\n"
                    "for epoch in range(3):\n    train_loader.sampler.set_epoch(epoch)\n"
                    "    for x in train_loader:\n        model(x).sum().backward()\n    validate(loader_eval)\n",
    }

    def found(name, sync):
        files_ = {**files, "train.py": files["train.py"].format(sync=sync)}
        return {(f.rule, Path(f.path).name, f.line) for f in audit.audit_paths([_project(tmp_path / name, files_)])}
    loud = found("loud", "")
    assert ("eval-padding-duplicates", "train.py", 11) in loud, loud
    assert ("eval-padding-duplicates", "loaders.py", 9) not in loud, loud
    assert ("batchnorm-without-sync", "train.py", 7) in loud, loud
    quiet = found("quiet", "SYNC = torch.nn.SyncBatchNorm\n")
    assert not {r for r, _, _ in quiet} & {"batchnorm-without-sync"}, quiet


def test_no_seed_at_the_setup_helpers_call_in_the_flow():
    """An anchor where the defect is: when the group is set up in a small helper (`ddp_setup`: no loop, no wrap),
    the missing seed belongs in the flow that calls it and then builds the model, so no-seed names that call; an
    init_process_group in the training function itself stays the anchor."""
    helper = ("import os, torch, torch.distributed as dist\n"
              "from torch.nn.parallel import DistributedDataParallel as DDP\n"
              "def ddp_setup(rank, world_size):\n    os.environ['MASTER_ADDR'] = 'localhost'\n"
              "    dist.init_process_group('nccl', rank=rank, world_size=world_size)\n"
              "def main(rank, world_size):\n    ddp_setup(rank, world_size)\n    model = DDP(Net())\n"
              "    for x in loader:\n        model(x).sum().backward()\nif __name__ == '__main__':\n    main(0, 1)\n")
    inline = helper.replace("    ddp_setup(rank, world_size)\n", "    dist.init_process_group('nccl')\n").replace(
        "    dist.init_process_group('nccl', rank=rank, world_size=world_size)\n", "    pass\n")
    for src, text in ((helper, "ddp_setup(rank, world_size)"), (inline, "dist.init_process_group('nccl')")):
        lines = [f.line for f in audit.audit_source(src) if f.rule == "no-seed"]
        assert len(lines) == 1 and src.splitlines()[lines[0] - 1].strip() == text, (lines, src)
    # the wrap that broadcasts rank 0's unseeded init is where the consequence happens: its related place
    found = [f for f in audit.audit_source(helper) if f.rule == "no-seed"]
    assert [n for _, n in found[0].related] == [8], found


def test_a_log_over_several_lines_names_the_line_of_its_loss_value():
    """`print(f"Epoch {epoch}, "\n f"Train MAE: {train_mae}")` by rank 0: the finding stays at the call and names
    the line that holds the unreduced value as its related place (a reader, or SARIF, lands on the value)."""
    src = DDP_HEAD + "torch.manual_seed(0)\nmodel = DDP(Net())\nfor epoch in range(3):\n" \
        "    loss = model(x).mean()\n    loss.backward()\n    if rank == 0:\n" \
        "        print(f'Epoch {epoch}, '\n              f'loss: {loss.item():.4f}')\n"
    found = [f for f in audit.audit_source(src) if f.rule == "rank0-local-loss"]
    lines = src.splitlines()
    assert len(found) == 1 and lines[found[0].line - 1].strip().startswith("print("), found
    assert [lines[n - 1].strip() for _, n in found[0].related] == ["f'loss: {loss.item():.4f}')",
                                                                   "if rank == 0:"], found  # (and rank 0's guard)


def test_a_helper_sampler_reported_in_the_script_only_where_its_epoch_loop_is(tmp_path):
    """What the script-side set-epoch-missing (above) must not take in (batch 6's ZoeDepth): a script that builds
    the loader through the helper and hands it to a trainer whose epoch loop lives in another file; the helper's
    own line stays the finding."""
    root = _project(tmp_path, {
        "data.py": "from torch.utils.data import DataLoader, DistributedSampler\ndef build(ds):\n"
                   "    return DataLoader(ds, sampler=DistributedSampler(ds))\n",
        "trainer.py": "def fit(model, loader):\n    for epoch in range(3):\n        for x in loader:\n"
                      "            model(x).sum().backward()\n",
        "train.py": "import torch, torch.distributed as dist\n"
                    "from torch.nn.parallel import DistributedDataParallel as DDP\nfrom data import build\n"
                    "from trainer import fit\ndist.init_process_group('nccl')\ntorch.manual_seed(0)\n"
                    "fit(DDP(Net()), build(ds))\n",
    })
    found = {(f.rule, Path(f.path).name) for f in audit.audit_paths([root])}
    assert ("set-epoch-missing", "data.py") in found and ("set-epoch-missing", "train.py") not in found, found


# Held-out batch 8's classes fixed in main (its first look 0.35 / 0.37 in docs/measured/cpu2/audit_heldout_batch8.txt);
# each failing before its fix.
PAD_SAMPLER = ("class EvalDistributedSampler(torch.utils.data.Sampler):\n    def __init__(self, ds, n, r):\n"
               "{body}    def __iter__(self):\n        return iter(self.idx)\n"
               "def evaluate(loader):\n    for x, y in loader:\n        s = model(x).sum()\n"
               "        dist.all_reduce(s)\n"
               "val_sampler = EvalDistributedSampler(val_set, world_size, rank)\n"
               "val_loader = DataLoader(val_set, sampler=val_sampler)\nevaluate(val_loader)\n")
VALIDATE = ("model = DDP(Net())\ndef train_epoch():\n    for x, y in loader:\n        loss = crit(model(x), y)\n"
            "        loss.backward()\n        opt.step()\n"
            "def {name}():\n    {ctx}for x, y in val_loader:\n        {ind}loss = crit(model(x), y)\n"
            "        {ind}if rank == 0:\n            {ind}print('val loss', loss.item())\n"
            "for epoch in range(3):\n    train_epoch()\n    {name}()\n")
CASES8_MAIN = [
    # a project sampler class pads only if its code does: contiguous, unpadded shards count nothing twice
    ("eval-padding-duplicates",
     PAD_SAMPLER.format(body="        seps = np.linspace(0, len(ds), n + 1, dtype=int)\n"
                             "        self.idx = range(seps[r], seps[r + 1])\n"),
     PAD_SAMPLER.format(body="        per = math.ceil(len(ds) / n)\n        idx = list(range(len(ds)))\n"
                             "        idx += idx[:per * n - len(idx)]\n        self.idx = idx[r::n]\n")),
    # a loss printed by rank 0 in an evaluation function the epoch loop calls next to training: `validate()`,
    # or any function whose loop runs under torch.no_grad()
    ("rank0-local-loss", VALIDATE.format(name="validate", ctx="", ind=""),
     VALIDATE.format(name="check", ctx="", ind="")),
    ("rank0-local-loss", VALIDATE.format(name="check", ctx="with torch.no_grad():\n        ", ind="    "),
     VALIDATE.format(name="check", ctx="", ind="")),
]


def test_one_seed_of_several_generators_is_one_finding():
    """`random.seed(s); np.random.seed(s); torch.manual_seed(s)` with a per-rank s that moves rank 0: one finding,
    at torch's seed (the model init's)."""
    body = ("import random\nimport numpy as np\ns = args.seed * world_size + rank\nrandom.seed(s)\n"
            "np.random.seed(s)\ntorch.manual_seed(s)\nmodel = DDP(Net())\n")
    found = [f for f in audit.audit_source(DDP_HEAD + body) if f.rule == "seed-per-rank"]
    assert len(found) == 1 and "torch.manual_seed" in (DDP_HEAD + body).splitlines()[found[0].line - 1], found


SAVE_PROJECT = {
    "train.py": "import argparse, torch, torch.distributed as dist\nfrom torch.nn.parallel import "
                "DistributedDataParallel as DDP\nfrom ckpt import save_checkpoint, reinit\ntorch.manual_seed(0)\n"
                "p = argparse.ArgumentParser()\np.add_argument('--reinit', default={default}, type=bool)\n"
                "args = p.parse_args()\ndist.init_process_group('gloo')\nmodel = DDP(Net())\n"
                "if args.reinit:\n    reinit(model)\nif dist.get_rank() == 0:\n    save_checkpoint(model, 'last.pt')\n",
    "ckpt.py": "import torch\ndef write_state(sd, path):\n    torch.save(sd, path)\n"
               "def save_checkpoint(model, path):\n    write_state(model.module.state_dict(), path)\n"
               "def reinit(model):\n    torch.save(model.module.state_dict(), 'init.pt')\n",
    "convert.py": "import torch\nsd = torch.load('a.pt', map_location='cpu')\n"
                  "torch.save(dict((k[7:], v) for k, v in sd.items()), 'b.pt')\n",
}


def test_saves_a_default_run_never_makes_on_every_rank(tmp_path):
    """No save-on-every-rank for a save helper's inner write (its call is judged where it is made), for a save
    reached only under an option off by default (`--reinit default=False`), or for a converter script that never
    runs with the distributed script; the same option on by default: every rank writes init.pt."""
    files = {k: v.format(default="False") for k, v in SAVE_PROJECT.items()}
    found = [f for f in audit.audit_paths([_project(tmp_path / "off", files)]) if f.rule == "save-on-every-rank"]
    assert found == [], found
    files["train.py"] = SAVE_PROJECT["train.py"].format(default="True")
    found = [f for f in audit.audit_paths([_project(tmp_path / "on", files)]) if f.rule == "save-on-every-rank"]
    assert [Path(f.path).name for f in found] == ["ckpt.py"], found


def test_an_import_from_a_source_folder_the_script_puts_on_sys_path(tmp_path):
    """`import _init_paths` (which adds lib/ to sys.path) then `from dataset import make_loader`: lib/dataset/
    is followed, so the script's `train_loader.sampler.set_epoch(epoch)` is the sampler's set_epoch."""
    files = {"tools/_init_paths.py": "import sys\nsys.path.insert(0, 'lib')\n",
             "tools/train.py": "import torch, torch.distributed as dist\nimport _init_paths\n"
                               "from torch.nn.parallel import DistributedDataParallel as DDP\n"
                               "from dataset import make_loader\ntorch.manual_seed(0)\n"
                               "dist.init_process_group('gloo')\nmodel = DDP(Net())\ntrain_loader = make_loader()\n"
                               "for epoch in range(3):\n    train_loader.sampler.set_epoch(epoch)\n"
                               "    for x in train_loader:\n        model(x).sum().backward()\n",
             "lib/dataset/build.py": "import torch\ndef make_loader():\n"
                                     "    s = torch.utils.data.distributed.DistributedSampler(ds)\n"
                                     "    return torch.utils.data.DataLoader(ds, sampler=s)\n"}
    found = audit.audit_paths([_project(tmp_path, files)])
    assert "set-epoch-missing" not in {f.rule for f in found}, found


LOG_STEP = ("import logging\nlogging.basicConfig(level=logging.DEBUG)\nmodel = DDP(Net())\n"
            "for i, (x, y) in enumerate(data):\n    loss = crit(model(x), y)\n    loss.backward()\n    opt.step()\n"
            "    if i % 10 == 0:\n        loss_sum = loss.detach().clone()\n        dist.all_reduce(loss_sum)\n"
            "        log_str = 'step {} '.format(i)\n        TEXTlogging.debug(log_str)\n")
NODE_RANK = ("import torch.multiprocessing as mp\nfrom config import cfg\n"
             "def worker(rank, args):\nWORKER    dist.init_process_group('nccl', rank=rank, world_size=2)\n"
             "    model = DDP(Net())\n    for i, (x, y) in enumerate(data):\n        loss = crit(model(x), y)\n"
             "        loss.backward()\n        opt.step()\n        if i % 10 == 0 and cfg.RANK == 0:\n"
             "            print('loss', loss.item())\n"
             "def main(args):\n    cfg.RANK = args.rank\n    mp.spawn(worker, nprocs=2, args=(args,))\n")
TV_HEAD = (DDP_HEAD + "import argparse\nimport torch.nn as nn\nimport torchvision.models as models\n"
           "torch.manual_seed(0)\n")
CASES8 = [
    # a torchvision model factory by name builds a BatchNorm model (the ResNet family) unless the name is a family
    # without BatchNorm (ViT, Swin, ConvNeXt, AlexNet, plain VGG): DDP without SyncBatchNorm normalises per rank
    ("batchnorm-without-sync",
     "p = argparse.ArgumentParser()\np.add_argument('--arch', default='vit_b_16')\nargs = p.parse_args()\n"
     "model = models.__dict__[args.arch]()\nmodel = DDP(model.cuda())\n",
     "p = argparse.ArgumentParser()\np.add_argument('--arch', default='resnet50')\nargs = p.parse_args()\n"
     "model = models.__dict__[args.arch](num_classes=10)\nmodel = DDP(model.cuda())\n", TV_HEAD),
    ("batchnorm-without-sync",
     "model = models.resnet50()\nmodel = nn.SyncBatchNorm.convert_sync_batchnorm(model)\nmodel = DDP(model)\n",
     "model = models.resnet50()\nmodel = DDP(model)\n", TV_HEAD),
    # a line of text built from the loss and logged through the root logger that every rank configures: each rank
    # logs its own loss
    ("every-rank-prints-loss", LOG_STEP.replace("TEXT", "log_str += 'loss {:.4f}'.format(loss_sum / 10)\n        "
                                                 "if rank == 0:\n            "),
     LOG_STEP.replace("TEXT", "log_str += 'loss {:.4f}'.format(loss.item())\n        ")),
    # a dict that carries the losses, logged by a key that is no loss (a setting read before the loop), logs no loss
    ("every-rank-prints-loss",
     "import logging\nlogging.basicConfig(level=logging.INFO)\ndef train(model, info):\n"
     "    logging.info('accumulating {} steps'.format(info['accum_grad']))\n    for x, y in data:\n"
     "        info = step(model, x, y, info)\n        info['loss_dict']['loss'].backward()\n        opt.step()\n"
     "def step(model, x, y, info):\n    loss_dict = {'loss': crit(model(x), y)}\n    info['loss_dict'] = loss_dict\n"
     "    return info\ntrain(DDP(Net()), {})\n",
     "import logging\nlogging.basicConfig(level=logging.INFO)\ndef train(model, info):\n    for x, y in data:\n"
     "        info = step(model, x, y, info)\n        info['loss_dict']['loss'].backward()\n        opt.step()\n"
     "        logging.info('loss {}'.format(info['loss_dict']['loss']))\n"
     "def step(model, x, y, info):\n    loss_dict = {'loss': crit(model(x), y)}\n    info['loss_dict'] = loss_dict\n"
     "    return info\ntrain(DDP(Net()), {})\n"),
    # a rank-0 guard on a config attribute that only the launching parent sets before mp.spawn: every spawned
    # worker re-imports the config with its default rank 0 and passes the guard
    ("every-rank-prints-loss", NODE_RANK.replace("WORKER", "    cfg.RANK = rank\n"), NODE_RANK.replace("WORKER", "")),
]


def test_batchnorm_in_a_model_built_by_a_factory_named_by_a_string(tmp_path):
    """`eval('models.' + cfg.NAME + '.get_net')(cfg)`: the model is whatever the project's get_net builds; when
    every get_net in the project builds BatchNorm, the DDP wrap without SyncBatchNorm normalises per rank. The
    same project whose net has no BatchNorm: nothing."""
    net = ("import torch.nn as nn\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
           "        self.c = nn.Conv2d(3, 8, 3)\n        self.n = nn.{norm}(8)\n"
           "def get_net(cfg):\n    return Net()\n")
    files = {"train.py": "import torch, torch.distributed as dist\nfrom torch.nn.parallel import "
             "DistributedDataParallel as DDP\nimport models\ndef main(cfg):\n    dist.init_process_group('nccl')\n"
             "    torch.manual_seed(0)\n    model = eval('models.' + cfg.NAME + '.get_net')(cfg)\n"
             "    model = DDP(model.cuda())\nif __name__ == '__main__':\n    main(None)\n",
             "models/__init__.py": "from . import net\n", "models/net.py": net.format(norm="GroupNorm")}
    assert "batchnorm-without-sync" not in {f.rule for f in audit.audit_paths([_project(tmp_path / "a", files)])}
    files["models/net.py"] = net.format(norm="BatchNorm2d")
    found = [(f.rule, f.line) for f in audit.audit_paths([_project(tmp_path / "b", files)])]
    assert ("batchnorm-without-sync", 8) in found, found


def test_a_meters_collective_when_the_group_exists_only_under_the_launchers_environment(tmp_path):
    """The group is made only past `elif "RANK" not in os.environ: return` (a later arm of an if/elif chain), so
    a meter's barrier/all_reduce with no group check, called at every epoch end, raises in the single-process
    run; the project's own `comm.barrier()` that tests the flag its setup sets True is no collective outside the
    switch, nor is the meter's once it checks dist.is_initialized()."""
    comm = ("import os, torch, torch.distributed as tdist\nready = False\ndef setup():\n    global ready\n"
            "    if not torch.cuda.is_available():\n        return\n    elif 'RANK' not in os.environ:\n"
            "        return\n    tdist.init_process_group('nccl')\n    ready = True\n"
            "def barrier():\n    if ready:\n        tdist.barrier()\n")
    meter = ("import torch, torch.distributed as tdist\nclass Meter:\n    def __init__(self):\n        self.n = 0\n"
             "    def sync(self):\n{check}        t = torch.tensor([self.n])\n        tdist.barrier()\n"
             "        tdist.all_reduce(t)\n        self.n = int(t[0])\n")
    files = {"comm.py": comm, "meter.py": meter.format(check="        if not tdist.is_initialized():\n"
                                                               "            return\n"),
             "train.py": "import torch\nimport comm\nfrom meter import Meter\ncomm.setup()\ncomm.barrier()\n"
             "torch.manual_seed(0)\nm = Meter()\nfor epoch in range(3):\n    m.n += 1\n    m.sync()\n"}
    found = [(f.rule, Path(f.path).name) for f in audit.audit_paths([_project(tmp_path / "a", files)])]
    assert not any(r == "collective-outside-switch" for r, _ in found), found
    files["meter.py"] = meter.format(check="")
    found = [(f.rule, Path(f.path).name, f.line) for f in audit.audit_paths([_project(tmp_path / "b", files)])]
    assert [x for x in found if x[0] == "collective-outside-switch"] == [
        ("collective-outside-switch", "meter.py", 7)], found


def test_a_trainers_loss_records_printed_through_a_root_logger_every_rank_gives_a_console(tmp_path):
    """A trainer class appends each step's loss.item() to self.stats and a hook method prints their mean through
    the root logger (`logger = getLogger()`); the project's create_logger adds the console handler on every
    rank: each rank prints its own unreduced loss. With the console handler added on rank 0 only: quiet."""
    log = ("import logging\ndef create_logger(path, rank):\n    console = logging.StreamHandler()\n"
           "    logger = logging.getLogger()\n    logger.handlers = []\n{guard}logger.addHandler(console)\n"
           "    return logger\n")
    files = {"trainer.py": "import numpy as np\nfrom logging import getLogger\nlogger = getLogger()\n"
             "class Trainer:\n    def __init__(self, model, opt):\n        self.model, self.opt = model, opt\n"
             "        self.stats = {'lm': []}\n    def step(self, x, y):\n        loss = crit(self.model(x), y)\n"
             "        self.opt.zero_grad()\n        loss.backward()\n        self.opt.step()\n"
             "        self.stats['lm'].append(loss.item())\n    def print_stats(self):\n"
             "        s_stat = ' || '.join('{}: {:.4f}'.format(k, np.mean(v)) for k, v in self.stats.items())\n"
             "        logger.info('it - ' + s_stat)\n",
             "train.py": "import os, torch, torch.distributed as dist\nfrom torch.nn.parallel import "
             "DistributedDataParallel as DDP\nfrom trainer import Trainer\nfrom log import create_logger\n"
             "dist.init_process_group('nccl')\nrank = int(os.environ['RANK'])\ncreate_logger('out.log', rank)\n"
             "torch.manual_seed(0)\nt = Trainer(DDP(Net()), opt)\nfor x, y in data:\n    t.step(x, y)\n"
             "    t.print_stats()\n",
             "log.py": log.format(guard="    if rank == 0:\n        ")}
    found = [(f.rule, Path(f.path).name) for f in audit.audit_paths([_project(tmp_path / "a", files)])]
    assert ("every-rank-prints-loss", "trainer.py") not in found, found
    files["log.py"] = log.format(guard="    ")
    found = [(f.rule, Path(f.path).name, f.line) for f in audit.audit_paths([_project(tmp_path / "b", files)])]
    assert ("every-rank-prints-loss", "trainer.py", 16) in found, found


def test_batchnorm_by_default_in_a_module_of_a_model_built_by_a_factory_these_files_lack(tmp_path):
    """The script hands `model = init_model(args)` (a project module that is not in the copy) to a helper that
    wraps it in DDP, and the project's conv module normalises with `norm='batch_norm'` by default: reported for a
    check by hand at the helper's call. The same project whose module defaults to layer_norm: nothing."""
    conv = ("import torch.nn as nn\nNORMS = {'batch_norm': nn.BatchNorm1d, 'layer_norm': nn.LayerNorm}\n"
            "class ConvModule(nn.Module):\n    def __init__(self, ch, norm: str = '{norm}'):\n"
            "        super().__init__()\n        self.norm = NORMS[norm](ch)\n")
    files = {"pkg/bin/train.py": "import torch, torch.distributed as dist\nfrom pkg.utils.init_model import "
             "init_model\nfrom pkg.utils.wrap import wrap_model\ndef main(args):\n    dist.init_process_group('nccl')\n"
             "    torch.manual_seed(0)\n    model, cfg = init_model(args)\n    model = wrap_model(args, model)\n"
             "if __name__ == '__main__':\n    main(None)\n",
             "pkg/utils/wrap.py": "import torch\ndef wrap_model(args, model):\n"
             "    return torch.nn.parallel.DistributedDataParallel(model.cuda())\n",
             "pkg/models/conv.py": conv.replace("{norm}", "layer_norm")}
    found = [f.rule for f in audit.audit_paths([_project(tmp_path / "a", files)])]
    assert "batchnorm-without-sync" not in found, found
    files["pkg/models/conv.py"] = conv.replace("{norm}", "batch_norm")
    found = [(f.rule, Path(f.path).name, f.line) for f in audit.audit_paths([_project(tmp_path / "b", files)])]
    assert ("batchnorm-without-sync", "train.py", 8) in found, found


# Held-out batch 9's classes (its first look 0.87 / 0.87 in docs/measured/cpu2/audit_heldout_batch9.txt); each
# failing before its fix.
def test_one_defect_in_a_helper_and_a_script_is_one_finding_naming_both(tmp_path):
    """A shuffling sampler made in a helper whose set_epoch the script's epoch loop never calls, and a padding
    evaluation sampler the script asks the helper for: one finding each (not one in the helper and one in the
    script), shown in the script, with the helper's line as its related place in the text, JSON and SARIF."""
    root = _project(tmp_path, {
        "data.py": "from torch.utils.data import DataLoader, DistributedSampler\ndef build(ds, train=True):\n"
                   "    if train:\n        return DataLoader(ds, sampler=DistributedSampler(ds))\n"
                   "    return DataLoader(ds, sampler=DistributedSampler(ds, shuffle=False))\n",
        "train.py": "import torch, torch.distributed as dist\n"
                    "from torch.nn.parallel import DistributedDataParallel as DDP\nfrom data import build\n"
                    "dist.init_process_group('nccl')\ntorch.manual_seed(0)\nmodel = DDP(Net())\n"
                    "loader = build(ds)\nval_loader = build(val_ds, train=False)\n"
                    "def validate():\n    for x, y in val_loader:\n"
                    "        acc = (model(x).argmax(1) == y).float().mean()\n        dist.all_reduce(acc)\n"
                    "for epoch in range(3):\n    for x in loader:\n        model(x).sum().backward()\n    validate()\n",
    })
    found = [f for f in audit.audit_paths([root]) if f.rule in ("set-epoch-missing", "eval-padding-duplicates")]
    where = sorted((f.rule, Path(f.path).name, f.line, tuple((Path(p).name, n) for p, n in f.related)) for f in found)
    # (the evaluation loop's reduction that counts the duplicates is the eval finding's second place; the epoch
    # loop's iteration of the loader, where every epoch repeats the first one's order, and that epoch loop, the
    # set_epoch finding's)
    assert where == [("eval-padding-duplicates", "train.py", 8, (("data.py", 5), ("train.py", 12))),
                     ("set-epoch-missing", "train.py", 7, (("data.py", 4), ("train.py", 14), ("train.py", 13)))], where
    sarif = json.loads(audit.to_sarif(found))["runs"][0]["results"]
    assert all(r["relatedLocations"][0]["physicalLocation"]["artifactLocation"]["uri"].endswith("data.py")
               for r in sarif), sarif
    assert all(d["related"][0]["file"].endswith("data.py") for d in json.loads(audit.to_json(found)))


FIT = ("from torch.utils.data import DataLoader, DistributedSampler\n"
       "val_loader = DataLoader(val_set, sampler=DistributedSampler(val_set, shuffle=False))\n"
       "def reduce_dict(d):\n    for v in d.values():\n        dist.all_reduce(v)\n    return d\n"
       "def train_one_epoch():\n    for x, y in loader:\n        loss = crit(model(x), y)\n        loss.backward()\n"
       "    return reduce_dict({{'loss': loss}})\n"
       "def fit():\n    for epoch in range(3):\n        train_stats = train_one_epoch()\n"
       "        test_stats = {{'acc': predict(val_loader)}}\n        for {loop}:\n"
       "            train_stats = train_one_epoch()\n"
       "fit()\n")
CASES9 = [
    # a loop over a results dict (RT-DETR's `for k in test_stats.keys()` in fit) is no evaluation loop: the
    # training epoch's reduction called in the same function does not make the evaluation reduce its metric
    # (RT-DETR's metric is the COCO evaluator, merged by image id)
    ("eval-padding-duplicates", FIT.format(loop="k in test_stats.keys()"), FIT.format(loop="x in val_loader")),
]


# Held-out batch 10's classes (its first look 0.91 / 0.56 in docs/measured/cpu2/audit_heldout_batch10.txt); each
# failing before its fix.
METER_LOOP = ("losses = AverageMeter()\nfor x, y in loader:\n    loss = crit(model(x), y)\n    opt.zero_grad()\n"
              "    loss.backward()\n    opt.step()\n    losses.update(loss.item(), x.size(0))\n{inside}"
              "loss_sum = torch.tensor([losses.sum])\ndist.all_reduce(loss_sum)\n"
              "losses.avg = loss_sum.item() / dist.get_world_size()\n{after}")
RECORD_LOOP = ("for step, (x, y) in enumerate(loader):\n    loss = crit(model(x), y)\n    opt.zero_grad()\n"
               "    loss.backward()\n    opt.step()\n{reduce}    scalars = {{}}\n"
               "    scalars['train/loss'] = loss.item()\n"
               "    if dist.get_rank() == 0:\n        for k in scalars:\n"
               "            writer.add_scalar(k, scalars[k], step)\n")
CASES10 = [
    # a meter printed in the loop and all-reduced only after it (3D-ResNets): the per-batch print is unreduced
    ("every-rank-prints-loss",
     METER_LOOP.format(inside="", after="print('Loss {loss.avg:.4f}'.format(loss=losses))\n"),
     METER_LOOP.format(inside="    print('Loss {loss.val:.4f}'.format(loss=losses))\n", after="")),
    # a record filled by key with the loss and logged key by key by rank 0 (NeRF++'s scalars_to_log)
    ("rank0-local-loss", RECORD_LOOP.format(reduce="    dist.all_reduce(loss)\n    loss /= dist.get_world_size()\n"),
     RECORD_LOOP.format(reduce="")),
]


def test_a_gather_helper_a_loss_calls_is_one_finding_naming_the_loss(tmp_path):
    """SLIP: utils.all_gather_batch is a plain all_gather; CLIPLoss (in losses.py) builds its in-batch negatives
    with it. One finding, at the gather (where the fix goes), with the loss's call as its related place."""
    root = _project(tmp_path, {
        "utils.py": "import torch, torch.distributed as dist\ndef all_gather_batch(tensors):\n"
                    "    out = []\n"
                    "    for t in tensors:\n"
                    "        all_t = [torch.ones_like(t) for _ in range(dist.get_world_size())]\n"
                    "        dist.all_gather(all_t, t)\n        out.append(torch.cat(all_t))\n    return out\n",
        "losses.py": "import torch.nn as nn, utils\nclass CLIPLoss(nn.Module):\n    def forward(self, img, txt):\n"
                     "        img_all, txt_all = utils.all_gather_batch([img, txt])\n"
                     "        return (img @ txt_all.t()).mean() + (txt @ img_all.t()).mean()\n",
        "train.py": "import torch, torch.distributed as dist\n"
                    "from torch.nn.parallel import DistributedDataParallel as DDP\nfrom losses import CLIPLoss\n"
                    "dist.init_process_group('nccl')\ntorch.manual_seed(0)\nmodel = DDP(Net())\ncrit = CLIPLoss()\n"
                    "for x, t in loader:\n    crit(*model(x, t)).backward()\n",
    })
    found = [(Path(f.path).name, f.line, [(Path(p).name, n) for p, n in f.related])
             for f in audit.audit_paths([root]) if f.rule == "gather-without-grad"]
    assert found == [("utils.py", 6, [("losses.py", 4)])], found



# Held-out batch 11's classes (its first look 0.38 / 0.42 in docs/measured/cpu2/audit_heldout_batch11.txt); each
# failing before its fix.
PLACED = ("import argparse\np = argparse.ArgumentParser()\np.add_argument('--mlperf-logging', action='store_true')\n"
          "args = p.parse_args()\n"
          "device = torch.device('cuda', {dev})\nmodel = DDP(Net().to(device), device_ids=[{dev}])\n"
          "def inference(loader):\n    for x in loader:\n        z = model(x.to(device))\n"
          "        out = [torch.empty_like(z), torch.empty_like(z)]\n"
          "        if {guard}:\n            dist.all_gather(out, z)\n"
          "for step, (x, y) in enumerate(loader):\n    loss = crit(model(x), y)\n    loss.backward()\n"
          "    if {accum}:\n        opt.step()\n        opt.zero_grad()\n"
          "inference(val_loader)\n")
CRASH_DUMP = ("model = DDP(Net())\nfor batch in loader:\n    try:\n        loss = model(batch).sum()\n"
              "        loss.backward()\n    except Exception:\n"
              "        torch.save({{'batch': batch, 'model': model.module.state_dict()}}, 'crash.pt')\n{after}")
LOADED = ("import argparse\np = argparse.ArgumentParser()\np.add_argument('--load-model', type=str, default='')\n"
          "args = p.parse_args()\nmodel = DDP(Net())\n"
          "if {test}:\n    state = torch.load(args.load_model)\n    model.module.load_state_dict(state)\n")
CASES11 = [
    # a rank only as a device placement (`torch.device('cuda', local_rank)`, device_ids) holds no rank: a test of
    # a tensor moved there (`if z.is_cuda:`) is no guard that keeps rank 0 out of the all_gather (DLRM)
    ("collective-under-rank0", PLACED.format(dev="int(os.environ['LOCAL_RANK'])", accum="True", guard="z.is_cuda"),
     PLACED.format(dev="int(os.environ['LOCAL_RANK'])", accum="True", guard="rank == 0")),
    # a count per rank (DLRM's n_emb_per_rank) is no rank: a test of it is no rank guard
    ("collective-under-rank0",
     "n_emb_per_rank = 8 // world_size\nx = torch.ones(2)\nif n_emb_per_rank > 0:\n    dist.all_reduce(x)\n",
     "n_emb = 8 // world_size\nx = torch.ones(2)\nif rank > 0:\n    dist.all_reduce(x)\n"),
    # accumulation only under a flag off unless given: `flag and (j + 1) % accum == 0 or not flag` (DLRM)
    ("accumulation-without-no-sync",
     PLACED.format(dev="0", guard="True",
                   accum="args.mlperf_logging and (step + 1) % args.accum == 0 or not args.mlperf_logging"),
     PLACED.format(dev="0", guard="True", accum="(step + 1) % args.accum == 0")),
    # a save in an exception handler that raises again: the failing rank's dump of its batch (VALL-E)
    ("save-on-every-rank", CRASH_DUMP.format(after="        raise\n"),
     CRASH_DUMP.format(after="        continue\n")),
    # a load under an option whose default is "" (DLRM's --load-model): the default run never loads
    ("load-without-map-location", LOADED.format(test="not (args.load_model == '')"),
     LOADED.format(test="os.path.exists('ckpt.pt')")),
]

# batch 11's misses, fixed by class after its first look (the first look and the fixes are in docs/results.md)
SPAWN_HEAD = ("import os, sys, random, torch, torch.distributed as dist, torch.multiprocessing as mp\n"
              "from itertools import cycle\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
              "from torch.utils.data import DataLoader, DistributedSampler\n")
WRITER_HANDED = ("writer = SummaryWriter() if rank == 0 else None\nmodel = DDP(Net())\n"
          "def train_epoch(loader, tb_writer):\n    for x, y in loader:\n        loss = crit(model(x), y)\n"
          "        loss.backward()\n        opt.step()\n        if tb_writer is not None:\n{reduce}"
          "            tb_writer.add_scalar('loss', loss.item())\ntrain_epoch(loader, writer)\n")
WRITES_ITSELF = ("tb_writer = SummaryWriter() if rank == 0 else None\nmodel = DDP(Net())\nfor x, y in loader:\n"
                 "    loss, loss_info = model(x, y)\n    loss.backward()\n    opt.step()\n{reduce}"
                 "    if tb_writer is not None:\n        loss_info.write_summary(tb_writer, 'train/', 0)\n")
TRAINER = ("class Trainer:\n    def __init__(self):\n        self.model = DDP(Net())\n"
           "    def train(self, loader):\n        for x, y in loader:\n            loss = crit(self.model(x), y)\n"
           "            loss.backward()\n            opt.step()\n            self.g_loss = {value}\n"
           "    def print_log(self):\n        data = [('G', self.g_loss)]\n"
           "        print(' | '.join(f'{{k}}: {{v}}' for k, v in data))\n"
           "    def save(self):\n        torch.save(self.model.module.state_dict(), 'model.pt')\n"
           "trainer = Trainer()\ntrainer.train(loader)\nif rank == 0:\n    trainer.print_log()\n{save}")
SPAWNED = ("def run(rank, world_size):\n    dist.init_process_group('gloo', rank=rank, world_size=world_size)\n"
           "    torch.manual_seed(0)\n    model = DDP(Net())\n"
           "    sampler = DistributedSampler(ds, shuffle=True)\n    loader = DataLoader(ds, sampler=sampler)\n"
           "{loop}def main():\n    mp.spawn(run, args=(2,), nprocs=2)\n")
HOOKED = ("model = DDP(Net())\ndef train_epoch(loader):\n    for x, y in loader:\n"
          "        loss = crit(model(x), y)\n        loss.backward()\n        opt.step()\n"
          "    return {{'loss': loss}}\n"
          "def cv(loader):\n    out = {{'loss': 0.0}}\n    with torch.no_grad():\n        for x, y in loader:\n"
          "            out['loss'] += crit(model(x), y).item()\n    return out\n"
          "def log_epoch(loss_dict):\n    if rank == 0:\n        print(loss_dict['loss'])\n"
          "for epoch in range(3):\n    loss_dict = train_epoch(loader)\n{cv}    log_epoch(loss_dict)\n")
CASES11_MISSES = [
    # a rank-0 writer handed down as a parameter: `if tb_writer is not None:` is rank 0's (3D-ResNets, VALL-E)
    ("rank0-local-loss", WRITER_HANDED.format(reduce="            loss = reduce_mean(loss)\n"),
     WRITER_HANDED.format(reduce="")),
    # a loss record that writes itself into the rank-0 writer (VALL-E's loss_info.write_summary(tb_writer, ...))
    ("rank0-local-loss", WRITES_ITSELF.format(reduce="    loss_info.reduce(x.device)\n"),
     WRITES_ITSELF.format(reduce="")),
    # a method called on an instance of a project class runs that class's method (Lightweight GAN's final
    # `model.save(n)`, made by every spawned rank)
    ("save-on-every-rank", TRAINER.format(value="loss.item()", save="if rank == 0:\n    trainer.save()\n"),
     TRAINER.format(value="loss.item()", save="trainer.save()\n")),
    # the step's loss kept on the instance and printed by another method (Lightweight GAN's print_log)
    ("rank0-local-loss", TRAINER.format(value="reduce_mean(loss).item()", save=""),
     TRAINER.format(value="loss.item()", save="")),
    # a module with no main guard that spawns the ranks is the script (a console-script entry): its sampler's
    # epochs, fed through cycle(), repeat without set_epoch (Lightweight GAN)
    ("set-epoch-missing",
     SPAWNED.format(loop="    for epoch in range(3):\n        sampler.set_epoch(epoch)\n"
                         "        for x in loader:\n            model(x).sum().backward()\n"),
     SPAWNED.format(loop="    it = cycle(loader)\n    for step in range(1000):\n"
                         "        model(next(it)).sum().backward()\n"),
     SPAWN_HEAD),
    # random and numpy seeded alone leave torch unseeded (NATSpeech)
    ("no-seed", "torch.manual_seed(0)\nmodel = DDP(Net())\n", "model = DDP(Net())\n",
     DDP_HEAD + "import random, numpy as np\nrandom.seed(0)\nnp.random.seed(0)\n"),
    # stdout sent to /dev/null on the other ranks makes print rank 0's (NATSpeech)
    ("rank0-local-loss",
     "if rank != 0:\n    sys.stdout = open(os.devnull, 'w')\n" + LOOP + "    mloss = reduce_mean(loss)\n"
     "    print('loss', mloss.item())\n",
     "if rank != 0:\n    sys.stdout = open(os.devnull, 'w')\n" + LOOP + "    print('loss', loss.item())\n"),
    # a fixed port only where the run is not distributed (Lightweight GAN's one-process group for SyncBatchNorm)
    ("hard-coded-master-port",
     "if sync_bn and not args.distributed:\n    os.environ['MASTER_PORT'] = '12355'\n",
     "if sync_bn and args.distributed:\n    os.environ['MASTER_PORT'] = '12355'\n"),
    # a loader built with the rank holds this rank's shard, not a rank: a step counter from its length is no rank
    # (VAR's `if g_it == 0:` read as a rank-0 guard around an all_reduce)
    ("collective-under-rank0",
     "loader = DataLoader(ds, batch_sampler=InfiniteSampler(rank=rank, world_size=world_size))\n"
     "n_iters = len(loader)\nx = torch.ones(2)\nfor it in range(10):\n    g_it = ep * n_iters + it\n"
     "    if g_it == 0:\n"
     "        dist.all_reduce(x)\n",
     "loader = DataLoader(ds, batch_sampler=InfiniteSampler(rank=rank, world_size=world_size))\n"
     "n_iters = len(loader)\nx = torch.ones(2)\nfor g_it in range(n_iters):\n    if rank == 0:\n"
     "        dist.all_reduce(x)\n"),
    # a hook the epoch loop calls after an evaluation may log what the evaluation returned (WeNet's log_per_epoch
    # after executor.cv): no training-loss log
    ("rank0-local-loss", HOOKED.format(cv="    loss_dict = cv(val_loader)\n"), HOOKED.format(cv="")),
]

# batch 12's classes, after its first look (docs/measured/cpu2/audit_heldout_batch12.txt)
SWITCHED_HEAD = ("import os, sys, logging, argparse, torch, torch.distributed as dist\n"
                 "from torch.nn.parallel import DistributedDataParallel as DDP\n"
                 "p = argparse.ArgumentParser()\np.add_argument('--distributed', action='store_true')\n"
                 "args = p.parse_args()\nif args.distributed:\n    dist.init_process_group('gloo')\n"
                 "torch.manual_seed(0)\n")
GATHERED = ("class Gather(torch.autograd.Function):\n    @staticmethod\n    def forward(ctx, x):\n"
            "        out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]\n"
            "        dist.all_gather(out, x)\n        return tuple(out)\n"
            "    @staticmethod\n    def backward(ctx, *g):\n        g = torch.stack(g)\n        dist.all_reduce(g)\n"
            "        return g[dist.get_rank()]\ndef gather(x):\n{check}    return torch.cat(Gather.apply(x))\n"
            "model = Net()\nfor x in loader:\n    z = model(x)\n    (z @ gather(z).T).mean().backward()\n")
BN_NET = ("class Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
          "        self.bn = torch.nn.BatchNorm2d(4)\n")
SEEDED_ARMS = ("def init_seeds(seed):\n    torch.manual_seed(seed)\n"
               "local_rank = int(os.environ.get('LOCAL_RANK', -1))\n"
               "if local_rank != -1:\n    init_seeds({seed})\nelse:\n    init_seeds(42)\nmodel = DDP(Net())\n")
STATS_TRAINER = ("from collections import defaultdict\nclass Trainer:\n    def __init__(self):\n"
                 "        self.model = DDP(Net())\n        self.stats = defaultdict(Meter)\n"
                 "        self.tb = Writer() if rank == 0 else None\n"
                 "    def update_stats(self, new_stats):\n        for name, val in new_stats.items():\n"
                 "            self.stats[name].update(val)\n"
                 "    def print_stats(self):\n        line = ''\n        for name, val in self.stats.items():\n"
                 "            line += '%s: %.5f ' % (name, val.avg)\n        print(line)\n"
                 "    def train(self, loader):\n        for x in loader:\n            loss, {comp} = self.model(x)\n"
                 "            loss.backward()\n            opt.step()\n            self.update_stats({comp})\n"
                 "            {log}\n")
TB_WRITES = "if self.tb is not None: self.tb.write_epoch(self.stats)"
CASES12 = [
    # `if dist.is_initialized():` is a distributed switch (Contriever's barriers)
    ("collective-outside-switch", "if dist.is_initialized():\n    dist.barrier()\n", "dist.barrier()\n",
     SWITCHED_HEAD),
    # so is a helper's `if not dist.is_initialized(): return x` before an autograd gather (Contriever's gather)
    ("collective-outside-switch", GATHERED.format(check="    if not dist.is_initialized():\n        return x\n"),
     GATHERED.format(check=""), SWITCHED_HEAD),
    # the statistics returned beside the loss (`loss, stats = self.actor(data)`), handed to a method that fills
    # `self.stats`, printed by another on every rank or written by a rank-0 writer's own method (OSTrack)
    ("every-rank-prints-loss", STATS_TRAINER.format(comp="shape", log="self.print_stats()"),
     STATS_TRAINER.format(comp="stats", log="self.print_stats()")),
    ("rank0-local-loss", STATS_TRAINER.format(comp="shape", log=TB_WRITES),
     STATS_TRAINER.format(comp="stats", log=TB_WRITES)),
    # `if dist.is_initialized(): return` before the set-up keeps it from running twice: the group always exists
    # (improved-diffusion's setup_dist), so a barrier needs no switch
    ("collective-outside-switch",
     "def setup():\n    if dist.is_initialized():\n        return\n    dist.init_process_group('gloo')\n"
     "setup()\ndist.barrier()\n",
     "def setup():\n    if args.distributed:\n        dist.init_process_group('gloo')\nsetup()\ndist.barrier()\n",
     "import argparse, torch, torch.distributed as dist\np = argparse.ArgumentParser()\n"
     "p.add_argument('--distributed', action='store_true')\nargs = p.parse_args()\ntorch.manual_seed(0)\n"),
    # a rank read by key (`self.config["rank"] == 0`, ParallelWaveGAN) is a rank-0 guard
    ("save-on-every-rank",
     "model = DDP(Net())\nif config['rank'] == 0:\n    torch.save(model.module.state_dict(), 'a.pt')\n",
     "model = DDP(Net())\nif config['epoch'] == 0:\n    torch.save(model.module.state_dict(), 'a.pt')\n"),
    # a dict of loss functions (`criterion["stft"] = MultiResolutionSTFTLoss()`) carries no loss value
    ("every-rank-prints-loss",
     "criterion = {}\ncriterion['stft'] = STFTLoss()\ntrainer = Trainer(criterion=criterion)\n" + LOOP +
     "    print('step', trainer.steps)\n",
     "stats = {}\n" + LOOP + "    stats['stft'] = loss.item()\n    trainer = Trainer(stats=stats)\n"
     "    print('step', trainer.steps)\n"),
    # a root logger writing to sys.stdout, which the other ranks send to /dev/null, is rank 0's console
    ("every-rank-prints-loss",
     "if rank != 0:\n    sys.stdout = open(os.devnull, 'w')\nlogging.basicConfig(stream=sys.stdout)\n" + LOOP +
     "    logging.info('loss %f', loss.item())\n",
     "logging.basicConfig(stream=sys.stdout)\n" + LOOP + "    logging.info('loss %f', loss.item())\n",
     DDP_HEAD + "import sys, logging\ntorch.manual_seed(0)\n"),
    # a per-rank seed only in the distributed arm, the single run's in the other (OSTrack): rank 0's is the
    # single run's; judged at the helper's call, not again inside the helper
    ("seed-per-rank", SEEDED_ARMS.format(seed="42 + local_rank"), SEEDED_ARMS.format(seed="42 + 1 + local_rank"),
     "import os, torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"),
    # a module a launcher imports by name (`run(settings)`, no main guard) that wraps a model with BatchNorm
    ("batchnorm-without-sync",
     BN_NET + "def run(settings):\n    net = Net()\n    net = torch.nn.SyncBatchNorm.convert_sync_batchnorm(net)\n"
     "    net = DDP(net)\n",
     BN_NET + "def run(settings):\n    net = Net()\n    net = DDP(net)\n",
     "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"),
    # the flag around the conversion is the distributed switch itself, which also gates the wrap (SwinUNETR)
    ("batchnorm-without-sync",
     BN_NET + "model = Net()\nif args.distributed:\n"
     "    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\n"
     "    model = DDP(model)\n",
     BN_NET + "p.add_argument('--sync_bn', action='store_true')\nmodel = Net()\nif args.sync_bn:\n"
     "    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\nif args.distributed:\n    model = DDP(model)\n",
     SWITCHED_HEAD),
    # SyncBatchNorm only under an option no audited file defines (Point-MAE's parser is elsewhere): check by hand
    ("batchnorm-without-sync",
     "p.add_argument('--sync_bn', type=int, default=1)\nmodel = Net()\nif args.sync_bn:\n"
     "    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\nmodel = DDP(model)\n",
     "model = Net()\nif args.sync_bn:\n    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\n"
     "model = DDP(model)\n", SWITCHED_HEAD),
]


def test_batch13_project_classes(tmp_path):
    """Batch 13's classes that need several files: a model handed to the function that wraps it (TransReID's
    do_train(cfg, model, ...)); a loader builder no audited script imports, with set_epoch in the script that
    reaches it through a missing module, and a `training` parameter that makes it build the evaluation split too
    (UniAD); a helper reached through `from utils import *` (CasMVSNet's reduce_scalar_outputs); a library's
    demo under its main guard (CasMVSNet's models/module.py)."""
    files = {
        "model.py": ("import torch\nclass Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                     "        self.bn = torch.nn.BatchNorm1d(4)\n    def forward(self, x):\n        return self.bn(x)\n"
                     "def make_model():\n    return Net()\n"),
        "processor.py": ("import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
                         "def do_train(cfg, model, loader):\n    model = DDP(model)\n    for x in loader:\n"
                         "        model(x).sum().backward()\n"),
        "data.py": ("from torch.utils.data import DataLoader, DistributedSampler\n"
                    "def build_loader(ds, training, distributed=True):\n    sampler = DistributedSampler(ds)\n"
                    "    return DataLoader(ds, sampler=sampler)\n"),
        "utils.py": ("import torch.distributed as dist\ndef reduce_scalars(t):\n    dist.all_reduce(t)\n"
                     "    return t\n"),
        "demo.py": ("import torch\nfrom torch.utils.data import DataLoader\ndef helper(x):\n    return x\n"
                    "if __name__ == '__main__':\n    dl = DataLoader(list(range(4)))\n    item = next(iter(dl))\n"),
        "train.py": ("import torch, torch.distributed as dist\nfrom model import make_model\n"
                     "from processor import do_train\n"
                     "from builder import build_dataloader\nfrom utils import *\nfrom demo import helper\n"
                     "dist.init_process_group('nccl')\ntorch.manual_seed(0)\n"
                     "train_loader, val_loader = build_dataloader(cfg)\nmodel = make_model()\n"
                     "def test_step(model, x):\n    return reduce_scalars(model(x).mean())\n"
                     "def validate(model):\n    for x in val_loader:\n        test_step(model, x)\n"
                     "for epoch in range(3):\n    train_loader.sampler.set_epoch(epoch)\n"
                     "    do_train(cfg, model, train_loader)\n    validate(model)\n"),
    }
    root = _project(tmp_path, files)
    found = {(f.rule, Path(f.path).name, f.line) for f in audit.audit_paths([root])}
    assert ("batchnorm-without-sync", "processor.py", 4) in found, found
    assert ("eval-padding-duplicates", "data.py", 3) in found, found  # the reduction reached through the star
    assert not {r for r, name, _ in found if name == "demo.py"}, found  # the demo never runs under DDP
    assert not {r for r, _, _ in found} & {"set-epoch-missing", "peek-iterator"}, found

def test_a_loss_logged_where_a_function_with_its_own_finding_returns_it_is_one_finding():
    """docTR: fit_one_epoch shows rank 0's train_loss in its bar and returns the epoch mean, which main prints on
    rank 0: one defect, one finding (the first), with the print as its related place."""
    src = DDP_HEAD + ("torch.manual_seed(0)\nmodel = DDP(Net())\ndef fit_one_epoch(loader):\n    total = 0.0\n"
                      "    for x in loader:\n        train_loss = model(x).sum()\n        train_loss.backward()\n"
                      "        if rank == 0:\n            print(train_loss.item())\n"
                      "        total += train_loss.item()\n"
                      "    return total / len(loader), 0.1\nfor epoch in range(3):\n"
                      "    train_loss, lr = fit_one_epoch(loader)\n    if rank == 0:\n"
                      "        print(f'epoch loss {train_loss}')\n")
    found = [f for f in audit.audit_source(src) if f.rule == "rank0-local-loss"]
    lines = src.splitlines()
    assert len(found) == 1 and lines[found[0].line - 1].strip() == "print(train_loss.item())", found
    assert [lines[n - 1].strip() for _, n in found[0].related] == ["if rank == 0:",
                                                                   "print(f'epoch loss {train_loss}')"], found

def test_a_base_class_rank0_flag_in_a_subclass_and_a_text_that_carries_the_loss(tmp_path):
    """VL-T5: TrainerBase sets `self.verbose = True`, then False off rank 0; the VQA Trainer in another file logs
    under `if self.verbose:` a text the loss went into (`desc_str += f' | Loss {loss_meter.val}'`): rank 0's own
    loss, found at the log, with the line that put the loss into the text as its related place."""
    base = ("import torch.distributed as dist\nclass TrainerBase:\n    def __init__(self, args):\n"
            "        self.args = args\n        self.verbose = True\n        if self.args.distributed:\n"
            "            if self.args.gpu != 0:\n                self.verbose = False\n")
    vqa = ("import torch, torch.distributed as dist\nimport torch.multiprocessing as mp\n"
           "from torch.nn.parallel import DistributedDataParallel as DDP\nfrom trainer_base import TrainerBase\n"
           "class Trainer(TrainerBase):\n    def train(self, loader):\n        self.model = DDP(Net())\n"
           "        for x in loader:\n            loss = self.model(x).sum()\n            loss.backward()\n"
           "            if self.verbose:\n                desc_str = 'Epoch 0'\n"
           "                desc_str += f' | Loss {loss.item():4f}'\n                pbar.set_description(desc_str)\n"
           "def main_worker(gpu, args):\n    args.gpu = gpu\n    dist.init_process_group('nccl')\n"
           "    torch.manual_seed(0)\n    Trainer(args).train(loader)\nif __name__ == '__main__':\n"
           "    mp.spawn(main_worker, args=(args,), nprocs=2)\n")
    root = _project(tmp_path, {"trainer_base.py": base, "vqa.py": vqa})
    found = [f for f in audit.audit_paths([root]) if f.rule == "rank0-local-loss"]
    assert [(Path(f.path).name, f.line, [n for _, n in f.related]) for f in found] == [("vqa.py", 14, [13, 11])], \
        found  # (11: the rank-0 guard)

SAVES_BY_SWITCH = ("model = DDP(Net())\nfor epoch in range(3):\n    model(x).sum().backward()\n"
                   "    if cfg.MODEL.{flag}:\n        if dist.get_rank() == 0:\n"
                   "            torch.save(model.state_dict(), 'm.pth')\n    else:\n"
                   "        torch.save(model.state_dict(), 'm.pth')\n")
LEAKY_SAVE = ("import argparse\nparser = argparse.ArgumentParser()\n"
              "parser.add_argument('--multiprocessing-distributed', action='store_true')\nargs = parser.parse_args()\n"
              "is_distributed = world_size > 1\nmodel = DDP(Net())\nfor epoch in range(3):\n"
              "    model(x).sum().backward()\n    if (not {flag}) or (dist.get_rank() == 0):\n"
              "        torch.save(model.state_dict(), 'm.pth')\n")
NAMED_LOGGER = ("import logging, sys\ndef setup_logger(name):\n    logger = logging.getLogger(name)\n"
                "    ch = logging.StreamHandler(stream=sys.stdout)\n    logger.addHandler(ch)\n    return logger\n"
                "{setup}\nlogger = logging.getLogger('reid.train')\nmodel = DDP(Net())\nfor x in loader:\n"
                "    loss = model(x).sum()\n    loss.backward()\n    logger.info(f'loss {{loss.item():.3f}}')\n")
BN_NET = ("class Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
          "        self.bn = torch.nn.BatchNorm2d(3)\n    def forward(self, x):\n        return self.bn(x)\n")
EVAL_ONLY = ("model = DDP(Net())\nmodel.load_state_dict(torch.load('m.pth', map_location='cpu'))\nmodel.eval()\n"
             "with torch.no_grad():\n    for x in loader:\n        print(model(x).mean())\n")
GATHER_HELPER = ("def cat_all(t):\n    out = [torch.zeros_like(t) for _ in range(world_size)]\n"
                 "    dist.all_gather(out, t)\n    return torch.cat(out)\nmodel = DDP(Net())\nfor x in loader:\n"
                 "    z = model(x)\n    loss = {loss}\n    loss.backward()\n")
WRITER_CLASS = ("from torch.utils.tensorboard import SummaryWriter\ndef can_log():\n    return dist.get_rank() == 0\n"
                "class DistWriter(SummaryWriter):\n    def add_scalar(self, *a, **k):\n{body}"
                "def get_logger(d):\n    logger = DistWriter(d)\n    return logger\nwriter = get_logger('runs')\n"
                "model = DDP(Net())\nfor step, x in enumerate(loader):\n    loss = model(x).sum()\n"
                "    loss.backward()\n    writer.add_scalar('loss', loss.item(), step)\n")
HOOK_AFTER = ("def inference(net, x):\n    return net(x)\ndef train_step(net, x):\n    net(x).sum().backward()\n"
              "def calc_loss(out, writer, step):\n    loss = out.sum()\n    writer.add_scalar('loss', loss, step)\n"
              "    return loss\nwriter = SummaryWriter() if rank == 0 else None\nmodel = DDP(Net())\n"
              "def train(loader):\n    for step, x in enumerate(loader):\n{body}train(loader)\n")

CASES13 = [
    # the else of a distributed switch named DIST_TRAIN is the one-process run (TransReID's save)
    ("save-on-every-rank", SAVES_BY_SWITCH.format(flag="DIST_TRAIN"), SAVES_BY_SWITCH.format(flag="WARMUP")),
    # `not is_distributed or rank == 0` with is_distributed from the world size is no leaky guard (CasMVSNet);
    # with a launcher option that torchrun never sets, it is
    ("save-on-every-rank", LEAKY_SAVE.format(flag="is_distributed"),
     LEAKY_SAVE.format(flag="args.multiprocessing_distributed")),
    # a logger named below one that a helper gives a console on every rank (TransReID's transreid.train)
    ("every-rank-prints-loss", NAMED_LOGGER.format(setup="if rank == 0:\n    setup_logger('reid')"),
     NAMED_LOGGER.format(setup="setup_logger('reid')")),
    # a script that only evaluates loaded weights owes no seed and no SyncBatchNorm (UFLD's test.py)
    ("no-seed", EVAL_ONLY, EVAL_ONLY + "for x in loader:\n    model(x).sum().backward()\n", DDP_HEAD),
    ("batchnorm-without-sync", BN_NET + EVAL_ONLY, BN_NET + EVAL_ONLY + "for x in loader:\n"
     "    model(x).sum().backward()\n"),
    # a gather helper nobody calls here is its callers' business (UFLD's dist_cat_reduce_tensor); in the loss,
    # it is a finding
    ("gather-without-grad", GATHER_HELPER.format(loss="z.sum()"),
     GATHER_HELPER.format(loss="(z @ cat_all(z).T).mean()")),
    # a writer class whose every method writes under a rank-0 test, made by a factory (UFLD's DistSummaryWriter)
    ("rank0-local-loss", WRITER_CLASS.format(body="        super().add_scalar(*a, **k)\n"),
     WRITER_CLASS.format(body="        if can_log():\n            super().add_scalar(*a, **k)\n")),
    # a loss hook after a forward named `inference` that the loop's backward follows is training (UFLD's
    # calc_loss); after an evaluation that ends the loop's work it is not (WeNet's)
    ("rank0-local-loss", HOOK_AFTER.format(body="        train_step(model, x)\n        out = inference(model, x)\n"
                                                "        calc_loss(out, writer, step)\n"),
     HOOK_AFTER.format(body="        out = inference(model, x)\n        loss = calc_loss(out, writer, step)\n"
                            "        loss.backward()\n")),
]

BASIC_LOGGER = ("import logging\nlogging.basicConfig(level=logging.INFO)\nlogger = logging.getLogger(__name__)\n"
                "{level}"
                "model = DDP(Net())\nfor x in loader:\n    loss = model(x).sum()\n    loss.backward()\n"
                "    logger.info('loss %f', loss.item())\n")
BAR = ("from tqdm import tqdm\nmodel = DDP(Net())\npbar = tqdm(loader{disable})\nfor x in pbar:\n"
       "    loss = model(x).sum()\n    loss.backward()\n    pbar.set_postfix(loss=loss.item())\n")
# Classes found by probing common DDP idioms between batches (not from a held-out label)
CASES_PROBES = [
    # basicConfig on every rank gives a named logger's INFO lines a console on every rank; a level chosen by rank
    # (`if rank > 0: logger.setLevel(logging.ERROR)`, I-JEPA's and MSN's) leaves rank 0's alone
    ("every-rank-prints-loss", BASIC_LOGGER.format(level="if rank > 0:\n    logger.setLevel(logging.ERROR)\n"),
     BASIC_LOGGER.format(level="")),
    # a progress bar disabled off rank 0 shows rank 0's own loss (docTR's)
    ("rank0-local-loss", BAR.format(disable=""), BAR.format(disable=", disable=rank != 0")),
]

RANKED_TRAINER = ("class Trainer:\n    def __init__(self, local_rank):\n        self.local_rank = local_rank\n"
                  "    def load(self, path):\n        loc = 'cuda:%d' % self.local_rank\n"
                  "        ck = torch.load(path, map_location={{'cuda:0': loc}})\n        return ck['it']\n"
                  "trainer = Trainer(local_rank=rank)\nit = trainer.load('x')\n{test}    dist.barrier()\n")
SAVE_PATH_RANK0 = ("class Trainer:\n    def __init__(self, logger=None, save_path=None):\n"
                   "        self.logger = logger\n"
                   "        self.save_path = save_path\n    def save(self, it):\n        if self.save_path is None:\n"
                   "            return\n"
                   "        torch.save(model.module.state_dict(), f'{{self.save_path}}_{{it}}.pth')\n"
                   "model = DDP(Net())\n{build}for x in loader:\n    model(x).sum().backward()\nt.save(1)\n")
ACCUM_OPTION = ("import argparse\np = argparse.ArgumentParser()\n"
                "p.add_argument('--gradient_accumulation_steps', type=int, default={default})\nargs = p.parse_args()\n"
                "model = DDP(Net())\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                "for step_i, x in enumerate(loader):\n    model(x).sum().backward()\n    update = True\n"
                "    if args.gradient_accumulation_steps > 1:\n"
                "        update = step_i % args.gradient_accumulation_steps == 0\n    if update:\n        opt.step()\n")
VAL_LOADER = ("val_sampler = DistributedSampler(val_ds, shuffle=False)\n"
              "val_loader = DataLoader(val_ds, sampler=val_sampler)\n")
MERGED_EVAL = (VAL_LOADER +
               "model = DDP(Net())\ndef evaluate(loader):\n    res = {{}}\n    for x, qid in loader:\n"
               "        res[qid] = model(x)\n    gathered = dist_utils.all_gather(res)\n{merge}"
               "for x in loader:\n    model(x).sum().backward()\nevaluate(val_loader)\n")
REDUCE_DICT = (VAL_LOADER +
               "def reduce_dict(input_vals):\n    values = []\n    for k, v in sorted(input_vals.items()):\n"
               "        values.append(v)\n    values = torch.stack(values)\n    dist.reduce(values, dst=0)\n"
               "    return values\nmodel = DDP(Net())\nfor x in loader:\n    loss = model(x).sum()\n"
               "    loss.backward()\n"
               "    reduce_dict({{'loss': loss.detach()}})\n{evaluate}")
SEED_FLAG = ("import argparse\np = argparse.ArgumentParser()\np.add_argument('--deterministic', action='store_true')\n"
             "args = p.parse_args()\n{seed}model = DDP(Net())\nfor x in loader:\n    model(x).sum().backward()\n")
VERBOSE = ("class Trainer:\n    def __init__(self):\n        self.verbose = True\n{off}"
           "        self.model = DDP(Net())\n    def train(self, loader):\n        for x in loader:\n"
           "            loss = self.model(x).sum()\n            loss.backward()\n            if self.verbose:\n"
           "                print(loss.item())\nTrainer().train(loader)\n")

CASES14 = [
    # an object built with the rank keeps it inside: what its methods return (a resumed step count) is no rank
    # (XMem's `XMemTrainer(config, local_rank=local_rank)`, then `total_iter = model.load_checkpoint(...)`)
    ("collective-under-rank0", RANKED_TRAINER.format(test="if it % 10 == 0 and it != 0:\n"),
     RANKED_TRAINER.format(test="if rank == 0 and it % 10 == 0:\n")),
    # a save path handed only where rank 0 builds the trainer, the others keeping None (XMem's save_network)
    ("save-on-every-rank",
     SAVE_PATH_RANK0.format(build="if rank == 0:\n    t = Trainer(logger=Logger(), save_path='out')\nelse:\n"
                                  "    t = Trainer()\n"),
     SAVE_PATH_RANK0.format(build="t = Trainer(save_path='out')\n")),
    # accumulation only when an option that defaults to 1 is raised (VL-T5)
    ("accumulation-without-no-sync", ACCUM_OPTION.format(default=1), ACCUM_OPTION.format(default=4)),
    # an evaluation whose gathered results merge by the sample's key counts no duplicate (VL-T5's quesid2ans)
    ("eval-padding-duplicates",
     MERGED_EVAL.format(merge="    out = {}\n    for part in gathered:\n        for k, v in part.items():\n"
                              "            out[k] = v\n    return out\n"),
     MERGED_EVAL.format(merge="    scores = []\n    for part in gathered:\n        scores += list(part.values())\n"
                              "    return sum(scores) / len(scores)\n")),
    # a loop over sorted(d.items()) in a reduce helper is no evaluation loop (`input_vals`: no 'val' split)
    ("eval-padding-duplicates", REDUCE_DICT.format(evaluate=""),
     REDUCE_DICT.format(evaluate="def validate():\n    t = torch.zeros(1)\n    for x in val_loader:\n"
                                 "        t += model(x).sum()\n    dist.all_reduce(t)\nvalidate()\n")),
    # torch seeded only under a store_true option (CTKD's --deterministic) is unseeded in the default run
    ("no-seed", SEED_FLAG.format(seed="torch.manual_seed(27)\n"),
     SEED_FLAG.format(seed="if args.deterministic:\n    torch.manual_seed(27)\n"), DDP_HEAD),
    # a flag set True, then False off rank 0 (VL-T5's self.verbose): rank 0's alone
    ("rank0-local-loss", VERBOSE.format(off=""),
     VERBOSE.format(off="        if rank != 0:\n            self.verbose = False\n")),
]

WRITER_REBOUND = ("import csv\nfrom torch.utils.tensorboard import SummaryWriter\ndef main():\n"
                  "    if rank == 0:\n        writer = SummaryWriter('runs') if training else None\n    else:\n"
                  "        writer = None\n    model = DDP(Net())\n    for epoch in range(3):\n"
                  "        train_loss = train_one_epoch(model)\n{reduce}        if writer is not None:\n"
                  "            writer.add_scalar('train_loss', train_loss, epoch)\n"
                  "    with open('results.csv', 'w') as f:\n        writer = csv.writer(f)\n"
                  "        writer.writerow(['done'])\n"
                  "def train_one_epoch(model):\n    total = 0.0\n    for x in loader:\n        loss = model(x).sum()\n"
                  "        loss.backward()\n        total += loss.item()\n    return total\nmain()\n")
UNSEEN_SETUP = ("import logging\nfrom openpoints.utils import setup_logger_dist\nsetup_logger_dist('log', {who})\n"
                "model = DDP(Net())\nfor x in loader:\n    loss = model(x).sum()\n    loss.backward()\n"
                "    logging.info(f'loss {{loss.item():.3f}}')\n")
EVERY_BAR = ("from tqdm import tqdm\nmodel = DDP(Net())\npbar = tqdm(enumerate(loader){disable})\nfor i, x in pbar:\n"
             "    loss = model(x).sum()\n    loss.backward()\n    pbar.set_description(f'Loss {{loss.item():.3f}}')\n")

CASES15 = [
    # a rank-0 SummaryWriter built as `SummaryWriter(...) if training else None` under `if rank == 0:`, the name
    # rebound to a csv writer only after its uses (PointNeXt)
    ("rank0-local-loss", WRITER_REBOUND.format(reduce="        train_loss = reduce_mean(train_loss)\n"),
     WRITER_REBOUND.format(reduce="")),
    # a logger set-up from a module these files lack, handed the rank: the root's consoles are not known here
    ("every-rank-prints-loss", UNSEEN_SETUP.format(who="rank"), UNSEEN_SETUP.format(who="'train'")),
    # a tqdm bar with no `disable=` on every rank shows each rank's own loss (PointNeXt's train_one_epoch)
    ("every-rank-prints-loss", EVERY_BAR.format(disable=", disable=rank != 0"), EVERY_BAR.format(disable="")),
]


# held-out batches 16 and 17 (a helper labelled them blind; tests/outside/heldout_labels.json)
ACCUM_OPTION = ("import argparse\np = argparse.ArgumentParser()\n"
                "p.add_argument('--gradient_accumulation_steps', type=int, default={default})\nargs = p.parse_args()\n"
                "model = DDP(Net())\nfor step, (x, y) in enumerate(loader):\n    loss = crit(model(x), y)\n"
                "    loss.backward()\n    if (step + 1) % args.gradient_accumulation_steps == 0:\n"
                "        opt.step()\n        opt.zero_grad()\n")
LOSS_MODULE = ("import torch.nn as nn\nmodel = DDP(Net())\nLOSS_DICT = {{'Softmax': nn.CrossEntropyLoss()}}\n"
               "loss = LOSS_DICT['Softmax'].cuda()\n{before}for x, y in loader:\n    out = model(x)\n"
               "    {name} = loss(out, y)\n    opt.zero_grad()\n    {name}.backward()\n    opt.step()\n{inside}")
SEED_TEST = ("import argparse\np = argparse.ArgumentParser()\np.add_argument('--seed', type=int, default={default})\n"
             "args = p.parse_args()\nif args.seed > 0:\n    torch.manual_seed(args.seed)\nmodel = DDP(Net())\n" + LOOP)
OPTION_PORT = ("import argparse\np = argparse.ArgumentParser()\np.add_argument('--port', type=str, default={default})\n"
               "args = p.parse_args()\nos.environ['MASTER_ADDR'] = 'localhost'\nos.environ['MASTER_PORT'] = args.port\n"
               "dist.init_process_group('nccl', rank=0, world_size=2)\ntorch.manual_seed(0)\nmodel = DDP(Net())\n")
VERBOSE_BAR = ("from tqdm import tqdm\nmodel = DDP(Net())\ndef train_network(loader, verbose):\n    loss_sum = 0\n"
               "    with tqdm(loader, disable=not verbose) as bar:\n        for x, y in bar:\n"
               "            loss = crit(model(x), y)\n            opt.zero_grad()\n            loss.backward()\n"
               "            opt.step()\n            loss_sum += loss.item()\n"
               "            bar.set_postfix(loss=loss_sum)\n"
               "train_network(loader, verbose={verbose})\n")
NORM_CLASS = ("import torch.nn as nn\nclass Disc(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
              "        {line}\n        self.body = nn.Sequential(nn.Conv2d(3, 8, 3), norm_layer(8))\n"
              "model = DDP(Disc())\n" + LOOP)
OTHER_SYNC = ("import torch.nn as nn\ndef Normalize(c, kind='group'):\n    if kind == 'group':\n"
              "        return nn.GroupNorm(8, c)\n    return nn.SyncBatchNorm(c)\n"
              "class Disc(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
              "        self.body = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))\n"
              "model = Disc()\n{convert}model = DDP(model)\n" + LOOP)
GATHERED_LOSS = ("import torch.nn as nn\nclass Retrieval(nn.Module):\n    def forward(self, text, video):\n"
                 "        t, v = self.enc(text), self.enc(video)\n{gather}"
                 "        loss = (t @ v.T).logsumexp(1).mean()\n        return loss\n"
                 "def train_epoch(model, loader):\n    for text, video in loader:\n        loss = model(text, video)\n"
                 "        loss = loss.mean()\n        opt.zero_grad()\n        loss.backward()\n        opt.step()\n"
                 "        if rank == 0:\n            print('loss', float(loss))\n"
                 "model = DDP(Retrieval())\ntrain_epoch(model, loader)\n")
GATHER_ALL = ("        out = [torch.empty_like(v) for _ in range(world_size)]\n        dist.all_gather(out, v)\n"
              "        v = torch.cat(out)\n")
ALIAS_GATHER = ("import torch.nn as nn\nclass AllGather(torch.autograd.Function):\n    @staticmethod\n"
                "    def forward(ctx, x):\n        out = [torch.empty_like(x) for _ in range(world_size)]\n"
                "        dist.all_gather(out, x)\n        ctx.n = x.shape[0]\n        return torch.cat(out)\n"
                "    @staticmethod\n    def backward(ctx, g):\n{reduce}"
                "        return g[ctx.n * rank:ctx.n * (rank + 1)]\nallgather = AllGather.apply\n"
                "class Retrieval(nn.Module):\n    def similarity(self, t, v):\n        v = allgather(v)\n"
                "        return t @ v.T\n    def forward(self, text, video):\n"
                "        loss = self.similarity(text, video).logsumexp(1).mean()\n        return loss\n"
                "model = DDP(Retrieval())\nfor text, video in loader:\n    model(text, video).backward()\n"
                "    opt.step()\n")

CASES16 = [
    # accumulation whose step gate counts with an option that defaults to 1 (CLIP4Clip): the default run steps
    # every micro-batch, so no all-reduce is wasted
    ("accumulation-without-no-sync", ACCUM_OPTION.format(default=1), ACCUM_OPTION.format(default=4)),
    # the name printed still holds the loss function its last binding built (CurricularFace's `loss =
    # LOSS_DICT[...]`), not a loss value; the loud twin prints the loop's value under the same guard
    ("rank0-local-loss", LOSS_MODULE.format(before="if rank == 0:\n    print('{} Loss Generated'.format(loss))\n",
                                            name="l", inside=""),
     LOSS_MODULE.format(before="", name="loss_value",
                        inside="    if rank == 0:\n        print('loss', loss_value.item())\n")),
    # torch seeded only when `args.seed > 0`, which the default -1 fails (MaskGIT)
    ("no-seed", SEED_TEST.format(default=1), SEED_TEST.format(default=-1), DDP_HEAD),
    # MASTER_PORT from an option whose default is a fixed port, overriding the environment (voxceleb_trainer)
    ("hard-coded-master-port", OPTION_PORT.format(default="None"), OPTION_PORT.format(default="'8888'"),
     "import os, torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"),
    # a bar `with tqdm(..., disable=not verbose) as bar:` whose every caller hands verbose a rank-0 test
    ("rank0-local-loss", VERBOSE_BAR.format(verbose="True"), VERBOSE_BAR.format(verbose="(rank == 0)")),
    # BatchNorm handed on as the layer class to build (`norm_layer = nn.BatchNorm2d`, LlamaGen's PatchGAN)
    ("batchnorm-without-sync", NORM_CLASS.format(line="norm_layer = nn.InstanceNorm2d"),
     NORM_CLASS.format(line="norm_layer = nn.BatchNorm2d")),
    # a SyncBatchNorm layer another model builds converts nothing (LlamaGen's VQ model under norm_type='batch')
    ("batchnorm-without-sync", OTHER_SYNC.format(convert="model = nn.SyncBatchNorm.convert_sync_batchnorm(model)\n"),
     OTHER_SYNC.format(convert="")),
    # a model whose loss is computed over every rank's all-gathered features logs the global batch's loss on rank
    # 0 (CLIP4Clip); without the gather, the same log is rank 0's own
    ("rank0-local-loss", GATHERED_LOSS.format(gather=GATHER_ALL), GATHERED_LOSS.format(gather="")),
    # an autograd gather applied by alias inside the model's forward (CLIP4Clip's `allgather = AllGather.apply`),
    # whose backward keeps only this rank's slice without an all_reduce (the alias's sites are followed, and a
    # helper the forward calls may train: test_an_aliased_gather_names_where_it_is_applied)
    ("gather-without-grad", ALIAS_GATHER.format(reduce="        dist.all_reduce(g)\n"),
     ALIAS_GATHER.format(reduce="")),
]



# held-out batches 18 and 19 (helpers labelled them blind; tests/outside/heldout_labels.json)
OWN_SWITCH = ("import argparse\np = argparse.ArgumentParser()\np.add_argument('--multi_gpu', action='store_true')\n"
              "args = p.parse_args()\nmodel = Net()\n{wrap}for epoch in range(3):\n    model(x).sum().backward()\n"
              "    if not args.multi_gpu or (args.multi_gpu and rank == 0):\n"
              "        torch.save(model.state_dict(), 'm.pth')\n")
RANK0_EVAL = ("def evaluate():\n    for x in val_loader:\n        dist.all_reduce(x)\nmodel = DDP(Net())\n"
              "for step, x in enumerate(loader):\n    model(x).sum().backward()\n    if args.local_rank in [-1, 0]:\n"
              "{call}")
HELPER_BARRIER = ("def load_cache():\n    if rank not in [-1, 0]{cond}:\n        dist.barrier()\n"
                  "    feats = torch.load('cache.pt', map_location='cpu')\n"
                  "    if rank == 0{cond}:\n        dist.barrier()\n"
                  "    return feats\n"
                  "def evaluate():\n    return 0\nmodel = DDP(Net())\nfor x in loader:\n"
                  "    model(x).sum().backward()\nif rank == 0:\n    feats = load_cache()\n")
STDOUT_BAR = ("import sys\nclass ProgressBar:\n    def __call__(self, step, info):\n{body}"
              "pbar = ProgressBar()\nmodel = DDP(Net())\nfor step, (x, y) in enumerate(loader):\n"
              "    loss = crit(model(x), y)\n    loss.backward()\n    opt.step()\n"
              "    pbar(step, {{'loss': loss.item()}})\n")
HIDDEN = ("import sys\nclass HiddenPrints:\n    def __init__(self, rank):\n        self.rank = rank\n"
          "    def __enter__(self):\n        if self.rank == 0:\n            return\n"
          "        {silence}\n    def __exit__(self, *a):\n        pass\nmodel = DDP(Net())\n"
          "with HiddenPrints(rank):\n    for x, y in loader:\n        loss = crit(model(x), y)\n"
          "        loss.backward()\n"
          "        opt.step()\n        print('loss', loss.item())\n")
EARLY_STOP = ("class EarlyStopping:\n    def __call__(self, val_loss, model, path):\n"
              "        self.save_checkpoint(model, path)\n    def save_checkpoint(self, model, path):\n"
              "        torch.save(model.module.state_dict(), path + '/checkpoint.pth')\n"
              "early_stopping = EarlyStopping()\nmodel = DDP(Net())\nfor epoch in range(3):\n"
              "    for x in loader:\n        model(x).sum().backward()\n{call}")
EMA_ALIAS = ("import argparse\np = argparse.ArgumentParser()\n"
             "p.add_argument('--use-ema', action='store_true', default={default})\nargs = p.parse_args()\n"
             "def test(loader, net):\n    with torch.no_grad():\n        for x in loader:\n            net(x)\n"
             "model = DDP(Net())\nema_model = copy.deepcopy(model.module)\nfor x in loader:\n"
             "    model(x).sum().backward()\nif args.use_ema:\n    test_model = ema_model\nelse:\n"
             "    test_model = model\nif rank == 0:\n    test(val_loader, test_model)\n")
GRAD_DUMP = ("model = DDP(Net())\nfor x in loader:\n    model(x).sum().backward()\n"
             "    if not all(p.grad.isfinite().all() for p in model.parameters()):\n"
             "        torch.save(model.module.state_dict(), 'dump.pth')\n{stop}")
GROUP_LR = ("model = DDP(Net())\nopt = torch.optim.Adam(model.parameters(), lr=1e-4)\n"
            "for param_group in opt.param_groups:\n    param_group['lr'] = param_group['lr'] * {factor}\n")
INFERENCE_EPOCH = ("from tqdm import tqdm\nval_sampler = DistributedSampler(val_set)\n"
                   "val_loader = DataLoader(val_set, sampler=val_sampler)\nmodel = DDP(Net())\n"
                   "def inference_epoch():\n    pbar = tqdm(enumerate(val_loader))\n    for i, x in pbar:\n"
                   "        r = model(x)\n{reduce}inference_epoch()\n")
WORKER_SEED = ("import numpy as np\ndef worker_init_fn(worker_id):\n"
               "    np.random.seed(torch.initial_seed() % 2 ** 32)\n"
               "{seed}loader = DataLoader(ds, worker_init_fn=worker_init_fn)\nmodel = DDP(Net())\n" + LOOP)
GATED_HELPER = ("import argparse\np = argparse.ArgumentParser()\n"
                "p.add_argument('--fix_random_seed', action='store_true')\n"
                "args = p.parse_args()\ndef set_random_seed(seed):\n    torch.manual_seed(seed)\n"
                "{call}model = DDP(Net())\n" + LOOP)
FSTRING_PORT = ("import argparse\np = argparse.ArgumentParser()\np.add_argument('--port', type=int, default=12361)\n"
                "args = p.parse_args()\ndist.init_process_group('nccl', init_method={url}, world_size=2, rank=0)\n"
                "torch.manual_seed(0)\nmodel = DDP(Net())\n")
NO_HEAD = "import os, torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
SPAWN_HEAD = ("import os, copy, torch, torch.distributed as dist\nimport torch.multiprocessing as mp\n"
              "from torch.nn.parallel import DistributedDataParallel as DDP\n"
              "from torch.utils.data import DataLoader, DistributedSampler\n")

ONE_SAMPLER_HELPER = ("def data_provider(flag):\n"
                      "    train_datasampler = DistributedSampler(ds, shuffle=flag == 'train')\n"
                      "    return DataLoader(ds, sampler=train_datasampler)\nmodel = DDP(Net())\n"
                      "def vali(loader):\n    for x in loader:\n        r = model(x)\n        dist.all_reduce(r)\n"
                      "loader = data_provider(flag='{flag}')\nvali(loader)\n")

CASES18 = [
    # a helper with one sampler for every split, named like the training one (Timer's `train_datasampler`), builds
    # the evaluation split's padding sampler when it is asked for flag='val'
    ("eval-padding-duplicates", ONE_SAMPLER_HELPER.format(flag="train"), ONE_SAMPLER_HELPER.format(flag="val")),
    # `not args.multi_gpu or rank == 0` where the project wraps (or spawns) only under that flag: rank 0's alone in
    # every run the script starts (SAM-Med3D); a flag that gates no wrap is the leaky launcher option
    ("save-on-every-rank", OWN_SWITCH.format(wrap="if args.multi_gpu:\n    model = DDP(model)\n"),
     OWN_SWITCH.format(wrap="model = DDP(model)\n")),
    # `if args.local_rank == -1:` runs in a one-process run only: no rank waits there (BERT-NER's evaluate)
    ("collective-under-rank0", RANK0_EVAL.format(call="        if args.local_rank == -1:\n            evaluate()\n"),
     RANK0_EVAL.format(call="        evaluate()\n")),
    # the rank-0-first barrier pair of a cache helper that rank 0 alone calls: under `and not evaluate`, where
    # `evaluate` names a function (always true, so the test is always false: BERT-NER), neither runs; without it,
    # rank 0 waits at its barrier for ranks that never call the helper (the not-rank-0 one is not reached)
    ("collective-under-rank0", HELPER_BARRIER.format(cond=" and not evaluate"), HELPER_BARRIER.format(cond="")),
    # an object whose __call__ writes to stdout prints the loss it is handed (BERT-NER's ProgressBar)
    ("every-rank-prints-loss", STDOUT_BAR.format(body="        self.last = info\n"),
     STDOUT_BAR.format(body="        sys.stdout.write(f'\\r{{step}} {{info}}')\n")),
    # code after `if self.rank == 0: return` runs off rank 0: a stdout silenced there leaves rank 0's prints alone
    # (Timer's HiddenPrints)
    ("every-rank-prints-loss", HIDDEN.format(silence="sys.stdout = open(os.devnull, 'w')"),
     HIDDEN.format(silence="pass")),
    # an instance called like a function runs its __call__ (Timer's early_stopping(val_loss, model, path))
    ("save-on-every-rank", EARLY_STOP.format(call="    if rank == 0:\n        early_stopping(0.0, model, 'ckpt')\n"),
     EARLY_STOP.format(call="    early_stopping(0.0, model, 'ckpt')\n")),
    # the wrapper bound only in the else of an option that cannot be turned off (FixMatch's --use-ema)
    ("ddp-forward-under-rank0", EMA_ALIAS.format(default="True"), EMA_ALIAS.format(default="False"), SPAWN_HEAD
     + "dist.init_process_group('nccl')\nrank = dist.get_rank()\ntorch.manual_seed(0)\n"),
    # a dump that stops in the debugger is no checkpoint (GeoTransformer's invalid-gradient check)
    ("save-on-every-rank", GRAD_DUMP.format(stop="        ipdb.set_trace()\n"), GRAD_DUMP.format(stop="")),
    # the lr written through param_group['lr'] (GeoTransformer's register_optimizer)
    ("lr-grows-with-world-size", GROUP_LR.format(factor="1"), GROUP_LR.format(factor="world_size")),
    # an evaluation loop in inference_epoch() over a bar of the val loader that reduces (GeoTransformer)
    ("eval-padding-duplicates", INFERENCE_EPOCH.format(reduce=""),
     INFERENCE_EPOCH.format(reduce="        dist.all_reduce(r)\n")),
    # torch.initial_seed() reads the seed; it seeds nothing (MTR's worker_init_fn)
    ("no-seed", WORKER_SEED.format(seed="torch.manual_seed(0)\n"), WORKER_SEED.format(seed=""), DDP_HEAD),
    # a seeding helper called only under an option off by default (MTR's --fix_random_seed)
    ("no-seed", GATED_HELPER.format(call="set_random_seed(666)\n"),
     GATED_HELPER.format(call="if args.fix_random_seed:\n    set_random_seed(666)\n"), DDP_HEAD),
    # an f-string rendezvous on an option whose default is a fixed port (SAM-Med3D)
    ("hard-coded-master-port", FSTRING_PORT.format(url="f'tcp://127.0.0.1:{os.environ[\"MASTER_PORT\"]}'"),
     FSTRING_PORT.format(url="f'tcp://127.0.0.1:{args.port}'"), NO_HEAD),
]



# held-out batches 20 and 21 (helpers labelled them blind; tests/outside/heldout_labels.json)
OPTIONAL_GROUP = ("import argparse, torch, torch.distributed as dist\n"
                  "from torch.nn.parallel import DistributedDataParallel as DDP\n"
                  "p = argparse.ArgumentParser()\np.add_argument('--distributed', action='store_true')\n"
                  "args = p.parse_args()\nif args.distributed:\n    dist.init_process_group('nccl')\n"
                  "torch.manual_seed(0)\nmodel = Net()\n")
ONE_PROCESS_PATH = ("def main(rank, use_ddp):\n    if use_ddp:\n        dist.init_process_group('nccl')\n{wrap}"
                    "if __name__ == '__main__':\n    main(0, False)\n")
PORT_IN_OPT = ("import argparse\np = argparse.ArgumentParser()\np.add_argument('-P', '--port', default={default})\n"
               "args = p.parse_args()\nopt = {{}}\nopt['init_method'] = 'tcp://127.0.0.1:' + args.port\n"
               "def main_worker(gpu, opt):\n"
               "    dist.init_process_group('nccl', init_method=opt['init_method'], world_size=2, rank=gpu)\n"
               "    torch.manual_seed(0)\n    model = DDP(Net())\n")

CASES20 = [
    # a DDP wrap outside the switch that sets up an optional group, in a project that runs itself without the
    # group (SEA-RAFT's `main(0, 1, args, False)` for one GPU): that run raises at the wrap. (Without such a call
    # the wrap is left out: the one-process run stops there before any work, test_audit_classes63.)
    ("collective-outside-switch", ONE_PROCESS_PATH.format(wrap="    if use_ddp:\n        m = DDP(model)\n"),
     ONE_PROCESS_PATH.format(wrap="    m = DDP(model)\n"), OPTIONAL_GROUP),
    # 'tcp://127.0.0.1:' + args.port stored in opt['init_method'] and passed on, --port defaulting to a fixed
    # port (Palette)
    ("hard-coded-master-port", PORT_IN_OPT.format(default="None"), PORT_IN_OPT.format(default="'21012'"), NO_HEAD),
]



# held-out batch 22 (a helper labelled it blind; tests/outside/heldout_labels.json)
INITIALIZED_WRAP = ("def initialized():\n    return __initialized\nmodel = Net()\n{wrap}" + LOOP)
GLOBAL_BATCH = ("per_gpu = args.bs // dist.get_world_size()\nglb_batch_size = {glb}\n"
                "lr = args.base_lr * glb_batch_size / 256\nmodel = DDP(Net())\n"
                "opt = torch.optim.SGD(model.parameters(), lr=lr)\n")
RESUMED_DESC = ("def load_checkpoint(path):\n    ckpt = torch.load(path, map_location='cpu')\n"
                "    return ckpt['epoch'], ckpt['performance_desc']\nmodel = DDP(Net())\n"
                "ep_start, {name} = load_checkpoint(args.resume_from)\nif rank == 0:\n"
                "    print('done', {name})\nfor x, y in loader:\n    loss = crit(model(x), y)\n"
                "    loss.backward()\n    opt.step()\n    {name} = f'{{loss.item():.4f}}'\n")

CASES22 = [

    # a helper named initialized() asks whether the group exists (SparK's dist.initialized()): the collective under
    # it is switched
    ("collective-outside-switch", INITIALIZED_WRAP.format(wrap="if initialized():\n    dist.barrier()\n"),
     INITIALIZED_WRAP.format(wrap="dist.barrier()\n"), OPTIONAL_GROUP),
    # a global batch made of a per-GPU batch divided by the world size, times it, stays fixed (SparK's arg_util)
    ("lr-grows-with-world-size", GLOBAL_BATCH.format(glb="per_gpu * dist.get_world_size()"),
     GLOBAL_BATCH.format(glb="args.bs * dist.get_world_size()")),
    # a value read back from a checkpoint before the log is no loss of this run (SparK's "PT already done")
    ("rank0-local-loss", RESUMED_DESC.format(name="performance_desc"), RESUMED_DESC.format(name="performance_desc")
     .replace("ep_start, performance_desc = load_checkpoint(args.resume_from)\n",
              "performance_desc = f'{crit(model(x0), y0).item():.4f}'\n")),
]


# PaCo: print is silenced off rank 0, but the progress meter appends its line to one log file with open().write
FILE_METER = ("import builtins\nif rank != 0:\n    builtins.print = lambda *a: None\nclass Meter:\n"
              "    def __init__(self, name):\n        self.name, self.avg = name, 0.0\n"
              "    def update(self, v):\n        self.avg = v\n    def __str__(self):\n"
              "        return f'{{self.name}} {{self.avg}}'\nclass ProgressMeter:\n"
              "    def __init__(self, meters):\n        self.meters = meters\n    def display(self, i):\n"
              "        line = ' '.join(str(m) for m in self.meters)\n{write}"
              "model = DDP(Net())\nlosses = Meter('Loss')\nprogress = ProgressMeter([losses])\n"
              "for i, (x, y) in enumerate(loader):\n    loss = crit(model(x), y)\n    loss.backward()\n"
              "    opt.step()\n    losses.update(loss.item())\n    progress.display(i)\n")

# RobustVideoMatting: three shuffling samplers; the helpers that draw from two of them call their set_epoch, the
# epoch loop over the third never does
TWO_SAMPLERS = ("class Trainer:\n    def __init__(self):\n        self.model = DDP(Net())\n"
                "        self.lr_sampler = DistributedSampler(lr_set)\n"
                "        self.lr_loader = DataLoader(lr_set, sampler=self.lr_sampler)\n"
                "        self.hr_sampler = DistributedSampler(hr_set)\n"
                "        self.hr_loader = DataLoader(hr_set, sampler=self.hr_sampler)\n"
                "        self.hr_iter = iter(self.hr_loader)\n    def next_hr(self):\n        try:\n"
                "            return next(self.hr_iter)\n        except StopIteration:\n"
                "            self.hr_sampler.set_epoch(self.hr_sampler.epoch + 1)\n"
                "            self.hr_iter = iter(self.hr_loader)\n            return next(self.hr_iter)\n"
                "    def fit(self):\n        for epoch in range(10):\n{lr}"
                "            for x in self.lr_loader:\n                self.model(x, self.next_hr()).sum().backward()\n"
                "Trainer().fit()\n")

# MP-SENet: rank 0 alone validates through the DDP wrapper under no_grad; its model holds only buffer-free layers
# (InstanceNorm2d(affine=True), LayerNorm, Conv2d), so the forward broadcasts nothing
RANK0_VALID = ("import torch.nn as nn\nclass Block(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
               "        self.net = nn.Sequential(nn.Conv2d(1, 8, 3), {norm}, nn.PReLU(8))\n"
               "    def forward(self, x):\n        return self.net(x)\nclass Net(nn.Module):\n"
               "    def __init__(self):\n        super().__init__()\n        self.blocks = nn.ModuleList([Block()])\n"
               "    def forward(self, x):\n        return self.blocks[0](x)\nmodel = Net()\nmodel = DDP(model)\n"
               "for x in loader:\n    model(x).sum().backward()\n    if rank == 0:\n        with torch.no_grad():\n"
               "            model(x_val)\n")

# DyTox and DeiT: the padding evaluation sampler only under --dist-eval, a store_true option off by default
DIST_EVAL = ("import argparse\nparser = argparse.ArgumentParser()\n"
             "parser.add_argument('--dist-eval', action='store_true', default={default})\nargs = parser.parse_args()\n"
             "if args.dist_eval:\n    val_sampler = DistributedSampler(val_set, shuffle=False)\nelse:\n"
             "    val_sampler = torch.utils.data.SequentialSampler(val_set)\n"
             "val_loader = DataLoader(val_set, sampler=val_sampler)\ndef evaluate():\n    for x in val_loader:\n"
             "        dist.all_reduce(x)\nevaluate()\n")

# DyTox: the teacher is copied in the task loop from the second task on, after a DDP pass made the weights one
TASK_COPY = ("import copy\ntorch.manual_seed(args.seed + rank)\nmodel = Net()\n"
             "for task_id, ds in enumerate(tasks):\n    if {test}:\n        teacher = copy.deepcopy(model)\n"
             "    ddp = DDP(model)\n    for x in ds:\n        ddp(x).sum().backward()\n")

# VAR: the group exists only when a launcher set RANK (`if 'RANK' in os.environ: init_process_group(...)`)
ENV_SWITCH_HEAD = ("import os, torch, torch.distributed as dist\n"
                   "from torch.nn.parallel import DistributedDataParallel as DDP\ntorch.manual_seed(0)\n"
                   "model = Net()\nif 'RANK' in os.environ:\n    dist.init_process_group('nccl')\n"
                   "    model = DDP(model)\n")

# FourCastNet: a helper of either split builds the sampler, but only the training loader gets it
EITHER_SPLIT = ("def get_data_loader(path, distributed, train):\n    dataset = Data(path)\n"
                "    sampler = DistributedSampler(dataset, shuffle=train) if distributed else None\n"
                "    loader = DataLoader(dataset, sampler={given})\n    if train:\n"
                "        return loader, sampler\n    return loader, None\n"
                "train_loader, train_sampler = get_data_loader('a', True, train=True)\n"
                "valid_loader, _ = get_data_loader('b', True, train=False)\nmodel = DDP(Net())\n"
                "def validate():\n    with torch.no_grad():\n        for x in valid_loader:\n"
                "            err = model(x).sum()\n            dist.all_reduce(err)\n"
                "for epoch in range(3):\n    train_sampler.set_epoch(epoch)\n    for x in train_loader:\n"
                "        model(x).sum().backward()\n    validate()\n")

# UniTS: the loss comes from a helper whose masking indexes with torch.gather (a tensor op, no collective)
TENSOR_GATHER = ("def random_masking(x, ids):\n    return torch.gather(x, dim=1, index=ids)\n"
                 "def train_step(model, x, ids):\n    return model(random_masking(x, ids)).mean()\n"
                 "model = DDP(Net())\nfor i, (x, ids) in enumerate(loader):\n    loss = train_step(model, x, ids)\n"
                 "    loss.backward()\n    opt.step()\n    loss_display = loss.item()\n{reduce}"
                 "    if rank == 0:\n        print(f'loss {{loss_display}}')\n")

# Point-MAE: validate() would all-gather the padded shards, but nothing calls it (its call is commented out)
UNCALLED_VALIDATE = ("val_sampler = DistributedSampler(val_set)\n"
                     "val_loader = DataLoader(val_set, sampler=val_sampler)\n"
                     "model = DDP(Net())\ndef validate():\n    for x in val_loader:\n        out = model(x)\n"
                     "        dist.all_reduce(out)\nfor x in loader:\n    model(x).sum().backward()\n{call}")

CASES24 = [
    ("eval-padding-duplicates", UNCALLED_VALIDATE.format(call="# validate()\n"),
     UNCALLED_VALIDATE.format(call="validate()\n")),
    ("rank0-local-loss", TENSOR_GATHER.format(reduce="    loss_display = reduce_mean(loss).item()\n"),
     TENSOR_GATHER.format(reduce="")),
    ("eval-padding-duplicates", EITHER_SPLIT.format(given="sampler if train else None"),
     EITHER_SPLIT.format(given="sampler")),
    ("collective-outside-switch", "for x in loader:\n    model(x).sum().backward()\n"
     "if 'RANK' in os.environ:\n    dist.barrier()\n",
     "for x in loader:\n    model(x).sum().backward()\ndist.barrier()\n", ENV_SWITCH_HEAD),
    ("seed-per-rank", TASK_COPY.format(test="use_kd and task_id > 0"), TASK_COPY.format(test="use_kd")),
    ("seed-per-rank", TASK_COPY.format(test="task_id != 0"), TASK_COPY.format(test="use_kd or task_id > 0")),
    ("eval-padding-duplicates", DIST_EVAL.format(default="False"), DIST_EVAL.format(default="True")),
    # ... but `--distributed` (3D-ResNets), off by default too, is how the DDP run is asked for
    ("eval-padding-duplicates", DIST_EVAL.format(default="False"),
     DIST_EVAL.format(default="False").replace("dist-eval", "distributed").replace("dist_eval", "distributed")),
    ("ddp-forward-under-rank0", RANK0_VALID.format(norm="nn.InstanceNorm2d(8, affine=True)"),
     RANK0_VALID.format(norm="nn.BatchNorm2d(8)")),
    ("ddp-forward-under-rank0", RANK0_VALID.format(norm="nn.LayerNorm(8)"),
     RANK0_VALID.format(norm="nn.InstanceNorm2d(8, track_running_stats=True)")),
    # one sampler's set_epoch called by name, another's never: that one repeats its order
    ("set-epoch-missing", TWO_SAMPLERS.format(lr="            self.lr_sampler.set_epoch(epoch)\n"),
     TWO_SAMPLERS.format(lr="")),
    # a meter that writes its line to one shared file on every rank (print silenced off rank 0 does not stop it);
    # a file named by the rank is each rank's own
    ("every-rank-prints-loss",
     FILE_METER.format(write="        open(f'log_{rank}.txt', 'a+').write(line + '\\n')\n"),
     FILE_METER.format(write="        open('train.log', 'a+').write(line + '\\n')\n")),
    ("every-rank-prints-loss",
     FILE_METER.format(write="        print(line)\n"),
     FILE_METER.format(write="        with open('train.log', 'a') as fh:\n            fh.write(line)\n")),
]


# Held-out batch 28's classes (its first look 1/7, 1/7 in docs/measured/cpu2/audit_heldout_batch28.txt)
# unicom: `if world_size >= 1: init_process_group(...)` holds for every run: the group always exists
ALWAYS_GROUP = ("import os, torch, torch.distributed as dist\n"
                "from torch.nn.parallel import DistributedDataParallel as DDP\n"
                "world_size = int(os.environ.get('WORLD_SIZE', 1))\ntorch.manual_seed(0)\n"
                "if world_size {test}:\n    dist.init_process_group('nccl')\n")
# unicom and LoRA: accumulation counted with `--gradient_acc` / `--grad_acc`, default 1
GRAD_ACC = ("import argparse\nparser = argparse.ArgumentParser()\n"
            "parser.add_argument('--gradient_acc', type=int, default={default})\nargs = parser.parse_args()\n"
            "model = DDP(Net())\nfor step, x in enumerate(loader):\n    loss = model(x).sum() / args.gradient_acc\n"
            "    loss.backward()\n    if step % args.gradient_acc == 0:\n        opt.step()\n        opt.zero_grad()\n")
# OpenUnReID: sys.stdout = Logger(...), whose write writes only on rank 0: every print is rank 0's
STDOUT_LOGGER = ("import sys\nclass Logger:\n    def __init__(self, rank):\n        self.rank = rank\n"
                 "    def write(self, msg):\n        {test}\n            sys.__stdout__.write(msg)\n"
                 "sys.stdout = Logger(rank)\nmodel = DDP(Net())\nfor x in loader:\n    loss = model(x).sum()\n"
                 "    loss.backward()\n    print(f'loss {{loss.item()}}')\n")
# hyp_metric: every rank's features gathered under no_grad, then this rank's own slot put back with its graph
OWN_SLOT = ("model = DDP(Net())\nfor x in loader:\n    z = model(x)\n{gather}"
            "    loss = contrastive(z)\n    loss.backward()\n")
# hyp_metric: the evaluation helper's embeddings are all-gathered after it returns
EVAL_THEN_GATHER = ("def eval_dataset(model, dl):\n    return torch.cat([model(x) for x in dl])\n"
                    "def get_emb(model, ds_eval):\n    sampler = DistributedSampler(ds_eval)\n"
                    "    x = eval_dataset(model, DataLoader(ds_eval, sampler=sampler))\n{gather}    return x\n"
                    "model = DDP(Net())\nfor b in loader:\n    model(b).sum().backward()\n"
                    "emb = get_emb(model, test_set)\n")

# Held-out batch 24's classes: GANgealing's primary() (`return True` without a group, else get_rank() == 0), its
# all_gather helper returning early in both arms of `if cat:` when the world size is 1, and stylegan2's trainer
# stepping through a partial of a backward helper (`backwards = partial(loss_backwards, fp16)`)
PRIMARY = ("def primary():\n    if not dist.is_initialized():\n        return True\n    return {test}\n"
           "model = DDP(Net())\nfor i, x in enumerate(loader):\n    model(x).sum().backward()\n    if primary():\n"
           "        torch.save(model.module.state_dict(), 'ckpt.pt')\n")
EARLY_GATHER = ("def all_gather(x, cat=True):\n{early}"
                "    out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]\n"
                "    dist.all_gather(out, x)\n    return torch.cat(out) if cat else torch.stack(out)\n"
                "model = Net()\nif args.distributed:\n    dist.init_process_group('nccl')\n    model = DDP(model)\n"
                "for x in loader:\n    z = all_gather(model(x))\n")
PARTIAL_BACKWARD = ("from functools import partial\ndef loss_backwards(fp16, loss, opt):\n    loss.backward()\n"
                    "class Trainer:\n    def __init__(self):\n        self.model = DDP(Net())\n"
                    "    def train(self, x):\n        backwards = partial(loss_backwards, False)\n"
                    "        disc_loss = self.model(x).sum()\n        backwards(disc_loss, self.opt)\n"
                    "        self.d_loss = float({value})\n    def print_log(self):\n"
                    "        data = [('D', self.d_loss)]\n"
                    "        log = ' | '.join(f'{{n}}: {{v:.2f}}' for n, v in data)\n"
                    "        print(log)\nis_main = rank == 0\nt = Trainer()\nfor x in loader:\n    t.train(x)\n"
                    "    if is_main:\n        t.print_log()\n")

# Held-out batch 29's class: MagFace's model-parallel classifier gathers every rank's labels before the loss
# (`target = ts.distributed.gather(target, dim=0)`), so the loss its meter shows is the global batch's
GATHERED_LABELS = ("import builtins\nif rank != 0:\n    builtins.print = lambda *a: None\nmodel = DDP(Net())\n"
                   "losses = AverageMeter('Loss')\nfor i, (x, target) in enumerate(loader):\n"
                   "    output = model(x)\n{gather}    loss_id, loss_g = criterion(output, target)\n"
                   "    loss = loss_id + 0.1 * loss_g\n    loss.backward()\n    losses.update(loss.item())\n"
                   "    print(f'loss {{losses.avg}}')\n")

# Held-out batch 30's class: Jukebox's `log_input_output = (logger.iters % hps.save_iters == 0)`, where logger is
# built with the rank: a step-count flag on every rank, so the all-gather it gates is reached by every rank
PERIODIC = ("logger = init_logging(hps, local_rank, rank)\nmodel = DDP(Net())\nfor i, x in enumerate(loader):\n"
            "    model(x).sum().backward()\n    log_io = ({test})\n    if log_io:\n"
            "        out = [torch.zeros_like(x) for _ in range(2)]\n        dist.all_gather(out, x)\n")

# Oscar: the group is set up in the else of `if args.local_rank == -1 or args.no_cuda:`, and main() (long, with an
# is_initialized() check around another call) all-reduces its metrics at every checkpoint, outside the switch
OSCAR_MAIN = ("import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
              "def main(args):\n    torch.manual_seed(0)\n    if args.local_rank == -1 or args.no_cuda:\n"
              "        device = 'cpu'\n    else:\n        dist.init_process_group('nccl')\n"
              "    model = Net()\n    if dist.is_initialized():\n        model = DDP(model)\n"
              + "".join(f"    step{i} = {i}\n" for i in range(12)) +
              "    for step, x in enumerate(loader):\n        loss = model(x).sum()\n        loss.backward()\n"
              "        if step % 100 == 0:\n            m = torch.tensor([loss.item()])\n{reduce}"
              "main(args)\n")

CASES28 = [
    ("collective-outside-switch",
     OSCAR_MAIN.format(reduce="            if dist.is_initialized():\n                dist.all_reduce(m)\n"),
     OSCAR_MAIN.format(reduce="            dist.all_reduce(m)\n"), ""),
    ("collective-under-rank0", PERIODIC.format(test="logger.iters % hps.save_iters == 0"),
     PERIODIC.format(test="rank == 0")),
    ("rank0-local-loss", GATHERED_LABELS.format(gather="    target = ts.distributed.gather(target, dim=0)\n"),
     GATHERED_LABELS.format(gather="")),
    ("save-on-every-rank", PRIMARY.format(test="dist.get_rank() == 0"), PRIMARY.format(test="True")),
    ("collective-outside-switch", EARLY_GATHER.format(
        early="    if dist.get_world_size() == 1:\n        if cat:\n            return x\n        else:\n"
              "            return x.unsqueeze(0)\n"), EARLY_GATHER.format(early=""), ""),
    ("rank0-local-loss", PARTIAL_BACKWARD.format(value="reduce_mean(disc_loss)"),
     PARTIAL_BACKWARD.format(value="disc_loss")),
    ("collective-outside-switch", ALWAYS_GROUP.format(test=">= 1") + "model = DDP(Net())\ndist.barrier()\n",
     ALWAYS_GROUP.format(test="> 1") + "model = DDP(Net())\ndist.barrier()\n", ""),
    ("accumulation-without-no-sync", GRAD_ACC.format(default=1), GRAD_ACC.format(default=4)),
    ("rank0-local-loss", STDOUT_LOGGER.format(test="if True:"), STDOUT_LOGGER.format(test="if self.rank == 0:")),
    ("gather-without-grad",
     "    import torch.distributed.nn.functional as dnf\n    z = torch.cat(dnf.all_gather(z))\n".join(
         OWN_SLOT.split("{gather}")),
     OWN_SLOT.format(gather="    with torch.no_grad():\n        all_z = [torch.zeros_like(z) for _ in range(2)]\n"
                            "        dist.all_gather(all_z, z)\n    all_z[rank] = z\n    z = torch.cat(all_z)\n")),
    ("eval-padding-duplicates", EVAL_THEN_GATHER.format(gather=""),
     EVAL_THEN_GATHER.format(gather="    all_x = [torch.zeros_like(x) for _ in range(2)]\n"
                                    "    dist.all_gather(all_x, x)\n    x = torch.cat(all_x)\n")),
]


# Classes from earlier batches' misses, fixed before batch 31's first look: a logging level picked by rank (Oscar's
# `basicConfig(level=INFO if local_rank in [-1, 0] else WARN)`, MSN's setLevel under `if rank == 0`) makes the INFO
# lines rank 0's; MSN's and I-JEPA's log in a closure of the training loop (`def log_stats():`), under
# `if itr % log_freq == 0 or np.isnan(loss):` (a schedule, not an abort), of a loss an autograd Function's forward
# all-reduces (`AllReduce.apply(loss)`, I-JEPA) or not (MSN); MSN's CSVLogger prints into one file per rank
LEVEL_BY_RANK = ("import logging\nlogging.basicConfig(level={level})\nlogger = logging.getLogger()\n"
                 "model = DDP(Net())\nfor x in loader:\n    loss = model(x).sum()\n    loss.backward()\n"
                 "    logger.info(f'loss {{loss.item()}}')\n")
CLOSURE_LOG = ("import numpy as np\nclass AllReduce(torch.autograd.Function):\n    @staticmethod\n"
               "    def forward(ctx, x):\n        x = x / dist.get_world_size()\n        dist.all_reduce(x)\n"
               "        return x\n    @staticmethod\n    def backward(ctx, g):\n        return g\n"
               "def main():\n    model = DDP(Net())\n    for itr, x in enumerate(loader):\n"
               "        def train_step():\n            loss = model(x).sum()\n{reduce}"
               "            loss.backward()\n            return float(loss)\n        loss = train_step()\n"
               "        loss_meter.update(loss)\n        def log_stats():\n"
               "            if rank == 0 and (itr % 10 == 0 or np.isnan(loss)):\n"
               "                print('loss %.3f' % loss_meter.avg)\n        log_stats()\nmain()\n")
CSV_LOGGER = ("class CSVLogger:\n    def __init__(self, fname):\n        self.fname = fname\n"
              "    def log(self, *values):\n        with open(self.fname, 'a') as fh:\n"
              "            print(*values{file})\n"
              "csv_logger = CSVLogger(f'log_r{{rank}}.csv')\nmodel = DDP(Net())\nfor itr, x in enumerate(loader):\n"
              "    loss = model(x).sum()\n    loss.backward()\n    csv_logger.log(itr, loss.item())\n")
CASES31 = [
    ("rank0-local-loss", LEVEL_BY_RANK.format(level="logging.INFO"),
     LEVEL_BY_RANK.format(level="logging.INFO if rank in [-1, 0] else logging.WARN")),
    ("every-rank-prints-loss", LEVEL_BY_RANK.format(level="logging.INFO if rank in [-1, 0] else logging.WARN"),
     LEVEL_BY_RANK.format(level="logging.INFO")),
    ("rank0-local-loss", CLOSURE_LOG.format(reduce="            loss = AllReduce.apply(loss)\n"),
     CLOSURE_LOG.format(reduce="")),
    ("every-rank-prints-loss", CSV_LOGGER.format(file=", file=fh"), CSV_LOGGER.format(file="")),
    ("collective-under-rank0", "negative_all_rank = args.negative_all_rank\nif negative_all_rank:\n"
     "    dist.all_gather(out, x)\n", "if local_rank:\n    dist.all_gather(out, x)\n"),
]


# Held-out batch 37's classes: Equiformer's master alone torch.loads the per-rank prediction files (onto its own GPU),
# and files the loss into a metrics record by name (`self.metrics = evaluator.update("loss", loss.item(), ...)`),
# then logs a text built from a dict comprehension over that record
RANK0_LOAD = ("model = DDP(Net())\nfor x in loader:\n    model(x).sum().backward()\n{test}"
              "    preds = torch.load(f'pos_pred_{{i}}.pt')\n")
FILED_LOSS = ("model = DDP(Net())\nfor x in loader:\n    loss = model(x).sum()\n    loss.backward()\n"
              "    metrics = evaluator.update({key}, loss.item(), {{}})\n"
              "    log_dict = {{k: metrics[k]['metric'] for k in metrics}}\n    log_str = []\n"
              "    for k, v in log_dict.items():\n        log_str.append('{{}}: {{:.2e}}'.format(k, v))\n"
              "    if rank == 0:\n        print(', '.join(log_str))\n")
# ... and saves on every rank in a Ray Tune helper it calls only under `if self.is_hpo:`, a flag the trainer's
# __init__ defaults to False and that no call in the project passes
HPO_FLAG = ("class Trainer:\n    def __init__(self, is_hpo=False):\n        self.is_hpo = is_hpo\n"
            "    def save_hpo(self):\n        torch.save(self.model.module.state_dict(), 'ckpt.pt')\n"
            "    def train(self):\n        self.model = DDP(Net())\n        for x in loader:\n"
            "            self.model(x).sum().backward()\n            if self.is_hpo:\n                self.save_hpo()\n"
            "Trainer({given}).train()\n")
CASES37 = [
    ("save-on-every-rank", HPO_FLAG.format(given=""), HPO_FLAG.format(given="is_hpo=True")),
    ("load-without-map-location", RANK0_LOAD.format(test="if rank == 0:\n"), RANK0_LOAD.format(test="if True:\n")),
    ("rank0-local-loss", FILED_LOSS.format(key="'energy_mae'"), FILED_LOSS.format(key="'loss'")),
]


# Held-out batch 35's classes: WeSpeaker scales its scheduler's lr factor with the GPU count
# (`configs['scheduler_args']['scale_ratio'] = world_size * batch_size / 64`), and hands run_epoch a logger its
# get_logger helper makes on every rank (basicConfig with no rank guard), which logs the loss meter twice in one
# function: one finding
SCALE_RATIO = ("configs['scheduler_args']['scale_ratio'] = 1.0 * {world}configs['batch_size'] / 64\n"
               "scheduler = getattr(schedulers, configs['scheduler'])(optimizer, **configs['scheduler_args'])\n")
HANDED_LOGGER = ("import logging\ndef get_logger(outdir):\n{guard}    logging.basicConfig(level=logging.DEBUG)\n"
                 "    logger = logging.getLogger('Pyobj, f')\n    return logger\n"
                 "def run_epoch(model, loader, logger):\n    for i, x in enumerate(loader):\n"
                 "        loss = model(x).sum()\n        loss_meter.add(loss.item())\n        loss.backward()\n"
                 "        if i % 10 == 0:\n            logger.info(loss_meter.value()[0])\n"
                 "    logger.info(loss_meter.value()[0])\n"
                 "logger = get_logger('exp')\nmodel = DDP(Net())\nrun_epoch(model, loader, logger)\n")
# GFSLT-VLP sets up the group only when launched, yet builds its DistributedSampler on every path: a run without
# the launcher stops there, so its set_epoch and all_gather under/outside the switch break no single run; its
# `def loss_fn_kd(...)` with reduction='sum' is never called
ONLY_DISTRIBUTED = ("import os\nif 'RANK' in os.environ:\n    dist.init_process_group('nccl')\n"
                    "    distributed = True\nelse:\n    distributed = False\nmodel = DDP(Net())\n"
                    "s = DistributedSampler(ds{replicas})\nfor epoch in range(3):\n    if distributed:\n"
                    "        s.set_epoch(epoch)\n    for b in DataLoader(ds, sampler=s):\n"
                    "        model(b).sum().backward()\n        out = [torch.zeros(1), torch.zeros(1)]\n"
                    "        dist.all_gather(out, torch.ones(1))\n")
UNUSED_KD = ("def loss_fn_kd(outputs, teacher):\n    return torch.nn.KLDivLoss(reduction='sum')(outputs, teacher)\n"
             "model = DDP(Net())\nfor x in loader:\n    {use}.backward()\n")
CASES35 = [
    ("set-epoch-missing", ONLY_DISTRIBUTED.format(replicas=""),
     ONLY_DISTRIBUTED.format(replicas=", num_replicas=2, rank=0"), ""),
    ("collective-outside-switch", ONLY_DISTRIBUTED.format(replicas=""),
     ONLY_DISTRIBUTED.format(replicas=", num_replicas=2, rank=0"), ""),
    ("sum-loss-unscaled", UNUSED_KD.format(use="model(x).sum()"), UNUSED_KD.format(use="loss_fn_kd(model(x), t)")),
    ("lr-grows-with-world-size", SCALE_RATIO.format(world=""), SCALE_RATIO.format(world="world_size * ")),
    ("every-rank-prints-loss", HANDED_LOGGER.format(guard="    if rank != 0:\n        return None\n"),
     HANDED_LOGGER.format(guard="")),
]


# Held-out batches 32, 33 and 36's classes: OpenSphere fills a dataset-sized buffer by sample index and all-reduces
# it (a padded duplicate lands on its own sample's slot); NLSPN's launcher loads a checkpoint in test() after its
# mp.spawn of the workers returns (one process); DOT's rank 0 validates alone on an unsharded set inside a
# `for global_iter in range(...)` loop and appends each step's loss
SCATTERED = ("model = DDP(Net())\nfor x in loader:\n    model(x).sum().backward()\n"
             "def evaluate(model, val_loader):\n    feats = torch.zeros(len(val_loader.dataset), 8)\n"
             "    for data, indices in val_loader:\n        {store}\n    dist.all_reduce(feats)\n    return feats\n"
             "val_loader = DataLoader(val_set, sampler=DistributedSampler(val_set))\nevaluate(model, val_loader)\n")
AFTER_SPAWN = ("import torch.multiprocessing as mp\ndef train(gpu, args):\n    dist.init_process_group('nccl')\n"
               "    torch.manual_seed(0)\n    model = DDP(Net())\n    for x in loader:\n"
               "        model(x).sum().backward()\n{worker}def test(args):\n"
               "    state = torch.load(args.pretrain)\n    Net().load_state_dict(state)\n"
               "def main(args):\n    mp.spawn(train, nprocs=2, args=(args,))\n    test(args)\nmain(args)\n")
RANK0_VALID = ("model = DDP(Net())\ndef step(dataset, model):\n    loss = model(dataset.next()).mean()\n"
               "    return loss\nfor global_iter in range(1000):\n    step(train_set, model).backward()\n"
               "    if rank == 0:\n        losses = []\n        for {loop}:\n"
               "            losses.append(step({data}, model.module))\n        loss = torch.stack(losses).mean()\n"
               "        print(f'valid {{loss.item()}}')\n")
# PET converts to SyncBatchNorm only under `--syn_bn`, an int option that defaults to 0
SYN_BN_INT = ("import argparse\np = argparse.ArgumentParser()\n"
              "p.add_argument('--syn_bn', default={default}, type=int)\nargs = p.parse_args()\n"
              "model = Net()\nif args.syn_bn:\n"
              "    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\nmodel = DDP(model)\n")
CASES3236 = [
    ("batchnorm-without-sync", SYN_BN_INT.format(default=1), SYN_BN_INT.format(default=0)),
    ("eval-padding-duplicates", SCATTERED.format(store="feats[indices] = model(data)"),
     SCATTERED.format(store="feats = torch.cat([feats, model(data)])")),
    ("load-without-map-location", AFTER_SPAWN.format(worker=""),
     AFTER_SPAWN.format(worker="        test(args)\n"), ""),
    ("rank0-local-loss", RANK0_VALID.format(loop="_ in range(8)", data="valid_set"),
     RANK0_VALID.format(loop="batch in train_loader", data="batch")),
]


# Held-out batch 34's classes: CBIM's validation drops the padded samples it gathered (`dataset_len %
# world_size`); CLIP-Driven loads an option that defaults to a .pth file, and builds its UNet of ContBatchNorm3d
# (a _BatchNorm); BiRefNet's Logger class adds a StreamHandler on every rank
DROPS_PADDING = ("model = DDP(Net())\nfor x in loader:\n    model(x).sum().backward()\n"
                 "def validation(model, loader):\n    out = []\n    for x in loader:\n"
                 "        out.append(concat_all_gather(model(x)))\n{drop}    return out\n"
                 "def concat_all_gather(t):\n    ts = [torch.zeros_like(t) for _ in range(2)]\n"
                 "    dist.all_gather(ts, t)\n    return torch.cat(ts)\n"
                 "val_loader = DataLoader(val_set, sampler=DistributedSampler(val_set))\n"
                 "validation(model, val_loader)\n")
OPTION_FILE = ("import argparse\np = argparse.ArgumentParser()\np.add_argument('--word_embedding', default={default})\n"
               "args = p.parse_args()\nmodel = DDP(Net())\nemb = torch.load(args.word_embedding)\n")
CONT_BN = ("class ContBatchNorm3d({base}):\n    def forward(self, x):\n        return x\n"
           "class UNet(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
           "        self.bn = ContBatchNorm3d(8)\nmodel = DDP(UNet())\n")
LOGGER_CLASS = ("import logging\nclass Logger:\n    def __init__(self, path):\n"
                "        self.logger = logging.getLogger('BiRefNet')\n{handler}"
                "    def info(self, txt):\n        self.logger.info(txt)\nlogger = Logger('log.txt')\n"
                "model = DDP(Net())\nfor x in loader:\n    loss = model(x).sum()\n    loss.backward()\n"
                "    logger.info(f'loss {{loss.item()}}')\n")
CASES34 = [
    ("eval-padding-duplicates", DROPS_PADDING.format(
        drop="    pad = len(loader.dataset) % dist.get_world_size()\n    out = out[:len(out) - pad]\n"),
     DROPS_PADDING.format(drop="")),
    ("load-without-map-location", OPTION_FILE.format(default="'words.txt'"),
     OPTION_FILE.format(default="'./pretrained_weights/txt_encoding.pth'")),
    ("batchnorm-without-sync", CONT_BN.format(base="torch.nn.Module"),
     CONT_BN.format(base="torch.nn.modules.batchnorm._BatchNorm")),
    ("every-rank-prints-loss", LOGGER_CLASS.format(handler="        self.logger.addHandler(logging.FileHandler("
                                                           "f'log{rank}.txt'))\n"),
     LOGGER_CLASS.format(handler="        self.logger.addHandler(logging.StreamHandler())\n")),
]


# Held-out batch 36's classes: ivanvovk/WaveGrad logs through a Logger whose log_training returns unless
# self.rank == 0 (rank 0's log, not every rank's), and spawns its workers through a helper
# (`run_distributed(run_training, ...)` runs mp.spawn(fn, ...)) after seeding only the parent
INNER_GUARD = ("class Logger:\n    def __init__(self, rank):\n        self.rank = rank\n"
               "    def log_training(self, it, stats):\n{guard}        print(f'{{it}}: {{stats}}')\n"
               "logger = Logger(rank)\nmodel = DDP(Net())\nfor it, x in enumerate(loader):\n"
               "    loss = model(x).sum()\n    loss.backward()\n    loss_stats = {{'total_loss': loss.item()}}\n"
               "    logger.log_training(it, loss_stats)\n")
SPAWN_HELPER = ("import torch, torch.multiprocessing as mp, torch.distributed as dist\n"
                "from torch.nn.parallel import DistributedDataParallel as DDP\n"
                "def run_training(rank, args):\n{seed}    dist.init_process_group('nccl', rank=rank, world_size=2)\n"
                "    model = DDP(Net())\ndef run_distributed(fn, args):\n    mp.spawn(fn, args=(args,), nprocs=2)\n"
                "if __name__ == '__main__':\n    torch.manual_seed(1234)\n    run_distributed(run_training, args)\n")
CASES36 = [
    ("every-rank-prints-loss", INNER_GUARD.format(guard="        if self.rank != 0: return\n"),
     INNER_GUARD.format(guard="")),
    ("rank0-local-loss", INNER_GUARD.format(guard=""), INNER_GUARD.format(guard="        if self.rank != 0: return\n")),
    ("seed-before-spawn", SPAWN_HELPER.format(seed="    torch.manual_seed(1234)\n"), SPAWN_HELPER.format(seed=""), ""),
]


# Held-out batch 38's classes: DS2 calls set_epoch under `if isinstance(dataloader.sampler, DistributedSampler):`
# (true whenever the sampler is one), and its detectron2-style setup_logger adds the console handler on rank 0 only
# and a StreamHandler on each rank's own log file (no console)
SAMPLER_TYPE = ("s = DistributedSampler(ds)\nloader = DataLoader(ds, sampler=s)\nfor epoch in range(3):\n"
                "    if {test}:\n        loader.sampler.set_epoch(epoch)\n    for b in loader: pass\n")
FILE_STREAM = ("import logging, sys\ndef setup_logger(output, distributed_rank):\n"
               "    logger = logging.getLogger('contrast')\n    if distributed_rank == 0:\n"
               "        logger.addHandler(logging.StreamHandler(stream=sys.stdout))\n"
               "    logger.addHandler(logging.StreamHandler({stream}))\n    return logger\n"
               "logger = setup_logger('out', dist.get_rank())\nmodel = DDP(Net())\nfor x in loader:\n"
               "    loss = model(x).sum()\n    loss.backward()\n    logger.info(f'loss {{loss.item():.3f}}')\n")
CASES38 = [
    ("set-epoch-missing", SAMPLER_TYPE.format(test="isinstance(loader.sampler, DistributedSampler)"),
     SAMPLER_TYPE.format(test="args.distributed")),
    ("rank0-local-loss", FILE_STREAM.format(stream="sys.stderr"),
     FILE_STREAM.format(stream="open(f'log{rank}.txt', 'a')")),
]


# Held-out batch 40's class: MiniMind logs through `def Logger(content): if is_main_process(): print(content)`, a
# print wrapper: its call logs what it is handed on rank 0 alone. A helper that is handed the loss and also loops
# (a training function given a logger) is no such log.
PRINT_WRAPPER = ("def is_main_process():\n    return dist.get_rank() == 0\n"
                 "def Logger(content):\n    if is_main_process():\n        {body}\n"
                 "model = DDP(Net())\nfor x in loader:\n    loss = model(x).sum()\n    loss.backward()\n"
                 "    Logger(f'loss {{loss.item():.3f}}')\n")
CASES40 = [
    ("rank0-local-loss", PRINT_WRAPPER.format(body="for line in content.split():\n            print(line)"),
     PRINT_WRAPPER.format(body="print(content)")),
    ("every-rank-prints-loss", PRINT_WRAPPER.format(body="print(content)"),
     PRINT_WRAPPER.format(body="print(content)").replace("    if is_main_process():\n    ", "")),
]


# Held-out batches 44-47's classes. ADL-Stereo spawns its ranks under `if args.distributed and
# args.multiprocessing_distributed:`, so `not args.multiprocessing_distributed or rank % ngpus == 0` is rank 0's
# guard in every run it starts; YouReID saves under `'RANK' not in os.environ or int(os.environ['RANK']) == 0`, true
# only on rank 0 of a launched run; Soft-HuBERT's `step, best = load_checkpoint(..., rank=rank)` returns no rank, so
# `if step % N == 0:` is no rank test; and its validation meter is fed over a loader with no sampler (every rank
# sees the whole set: rank 0's number is the single run's)
SPAWN_AND = ("import torch.multiprocessing as mp\ndef main_worker(gpu, ngpus, args):\n    model = DDP(Net())\n"
             "    if not args.multiprocessing_distributed or args.rank % ngpus == 0:\n"
             "        torch.save(model.state_dict(), 'ckpt.pt')\n"
             "if {flag}:\n    mp.spawn(main_worker, nprocs=2, args=(2, args))\n")
LAUNCHED = ("model = DDP(Net())\nif {test}:\n    torch.save(model.state_dict(), 'ckpt.pt')\n")
OPAQUE = ("def load_checkpoint(path, model, rank):\n    ckpt = torch.load(path, map_location=f'cuda:{{rank}}')\n"
          "    step = ckpt['step']\n    return {ret}\n"
          "model = DDP(Net())\nstep = load_checkpoint('c.pt', model, rank)\n"
          "for x in loader:\n    step += 1\n    if step % 100 == 0:\n        model(x)\n")
WHOLE_SET = ("model = DDP(Net())\nval_loader = DataLoader(val_ds, batch_size=1{sampler})\n"
             "for x in loader:\n    model(x).sum().backward()\nval_loss = Meter()\n"
             "with torch.no_grad():\n    for x in val_loader:\n        loss = model(x).mean()\n"
             "        val_loss.update(loss.item())\nif rank == 0:\n    print(val_loss.avg)\n")
CASES44 = [
    ("save-on-every-rank", SPAWN_AND.format(flag="args.distributed and args.multiprocessing_distributed"),
     SPAWN_AND.format(flag="args.distributed").replace("args.rank % ngpus == 0", "args.save")),
    ("save-on-every-rank", LAUNCHED.format(test="'RANK' not in os.environ or int(os.environ['RANK']) == 0"),
     LAUNCHED.format(test="'RANK' not in os.environ or args.save")),
    ("ddp-forward-under-rank0", OPAQUE.format(ret="step"), OPAQUE.format(ret="rank")),
    ("rank0-local-loss", WHOLE_SET.format(sampler=""),
     WHOLE_SET.format(sampler=", sampler=DistributedSampler(val_ds)")),
]


# DGL's `mp.spawn(run, ...)` hands run its process index first (`def run(proc_id, ...)`, then `if proc_id == 0:`)
# and passes init_method second by position; ADL-Stereo builds `__models__[args.model](...)` from a table these
# files lack, --model defaulting to a class the project defines; HigherHRNet converts to SyncBatchNorm only under
# `cfg.MODEL.SYNC_BN`, False in its yacs defaults
SPAWN_INDEX = ("import torch.multiprocessing as mp\ndef run(proc_id, nprocs):\n    model = DDP(Net())\n"
               "    for x in loader:\n        loss = model(x).sum()\n        loss.backward()\n"
               "        if {test}:\n            print(loss.item())\nmp.spawn(run, args=(2,), nprocs=2)\n")
PORT_ARG = "dist.init_process_group('nccl', {url}, world_size=2, rank=rank)\n"
CONFIG_OFF = ("from yacs.config import CfgNode as CN\n_C = CN()\n_C.MODEL = CN()\n_C.MODEL.SYNC_BN = {default}\n"
              "cfg = _C.clone()\nmodel = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))\n"
              "if cfg.MODEL.SYNC_BN:\n    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\n"
              "model = DDP(model)\nfor x in loader:\n    model(x).sum().backward()\n")
CASES44 += [
    ("every-rank-prints-loss", SPAWN_INDEX.format(test="proc_id == 0"), SPAWN_INDEX.format(test="nprocs == 2")),
    ("hard-coded-master-port", PORT_ARG.format(url="'env://'"), PORT_ARG.format(url="'tcp://127.0.0.1:12347'")),
    ("batchnorm-without-sync", CONFIG_OFF.format(default="True"), CONFIG_OFF.format(default="False")),
]


# Held-out batches 48-51's classes: NeWCRFs's evaluation sampler keeps torch's padding line commented out (its own
# __iter__ pads nothing); DDGAN logs DCGAN's `errG`/`errD`; PVDM loads GradScaler states (Python numbers) without
# map_location
SAMPLER_OWN_ITER = ("class EvalDistributedSampler(torch.utils.data.Sampler):\n    def __init__(self, ds):\n"
                    "        self.total_size = len(ds)\n        self.ds = ds\n    def __iter__(self):\n"
                    "        indices = list(range(len(self.ds)))\n{pad}"
                    "        return iter(indices[rank:self.total_size:world_size])\n"
                    "val_sampler = EvalDistributedSampler(val_ds)\n"
                    "val_loader = DataLoader(val_ds, sampler=val_sampler)\n"
                    "model = DDP(Net())\n"
                    "for x in loader:\n    model(x).sum().backward()\ndef evaluate(loader):\n"
                    "    for x in loader:\n        s = model(x).sum()\n        dist.all_reduce(s)\n"
                    "evaluate(val_loader)\n")
GAN_ERR = ("model = DDP(Net())\nfor x in loader:\n    errG = model(x).mean()\n    errG.backward()\n{reduce}"
           "    if rank == 0:\n        print('G loss', errG.item())\n")
SCALER_LOAD = ("from torch.cuda.amp import GradScaler\nscaler = GradScaler()\nmodel = DDP(Net())\n"
               "{holder}.load_state_dict(torch.load('ckpt/scaler.pth'))\n")
CASES48 = [
    ("eval-padding-duplicates", SAMPLER_OWN_ITER.format(pad=""),
     SAMPLER_OWN_ITER.format(pad="        indices += indices[:world_size - len(indices) % world_size]\n")),
    ("rank0-local-loss", GAN_ERR.format(reduce="    dist.all_reduce(errG)\n    errG /= world_size\n"),
     GAN_ERR.format(reduce="")),
    ("load-without-map-location", SCALER_LOAD.format(holder="scaler"), SCALER_LOAD.format(holder="model")),
]


# Every batch's (rule, quiet, loud[, head]) cases in one test: the rule stays quiet on the first script and fires on
# the second; `head` (batches 7 and 8) replaces the default DDP header for scripts that set up DDP themselves.
BATCH_CASES = {"batch3": CASES, "batch4": CASES4, "batch5": CASES5, "batch6": CASES6, "batch7": CASES7,
               "batch8": CASES8 + CASES8_MAIN, "batch9": CASES9, "batch10": CASES10, "batch11": CASES11,
               "batch11-misses": CASES11_MISSES, "batch12": CASES12, "batch13": CASES13,
               "probes": CASES_PROBES, "batch14": CASES14,
               "batch15": CASES15, "batch16-17": CASES16,
               "batch18-19": CASES18, "batch20-21": CASES20,
               "batch22": CASES22, "batch24-25": CASES24, "batch28": CASES28,
               "before-31": CASES31, "batch37": CASES37,
               "batch35": CASES35, "batch32-36": CASES3236,
               "batch34": CASES34, "batch36": CASES36,
               "batch38": CASES38, "batch40": CASES40, "batch44-47": CASES44, "batch48-51": CASES48}


@pytest.mark.parametrize("case", [c for cases in BATCH_CASES.values() for c in cases],
                         ids=[f"{b}-{c[0]}-{i}" for b, cases in BATCH_CASES.items() for i, c in enumerate(cases)])
def test_quiet_and_loud_classes(case):
    rule, quiet, loud, *head = case
    found = (lambda body: rules(body, *head)) if head else rules
    assert rule not in found(quiet), found(quiet)
    assert rule in found(loud), found(loud)


def test_a_gather_function_applied_only_where_nothing_runs_backward(tmp_path):
    """DLRM's AllGather (an autograd.Function whose backward keeps only this rank's slice, no all_reduce) is
    applied only by a helper the evaluation calls: its backward never runs, so no finding; applied in the
    training loss, it is one."""
    helper = ("import torch, torch.distributed as dist\nclass AllGather(torch.autograd.Function):\n"
              "    @staticmethod\n    def forward(ctx, x):\n        out = [torch.empty_like(x) for _ in range(2)]\n"
              "        dist.all_gather(out, x)\n        ctx.r = dist.get_rank()\n        return torch.cat(out)\n"
              "    @staticmethod\n    def backward(ctx, g):\n        return g.narrow(0, ctx.r * 4, 4)\n"
              "def all_gather(x):\n    return AllGather.apply(x)\n")
    script = ("import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
              "import ext_dist\ndist.init_process_group('nccl')\ntorch.manual_seed(0)\nmodel = DDP(Net())\n"
              "def inference(loader):\n    with torch.no_grad():\n        for x in loader:\n"
              "            z = ext_dist.all_gather(model(x))\n"
              "for x in loader:\n    {use}.backward()\ninference(val_loader)\n")
    def found(name, use):
        root = _project(tmp_path / name, {"ext_dist.py": helper, "train.py": script.format(use=use)})
        return {f.rule for f in audit.audit_paths([root])}
    assert "gather-without-grad" not in found("eval", "model(x).sum()")
    assert "gather-without-grad" in found("train", "(model(x) @ ext_dist.all_gather(model(x)).T).mean()")


def test_a_rank0_flag_set_by_a_helper_on_the_object_it_is_handed(tmp_path):
    """HybrIK: `def init_dist(opt): ... if opt.rank % n == 0: opt.log = True / else: opt.log = False`, and the
    training script saves under `if opt.log:`: rank 0's save alone. The same helper setting the flag True on every
    rank leaves the saves on every rank."""
    helper = ("import torch.distributed as dist\ndef init_dist(opt):\n    dist.init_process_group('nccl')\n"
              "    opt.rank = dist.get_rank()\n{body}")
    script = ("import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\nfrom env import init_dist\n"
              "def main(opt):\n    init_dist(opt)\n    torch.manual_seed(0)\n    model = DDP(Net())\n"
              "    for x in loader:\n        model(x).sum().backward()\n        if opt.log:\n"
              "            torch.save(model.module.state_dict(), 'ckpt.pth')\n"
              "if __name__ == '__main__':\n    main(opt)\n")
    def found(name, body):
        root = _project(tmp_path / name, {"env.py": helper.format(body=body), "train.py": script})
        return {f.rule for f in audit.audit_paths([root])}
    assert "save-on-every-rank" not in found("guarded", "    if opt.rank % 8 == 0:\n        opt.log = True\n"
                                                        "    else:\n        opt.log = False\n")
    assert "save-on-every-rank" in found("every", "    opt.log = True\n")


def test_batchnorm_in_a_model_built_through_a_registry_or_a_module_named_at_run_time(tmp_path):
    """HybrIK builds its model with `builder.build_sppe(cfg)` from a builder these files lack, and the model class
    registers itself (`@SPPE.register_module`); voxceleb_trainer builds its network from
    `importlib.import_module("models." + name).__getattribute__("MainModel")`. BatchNorm in the registered class or
    in the package's MainModel is under DDP; a LayerNorm model is not."""
    registered = ("import torch.nn as nn\nfrom .builder import SPPE\n@SPPE.register_module\n"
                  "class Pose(nn.Module):\n    def __init__(self, norm_layer={norm}):\n        super().__init__()\n"
                  "        self.bn = norm_layer(8)\n")
    script = ("import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
              "from pose.models import builder\ndist.init_process_group('nccl')\ntorch.manual_seed(0)\n"
              "def preset_model(cfg):\n    return builder.build_sppe(cfg.MODEL)\nm = preset_model(cfg)\n"
              "m = DDP(m)\nfor x in loader:\n    m(x).sum().backward()\n")
    dynamic = ("import importlib, torch.nn as nn\nclass SpeakerNet(nn.Module):\n    def __init__(self, model):\n"
               "        super().__init__()\n"
               "        Model = importlib.import_module('models.' + model).__getattribute__('MainModel')\n"
               "        self.net = Model()\n")
    net = "import torch.nn as nn\ndef MainModel():\n    return nn.Sequential(nn.Conv2d(1, 8, 3), {norm}(8))\n"
    speaker = ("import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
               "from SpeakerNet import SpeakerNet\ndist.init_process_group('nccl')\ntorch.manual_seed(0)\n"
               "s = SpeakerNet('ResNetSE34L')\ns = DDP(s)\nfor x in loader:\n    s(x).sum().backward()\n")
    def found(name, files):
        return {f.rule for f in audit.audit_paths([_project(tmp_path / name, files)])}
    assert "batchnorm-without-sync" in found("reg-bn", {"pose/models/pose.py": registered.format(
        norm="nn.BatchNorm2d"), "pose/models/__init__.py": "", "train.py": script})
    assert "batchnorm-without-sync" not in found("reg-ln", {"pose/models/pose.py": registered.format(
        norm="nn.LayerNorm"), "pose/models/__init__.py": "", "train.py": script})
    # ResNeSt: `get_model(cfg.MODEL.NAME)(**kwargs)` from a build module these files lack; the builder functions
    # register themselves (`@RESNEST_MODELS_REGISTRY.register()` on `def resnet50(...)`)
    builders = ("import torch.nn as nn\nfrom .build import RESNEST_MODELS_REGISTRY\n"
                "class ResNet(nn.Module):\n    def __init__(self, norm_layer={norm}):\n        super().__init__()\n"
                "        self.bn = norm_layer(8)\n@RESNEST_MODELS_REGISTRY.register()\ndef resnet50(**kwargs):\n"
                "    return ResNet(**kwargs)\n")
    getter = ("import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
              "from resnest.models.build import get_model\ndist.init_process_group('nccl')\ntorch.manual_seed(0)\n"
              "m = get_model(cfg.MODEL.NAME)(**kw)\nm = DDP(m)\nfor x in loader:\n    m(x).sum().backward()\n")
    assert "batchnorm-without-sync" in found("get-bn", {"resnest/models/resnet.py": builders.format(
        norm="nn.BatchNorm2d"), "resnest/models/__init__.py": "", "train.py": getter})
    assert "batchnorm-without-sync" not in found("get-ln", {"resnest/models/resnet.py": builders.format(
        norm="nn.LayerNorm"), "resnest/models/__init__.py": "", "train.py": getter})
    assert "batchnorm-without-sync" in found("dyn-bn", {"SpeakerNet.py": dynamic, "train.py": speaker,
                                                        "models/ResNetSE34L.py": net.format(norm="nn.BatchNorm2d")})
    assert "batchnorm-without-sync" not in found("dyn-ln", {"SpeakerNet.py": dynamic, "train.py": speaker,
                                                            "models/ResNetSE34L.py": net.format(norm="nn.LayerNorm")})


def test_a_trainer_imported_in_the_first_of_two_arms_is_followed(tmp_path):
    """MaskGIT's main() imports its trainer in if/elif arms (`from Trainer.cls_trainer import MaskGIT` / `from
    Trainer.txt_trainer import MaskGIT`, the second file absent): the first import is followed, so the trainer's
    backward shows the script trains, and its missing seed is a finding rather than an evaluation script's."""
    trainer = ("import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\nclass MaskGIT:\n"
               "    def __init__(self, args):\n        self.model = DDP(Net())\n    def fit(self):\n"
               "        for x in loader:\n            self.model(x).sum().backward()\n")
    script = ("import torch\nfrom torch.distributed import init_process_group\ndef main(args):\n"
              "    if args.mode == 'cls':\n        from Trainer.cls_trainer import MaskGIT\n"
              "    elif args.mode == 'txt':\n        from Trainer.txt_trainer import MaskGIT\n"
              "    maskgit = MaskGIT(args)\n    if args.test_only:\n        maskgit.model.eval()\n    else:\n"
              "        maskgit.fit()\n{seed}if __name__ == '__main__':\n    init_process_group('nccl')\n"
              "    main(args)\n")
    def found(name, seed):
        root = _project(tmp_path / name, {"Trainer/cls_trainer.py": trainer, "Trainer/__init__.py": "",
                                          "main.py": script.format(seed=seed)})
        return {f.rule for f in audit.audit_paths([root])}
    assert "no-seed" in found("unseeded", "")
    assert "no-seed" not in found("seeded", "    torch.manual_seed(0)\n")


def test_a_copied_loss_logged_twice_is_one_finding(tmp_path):
    """CurricularFace prints its meter `losses` in the loop and writes `epoch_loss = losses.avg` after it, both on
    rank 0 alone: one defect, one finding."""
    body = ("def main():\n    model = DDP(Net())\n    losses = AverageMeter()\n    for x, y in loader:\n"
            "        loss = crit(model(x), y)\n        opt.zero_grad()\n        loss.backward()\n        opt.step()\n"
            "        losses.update(loss.item())\n        if rank == 0:\n            print('loss', losses.avg)\n"
            "    epoch_loss = losses.avg\n    if rank == 0:\n        writer.add_scalar('loss', epoch_loss)\n"
            "main()\n")
    assert rules(body).count("rank0-local-loss") == 1, rules(body)


def test_batchnorm_in_a_model_chosen_from_a_dict_of_builders(tmp_path):
    """CurricularFace: `BACKBONE_DICT = {'IR_50': IR_50, ...}` then `DDP(BACKBONE_DICT[name](size))`, the builders
    in another file: BatchNorm when the builders reach it."""
    builders = ("import torch.nn as nn\ndef IR_50(size):\n    return nn.Sequential(nn.Conv2d(3, 8, 3), {norm})\n"
                "def IR_101(size):\n    return nn.Sequential(nn.Conv2d(3, 8, 3), {norm})\n")
    script = ("import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
              "from backbone import IR_50, IR_101\ndist.init_process_group('nccl')\ntorch.manual_seed(0)\n"
              "BACKBONE_DICT = {'IR_50': IR_50, 'IR_101': IR_101}\nbackbone = BACKBONE_DICT['IR_101'](112)\n"
              "backbone = DDP(backbone)\nfor x in loader:\n    backbone(x).sum().backward()\n")
    def found(name, norm):
        root = _project(tmp_path / name, {"backbone.py": builders.format(norm=norm), "train.py": script})
        return {f.rule for f in audit.audit_paths([root])}
    assert "batchnorm-without-sync" in found("bn", "nn.BatchNorm2d(8)")
    assert "batchnorm-without-sync" not in found("ln", "nn.LayerNorm(8)")


def test_an_aliased_gather_names_where_it_is_applied():
    """CLIP4Clip's `allgather = AllGather.apply`, applied in a helper of the model's forward: the finding at the
    Function's gather names the line that applies it (where the labels, and a reader, look)."""
    from test_audit import DDP_HEAD as head
    source = head + "torch.manual_seed(0)\n" + ALIAS_GATHER.format(reduce="")
    found = [f for f in audit.audit_source(source) if f.rule == "gather-without-grad"]
    applied = next(i for i, line in enumerate(source.splitlines(), 1) if "v = allgather(v)" in line)
    assert found and any(line == applied for _, line in found[0].related), found


def test_a_fixed_rendezvous_address_in_a_config_dict(tmp_path):
    """CurricularFace: config.py holds `dict(..., DIST_URL='tcp://localhost:23456')` and train.py passes
    `init_method=cfg['DIST_URL']`: a fixed port on this host. A config whose address comes from the environment
    is not."""
    config = "import os\nconfigurations = {{1: dict(SEED=1337, DIST_URL={url})}}\n"
    script = ("import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
              "from config import configurations\ncfg = configurations[1]\n"
              "dist.init_process_group('nccl', init_method=cfg['DIST_URL'], world_size=2, rank=0)\n"
              "torch.manual_seed(cfg['SEED'])\nmodel = DDP(Net())\n")
    def found(name, url):
        root = _project(tmp_path / name, {"config.py": config.format(url=url), "train.py": script})
        return {f.rule for f in audit.audit_paths([root])}
    assert "hard-coded-master-port" in found("fixed", "'tcp://localhost:23456'")
    assert "hard-coded-master-port" not in found("env", "os.environ.get('DIST_URL', 'env://')")


def test_set_epoch_missing_is_shown_where_the_epoch_loop_gets_the_loader(tmp_path):
    """Timer: data_provider() builds the DistributedSampler, Exp.train() gets the loader through
    self._get_data(flag='train') and runs the epoch loop: the finding is at that call (where set_epoch belongs),
    naming the sampler."""
    factory = ("from torch.utils.data import DataLoader, DistributedSampler\ndef data_provider(args, flag):\n"
               "    sampler = DistributedSampler(ds, shuffle=True)\n    return ds, DataLoader(ds, sampler=sampler)\n")
    exp = ("from factory import data_provider\nclass Exp:\n    def _get_data(self, flag):\n"
           "        return data_provider(self.args, flag)\n    def train(self):\n"
           "        data, loader = self._get_data(flag='train')\n        for epoch in range(3):\n"
           "            for x in loader:\n                self.model(x).sum().backward()\n")
    script = ("import torch, torch.distributed as dist\nfrom exp import Exp\ndist.init_process_group('nccl')\n"
              "torch.manual_seed(0)\nExp().train()\n")
    root = _project(tmp_path, {"factory.py": factory, "exp.py": exp, "run.py": script})
    found = [f for f in audit.audit_paths([root]) if f.rule == "set-epoch-missing"]
    assert [(Path(f.path).name, f.line) for f in found] == [("exp.py", 6)], found
    assert [(Path(p).name, line) for p, line in found[0].related] == [("factory.py", 3)], found


def test_the_first_of_two_plain_imports_of_one_name_is_followed(tmp_path):
    """FixMatch: `import models.wideresnet as models` in one arm and `import models.resnext as models` (not in the
    copy) in the other, then `models.build_wideresnet(...)`: the first import is followed to its BatchNorm."""
    wrn = "import torch.nn as nn\ndef build_wideresnet(depth):\n    return nn.Sequential(nn.BatchNorm2d(8))\n"
    script = ("import torch, torch.distributed as dist\ndist.init_process_group('nccl')\ntorch.manual_seed(0)\n"
              "def create_model(args):\n    if args.arch == 'wideresnet':\n        import models.wideresnet as models\n"
              "        model = models.build_wideresnet(depth=28)\n    else:\n        import models.resnext as models\n"
              "        model = models.build_resnext(depth=29)\n    return model\nmodel = create_model(args)\n"
              "model = torch.nn.parallel.DistributedDataParallel(model)\nfor x in loader:\n"
              "    model(x).sum().backward()\n")
    root = _project(tmp_path, {"models/wideresnet.py": wrn, "models/__init__.py": "", "train.py": script})
    assert "batchnorm-without-sync" in {f.rule for f in audit.audit_paths([root])}


def test_a_base_class_reached_through_super_seeds_torch(tmp_path):
    """GeoTransformer: Trainer(EpochBasedTrainer) calls super().__init__(cfg), whose base BaseTrainer.__init__ calls
    initialize(seed=...), which seeds torch: the script is seeded. The same base without the seed leaves it not."""
    base = ("import torch\ndef initialize(seed=None):\n    if seed is not None:\n        {seed}\n"
            "class BaseTrainer:\n    def __init__(self, cfg):\n        initialize(seed=cfg.seed)\n"
            "class EpochBasedTrainer(BaseTrainer):\n    def __init__(self, cfg):\n        super().__init__(cfg)\n")
    script = ("import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
              "from engine import EpochBasedTrainer\nclass Trainer(EpochBasedTrainer):\n    def __init__(self, cfg):\n"
              "        super().__init__(cfg)\n        self.model = DDP(Net())\n    def run(self):\n"
              "        for x in loader:\n            self.model(x).sum().backward()\n"
              "if __name__ == '__main__':\n    dist.init_process_group('nccl')\n    Trainer(cfg).run()\n")
    def found(name, seed):
        root = _project(tmp_path / name, {"engine.py": base.format(seed=seed), "trainval.py": script})
        return {f.rule for f in audit.audit_paths([root])}
    assert "no-seed" not in found("seeded", "torch.manual_seed(seed)")
    assert "no-seed" in found("unseeded", "pass")


def test_a_loss_over_gathered_features_logged_through_a_callback_is_global(tmp_path):
    """arcface: `loss = module_partial_fc(emb, labels)` (a class whose forward all-gathers every rank's
    embeddings), `loss_am.update(loss.item())`, then a logging callback whose __call__ prints `loss.avg` on rank 0:
    the global batch's loss, the single run's number. A head that gathers nothing makes the same log rank 0's
    own."""
    head = ("import torch, torch.distributed as dist\nclass PartialFC(torch.nn.Module):\n"
            "    def forward(self, emb, labels):\n{gather}        loss = (emb @ emb.T).logsumexp(1).mean()\n"
            "        return loss\n")
    gather = ("        out = [torch.zeros_like(emb) for _ in range(dist.get_world_size())]\n"
              "        dist.all_gather(out, emb)\n        emb = torch.cat(out)\n")
    callbacks = ("import logging\nclass CallBackLogging:\n    def __init__(self, rank):\n        self.rank = rank\n"
                 "    def __call__(self, step, loss):\n        if self.rank == 0:\n"
                 "            msg = 'Loss %.4f step %d' % (loss.avg, step)\n            print(msg)\n")
    script = ("import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
              "from partial_fc import PartialFC\nfrom callbacks import CallBackLogging\n"
              "dist.init_process_group('nccl')\n"
              "rank = dist.get_rank()\ntorch.manual_seed(0)\nbackbone = DDP(Net())\nmodule_partial_fc = PartialFC()\n"
              "callback_logging = CallBackLogging(rank)\nloss_am = AverageMeter()\n"
              "for step, (img, labels) in enumerate(loader):\n"
              "    loss: torch.Tensor = module_partial_fc(backbone(img), labels)\n    loss.backward()\n"
              "    opt.step()\n    loss_am.update(loss.item(), 1)\n    callback_logging(step, loss_am)\n")
    def found(name, g):
        root = _project(tmp_path / name, {"partial_fc.py": head.format(gather=g), "callbacks.py": callbacks,
                                          "train.py": script})
        return {f.rule for f in audit.audit_paths([root])}
    assert "rank0-local-loss" not in found("gathered", gather)
    assert "rank0-local-loss" in found("local", "")


def test_one_function_that_saves_twice_on_every_rank_is_one_finding():
    """Timer's EarlyStopping.__call__ saves in two branches, on every rank: one finding, naming the other save."""
    body = ("class EarlyStopping:\n    def __call__(self, val_loss, model):\n        if self.best is None:\n"
            "            torch.save(model.module.state_dict(), 'ckpt.pth')\n        elif val_loss < self.best:\n"
            "            torch.save(model.module.state_dict(), 'ckpt.pth')\n"
            "early_stopping = EarlyStopping()\nmodel = DDP(Net())\nfor epoch in range(3):\n"
            "    model(x).sum().backward()\n    early_stopping(0.0, model)\n")
    assert rules(body).count("save-on-every-rank") == 1, rules(body)


def test_a_set_epoch_in_a_trainer_loaded_by_name_counts(tmp_path):
    """Palette: run.py builds the DistributedSampler through data/__init__.py and loads its trainer by name from
    the config (models/model.py, which no audited file imports); that trainer calls
    self.phase_loader.sampler.set_epoch(epoch), so the sampler's epochs are reshuffled."""
    data = ("from torch.utils.data import DataLoader, DistributedSampler\ndef define_dataloader(ds):\n"
            "    return DataLoader(ds, sampler=DistributedSampler(ds, shuffle=True))\n")
    model = ("class Model:\n    def train(self):\n        for epoch in range(3):\n{set_epoch}"
             "            for x in self.phase_loader:\n                self.net(x).sum().backward()\n")
    run = ("import importlib, torch, torch.distributed as dist\nimport data\ndist.init_process_group('nccl')\n"
           "torch.manual_seed(0)\nloader = data.define_dataloader(ds)\n"
           "Model = getattr(importlib.import_module(cfg['model']), 'Model')\nModel().train()\n")
    def found(name, set_epoch):
        root = _project(tmp_path / name, {"data/__init__.py": data, "models/model.py": model.format(
            set_epoch=set_epoch), "run.py": run})
        return {f.rule for f in audit.audit_paths([root])}
    assert "set-epoch-missing" not in found("set", "            self.phase_loader.sampler.set_epoch(epoch)\n")
    assert "set-epoch-missing" in found("unset", "")


def test_batchnorm_in_a_held_network_from_a_table_or_the_modules_globals(tmp_path):
    """PermaTrack (CenterNet-style): the trainer wraps `ModleWithLoss(model, loss)`, a class that only holds the
    network its caller hands in; main.py's model comes from create_model(), which picks `model_class =
    _network_factory[arch]`, whose DLASeg builds its backbone with `globals()['dla{}'.format(n)](...)`. BatchNorm
    in the dla* builders is under DDP (and named as the finding's related place); LayerNorm ones are not."""
    nets = ("import torch.nn as nn\ndef dla34(pretrained=False):\n"
            "    return nn.Sequential(nn.Conv2d(3, 8, 3), {norm}(8))\n"
            "class DLASeg(nn.Module):\n    def __init__(self, num_layers):\n        super().__init__()\n"
            "        self.base = globals()['dla{{}}'.format(num_layers)](pretrained=False)\n")
    model = ("from nets import DLASeg\n_network_factory = {'dla': DLASeg}\ndef create_model(arch):\n"
             "    model_class = _network_factory[arch]\n    return model_class(34)\n")
    trainer = ("import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
               "class ModleWithLoss(torch.nn.Module):\n    def __init__(self, model, loss):\n"
               "        super().__init__()\n"
               "        self.model = model\n        self.loss = loss\n    def forward(self, x):\n"
               "        return self.loss(self.model(x))\nclass Trainer:\n    def __init__(self, model):\n"
               "        self.model_with_loss = ModleWithLoss(model, torch.nn.MSELoss())\n"
               "    def set_device(self, rank):\n"
               "        self.model_with_loss = DDP(self.model_with_loss, device_ids=[rank])\n")
    main = ("import torch, torch.distributed as dist\nfrom model import create_model\nfrom trainer import Trainer\n"
            "dist.init_process_group('nccl')\ntorch.manual_seed(0)\nmodel = create_model('dla')\n"
            "trainer = Trainer(model)\ntrainer.set_device(0)\nfor x in loader:\n"
            "    trainer.model_with_loss(x).backward()\n")
    def found(name, norm):
        root = _project(tmp_path / name, {"nets.py": nets.format(norm=norm), "model.py": model,
                                          "trainer.py": trainer, "main.py": main})
        return [f for f in audit.audit_paths([root]) if f.rule == "batchnorm-without-sync"]
    bn = found("bn", "nn.BatchNorm2d")
    assert [(Path(f.path).name, f.line) for f in bn] == [("trainer.py", 14)], bn
    assert [(Path(p).name, line) for p, line in bn[0].related] == [("nets.py", 3), ("main.py", 8)], bn
    assert not found("ln", "nn.LayerNorm")


def test_each_evaluation_split_asked_of_a_padding_helper_is_a_finding(tmp_path):
    """OpenTAD: tools/train.py asks builder.build_dataloader for the val split and for the test split, each through
    a padding DistributedSampler, and both evaluations gather over ranks: two metrics counted with duplicates, two
    findings, each at the call that asks."""
    builder = ("from torch.utils.data import DataLoader, DistributedSampler\ndef build_dataloader(ds, shuffle=False):\n"
               "    return DataLoader(ds, sampler=DistributedSampler(ds, shuffle=shuffle))\n")
    script = ("import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
              "from builder import build_dataloader\ndist.init_process_group('nccl')\ntorch.manual_seed(0)\n"
              "val_loader = build_dataloader(val_set)\ntest_loader = build_dataloader(test_set)\nmodel = DDP(Net())\n"
              "def evaluate(loader):\n    for x in loader:\n        r = model(x)\n        dist.all_reduce(r)\n"
              "evaluate(val_loader)\nevaluate(test_loader)\n")
    root = _project(tmp_path, {"builder.py": builder, "train.py": script})
    found = [(Path(f.path).name, f.line) for f in audit.audit_paths([root]) if f.rule == "eval-padding-duplicates"]
    assert found == [("train.py", 6), ("train.py", 7)], found


def test_an_import_cycle_of_re_exports_does_not_crash(tmp_path):
    """SparK: two modules each re-export a name from the other (`from b import helper` in a.py, `from a import
    helper` in b.py): the audit crashed with a RecursionError; it now finds no definition and goes on."""
    root = _project(tmp_path, {"a.py": "from b import helper\n", "b.py": "from a import helper\n",
                               "train.py": "import torch, torch.distributed as dist\nfrom a import helper\n"
                                           "dist.init_process_group('nccl')\nhelper()\n"})
    assert isinstance(audit.audit_paths([root]), list)


def test_a_wrap_in_a_helper_nothing_calls_is_judged_by_its_callers(tmp_path):
    """SparK's dist.parallelize(net) wraps in DDP but no audited file calls it: no collective-outside-switch there,
    though the group is optional; the same helper called outside the switch, in a script that runs itself without
    the group (`main(False)`), is one."""
    helper = ("import torch\ndef parallelize(net):\n    return torch.nn.parallel.DistributedDataParallel(net)\n")
    script = ("import torch, torch.distributed as dist\nimport dist_utils\ndef main(distributed):\n"
              "    if distributed:\n        dist.init_process_group('nccl')\n    torch.manual_seed(0)\n"
              "    model = Net()\n{call}    for x in loader:\n        model(x).sum().backward()\n"
              "if __name__ == '__main__':\n    main(False)\n")
    def found(name, call):
        root = _project(tmp_path / name, {"dist_utils.py": helper, "main.py": script.format(call=call)})
        return {f.rule for f in audit.audit_paths([root])}
    assert "collective-outside-switch" not in found("unused", "")
    assert "collective-outside-switch" in found("used", "    model = dist_utils.parallelize(model)\n")



def test_a_layer_named_reduce_averages_nothing_over_ranks(tmp_path):
    """UniMatch's DeepLabV3+ has `self.reduce = nn.Sequential(...)`, called in its _decode: a layer, not a
    reduction over ranks, so what its forward returns is no value averaged over ranks (it had made the loss of
    the model's output, which rank 0 logs, read as reduced)."""
    from lab_utils.analysis.audit import Facts, Project, _expand
    model = ("import torch.nn as nn\nclass DeepLab(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
             "        self.reduce = nn.Sequential(nn.Conv2d(8, 4, 1))\n    def _decode(self, c1):\n"
             "        return self.reduce(c1)\n    def forward(self, x):\n        out = self._decode(x)\n"
             "        return out\n")
    root = _project(tmp_path, {"deeplab.py": model})
    files, top, _ = _expand([root])
    facts = Facts(Project(files, top))
    m = next(iter(facts.p.modules.values()))
    assert "out" not in facts.reduced_names(m, m.functions["DeepLab.forward"])


def test_a_meter_fed_the_loss_names_its_own_print_as_related(tmp_path):
    """SparK and MAR: the script feeds `metric_logger.update(loss=loss_value)` and MetricLogger.log_every (in
    util/misc.py) prints the meters on rank 0 alone: the finding, at the line that feeds it, names the meter's
    print line in misc.py as its related place (where the loss shows)."""
    misc = ("class MetricLogger:\n    def update(self, **kw):\n        self.kw = kw\n"
            "    def log_every(self, it, freq):\n        for x in it:\n            yield x\n"
            "            print(str(self.kw))\n")
    script = ("import builtins, torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel"
              " as DDP\nfrom misc import MetricLogger\ndist.init_process_group('nccl')\n"
              "if dist.get_rank() != 0:\n    builtins.print = lambda *a, **k: None\ntorch.manual_seed(0)\n"
              "model = DDP(Net())\nmetric_logger = MetricLogger()\nfor x in metric_logger.log_every(loader, 10):\n"
              "    loss = model(x).sum()\n    loss.backward()\n    metric_logger.update(loss=loss.item())\n")
    root = _project(tmp_path, {"misc.py": misc, "train.py": script})
    found = [f for f in audit.audit_paths([root]) if f.rule == "rank0-local-loss"]
    assert found and ("misc.py", 7) in [(Path(p).name, line) for p, line in found[0].related], found


def test_the_lr_finding_is_at_the_scaling_not_at_an_earlier_copy():
    """DyTox reads `base_lr = args.lr` before its task loop writes the scaled lr back (`args.lr =
    linear_scaled_lr`): the finding is at the line that multiplies by the world size, where the fix goes, not at
    the copy that a later assignment made look like it grows."""
    src = DDP_HEAD + ("torch.manual_seed(0)\nbase_lr = args.lr\nfor task in range(3):\n"
                      "    linear_scaled_lr = base_lr * args.batch_size * dist.get_world_size() / 512.0\n"
                      "    args.lr = linear_scaled_lr\n    opt = torch.optim.SGD(model.parameters(), lr=args.lr)\n")
    found = [f for f in audit.audit_source(src) if f.rule == "lr-grows-with-world-size"]
    assert [src.splitlines()[f.line - 1].strip()[:16] for f in found] == ["linear_scaled_lr"], found


def test_a_fixed_port_in_the_projects_json_config(tmp_path):
    """MP-SENet (HiFi-GAN's layout) reads `init_method=h.dist_config['dist_url']` from config.json, which sets
    "tcp://localhost:54321": a fixed port on this host. A config that reads the address from the environment, or
    two configs that disagree, are not that finding."""
    script = ("import json, torch, torch.multiprocessing as mp\nfrom torch.distributed import init_process_group\n"
              "from torch.nn.parallel import DistributedDataParallel as DDP\n"
              "def train(rank, h):\n    init_process_group(backend=h.dist_config['dist_backend'],\n"
              "                       init_method=h.dist_config['dist_url'], rank=rank, world_size=2)\n"
              "    torch.manual_seed(0)\n    model = DDP(Net())\n"
              "h = json.load(open('config.json'))\nmp.spawn(train, nprocs=2, args=(h,))\n")
    def found(name, urls):
        files = {"train.py": script}
        files |= {f"config{i}.json": json.dumps({"dist_config": {"dist_backend": "nccl", "dist_url": u}})
                  for i, u in enumerate(urls)}
        return {f.rule for f in audit.audit_paths([_project(tmp_path / name, files)])}
    assert "hard-coded-master-port" in found("fixed", ["tcp://localhost:54321"])
    assert "hard-coded-master-port" not in found("env", ["env://"])
    assert "hard-coded-master-port" not in found("two", ["tcp://localhost:54321", "tcp://10.0.0.2:54321"])
    assert "hard-coded-master-port" not in found("none", [])


def test_a_step_through_an_optimizer_wrapper_makes_a_training_script():
    """VAR steps through its AmpOptimizer (`self.var_opt.backward_clip_step(loss=loss)`, from a file these copies
    lack) and puts the model in eval mode for its validation: it trains, so it is no evaluation script, and its
    missing seed is a finding. A script that only evaluates stays quiet."""
    body = ("model = DDP(Net())\nvar_opt = AmpOptimizer(model)\nfor x in loader:\n    {step}\n"
            "model.eval()\nwith torch.no_grad():\n    model(x_val)\n")
    assert "no-seed" in rules(body.format(step="var_opt.backward_clip_step(loss=model(x).sum())"), DDP_HEAD)
    assert "no-seed" not in rules(body.format(step="model(x)"), DDP_HEAD)


def test_a_helpers_unswitched_collective_names_the_scripts_call(tmp_path):
    """VAR's SmoothedValue.synchronize_between_processes barriers and all-reduces, reached from the script's
    `me.synchronize_between_processes()` through MetricLogger's loop over its meters (objects the audit cannot
    type): the finding, in the helper, names the script's call, where the switch could go instead."""
    helper = ("from collections import defaultdict\nimport torch.distributed as tdist\nclass SmoothedValue:\n"
              "    def synchronize_between_processes(self):\n"
              "        tdist.barrier()\nclass MetricLogger:\n    def __init__(self):\n"
              "        self.meters = defaultdict(SmoothedValue)\n"
              "    def synchronize_between_processes(self):\n        for meter in self.meters.values():\n"
              "            meter.synchronize_between_processes()\n")
    script = ("import os, torch, torch.distributed as dist\n"
              "from torch.nn.parallel import DistributedDataParallel as DDP\nfrom utils import misc\n"
              "torch.manual_seed(0)\nmodel = Net()\nif args.distributed:\n"
              "    dist.init_process_group('nccl')\n    model = DDP(model)\nme = misc.MetricLogger()\n"
              "for x in loader:\n    model(x).sum().backward()\nme.synchronize_between_processes()\n")
    root = _project(tmp_path, {"utils/__init__.py": "", "utils/misc.py": helper, "train.py": script})
    found = [f for f in audit.audit_paths([root]) if f.rule == "collective-outside-switch"]
    assert [(Path(f.path).name, f.line) for f in found] == [("misc.py", 5)], found
    assert [(Path(p).name, line) for p, line in found[0].related] == [("train.py", 12)], found


def test_evaluation_through_a_gathering_helper_and_one_finding_per_builder():
    """UniTS: one builder makes a padding DistributedSampler in each of its branches; the test split asks it
    (`flag='test'`), and the evaluation concatenates every rank's predictions through a helper that all-gathers
    (gather_tensors_from_all_gpus). One finding for the builder, naming the other branch and the gather; a
    helper that only concatenates this rank's predictions counts nothing twice."""
    src = DDP_HEAD + (
        "torch.manual_seed(0)\ndef gather_preds(t):\n    out = [torch.empty_like(t) for _ in range(2)]\n"
        "    {gather}\n    return torch.cat(out)\ndef data_provider(flag, kind):\n    if kind == 'a':\n"
        "        return DataLoader(ds_a, sampler=DistributedSampler(ds_a))\n"
        "    return DataLoader(ds_b, sampler=DistributedSampler(ds_b))\nmodel = DDP(Net())\n"
        "def test_forecast(loader):\n    preds = []\n    for x in loader:\n        preds.append(model(x))\n"
        "    return gather_preds(torch.cat(preds))\ntest_loader = data_provider(flag='test', kind=kind)\n"
        "for x in data_provider(flag='train', kind=kind):\n    model(x).sum().backward()\ntest_forecast(test_loader)\n")
    found = [f for f in audit.audit_source(src.format(gather="dist.all_gather(out, t)"))
             if f.rule == "eval-padding-duplicates"]
    lines = src.format(gather="dist.all_gather(out, t)").splitlines()
    assert len(found) == 1, found
    assert {lines[line - 1].strip()[:20] for _, line in found[0].related} >= {
        "return DataLoader(ds", "dist.all_gather(out,"}, found[0].related
    assert "eval-padding-duplicates" not in {f.rule for f in audit.audit_source(src.format(gather="out = [t]"))}


def test_a_fixed_port_in_a_launch_script(tmp_path):
    """unicom's scripts/inshop_vit_b_16.sh runs `torchrun --master_port 12345` and FourCastNet's export_DDP_vars.sh
    exports MASTER_PORT=29500: a fixed port in the launch script, reported there. A port the environment can
    override (`${MASTER_PORT:-29500}`), or a port only in a comment, is not."""
    script = ("import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
              "dist.init_process_group('nccl')\ntorch.manual_seed(0)\nmodel = DDP(Net())\n")
    def found(name, sh):
        root = _project(tmp_path / name, {"train.py": script, "scripts/run.sh": sh})
        return [(Path(f.path).name, f.line) for f in audit.audit_paths([root]) if f.rule == "hard-coded-master-port"]
    assert found("torchrun", "#!/bin/bash\ntorchrun --nproc_per_node 4 --master_port 12345 \\\n  train.py\n") == [
        ("run.sh", 2)]
    assert found("export", "export MASTER_ADDR=localhost\nexport MASTER_PORT=29500\n") == [("run.sh", 2)]
    assert found("fallback", "torchrun --master_port=${MASTER_PORT:-29500} train.py\n") == []
    assert found("comment", "# torchrun --master_port 12345 train.py\ntorchrun --standalone train.py\n") == []
    # YouReID's cmd.sh: `PORT=9996`, then `--master_port=${PORT}`; a variable with a fallback is the environment's
    assert found("variable", "PORT=9996\npython -m torch.distributed.launch --master_port=${PORT} train.py\n") == [
        ("run.sh", 2)]
    assert found("variable-fallback", "PORT=${PORT:-9996}\ntorchrun --master_port=${PORT} train.py\n") == []


def test_a_meter_display_names_the_updates_that_feed_it_the_loss(tmp_path):
    """OpenUnReID: the base runner displays `self.train_progress` on rank 0's console; the script's SpCL runner
    feeds it the loss in its own train_step (`self.train_progress.update(meters)`). The finding at the display
    names that update, where the unreduced loss goes in."""
    runner = ("import builtins\nclass Meters:\n    def update(self, d):\n        self.d = d\n"
              "    def display(self, i):\n        print(self.d)\nclass BaseRunner:\n    def __init__(self, model):\n"
              "        self.model = model\n        self.train_progress = Meters()\n    def run(self, loader):\n"
              "        for i, x in enumerate(loader):\n            loss = self.train_step(x)\n"
              "            loss.backward()\n            self.train_progress.display(i)\n"
              "    def train_step(self, x):\n        loss = self.model(x).mean()\n"
              "        meters = {}\n        meters['loss'] = loss.item()\n        self.train_progress.update(meters)\n"
              "        return loss\n")
    script = ("import builtins, torch, torch.distributed as dist\n"
              "from torch.nn.parallel import DistributedDataParallel as DDP\nfrom runner import BaseRunner\n"
              "dist.init_process_group('nccl')\nif dist.get_rank() != 0:\n    builtins.print = lambda *a: None\n"
              "torch.manual_seed(0)\nclass SpCLRunner(BaseRunner):\n    def train_step(self, x):\n"
              "        loss = self.model(x).sum()\n        meters = {}\n        meters['loss'] = loss.item()\n"
              "        self.train_progress.update(meters)\n        return loss\n"
              "SpCLRunner(DDP(Net())).run(loader)\n")
    root = _project(tmp_path, {"runner.py": runner, "main.py": script})
    found = [f for f in audit.audit_paths([root]) if f.rule == "rank0-local-loss"]
    assert found and ("main.py", 13) in [(Path(p).name, line) for p, line in found[0].related], found


def test_a_folders_single_finding_is_named_by_its_file(tmp_path):
    """`ddp-lab audit FOLDER` whose one finding lies in one file (a launch script) names that file, not the
    folder; a single file given names it as the user typed it."""
    root = _project(tmp_path, {"train.py": "import torch.distributed as dist\ndist.init_process_group('nccl')\n"
                                           "model = DDP(Net())\nimport torch\ntorch.manual_seed(0)\n",
                               "run.sh": "torchrun --master_port 12345 train.py\n"})
    found = [f for f in audit.audit_paths([root]) if f.rule == "hard-coded-master-port"]
    text = audit.format_findings(found, str(root))
    assert text.startswith(f"{root / 'run.sh'}:1: hard-coded-master-port"), text


def test_a_sampler_nobody_sets_the_epoch_of_names_the_scripts_builder_call(tmp_path):
    """MagFace builds its shuffling sampler in a loader helper and runs its epoch loop around a train-one-epoch
    function: the finding at the sampler names the script's call of the helper, where the loader comes in."""
    loader = ("import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\ndef train_loader(args):\n"
              "    sampler = DistributedSampler(ds, shuffle=True)\n    return DataLoader(ds, sampler=sampler)\n")
    script = ("import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
              "import dataloader_dist\ndist.init_process_group('nccl')\ntorch.manual_seed(0)\n"
              "def do_train(loader, model):\n    for x in loader:\n        model(x).sum().backward()\n"
              "def main():\n    model = DDP(Net())\n    loader = dataloader_dist.train_loader(args)\n"
              "    for epoch in range(10):\n        do_train(loader, model)\nmain()\n")
    root = _project(tmp_path, {"dataloader_dist.py": loader, "train.py": script})
    found = [f for f in audit.audit_paths([root]) if f.rule == "set-epoch-missing"]
    assert found and ("train.py", 11) in [(Path(p).name, line) for p, line in found[0].related], found


def test_a_forward_whose_attribute_shares_a_name_with_a_model_of_its_caller_does_not_recurse():
    """GFSLT-VLP (held-out batch 35): SLRCLIP holds `self.model_txt = TextCLIP()` and TextCLIP holds its own
    `self.model_txt` (a pretrained encoder); the name resolves to TextCLIP in both, and asking whether TextCLIP's
    forward returns a reduced value asked it again, without end (RecursionError, the audit's first crash on held-out
    code). Now the loss log is judged and nothing recurses."""
    src = (
    "import torch, torch.distributed as dist\n"
    "from torch.nn.parallel import DistributedDataParallel as DDP\n"
    "class TextCLIP(torch.nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.model_txt = Encoder.from_pretrained('x').get_encoder()\n"
    "        self.lm_head = torch.nn.Linear(4, 4)\n"
    "    def forward(self, t):\n"
    "        txt_logits = self.model_txt(input_ids=t)[0]\n"
    "        return self.lm_head(txt_logits), txt_logits\n"
    "class Net(torch.nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.model_txt = TextCLIP()\n"
    "    def forward(self, x, t):\n"
    "        text_features, self.hidden = self.model_txt(t)\n"
    "        logits = x @ text_features.t()\n"
    "        return logits, logits.t(), torch.eye(4)\n"
    "dist.init_process_group(\"gloo\")\n"
    "torch.manual_seed(0)\n"
    "model = DDP(Net())\n"
    "for x in loader:\n"
    "    a, b, gt = model(x, t)\n"
    "    loss = (criterion(a, gt) + criterion(b, gt)) / 2\n"
    "    loss.backward()\n"
    "    if dist.get_rank() == 0:\n"
    "        print(loss.item())\n"
    )
    assert [f.rule for f in audit.audit_source(src)] == ["rank0-local-loss"]


def test_one_loss_logged_twice_by_every_rank_in_one_function_is_one_finding():
    """WeSpeaker's run_epoch logs loss_meter every interval and at the epoch's end: one defect, one finding at the
    first, naming the second."""
    found = [f for f in audit.audit_source(DDP_HEAD + "torch.manual_seed(0)\n" + HANDED_LOGGER.format(guard=""))
             if f.rule == "every-rank-prints-loss"]
    assert [f.line for f in found] == [19] and [line for _, line in found[0].related] == [20]


def test_a_model_from_a_factory_these_files_lack_whose_every_model_class_has_batchnorm(tmp_path):
    """WeSpeaker wraps `get_speaker_model(name)(**args)` from a module not copied, and 3D-Speaker an nn.Sequential
    of models its build() helper imports by the class path its YAML names; every model class the copied files
    define has BatchNorm: reported for a check by hand. A model file of LayerNorm only says nothing."""
    script = ("import torch\nimport torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel"
              " as DDP\nfrom spk.models.speaker_model import get_speaker_model\nfrom spk.utils.builder import build\n"
              "dist.init_process_group('nccl')\ntorch.manual_seed(0)\n{made}model = DDP(model)\n")
    builder = ("import importlib\ndef build(name, config):\n    mod, obj = config[name].rsplit('.', 1)\n"
               "    return getattr(importlib.import_module(mod), obj)()\n")
    def found(name, norm, made):
        root = _project(tmp_path / name, {
            "spk/bin/train.py": script.format(made=made), "spk/utils/builder.py": builder,
            "spk/models/resnet.py": f"import torch.nn as nn\nclass ResNet(nn.Module):\n    def __init__(self):\n"
                                    f"        super().__init__()\n        self.bn = nn.{norm}(8)\n"})
        return [(f.line, f.severity) for f in audit.audit_paths([root]) if f.rule == "batchnorm-without-sync"]
    factory = "model = get_speaker_model('ResNet34')(feat_dim=80)\n"
    built = "emb = build('embedding_model', config)\nhead = build('classifier', config)\n" \
            "model = torch.nn.Sequential(emb, head)\n"
    assert found("factory", "BatchNorm2d", factory) == [(9, "check-by-hand")]
    assert found("built", "BatchNorm2d", built) == [(11, "check-by-hand")]
    assert found("layernorm", "LayerNorm", factory) == []


def test_a_model_its_yaml_config_names_for_a_dynamic_builder(tmp_path):
    """OpenSphere wraps `self.backbone = self.build_module(cfg['backbone']).to(rank)`, a helper that imports the
    class its YAML names (`type: iresnet100`), beside a head without BatchNorm: the named builder reaches
    BatchNorm, reported for a check by hand; a config naming only the head says nothing."""
    model = ("import importlib, torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
             "class Model:\n    def __init__(self, cfg, rank):\n"
             "        self.backbone = self.build_module(cfg['backbone']).to(rank)\n"
             "        self.backbone = DDP(self.backbone)\n    def build_module(self, args):\n"
             "        return getattr(importlib.import_module('nets'), args.pop('type'))(**args)\n")
    nets = ("import torch.nn as nn\nclass IResNet(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.bn = nn.BatchNorm2d(8)\ndef iresnet100():\n    return IResNet()\n"
            "class SphereFace(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.w = nn.Linear(8, 8)\n")
    script = ("import torch, torch.distributed as dist\nfrom model import Model\ndist.init_process_group('nccl')\n"
              "torch.manual_seed(0)\nModel(cfg, 0)\n")
    def found(name, config):
        root = _project(tmp_path / name, {"train.py": script, "model.py": model, "nets.py": nets,
                                          "config/train.yml": config})
        return [(Path(f.path).name, f.line) for f in audit.audit_paths([root]) if f.rule == "batchnorm-without-sync"]
    assert found("backbone", "backbone:\n  type: iresnet100\nhead:\n  type: SphereFace\n") == [("model.py", 6)]
    assert found("head", "head:\n  type: SphereFace\n") == []


def test_a_fixed_port_in_the_yaml_config_the_script_loads_into_args(tmp_path):
    """CBIM rendezvouses on `init_method=f"{args.dist_url}"`, an attribute no option defines, which its YAML config
    sets to 'tcp://localhost:10000'; an env:// there is no fixed port."""
    script = ("import torch, yaml, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel"
              " as DDP\nargs = load(yaml.safe_load(open('config/acdc.yaml')))\n"
              "dist.init_process_group('nccl', init_method=f'{args.dist_url}')\ntorch.manual_seed(0)\n"
              "model = DDP(Net())\n")
    def found(name, url):
        root = _project(tmp_path / name, {"train.py": script, "config/acdc.yaml": f"dist_url: '{url}' # port\n"})
        return [f.line for f in audit.audit_paths([root]) if f.rule == "hard-coded-master-port"]
    assert found("fixed", "tcp://localhost:10000") == [4]
    assert found("env", "env://") == []
    # Stratified-Transformer's script replaces the config's address with a free port before it spawns
    script = script.replace("args = load(", "args = load(").replace(
        "dist.init_process_group(", "args.dist_url = f'tcp://127.0.0.1:{find_free_port()}'\ndist.init_process_group(")
    assert found("replaced", "tcp://localhost:10000") == []


def test_a_port_option_defined_alike_in_two_scripts(tmp_path):
    """ExpansionNet's train.py and test.py both define `--ddp_sync_port` with default 12354, and train.py sets
    `os.environ['MASTER_PORT'] = args.ddp_sync_port`: one fixed default, reported; two different defaults are not
    one port."""
    train = ("import os, argparse, torch, torch.distributed as dist\n"
             "from torch.nn.parallel import DistributedDataParallel as DDP\np = argparse.ArgumentParser()\n"
             "p.add_argument('--ddp_sync_port', type=int, default=12354)\nargs = p.parse_args()\n"
             "os.environ['MASTER_PORT'] = args.ddp_sync_port\ndist.init_process_group('nccl', rank=0, world_size=2)\n"
             "torch.manual_seed(0)\nmodel = DDP(Net())\n")
    def found(name, other):
        test = ("import argparse\np = argparse.ArgumentParser()\n"
                f"p.add_argument('--ddp_sync_port', type=int, default={other})\n")
        root = _project(tmp_path / name, {"train.py": train, "test.py": test})
        return [f.line for f in audit.audit_paths([root]) if f.rule == "hard-coded-master-port"]
    assert found("same", 12354) == [6]
    assert found("different", 12355) == []


def test_master_port_from_a_config_attribute_the_projects_json_fixes(tmp_path):
    """ivanvovk/WaveGrad sets `os.environ['MASTER_PORT'] = dist_config.MASTER_PORT`, which configs/default.json
    fixes to "600010"; a config without the key says nothing."""
    script = ("import os, json, torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel"
              " as DDP\ndef init_distributed(rank, dist_config):\n"
              "    os.environ['MASTER_PORT'] = dist_config.MASTER_PORT\n"
              "    dist.init_process_group('nccl', rank=rank, world_size=2)\ninit_distributed(0, cfg.dist_config)\n"
              "torch.manual_seed(0)\nmodel = DDP(Net())\n")
    def found(name, config):
        root = _project(tmp_path / name, {"train.py": script, "configs/default.json": config})
        return [f.line for f in audit.audit_paths([root]) if f.rule == "hard-coded-master-port"]
    assert found("fixed", '{"dist_config": {"MASTER_ADDR": "localhost", "MASTER_PORT": "600010"}}') == [4]
    assert found("none", '{"dist_config": {"MASTER_ADDR": "localhost"}}') == []


def test_a_logger_a_base_class_in_another_file_sets_up(tmp_path):
    """OpenSphere's trainer logs through `self.train_logger.add(msgs)`, an object its base class builds in
    base_trainer.py (`self.train_logger = PythonLogger(...)`), whose add() calls logger.info: rank 0's log of its
    own loss, after `if self.rank != 0: return`."""
    base = ("import logging\nclass PythonLogger:\n    def __init__(self):\n"
            "        self.logger = logging.getLogger('train')\n    def add(self, record, step):\n"
            "        self.logger.info(str(record))\nclass BaseTrainer:\n    def __init__(self):\n"
            "        self.train_logger = PythonLogger()\n")
    trainer = ("import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
               "from base_trainer import BaseTrainer\ndist.init_process_group('nccl')\ntorch.manual_seed(0)\n"
               "class Trainer(BaseTrainer):\n    def train_step(self, x):\n        loss = self.model(x).sum()\n"
               "        loss.backward()\n        if self.rank != 0:\n            return\n"
               "        msgs = {'loss': loss.item()}\n        self.train_logger.add(msgs, step=self.step)\n"
               "t = Trainer()\nt.model = DDP(Net())\nfor x in loader:\n    t.train_step(x)\n")
    root = _project(tmp_path, {"base_trainer.py": base, "train.py": trainer})
    assert [(Path(f.path).name, f.line) for f in audit.audit_paths([root]) if f.rule == "rank0-local-loss"] == [
        ("train.py", 13)]


def test_super_call_in_a_class_defined_inside_a_function_does_not_crash():
    """RecBole (held-out batch 47) defines `class TracingAdapter(torch.nn.Module)` inside a function and calls
    `super().__init__()` in it: the module's class index holds top-level classes only, and looking up the nested
    class's bases raised KeyError (the audit's second crash on held-out code). Now the call resolves to nothing and
    the rules go on."""
    src = ("import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
           "def get_flops(model):\n    class TracingAdapter(torch.nn.Module):\n"
           "        def __init__(self, m):\n            super().__init__()\n            self.m = m\n"
           "    return TracingAdapter(model)\n"
           "model = DDP(Net())\nget_flops(model)\nfor x in loader:\n    loss = model(x).sum()\n    loss.backward()\n"
           "    print(loss.item())\n")
    assert "every-rank-prints-loss" in {f.rule for f in audit.audit_source(src)}


def test_a_model_table_these_files_lack_builds_the_option_default_class(tmp_path):
    """ADL-Stereo (held-out batch 44) builds `__models__[args.model](maxdisp)` from backbones/__init__.py, which
    the copies lack; --model defaults to 'PSMNet', a class the project defines with BatchNorm: the default run
    wraps it in DDP without SyncBatchNorm. A default naming a class without BatchNorm is quiet."""
    models = ("import torch\nclass PSMNet(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
              "        self.bn = torch.nn.BatchNorm2d(4)\nclass GwcNet(torch.nn.Module):\n"
              "    def __init__(self):\n        super().__init__()\n        self.ln = torch.nn.LayerNorm(4)\n")
    train = (DDP_HEAD + "torch.manual_seed(0)\nimport argparse\nfrom backbones import __models__\n"
             "p = argparse.ArgumentParser()\np.add_argument('--model', default='{default}')\nargs = p.parse_args()\n"
             "model = __models__[args.model]()\nmodel = DDP(model)\nfor x in loader:\n    model(x).sum().backward()\n")

    def found(name, default):
        root = _project(tmp_path / name, {"backbones/PSMNet/models.py": models,
                                          "train.py": train.format(default=default)})
        return {f.rule for f in audit.audit_paths([root])}
    assert "batchnorm-without-sync" not in found("gwc", "GwcNet")
    assert "batchnorm-without-sync" in found("psm", "PSMNet")


def test_a_save_helper_nothing_names_is_dead_code(tmp_path):
    """Text4Vis's utils.py keeps an epoch_saving that train.py redefines, guards and calls itself; utils.py has a
    `__main__` self-test, so it reads as a script, but nothing names its epoch_saving: no save runs there. A
    helper the script imports and calls unguarded is a finding."""
    utils = ("import torch\nclass Meter:\n    pass\n"
             "def epoch_saving(model, filename):\n    torch.save(model.state_dict(), filename)\n"
             "if __name__ == '__main__':\n    print(torch.load('probs.pth'))\n")
    train = (DDP_HEAD + "torch.manual_seed(0)\n{imp}model = DDP(Net())\n{local}"
             "for x in loader:\n    model(x).sum().backward()\n{call}")
    local = "def epoch_saving(model, filename):\n    torch.save(model.state_dict(), filename)\n"

    def found(name, imp, local, call):
        root = _project(tmp_path / name, {"utils/utils.py": utils,
                                          "train.py": train.format(imp=imp, local=local, call=call)})
        return [(Path(f.path).name, f.line) for f in audit.audit_paths([root]) if f.rule == "save-on-every-rank"]
    assert found("shadowed", "from utils.utils import Meter\n", local,
                 "if rank == 0:\n    epoch_saving(model, 'last.pt')\n") == []
    assert found("imported", "from utils.utils import epoch_saving\n", "", "epoch_saving(model, 'last.pt')\n")


def test_a_load_in_the_arm_no_launcher_reaches_needs_no_map_location():
    """ADL-Stereo loads without map_location only in the else of `if args.distributed:`, YouReID only in the else
    of `if 'LOCAL_RANK' in os.environ:`: one process runs there. The same load on the launched path is a finding."""
    src = ("ckpt = 'c.pth'\nif {test}:\n    state = torch.load(ckpt, map_location='cpu')\nelse:\n"
           "    state = torch.load(ckpt)\nmodel = DDP(Net())\nmodel.load_state_dict(state)\n")
    assert "load-without-map-location" not in rules(src.format(test="args.distributed"))
    assert "load-without-map-location" not in rules(src.format(test="'LOCAL_RANK' in os.environ"))
    assert "load-without-map-location" in rules(src.format(test="args.resume_from_cpu"))



def test_a_plain_gather_whose_result_feeds_no_gradient_is_quiet(tmp_path):
    """AVID's memory bank gathers every rank's embeddings with a plain all_gather and reads them only under
    `with torch.no_grad():`; the same helper's result used in the loss is a finding. Text4Vis's gather_features is
    called only by create_logits, which nothing in these files calls."""
    helper = ("import torch, torch.distributed as dist\ndef gather_all(x):\n"
              "    out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]\n"
              "    dist.all_gather(out, x)\n    return torch.cat(out)\n")
    loss = ("import torch\nfrom dist_utils import gather_all\nclass NCELoss(torch.nn.Module):\n"
            "    def forward(self, z):\n        allz = gather_all(z)\n{use}")
    no_grad = ("        with torch.no_grad():\n            self.bank = 0.5 * self.bank + allz.mean(0)\n"
               "        return z.sum()\n")
    in_loss = "        return (z @ allz.T).logsumexp(1).mean()\n"
    script = (DDP_HEAD + "torch.manual_seed(0)\nfrom losses import NCELoss\nmodel = DDP(Net())\ncrit = NCELoss()\n"
              "for x in loader:\n    crit(model(x)).backward()\n")

    def found(name, use):
        root = _project(tmp_path / name, {"dist_utils.py": helper, "losses.py": loss.format(use=use),
                                          "train.py": script})
        return {f.rule for f in audit.audit_paths([root])}
    assert "gather-without-grad" not in found("bank", no_grad)
    assert "gather-without-grad" in found("loss", in_loss)


def test_python_config_defaults_turn_options_off(tmp_path):
    """Pointcept's configs/_base_/default_runtime.py sets `sync_bn = False` and `gradient_accumulation_steps = 1`;
    the trainer converts to SyncBatchNorm only `if self.cfg.sync_bn:` and divides the loss by
    `self.cfg.gradient_accumulation_steps`: the default run has plain BatchNorm and no accumulation. With the
    config's defaults turned on, the conversion runs and the accumulation is real."""
    trainer = (DDP_HEAD + "torch.manual_seed(0)\nclass Trainer:\n    def __init__(self, cfg):\n"
               "        self.cfg = cfg\n"
               "        model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))\n"
               "        if self.cfg.sync_bn:\n"
               "            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\n"
               "        self.model = DDP(model)\n    def train(self, loader, opt):\n"
               "        for i, x in enumerate(loader):\n"
               "            loss = self.model(x).sum() / self.cfg.gradient_accumulation_steps\n"
               "            loss.backward()\n"
               "            if (i + 1) % self.cfg.gradient_accumulation_steps == 0:\n                opt.step()\n"
               "Trainer(cfg).train(loader, opt)\n")

    def found(name, sync, steps):
        root = _project(tmp_path / name, {"configs/_base_/default_runtime.py":
                                          f"sync_bn = {sync}\ngradient_accumulation_steps = {steps}\n",
                                          "train.py": trainer})
        return {f.rule for f in audit.audit_paths([root])}
    off = found("defaults", False, 1)
    assert "batchnorm-without-sync" in off and "accumulation-without-no-sync" not in off, off
    on = found("turned-on", True, 4)
    assert "batchnorm-without-sync" not in on and "accumulation-without-no-sync" in on, on



def test_a_rank0_flag_set_on_args_holds_in_the_function_it_is_handed_to(tmp_path):
    """Chinese-CLIP's main sets `args.should_save = args.logs is not None and is_master(args)` and calls
    `train(model, args)`; train saves under `if args.should_save:`: rank 0's. A flag with no rank test in it
    leaves the save on every rank."""
    train = ("import torch\ndef train(model, args):\n    if args.should_save:\n"
             "        torch.save(model.state_dict(), 'ckpt.pt')\n")
    main = (DDP_HEAD + "torch.manual_seed(0)\nfrom train_lib import train\ndef is_master(args):\n"
            "    return args.rank == 0\nmodel = DDP(Net())\nargs.should_save = args.logs is not None{rank}\n"
            "train(model, args)\n")

    def found(name, rank):
        root = _project(tmp_path / name, {"train_lib.py": train, "main.py": main.format(rank=rank)})
        return {f.rule for f in audit.audit_paths([root])}
    assert "save-on-every-rank" not in found("master", " and is_master(args)")
    assert "save-on-every-rank" in found("everyone", "")


def test_a_builder_asked_only_for_evaluation_needs_no_set_epoch(tmp_path):
    """BiSeNet's get_data_loader builds a DistributedSampler only in its `else` of `if mode == 'train':`, and the
    only call that gets there asks for mode='val': an evaluation loader, read once per evaluation. A training
    call that reaches it needs set_epoch."""
    lib = ("import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\n"
           "def get_data_loader(ds, mode='train'):\n    if mode == 'train':\n        sampler = None\n    else:\n"
           "        sampler = DistributedSampler(ds, shuffle=True)\n    return DataLoader(ds, sampler=sampler)\n")
    main = (DDP_HEAD + "torch.manual_seed(0)\nfrom loaders import get_data_loader\nmodel = DDP(Net())\n"
            "dl = get_data_loader(ds, mode='{mode}')\nfor epoch in range(3):\n    for x in dl:\n"
            "        model(x).sum().backward()\n")

    def found(name, mode):
        root = _project(tmp_path / name, {"loaders.py": lib, "main.py": main.format(mode=mode)})
        return {f.rule for f in audit.audit_paths([root])}
    assert "set-epoch-missing" not in found("val", "val")
    assert "set-epoch-missing" in found("other", "trainval")


def test_a_helper_only_rank_0_calls_tests_its_arguments_not_the_rank():
    """AVID's CheckpointManager.save returns unless self.rank == 0, then calls save_checkpoint(state, ...), whose
    `if filename is None:` picks a default path. Everything save_checkpoint is handed there was rank 0's; reading
    `filename` as a rank-0 object made `filename is None` exclude rank 0 and the manager's save look unguarded.
    Without the early return the save runs on every rank."""
    src = ("def save_checkpoint(state, filename=None):\n    if filename is None:\n        filename = 'ckpt.pth'\n"
           "    torch.save(state, filename)\nclass CheckpointManager:\n    def __init__(self, rank):\n"
           "        self.rank = rank\n    def save(self, epoch, filename=None, **kw):\n{exit}"
           "        state = {{'epoch': epoch}}\n        if filename is None:\n            save_checkpoint(state)\n"
           "        else:\n            save_checkpoint(state, filename=filename)\n"
           "model = DDP(Net())\nckp = CheckpointManager(rank)\nfor epoch in range(2):\n"
           "    for x in loader:\n        model(x).sum().backward()\n    ckp.save(epoch, model=model)\n")
    assert "save-on-every-rank" not in rules(src.format(exit="        if self.rank != 0:\n            return\n"))
    assert "save-on-every-rank" in rules(src.format(exit=""))


def test_batch52_53_classes(tmp_path):
    """RepVGG's utils.py defines load_checkpoint twice (the first, without map_location, never runs);
    image_classification_sota logs `loss_m = AverageMeter(dist=True)`, whose update() all-reduces; icefall's
    save_checkpoint returns off rank 0 and then calls the save it imports as save_checkpoint_impl."""
    load = ("model = DDP(Net())\ndef load_checkpoint(ckpt_path):\n    return torch.load(ckpt_path)\n{again}"
            "model.load_state_dict(load_checkpoint('ckpt.pth'))\n")
    assert "load-without-map-location" not in rules(load.format(
        again="def load_checkpoint(ckpt_path):\n    return torch.load(ckpt_path, map_location='cpu')\n"))
    assert "load-without-map-location" in rules(load.format(again=""))
    meter = ("class AverageMeter:\n    def __init__(self, dist=False):\n        self.dist, self.val = dist, 0\n"
             "    def update(self, v):\n        self.val = v\n{reduce}"
             "loss_m = AverageMeter(dist=True)\nmodel = DDP(Net())\nfor x in loader:\n    loss = model(x).sum()\n"
             "    loss.backward()\n    loss_m.update(loss.item())\n    if rank == 0:\n        print(loss_m.val)\n")
    reduce = ("        if self.dist:\n            t = torch.tensor([self.val])\n            dist.all_reduce(t)\n"
              "            self.val = t.item() / dist.get_world_size()\n")
    assert "rank0-local-loss" not in rules(meter.format(reduce=reduce))
    assert "rank0-local-loss" in rules(meter.format(reduce=""))
    ckpt = ("import torch\ndef save_checkpoint(model, filename):\n    torch.save(model.state_dict(), filename)\n")
    train = (DDP_HEAD + "torch.manual_seed(0)\nfrom ckpt import save_checkpoint as save_checkpoint_impl\n"
             "def save_checkpoint(model, rank):\n{exit}    save_checkpoint_impl(model, 'epoch.pt')\n"
             "model = DDP(Net())\nfor x in loader:\n    model(x).sum().backward()\nsave_checkpoint(model, rank)\n")

    def saves(name, exit):
        root = _project(tmp_path / name, {"ckpt.py": ckpt, "train.py": train.format(exit=exit)})
        return {f.rule for f in audit.audit_paths([root])}
    assert "save-on-every-rank" not in saves("guarded", "    if rank != 0:\n        return\n")
    assert "save-on-every-rank" in saves("open", "")
