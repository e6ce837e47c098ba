"""`ddp-lab audit`: each rule fires on the bug it names and not on its fix; a project is judged across files
(helpers that seed, loader libraries, save helpers); real public scripts (tests/outside/) get the findings a
reader of them would agree with; the lab's own train.py gets none. tests/analysis/test_audit_corpus.py scores the
audit on a labelled corpus of public code."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lab_utils.analysis import audit

REPO = Path(__file__).resolve().parents[2]
OUTSIDE = REPO / "tests" / "outside"

DDP_HEAD = """
import os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
dist.init_process_group("gloo")
rank = int(os.environ["RANK"]); world_size = int(os.environ["WORLD_SIZE"])
"""


def rules(body: str, head: str = DDP_HEAD + "torch.manual_seed(0)\n") -> list[str]:
    return [f.rule for f in audit.audit_source(head + textwrap.dedent(body))]


# (rule, a script with the bug, the same script fixed)
CASES = [
    ("set-epoch-missing",
     "s = DistributedSampler(ds)\nfor epoch in range(3):\n    for b in DataLoader(ds, sampler=s): pass\n",
     "s = DistributedSampler(ds)\nfor epoch in range(3):\n    s.set_epoch(epoch)\n"
     "    for b in DataLoader(ds, sampler=s): pass\n"),
    ("set-epoch-missing",  # set_epoch only under a switch the sampler ignores
     "s = DistributedSampler(ds)\nfor epoch in range(3):\n    if args.distributed:\n        s.set_epoch(epoch)\n"
     "    for b in DataLoader(ds, sampler=s): pass\n",
     "s = DistributedSampler(ds) if args.distributed else None\nfor epoch in range(3):\n"
     "    if args.distributed:\n        s.set_epoch(epoch)\n    for b in DataLoader(ds, sampler=s): pass\n"),
    ("set-epoch-late",
     "s = DistributedSampler(ds)\nloader = DataLoader(ds, sampler=s)\nit = iter(loader)\nfor step in range(9):\n"
     "    try:\n        b = next(it)\n    except StopIteration:\n        it = iter(loader)\n"
     "        s.set_epoch(step)\n        b = next(it)\n",
     "s = DistributedSampler(ds)\nloader = DataLoader(ds, sampler=s)\nit = iter(loader)\nfor step in range(9):\n"
     "    try:\n        b = next(it)\n    except StopIteration:\n        s.set_epoch(step)\n"
     "        it = iter(loader)\n        b = next(it)\n"),
    ("sampler-with-shuffle",
     "s = DistributedSampler(ds)\ns.set_epoch(0)\nl = DataLoader(ds, sampler=s, shuffle=True)\n",
     "s = DistributedSampler(ds, shuffle=True)\ns.set_epoch(0)\nl = DataLoader(ds, sampler=s)\n"),
    ("seed-per-rank",  # rank 0 seeds 43, the single run (RANK = -1) seeds 42
     "RANK = int(os.environ.get('RANK', -1))\ntorch.manual_seed(42 + 1 + RANK)\n",
     "RANK = int(os.environ.get('RANK', -1))\ntorch.manual_seed(42 + 1 + max(RANK, 0))\n"),
    ("seed-per-rank",  # the same through a seeding helper
     "def init_seeds(seed=0):\n    torch.manual_seed(seed)\nRANK = int(os.getenv('RANK', -1))\ninit_seeds(1 + RANK)\n",
     "def init_seeds(seed=0):\n    torch.manual_seed(seed)\nRANK = int(os.getenv('RANK', -1))\n"
     "init_seeds(1 + max(RANK, 0))\n"),
    ("peek-iterator", "b = next(iter(loader))\n", "b = loader.batch_size\nk, v = next(iter(d.items()))\n"),
    ("sum-loss-unscaled", "loss = F.cross_entropy(y, t, reduction='sum')\n",
     "loss = F.cross_entropy(y, t, reduction='sum') * world_size\n"),
    ("gather-without-grad",
     "def gather(f):\n    out = [torch.zeros_like(f) for _ in range(world_size)]\n    dist.all_gather(out, f)\n"
     "    out[rank] = f\n    return torch.cat(out)\n",
     "def gather(f):\n    out = torch.distributed.nn.functional.all_gather(f)\n    return torch.cat(out)\n"),
    ("rank0-local-loss", "loss.backward()\nif rank == 0:\n    print(f'loss {loss.item()}')\n",
     "loss.backward()\ndist.all_reduce(loss)\nloss /= world_size\nif rank == 0:\n    print(f'loss {loss.item()}')\n"),
    ("rank0-local-loss", "loss.backward()\nRANK = int(os.getenv('RANK', -1))\nif RANK in {-1, 0}:\n"
     "    print(f'loss {loss.item()}')\n",
     "loss.backward()\nRANK = int(os.getenv('RANK', -1))\nred = reduce_tensor(loss)\nif RANK in {-1, 0}:\n"
     "    print(f'loss {red.item()}')\n"),
    ("rank0-local-loss",  # torchvision/DETR's setup_for_distributed: print is silenced off rank 0
     "import builtins\nbuiltins.print = quiet_print\nloss.backward()\nprint('loss', loss.item())\n",
     "import builtins\nbuiltins.print = quiet_print\nloss.backward()\nloss_r = reduce_dict(loss)\n"
     "print('loss', loss_r.item())\n"),
    ("every-rank-prints-loss", "loss.backward()\nprint(f'loss {loss.item()}')\n",
     "loss.backward()\ndist.all_reduce(loss)\nif rank == 0:\n    print(f'loss {loss.item() / world_size}')\n"),
    ("save-without-module", "model = DDP(model)\nif rank == 0:\n    torch.save(model.state_dict(), 'm.pt')\n",
     "model = DDP(model)\nif rank == 0:\n    torch.save(model.module.state_dict(), 'm.pt')\n"),
    ("save-on-every-rank", "torch.save(model.module.state_dict(), 'm.pt')\n",
     "if rank == 0:\n    torch.save(model.module.state_dict(), 'm.pt')\ndist.barrier()\n"),
    ("save-on-every-rank",  # true on every rank when torchrun starts the job (no --multiprocessing-distributed)
     "if not args.multiprocessing_distributed or args.rank % ngpus_per_node == 0:\n"
     "    torch.save(model.module.state_dict(), 'm.pt')\n",
     "if args.rank == 0:\n    torch.save(model.module.state_dict(), 'm.pt')\n"),
    ("load-without-map-location", "sd = torch.load('ckpt.pt')\n", "sd = torch.load('ckpt.pt', map_location='cpu')\n"),
    ("eval-padding-duplicates",
     "val_sampler = DistributedSampler(val_set)\nval_loader = DataLoader(val_set, sampler=val_sampler)\n"
     "def evaluate():\n    for x in val_loader:\n        dist.all_reduce(x)\nevaluate()\n",
     "val_loader = DataLoader(Subset(val_set, range(rank, len(val_set), world_size)))\n"
     "def evaluate():\n    for x in val_loader:\n        dist.all_reduce(x)\nevaluate()\n"),
    ("collective-under-rank0", "if rank == 0:\n    dist.barrier()\n",
     "if rank != 0:\n    dist.barrier()\nprepare()\nif rank == 0:\n    dist.barrier()\n"),
    ("collective-under-rank0", "if dist.get_rank() == 0:\n    dist.all_reduce(t)\n", "dist.all_reduce(t)\n"),
    ("collective-under-rank0",  # the other ranks returned early: what follows is rank 0's alone
     "def evaluate():\n    if rank != 0:\n        return\n    dist.all_reduce(t)\n",
     "def evaluate():\n    dist.all_reduce(t)\n    if rank != 0:\n        return\n    report(t)\n"),
    ("ddp-forward-under-rank0",
     "model = DDP(net)\nif rank == 0:\n    with torch.no_grad():\n        out = model(x)\n",
     "model = DDP(net)\nif rank == 0:\n    with torch.no_grad():\n        out = model.module(x)\n"),
    ("hard-coded-master-port", "os.environ['MASTER_PORT'] = '29500'\n",
     "os.environ['MASTER_PORT'] = str(find_free_port())\n"),
    ("accumulation-without-no-sync",
     "for i, b in enumerate(loader):\n    (model(b) / accum_steps).backward()\n"
     "    if (i + 1) % accum_steps == 0: opt.step()\n",
     "for i, b in enumerate(loader):\n    ctx = model.no_sync() if (i + 1) % accum_steps else nullcontext()\n"
     "    with ctx: (model(b) / accum_steps).backward()\n    if (i + 1) % accum_steps == 0: opt.step()\n"),
    ("batch-and-accum-divided", "batch_size = 32 // world_size\naccum_steps = 8 // world_size\n",
     "batch_size = 32 // world_size\naccum_steps = 8\n"),
    ("batchnorm-without-sync", "net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8))\n",
     "net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8))\n"
     "net = torch.nn.SyncBatchNorm.convert_sync_batchnorm(net)\n"),
]


IMPORTS_ONLY = DDP_HEAD.replace('dist.init_process_group("gloo")\n', "")

# (rule, bad, good, head): a rule whose fixture needs its own head (no seed, a process group set up under a switch)
HEADED_CASES = [
    ("no-seed", "model = DDP(build())\n", "torch.manual_seed(0)\nmodel = DDP(build())\n", DDP_HEAD),
    # (the parent's seed in the main guard: a top-level one re-runs in every spawned worker, which re-imports the
    # script as __mp_main__)
    ("seed-before-spawn",
     "import torch.multiprocessing as mp\ndef worker(r):\n    torch.cuda.manual_seed(0)\n    model = DDP(build())\n"
     "if __name__ == '__main__':\n    torch.manual_seed(0)\n    mp.spawn(worker, nprocs=2)\n",
     "import torch.multiprocessing as mp\ndef worker(r):\n    torch.manual_seed(0)\n    model = DDP(build())\n"
     "if __name__ == '__main__':\n    torch.manual_seed(0)\n    mp.spawn(worker, nprocs=2)\n", DDP_HEAD),
    ("collective-outside-switch",
     "if args.distributed:\n    dist.init_process_group('nccl')\nmodel = build()\ndist.barrier()\n",
     "if args.distributed:\n    dist.init_process_group('nccl')\nmodel = build()\nif args.distributed:\n"
     "    dist.barrier()\n", IMPORTS_ONLY + "torch.manual_seed(0)\n"),
]
CASES += [
    ("sampler-seed-per-rank",
     "s = DistributedSampler(ds, seed=args.seed + rank)\nfor epoch in range(3):\n    s.set_epoch(epoch)\n",
     "s = DistributedSampler(ds, seed=args.seed)\nfor epoch in range(3):\n    s.set_epoch(epoch)\n"),
]
ALL_CASES = [(*c, DDP_HEAD + "torch.manual_seed(0)\n") for c in CASES] + HEADED_CASES


@pytest.mark.parametrize("rule,bad,good,head", ALL_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(ALL_CASES)])
def test_each_rule_fires_on_the_bug_and_not_on_its_fix(rule, bad, good, head):
    assert rule in rules(bad, head), rules(bad, head)
    assert rule not in rules(good, head), rules(good, head)


def test_every_registered_rule_has_fixtures_a_chapter_notebook_and_one_sentence():
    """The registry is the one place a rule is written: id, chapter, summary, recogniser; each has a failing and a
    passing fixture above."""
    from test_audit_fsdp2 import CASES as FSDP2_CASES  # chapter 14's rules: their fixtures are small projects
    assert {c[0] for c in ALL_CASES} | {c[0] for c in CLASS_CASES} | {c[0] for c in FSDP2_CASES} == \
        set(audit.RULES) == set(audit.REGISTRY)
    for r in audit.REGISTRY.values():
        assert (REPO / "notebooks" / f"{r.chapter}.ipynb").exists(), r.id
        assert r.summary and ":" in r.summary and callable(r.check), r.id  # the defect: its consequence
    for _rule, bad, _, head in ALL_CASES:
        for f in audit.audit_source(head + textwrap.dedent(bad)):
            assert f.severity in audit.SEVERITIES and f.line >= 1, f  # never line 0


def test_the_package_keeps_its_modules_small():
    pkg = REPO / "lab_utils" / "analysis" / "audit"
    sizes = {p.name: len(p.read_text().splitlines()) for p in pkg.rglob("*.py")}
    assert max(sizes.values()) <= 600, sizes


# Issue 35's classes of mistakes: (rule, code where it must not fire, code where it must), each under DDP_HEAD
# plus a seed. The first is the false alarm of a class, the second keeps the rule alive.
CLASS_CASES = [
    # switches read as switches: `ddp` (RANK != -1) is true on every rank of a distributed run, not "rank != 0"
    ("collective-under-rank0",
     "ddp = int(os.environ.get('RANK', -1)) != -1\nif ddp:\n    dist.barrier()\n",
     "ddp = int(os.environ.get('RANK', -1)) != -1\nif rank != 0:\n    dist.barrier()\n"),
    ("save-on-every-rank",
     "ddp = int(os.environ.get('RANK', -1)) != -1\nfor s in range(3):\n    if rank == 0:\n"
     "        torch.save(model.module.state_dict(), 'm.pt')\n",
     "ddp = int(os.environ.get('RANK', -1)) != -1\nfor s in range(3):\n    if ddp:\n"
     "        torch.save(model.module.state_dict(), 'm.pt')\n"),
    ("save-on-every-rank",  # world_size > 1 is a switch, not a rank guard
     "for s in range(3):\n    if world_size > 1 and rank == 0:\n"
     "        torch.save(model.module.state_dict(), 'm.pt')\n",
     "for s in range(3):\n    if world_size > 1:\n        torch.save(model.module.state_dict(), 'm.pt')\n"),
    # meaning, not names
    ("every-rank-prints-loss",
     "import math, sys\nloss.backward()\nif not math.isfinite(loss.item()):\n"
     "    print(f'Loss is {loss.item()}, stopping training')\n    sys.exit(1)\n",
     "loss.backward()\nprint(f'loss {loss.item()}')\n"),
    ("save-on-every-rank",
     "import io\nbuf = io.BytesIO()\ntorch.save(model.state_dict(), buf)\n",
     "torch.save(model.state_dict(), 'ckpt.pt')\n"),
    ("sum-loss-unscaled",
     "loss = F.mse_loss(y, t, reduction='sum')\nloss = loss / y.numel()\nloss.backward()\n",
     "loss = F.mse_loss(y, t, reduction='sum')\nloss.backward()\n"),
    ("sum-loss-unscaled",
     "loss = F.cross_entropy(y, t, reduction='sum') / len(t)\nloss.backward()\n",
     "loss = F.cross_entropy(y, t, reduction='sum')\nloss.backward()\n"),
    # facts that live in objects and helpers: a rank-0-only writer, a meter fed the loss
    ("rank0-local-loss",
     "writer = SummaryWriter() if rank == 0 else None\nfor i in range(3):\n    loss = model(x)\n"
     "    loss.backward()\n    dist.all_reduce(loss)\n    if writer is not None:\n"
     "        writer.add_scalar('loss', loss.item() / world_size, i)\n",
     "writer = SummaryWriter() if rank == 0 else None\nfor i in range(3):\n    loss = model(x)\n"
     "    loss.backward()\n    if writer is not None:\n        writer.add_scalar('loss', loss.item(), i)\n"),
    ("rank0-local-loss",
     "def train(model, loader, meter):\n    for x in loader:\n        l = model(x)\n        l.backward()\n"
     "        meter.update(loss=reduce_value(l).item())\n        if dist.get_rank() == 0:\n            print(meter)\n",
     "def train(model, loader, meter):\n    for x in loader:\n        l = model(x)\n        l.backward()\n"
     "        meter.update(loss=l.item())\n        if dist.get_rank() == 0:\n            print(meter)\n"),
    # recognisers for what was missed: accumulation through a loss-scaler helper or a gated custom step; the lr
    # growing with the GPU count
    ("accumulation-without-no-sync",
     "def train(model, loader, opt, loss_scaler, k):\n    for i, b in enumerate(loader):\n"
     "        ctx = model.no_sync() if (i + 1) % k else nullcontext()\n        with ctx:\n"
     "            loss_scaler(model(b) / k, opt, update_grad=(i + 1) % k == 0)\n",
     "def train(model, loader, opt, loss_scaler, k):\n    for i, b in enumerate(loader):\n"
     "        loss_scaler(model(b) / k, opt, update_grad=(i + 1) % k == 0)\n"),
    ("accumulation-without-no-sync",
     "for it, b in enumerate(loader):\n    model(b).backward()\n    opt.step()\n    if it % 10 == 0:\n"
     "        log.step()\n",
     "for it, b in enumerate(loader):\n    model(b).backward()\n    if (it + 1) % args.k == 0:\n"
     "        opt.step()\n        opt.zero_grad()\n"),
    ("lr-grows-with-world-size",
     "opt = torch.optim.SGD(model.parameters(), lr=args.lr)\n",
     "eff_batch = args.batch_size * args.accum * dist.get_world_size()\nargs.lr = args.blr * eff_batch / 256\n"),
    # found on the held-out addition (tests/outside/heldout_labels.json), each a class: a save guarded two helpers
    # deep; a meter class that prints what it was fed (MetricLogger.log_every) and is synced before the summary;
    # a string formatted with the accumulation count
    ("save-on-every-rank",
     "def save_on_master(*a):\n    if dist.get_rank() == 0:\n        torch.save(*a)\n"
     "def save_model(model, path):\n    save_on_master({'model': model.state_dict()}, path)\n"
     "for epoch in range(3):\n    save_model(net, 'ckpt.pth')\n",
     "def save_model(model, path):\n    torch.save({'model': model.state_dict()}, path)\n"
     "for epoch in range(3):\n    save_model(net, 'ckpt.pth')\n"),
    ("rank0-local-loss",
     "import builtins\nbuiltins.print = quiet_print\nclass Meter:\n    def update(self, **kw): pass\n"
     "    def sync(self): dist.all_reduce(self.t)\n    def log_every(self, it):\n        for x in it:\n"
     "            yield x\n            print(self)\ndef train(loader):\n    meter = Meter()\n"
     "    for x in loader:\n        loss = model(x)\n        loss.backward()\n"
     "        meter.update(loss=reduce_value(loss).item())\n    meter.sync()\n    print('stats', meter)\n",
     "import builtins\nbuiltins.print = quiet_print\nclass Meter:\n    def update(self, **kw): pass\n"
     "    def sync(self): dist.all_reduce(self.t)\n    def log_every(self, it):\n        for x in it:\n"
     "            yield x\n            print(self)\ndef train(loader):\n    meter = Meter()\n"
     "    for x in meter.log_every(loader):\n        loss = model(x)\n        loss.backward()\n"
     "        meter.update(loss=loss.item())\n"),
    ("accumulation-without-no-sync",
     "print('accumulate grad iterations: %d' % args.accum_iter)\nfor b in loader:\n    model(b).backward()\n"
     "    opt.step()\n",
     "for i, b in enumerate(loader):\n    (model(b) / args.accum_iter).backward()\n"
     "    if (i + 1) % args.accum_iter == 0:\n        opt.step()\n"),
    # the wrapper chosen by a test: the unwrapped arm runs only when nothing is wrapped
    ("save-without-module",
     "if args.distributed:\n    model = DDP(model)\nfor e in range(3):\n    if rank == 0:\n"
     "        sd = model.module.state_dict() if hasattr(model, 'module') else model.state_dict()\n"
     "        torch.save(sd, 'm.pt')\n",
     "if args.distributed:\n    model = DDP(model)\nfor e in range(3):\n    if rank == 0:\n"
     "        torch.save(model.state_dict(), 'm.pt')\n"),
    # an all_gather inside a contrastive loss, its list concatenated by the caller
    ("gather-without-grad",
     "def gather(x):\n    out = [torch.zeros_like(x) for _ in range(world_size)]\n"
     "    dist.all_gather(out, x.detach())\n    return out\n",
     "def gather(x):\n    out = [torch.zeros_like(x) for _ in range(world_size)]\n    dist.all_gather(out, x)\n"
     "    return out\nclass ContrastiveLoss(torch.nn.Module):\n    def forward(self, a, b):\n"
     "        return F.cross_entropy(a @ torch.cat(gather(b)).T, labels)\n"),
    ("gather-without-grad",  # a GatherLayer whose backward all-reduces (VICReg's) vs one that only slices (SimCLR's)
     "class GatherLayer(torch.autograd.Function):\n    @staticmethod\n    def forward(ctx, x):\n"
     "        out = [torch.zeros_like(x) for _ in range(world_size)]\n        dist.all_gather(out, x)\n"
     "        return tuple(out)\n    @staticmethod\n    def backward(ctx, *g):\n        g = torch.stack(g)\n"
     "        dist.all_reduce(g)\n        return g[rank]\n"
     "def contrastive_loss(a, b):\n    return F.cross_entropy(a @ torch.cat(GatherLayer.apply(b)).T, labels)\n",
     "class GatherLayer(torch.autograd.Function):\n    @staticmethod\n    def forward(ctx, x):\n"
     "        out = [torch.zeros_like(x) for _ in range(world_size)]\n        dist.all_gather(out, x)\n"
     "        return tuple(out)\n    @staticmethod\n    def backward(ctx, *g):\n        return g[rank]\n"),
    # batch 2 of the held-out addition: an EMA loaded through torch.save into memory is no checkpoint; an unseen
    # helper named like a saver (from a module outside the folder) is a save; an lr schedule built from an lr
    # that grows with the GPU count
    ("save-on-every-rank",
     "import io\ndef _load_checkpoint_for_ema(ema, ckpt):\n    mem_file = io.BytesIO()\n"
     "    torch.save({'state_dict_ema': ckpt}, mem_file)\n    ema.load(mem_file)\n"
     "for e in range(3):\n    _load_checkpoint_for_ema(ema, ckpt)\n",
     "from model import save_model\nfor e in range(3):\n    save_model(args, model, optimizer)\n"),
    ("lr-grows-with-world-size",
     "lr_schedule = cosine_scheduler(args.lr, args.min_lr, args.epochs)\n",
     "lr_schedule = cosine_scheduler(args.lr * args.batch_size * dist.get_world_size() / 256, args.min_lr, 9)\n"),
    # a finding only where its consequence can happen
    ("set-epoch-missing",  # an evaluation sampler's order changes no metric; shuffle=False has one order anyway
     "s = DistributedSampler(val_set)\nt = DistributedSampler(ds, shuffle=False)\nfor epoch in range(3):\n"
     "    for b in DataLoader(val_set, sampler=s): pass\n    for b in DataLoader(ds, sampler=t): pass\n",
     "s = DistributedSampler(ds)\nfor epoch in range(3):\n    for b in DataLoader(ds, sampler=s): pass\n"),
    ("save-without-module",  # the loader strips the prefix: the checkpoint loads into the plain model
     "model = DDP(model)\nif rank == 0:\n    torch.save(model.state_dict(), 'm.pt')\n"
     "def load(net, sd):\n    net.load_state_dict({k.replace('module.', ''): v for k, v in sd.items()})\n",
     "model = DDP(model)\nif rank == 0:\n    torch.save(model.state_dict(), 'm.pt')\n"),
    ("hard-coded-master-port",  # a fallback: the launcher's port wins
     "if 'MASTER_PORT' not in os.environ:\n    os.environ['MASTER_PORT'] = '29500'\n",
     "os.environ['MASTER_PORT'] = '29500'\n"),
]


@pytest.mark.parametrize("rule,quiet,loud", CLASS_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CLASS_CASES)])
def test_issue35_classes_read_meaning_and_consequence(rule, quiet, loud):
    assert rule not in rules(quiet), rules(quiet)
    assert rule in rules(loud), rules(loud)


def test_a_launcher_that_only_defines_an_init_helper_sets_up_no_ddp():
    """NVIDIA waveglow's distributed.py: it defines init_distributed() (init_process_group) for train.py and, as a
    script, only starts processes with Popen. What the script runs decides, not what it defines."""
    src = ("import subprocess, sys, torch.distributed as dist\ndef init_distributed(rank, n):\n"
           "    dist.init_process_group('nccl', rank=rank, world_size=n)\ndef main():\n"
           "    subprocess.Popen([sys.executable, 'train.py'])\nif __name__ == '__main__':\n    main()\n")
    assert "no-seed" not in [f.rule for f in audit.audit_source(src)]
    runs_it = src.replace("    main()\n", "    init_distributed(0, 1)\n")
    assert "no-seed" in [f.rule for f in audit.audit_source(runs_it)]


def test_one_finding_per_defect_for_a_port_fixed_in_two_branches():
    """Barlow Twins sets `args.dist_url = 'tcp://...:58472'` in its SLURM branch and its local branch: one
    defect (the fixed port), one finding."""
    body = ("if slurm:\n    args.dist_url = f'tcp://{host}:58472'\nelse:\n    args.dist_url = 'tcp://localhost:58472'\n"
            "dist.init_process_group('nccl', init_method=args.dist_url)\n")
    assert rules(body).count("hard-coded-master-port") == 1, rules(body)


def test_no_seed_only_in_a_ddp_script():
    assert "no-seed" in rules("", head=DDP_HEAD)
    assert "no-seed" not in rules("", head="import torch\nx = torch.rand(3)\n")


def test_a_rank_term_in_a_conditional_is_a_switch_not_a_finding():
    """train.py's `seed + (rank if seed_mode == 'article' else 0)`: the article's bug behind a key."""
    assert "seed-per-rank" not in rules("torch.manual_seed(1 + (rank if per_rank else 0))\n")


def test_a_generator_seeded_per_rank_is_not_a_global_seed():
    """The checklist's own advice: DataLoader(generator=torch.Generator().manual_seed(data_seed + rank))."""
    assert "seed-per-rank" not in rules("g = torch.Generator().manual_seed(1234 + rank)\n")


