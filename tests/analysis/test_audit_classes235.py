"""Issue 35: classes of round 235-239's first look (docs/measured/cpu2/audit_heldout_round235.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (e756562)."""

from test_audit import _project
from test_audit_classes135 import SEEDED
from test_audit_classes189 import _found, _has, _line

STEP = "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
TRAIN = ("for step in range(4):\n    loss = model(torch.ones(2)).sum()\n    opt.zero_grad()\n    loss.backward()\n"
         "    opt.step()\n")


def test_a_keyword_wrap_of_a_holder_of_an_unseen_backbone(tmp_path):
    """FaceX-Zoo: `DistributedDataParallel(module=model, ...)` of FaceModel, whose __init__ keeps `self.backbone =
    backbone_factory.get_backbone()` (the factory's file not copied), while every model class the copies define
    (backbone/ResNets.py) has BatchNorm: check-by-hand at the wrap. With a converting call, nothing."""
    nets = ("import torch.nn as nn\nclass Resnet(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.bn = nn.BatchNorm2d(4)\n")
    train = SEEDED + ("class FaceModel(torch.nn.Module):\n    def __init__(self, backbone_factory):\n"
                      "        super().__init__()\n        self.backbone = backbone_factory.get_backbone()\n"
                      "def main(factory):\n    model = FaceModel(factory)\n    CONVERT\n"
                      "    model = torch.nn.parallel.DistributedDataParallel(module=model, broadcast_buffers=False)\n")
    for convert, want in (("pass", True), ("model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)", False)):
        root = _project(tmp_path / str(want), {"train.py": train.replace("CONVERT", convert),
                                               "backbone/ResNets.py": nets})
        assert _has(root, "batchnorm-without-sync") is want


def test_a_closure_saving_the_outer_functions_wrapper(tmp_path):
    """dialogue-generation: main() wraps `model = DistributedDataParallel(model)` under `if args.distributed:` and
    its closure `def save_state(name): torch.save({'model': model.state_dict()}, ...)` reads that model: the keys
    carry `module.`. Saving `model.module.state_dict()` there is right."""
    train = ("import argparse, torch, torch.distributed as dist\n"
             "from torch.nn.parallel import DistributedDataParallel\ntorch.manual_seed(0)\n"
             "p = argparse.ArgumentParser()\np.add_argument('--distributed', action='store_true')\n"
             "args = p.parse_args()\ndef main():\n    model = torch.nn.Linear(2, 2)\n    if args.distributed:\n"
             "        dist.init_process_group('gloo')\n        model = DistributedDataParallel(model)\n"
             "    def save_state(name):\n        torch.save({'model': SAVED.state_dict()}, name + '.pt')\n"
             "    for epoch in range(2):\n        if not args.distributed or dist.get_rank() == 0:\n"
             "            save_state('last')\nmain()\n")
    for saved, want in (("model", True), ("model.module", False)):
        root = _project(tmp_path / str(want), {"train.py": train.replace("SAVED", saved)})
        assert _has(root, "save-without-module") is want


def test_a_torchmetrics_meter_is_reduced_when_computed(tmp_path):
    """MineSegSAT: `epoch_loss = MeanMetric().to(device)`, fed each step, `ep_loss = epoch_loss.compute()` (which
    syncs every rank's state first), printed by rank 0: the whole run's loss. With sync_on_compute=False it is
    rank 0's own."""
    train = SEEDED + "from torchmetrics import MeanMetric\nmodel = DDP(torch.nn.Linear(2, 2))\n" + STEP + (
        "epoch_loss = MeanMetric(SYNC).to('cpu')\nfor epoch in range(2):\n    for step in range(4):\n"
        "        loss = model(torch.ones(2)).sum()\n        opt.zero_grad()\n        loss.backward()\n"
        "        opt.step()\n        epoch_loss.update(loss)\n    ep_loss = epoch_loss.compute()\n"
        "    if rank == 0:\n        print(f'Loss: {ep_loss.item()}')\n")
    for sync, want in (("", False), ("sync_on_compute=False", True)):
        root = _project(tmp_path / str(want), {"train.py": train.replace("SYNC", sync)})
        assert _has(root, "rank0-local-loss") is want