def test_a_per_rank_seed_whose_rank_0_is_the_single_run_is_no_finding():
    """nanoGPT's `1337 + seed_offset` (seed_offset = ddp_rank, 0 without DDP): DDP broadcasts rank 0's weights,
    and rank 0 seeds what the single run seeds; the per-rank part is what gives ranks different batches (its
    batches come from the global RNG), so 'one seed on every rank' would be the bug (truth review M3)."""
    body = "if ddp:\n    seed_offset = rank\nelse:\n    seed_offset = 0\ntorch.manual_seed(1337 + seed_offset)\n"
    assert "seed-per-rank" not in rules(body)
    assert "seed-per-rank" not in rules("torch.manual_seed(args.seed + dist.get_rank())\n")


def test_a_per_rank_seed_with_an_ema_copy_before_the_wrap_is_checked_by_hand():
    body = ("torch.manual_seed(7 + rank)\nnet = build()\nema = copy.deepcopy(net)\nnet = DDP(net)\n")
    found = [f for f in audit.audit_source(DDP_HEAD + body) if f.rule == "seed-per-rank"]
    assert [(f.line, f.severity) for f in found] == [(9, "check-by-hand")], found
    assert not [f for f in audit.audit_source(DDP_HEAD + "torch.manual_seed(7 + rank)\nnet = DDP(build())\n"
                                              "ema = copy.deepcopy(net.module)\n") if f.rule == "seed-per-rank"]