def test_a_round_trip_of_a_wrapper_the_single_run_also_has(tmp_path):
    """MonoSDF, MineSegSAT: DDP wraps the model whatever the world size, and the project loads its checkpoints
    back into the wrapper: the single run's keys carry `module.` too, no difference. (NeuralRecon: the other arm
    wraps in DataParallel.) Under a distributed switch with a plain single run the round trip is found,
    check-by-hand, as before."""
    body = ("    model.load_state_dict(torch.load('c.pt', map_location='cpu')['model'])\n"
            "    if rank == 0:\n        torch.save({'model': model.state_dict()}, 'c.pt')\n")
    head = SEEDED + "def main(distributed):\n    model = torch.nn.Linear(2, 2)\n"
    cases = (("    model = DDP(model)\n", []),
             ("    if distributed:\n        model = DDP(model)\n    else:\n"
              "        model = torch.nn.DataParallel(model)\n", []),
             ("    if distributed:\n        model = DDP(model)\n", ["check-by-hand"]))
    for i, (wrap, want) in enumerate(cases):
        root = _project(tmp_path / str(i), {"train.py": head + wrap + body + "main(True)\n"})
        assert [f.severity for f in _found(root) if f.rule == "save-without-module"] == want, wrap


def test_a_per_rank_seed_only_on_gpus_keeps_rank_0_at_the_base_seed(tmp_path):
    """audioset-convnext: `seed = args.seed`, then `seed = args.seed + idr_torch.rank` on GPUs, then
    `torch.manual_seed(seed)`: rank 0 seeds the base seed, as the single run does. `seed + 1 + RANK` with RANK -1
    in the single run alone does not."""
    train = ("import argparse, os, torch, torch.distributed as dist\n"
             "from torch.nn.parallel import DistributedDataParallel as DDP\np = argparse.ArgumentParser()\n"
             "p.add_argument('--seed', type=int, default=1978)\nargs = p.parse_args()\n"
             "dist.init_process_group('gloo')\nrank = dist.get_rank()\nRANK = int(os.environ.get('RANK', -1))\n"
             "seed = args.seed\n"
             "if torch.cuda.is_available():\n    seed = OFFSET\ntorch.manual_seed(seed)\n"
             "model = DDP(torch.nn.Linear(2, 2))\n")
    for offset, want in (("args.seed + rank", False), ("args.seed + 1 + RANK", True)):
        root = _project(tmp_path / str(want), {"train.py": train.replace("OFFSET", offset)})
        assert _has(root, "seed-per-rank") is want


def test_a_norm_option_whose_default_is_synced(tmp_path):
    """PLOP: `if opts.norm_act == 'iabn_sync': norm = InPlaceABNSync ... else: norm = nn.BatchNorm2d`, with
    --norm_act defaulting to 'iabn_sync': the default run's model has no plain BatchNorm. Defaulting to 'std'
    it has."""
    model = ("import torch.nn as nn\nfrom functools import partial\nfrom inplace_abn import InPlaceABNSync\n"
             "class Net(nn.Module):\n    def __init__(self, opts):\n        super().__init__()\n"
             "        if opts.norm_act == 'iabn_sync':\n            norm = partial(InPlaceABNSync)\n"
             "        else:\n            norm = nn.BatchNorm2d\n        self.bn = norm(4)\n")
    train = SEEDED + ("import argparse\nfrom net import Net\np = argparse.ArgumentParser()\n"
                      "p.add_argument('--norm_act', type=str, default='DEFAULT')\nopts = p.parse_args()\n"
                      "model = DDP(Net(opts))\n")
    for default, want in (("iabn_sync", False), ("std", True)):
        root = _project(tmp_path / default, {"train.py": train.replace("DEFAULT", default), "net.py": model})
        assert _has(root, "batchnorm-without-sync") is want


def test_a_seed_option_the_launch_script_passes(tmp_path):
    """Si-Blurry: `--rnd_seed` has no default and torch is seeded under `if self.rnd_seed is not None:`, but every
    launch script passes `--rnd_seed $seed`: the documented run is seeded. Without the script it is not."""
    train = ("import argparse, torch, torch.distributed as dist\n"
             "from torch.nn.parallel import DistributedDataParallel as DDP\np = argparse.ArgumentParser()\n"
             "p.add_argument('--rnd_seed', type=int)\nargs = p.parse_args()\ndist.init_process_group('gloo')\n"
             "if args.rnd_seed is not None:\n    torch.manual_seed(args.rnd_seed)\n"
             "model = DDP(torch.nn.Linear(2, 2))\n")
    script = "for seed in 1 2 3; do\n  torchrun --nproc_per_node 2 train.py --rnd_seed $seed\ndone\n"
    assert not _has(_project(tmp_path / "s", {"train.py": train, "run.sh": script}), "no-seed")
    assert _has(_project(tmp_path / "n", {"train.py": train}), "no-seed")


def test_a_helper_that_gathers_something_else_returns_its_own_loss(tmp_path):
    """Si-Blurry: `loss, acc = self.online_step(...)`, whose online_step all-gathers the batch's labels (for its
    memory) but returns the mean of its own batch's losses; rank 0 prints that loss: rank 0's own. A helper that
    all-reduces the loss it returns hands back the global one."""
    train = SEEDED + "model = DDP(torch.nn.Linear(2, 2))\n" + STEP + (
        "def online_step(x):\n    labels = [torch.zeros(2) for _ in range(world_size)]\n"
        "    dist.all_gather(labels, torch.ones(2))\n    loss = model(x).sum()\n    opt.zero_grad()\n"
        "    loss.backward()\n    opt.step()\n    out = loss.detach()\n    REDUCE\n    return out\n"
        "for step in range(4):\n    loss = online_step(torch.ones(2))\n    if rank == 0:\n"
        "        print(f'loss {loss:.4f}')\n")
    for reduce, want in (("pass", True), ("dist.all_reduce(out)", False)):
        root = _project(tmp_path / str(want), {"train.py": train.replace("REDUCE", reduce)})
        assert _has(root, "rank0-local-loss") is want


def test_gathered_predictions_read_only_by_a_metric(tmp_path):
    """RealNet's classifier: `dist.all_gather(all_preds, epoch_preds)`, `all_preds = torch.cat(all_preds)`, then
    `compute_top_k(all_preds, all_labels, 1)`: an accuracy, no loss, no gradient to lose. Fed to a loss, the same
    gather is the hedged finding it was."""
    train = SEEDED + "model = DDP(torch.nn.Linear(2, 2))\n" + STEP + (
        "def compute_top_k(p, y, k):\n    return (p == y).float().mean()\n"
        "def contrast(a, b):\n    return (a @ b.t()).logsumexp(1).mean()\n"
        "def epoch_end(epoch_preds, epoch_labels):\n    all_preds = [epoch_preds for _ in range(world_size)]\n"
        "    all_labels = [epoch_labels for _ in range(world_size)]\n    dist.all_gather(all_preds, epoch_preds)\n"
        "    dist.all_gather(all_labels, epoch_labels)\n    all_preds = torch.cat(all_preds, dim=0)\n"
        "    all_labels = torch.cat(all_labels, dim=0)\n    return USE(all_preds, all_labels)\n" + TRAIN +
        "    print(epoch_end(model(torch.ones(2, 2)), torch.ones(2, 2)))\n")
    for use, want in (("compute_top_k", False), ("contrast", True)):
        root = _project(tmp_path / use, {"train.py": train.replace("USE", use).replace(
            "return compute_top_k(all_preds, all_labels)", "return compute_top_k(all_preds, all_labels, 1)")})
        assert _has(root, "gather-without-grad") is want, use
    assert _line(train, "dist.all_gather(all_preds")