def test_an_import_alias_or_an_import_alone_makes_a_ddp_script():
    """`DistributedDataParallel as NativeDDP` (and a file that only imports it) must not silence the rules."""
    alias = ("import torch\nfrom torch.nn.parallel import DistributedDataParallel as NativeDDP\n"
             "model = NativeDDP(net)\nif rank == 0:\n    torch.save(model.state_dict(), 'm.pt')\n")
    assert {"no-seed", "save-without-module"} <= {f.rule for f in audit.audit_source(alias)}
    only_import = "import torch\nfrom torch.nn.parallel import DistributedDataParallel as NativeDDP\nmain()\n"
    assert "no-seed" not in {f.rule for f in audit.audit_source(only_import)}  # no DDP set-up it can see
    assert "load-without-map-location" in {f.rule for f in audit.audit_source(
        only_import + "rank = 0\nsd = torch.load('ckpt.pt')\n")}


def test_the_unwrapped_model_saved_under_another_name_is_no_finding():
    body = ("model = DDP(model)\nmodel_without_ddp = model.module\nif rank == 0:\n"
            "    torch.save(model_without_ddp.state_dict(), 'm.pt')\n"
            "def save(m):\n    torch.save(m.state_dict(), 'n.pt')\nif rank == 0:\n    save(model.module)\n")
    assert "save-without-module" not in rules(body)


def _project(tmp_path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    return tmp_path


def test_a_project_is_judged_across_files(tmp_path):
    """A seeding helper, a loader library with the sampler, a save helper: the script is clean, and auditing the
    helpers alone says nothing about what only the script decides."""
    root = _project(tmp_path, {
        "utils/misc.py": """
            import torch, random
            def fix_random_seeds(seed=31):
                torch.manual_seed(seed)
                random.seed(seed)
            def save_on_master(obj, path):
                torch.save(obj, path)
            """,
        "data.py": """
            from torch.utils.data import DataLoader, DistributedSampler
            def make_loader(ds):
                return DataLoader(ds, sampler=DistributedSampler(ds), batch_size=8)
            """,
        "train.py": """
            import torch, torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel as DDP
            from utils.misc import fix_random_seeds, save_on_master
            from data import make_loader
            def main():
                dist.init_process_group("gloo")
                fix_random_seeds(0)
                model = DDP(build())
                loader = make_loader(ds)
                for epoch in range(3):
                    loader.sampler.set_epoch(epoch)
                    for b in loader:
                        model(b).backward()
                    if dist.get_rank() == 0:
                        save_on_master({"model": model.module.state_dict()}, "ckpt.pt")
            if __name__ == "__main__":
                main()
            """})
    assert audit.audit_paths([root]) == [], audit.format_findings(audit.audit_paths([root]))
    assert audit.audit_file(root / "data.py") == []  # a loader library: set_epoch is the script's business
    assert audit.audit_file(root / "utils" / "misc.py") == []
    unguarded = (root / "train.py").read_text().replace("if dist.get_rank() == 0:\n            ", "")
    (root / "train.py").write_text(unguarded.replace("fix_random_seeds(0)", "pass"))
    found = {(Path(f.path).name, f.rule, f.line) for f in audit.audit_paths([root])}
    assert ("train.py", "no-seed", 7) in found and ("train.py", "save-on-every-rank", 15) in found, found
    (root / "train.py").write_text(unguarded.replace("loader.sampler.set_epoch(epoch)", "pass"))
    # one finding: in the script whose epoch loop never calls set_epoch, naming the helper's sampler and the
    # loop that iterates its loader
    found = audit.audit_paths([root])
    assert [(Path(f.path).name, f.line, [(Path(p).name, n) for p, n in f.related]) for f in found
            if f.rule == "set-epoch-missing"] == [
        ("train.py", 10, [("data.py", 4), ("train.py", 13), ("train.py", 11)])]


def test_a_rank_handed_to_a_class_guards_like_the_rank():
    """`Trainer(model, data, opt, rank, ...)` then `if self.gpu_id == 0: save`: the parameter holds the rank."""
    body = ("class Trainer:\n    def __init__(self, model, gpu_id):\n        self.gpu_id = gpu_id\n"
            "        self.model = DDP(model)\n    def train(self):\n        if self.gpu_id == 0:\n"
            "            torch.save(self.model.module.state_dict(), 'c.pt')\n")
    assert "save-on-every-rank" not in rules(body + "Trainer(net, rank).train()\n")
    assert "save-on-every-rank" in rules(body + "Trainer(net, 0).train()\n")  # 0 on every rank: no rank


def test_a_save_helper_that_guards_itself_is_no_every_rank_save():
    helper = "def save_on_master(*a):\n    if rank == 0:\n        torch.save(*a)\n"
    call = "save_on_master({'model': net.state_dict()}, 'c.pt')\n"
    assert "save-on-every-rank" not in rules(helper + call)
    assert "save-on-every-rank" in rules(helper.replace("if rank == 0:", "if True:") + call)


def test_a_wrapped_checkpoint_resumed_into_the_wrapped_model_keeps_its_prefix():
    """Barlow Twins / VICReg: model.state_dict() of the DDP model, loaded back with model.load_state_dict after
    the wrap, and the plain weights exported apart (`model.module.backbone.state_dict()`): module. round-trips,
    and the plain model has its own file. Without that export, and with a single run whose model is plain, the round
    trip is still found (a plain model cannot load the file), check-by-hand."""
    save = "model = DDP(net)\nif rank == 0:\n    torch.save({'model': model.state_dict()}, 'c.pt')\n"
    assert "save-without-module" in rules(save)
    resume = save + "model.load_state_dict(torch.load('c.pt', map_location='cpu')['model'])\n"
    export = "if rank == 0:\n    torch.save(model.module.backbone.state_dict(), 'resnet50.pth')\n"
    assert "save-without-module" not in rules(resume + export)
    switched = resume.replace("model = DDP(net)\n", "model = net\nif world_size > 1:\n    model = DDP(net)\n")
    found = [f for f in audit.audit_source(DDP_HEAD + "torch.manual_seed(0)\n" + switched)
             if f.rule == "save-without-module"]
    assert [f.severity for f in found] == ["check-by-hand"]  # (a wrap the single run also has: no finding,
    # test_audit_classes235)


def test_a_seed_through_an_intermediate_name_is_judged_as_written():
    """DETR's `seed = args.seed + utils.get_rank()`: rank 0 seeds the single run's seed; `seed + 1 + RANK` with
    RANK = -1 in the single run does not."""
    parsed = "parser.add_argument('--seed', default=42, type=int)\n"  # the name `seed` defaults to 42 alone
    assert "seed-per-rank" not in rules(parsed + "seed = args.seed + dist.get_rank()\ntorch.manual_seed(seed)\n")
    bad = "RANK = int(os.environ.get('RANK', -1))\nseed = 1234 + 1 + RANK\ntorch.manual_seed(seed)\n"
    assert "seed-per-rank" in rules(bad)


def test_a_fixed_port_through_a_variable_and_a_conditional_sampler():
    url = "args.dist_url = 'tcp://localhost:58472'\ndist.init_process_group('nccl', init_method=args.dist_url)\n"
    assert "hard-coded-master-port" in rules(url)
    assert "hard-coded-master-port" in rules(url.replace("'tcp://localhost:58472'", "f'tcp://{host}:58472'"))
    assert "hard-coded-master-port" not in rules(url.replace("'tcp://localhost:58472'", "'env://'"))
    loader = ("sampler = DistributedSampler(ds) if distributed else None\n"
              "loader = DataLoader(ds, shuffle=True, sampler=sampler)\n")
    assert "sampler-with-shuffle" in rules(loader)
    assert "sampler-with-shuffle" not in rules(loader.replace("shuffle=True", "shuffle=sampler is None"))


def test_an_evaluate_function_over_a_plain_loader_counts_padding():
    body = ("val_sampler = DistributedSampler(val_set, shuffle=False)\n"
            "def evaluate(data_loader):\n    for x in data_loader:\n        dist.all_reduce(x)\n"
            "evaluate(DataLoader(val_set, sampler=val_sampler))\n")
    assert "eval-padding-duplicates" in rules(body)
    assert "eval-padding-duplicates" not in rules(body.replace("dist.all_reduce(x)", "acc.append(x)"))


def test_losses_logged_through_a_helper_step_a_record_or_the_models_forward():
    """mingpt's Trainer prints a batch loss whose backward is in _run_batch; VICReg packs a local loss into
    `stats = dict(loss=loss.item())`; Barlow Twins' loss comes from an all-reduced matrix inside forward."""
    step = ("def run_batch(b):\n    loss = model(b)\n    loss.backward()\n    return loss.item()\n"
            "def run_epoch(loader):\n    for b in loader:\n        batch_loss = run_batch(b)\n"
            "        print(f'loss {batch_loss}')\n")
    assert "every-rank-prints-loss" in rules(step)
    assert "every-rank-prints-loss" not in rules(step.replace("print(f'loss {batch_loss}')",
                                                              "if rank == 0: print(f'loss {batch_loss}')"))
    net = ("class Net(torch.nn.Module):\n    def forward(self, x):\n        c = self.f(x)\n"
           "        dist.all_reduce(c)\n        loss = (c - 1).pow(2).sum()\n        return loss\n"
           "model = Net().cuda()\nmodel = DDP(model)\nfor x in loader:\n    loss = model.forward(x)\n"
           "    loss.backward()\n    if rank == 0:\n        stats = dict(step=1, loss=loss.item())\n"
           "        print(json.dumps(stats))\n")
    assert "rank0-local-loss" not in rules(net)  # the loss is computed from the all-reduced c
    assert "rank0-local-loss" in rules(net.replace("        dist.all_reduce(c)\n", ""))


def test_a_sibling_scripts_set_epoch_is_not_this_scripts(tmp_path):
    """pytorch/examples' ddp-tutorial-series: multigpu.py calls set_epoch, multigpu_torchrun.py does not; they
    share datautils.py, but neither runs the other."""
    script = """
        import torch, torch.distributed as dist
        from torch.utils.data import DataLoader, DistributedSampler
        from datautils import MyData
        dist.init_process_group("gloo")
        torch.manual_seed(0)
        loader = DataLoader(MyData(), sampler=DistributedSampler(MyData()))
        for epoch in range(2):
            {set_epoch}
            for b in loader:
                pass
        """
    root = _project(tmp_path, {"datautils.py": "class MyData:\n    pass\n",
                               "a.py": script.format(set_epoch="loader.sampler.set_epoch(epoch)"),
                               "b.py": script.format(set_epoch="pass")})
    found = {(Path(f.path).name, f.rule) for f in audit.audit_paths([root])}
    assert ("b.py", "set-epoch-missing") in found and ("a.py", "set-epoch-missing") not in found, found


def test_the_labs_own_train_script_has_no_finding():
    findings = audit.audit_file(REPO / "scripts" / "train.py")
    assert findings == [], audit.format_findings(findings, "scripts/train.py")


def test_findings_carry_line_rule_severity_message_and_chapter():
    f = audit.audit_source(DDP_HEAD + "torch.manual_seed(0)\nif rank == 0:\n    dist.barrier()\n")[0]
    assert (f.line, f.rule, f.severity, f.chapter) == (9, "collective-under-rank0", "defect", "00_preflight")
    assert f.format("x.py").startswith("x.py:9: collective-under-rank0 [defect] ")
    assert "notebooks/00_preflight.ipynb" in f.format("x.py")
    assert set(f.to_dict()) == {"file", "line", "rule", "severity", "message", "chapter", "related"}


@pytest.mark.slow  # 2.1 s: the audit takes 1.7 CPU-s on this 336-line file (facts.any_class walks the tree)
def test_nanogpt_train_rank0_local_loss_and_no_per_rank_seed_finding():
    """karpathy/nanoGPT train.py (MIT): rank 0 prints `loss.item()` of its own micro-batch (its own comment:
    "approximating the true total loss"). Its eval estimate is no finding: rank 0 alone averages eval_iters
    batches, as the single run does (held-out batch 6's label), but estimate_loss() runs the DDP-wrapped global
    `model` on rank 0 alone, whose forward broadcasts the buffers if the GPT has any (its causal-mask buffer
    without flash attention): ddp-forward-under-rank0, check by hand. Its `torch.manual_seed(1337 + seed_offset)`
    is no finding: rank 0's seed is the single run's (seed_offset = 0 without DDP), and the per-rank part is what
    gives the ranks different batches, drawn from the global RNG (truth review M3). It uses
    require_backward_grad_sync instead of no_sync, and divides only the accumulation steps: no finding either."""
    found = audit.audit_file(OUTSIDE / "nanogpt_train.py")
    src = (OUTSIDE / "nanogpt_train.py").read_text().splitlines()
    assert sorted(f.rule for f in found) == ["ddp-forward-under-rank0", "rank0-local-loss"], \
        audit.format_findings(found, "nanogpt")
    assert any("lossf" in src[f.line - 1] for f in found)
    assert not any("losses['train']" in src[f.line - 1] for f in found)  # the eval estimate: rank 0's whole own
    assert any(f.rule == "ddp-forward-under-rank0" and "model(X, Y)" in src[f.line - 1] for f in found)
    assert any("torch.manual_seed(1337 + seed_offset)" in line for line in src)  # still there, and no finding


def test_pytorch_examples_multigpu_torchrun_no_seed_and_peek():
    """pytorch/examples ddp-tutorial-series/multigpu_torchrun.py (BSD-3): it never seeds, and peeks a batch with
    next(iter(loader)) each epoch; it does call set_epoch and saves model.module (no finding there)."""
    found = audit.audit_file(OUTSIDE / "pytorch_examples_multigpu_torchrun.py")
    assert [f.rule for f in found] == ["peek-iterator", "no-seed"], audit.format_findings(found, "multigpu")
    src = (OUTSIDE / "pytorch_examples_multigpu_torchrun.py").read_text().splitlines()
    # no-seed at the flow's call of the setup helper (ddp_setup only sets up the group), where the seed belongs
    assert "ddp_setup(" in src[found[1].line - 1] and "def " not in src[found[1].line - 1]
    assert "next(iter(self.train_data))" in src[found[0].line - 1]


@pytest.mark.slow
def test_cli_exit_codes_json_and_sarif(tmp_path):
    run = lambda *a: subprocess.run([sys.executable, "-m", "lab_utils", "audit", *a], capture_output=True,  # noqa: E731
                                    text=True, cwd=REPO)
    as_json = run("--json", str(OUTSIDE / "pytorch_examples_multigpu_torchrun.py"))
    rows = json.loads(as_json.stdout)
    assert as_json.returncode == 1 and [r["rule"] for r in rows] == ["peek-iterator", "no-seed"]
    assert set(rows[0]) == {"file", "line", "rule", "severity", "message", "chapter", "related"} \
        and rows[0]["line"] >= 1
    sarif = json.loads(run("--sarif", str(OUTSIDE / "nanogpt_train.py")).stdout)
    assert sarif["version"] == "2.1.0" and {r["ruleId"] for r in sarif["runs"][0]["results"]} == \
        {"rank0-local-loss", "ddp-forward-under-rank0"}
    assert run("--json", "scripts/train.py").stdout.strip() == "[]"
    bad = run(str(OUTSIDE / "nanogpt_train.py"))
    assert bad.returncode == 1 and "rank0-local-loss" in bad.stdout
    assert run("scripts/train.py").returncode == 0
    missing = run("no_such_script.py")
    assert missing.returncode == 2 and "no_such_script.py: no such file" in missing.stderr
    broken = tmp_path / "audit_not_python.py"  # never inside the repository (a clean clone has no runs/)
    broken.write_text("def f(:\n")
    r = run(str(broken))
    assert r.returncode == 2 and "not Python" in r.stderr
