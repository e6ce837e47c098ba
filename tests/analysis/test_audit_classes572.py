"""Issue 35: classes of round 572-577's first look (docs/measured/cpu2/audit_heldout_round572.txt), fixed after
it, quiet and loud; each test fails at the first look's code (16ca760). The round's other misses are left, said in
docs/results.md."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_a_flag_raised_on_rank_0_and_in_the_one_process_arm_is_rank_0s(tmp_path):
    """ViLBERT: `default_gpu = False`, `if dist.is_available() and args.local_rank != -1: if rank == 0:
    default_gpu = True`, `else: default_gpu = True`; `if default_gpu: torch.save(...)` runs on rank 0 alone (no
    save-on-every-rank). A flag raised on every rank is no guard."""
    src = (DDP + "import argparse\np = argparse.ArgumentParser()\np.add_argument('--local_rank', type=int, "
           "default=-1)\nargs = p.parse_args()\ndist.init_process_group('gloo')\ntorch.manual_seed(0)\n"
           "model = DDP(torch.nn.Linear(2, 2))\ndefault_gpu = False\n"
           "if dist.is_available() and args.local_rank != -1:\n    rank = dist.get_rank()\n    RAISE\n"
           "else:\n    default_gpu = True\nif default_gpu:\n    torch.save(model.module.state_dict(), 'm.bin')\n")
    guarded = src.replace("RAISE", "if rank == 0:\n        default_gpu = True")
    assert not _rules(_project(tmp_path / "guarded", {"train.py": guarded}), "save-on-every-rank")
    every = src.replace("RAISE", "default_gpu = True")
    assert _rules(_project(tmp_path / "every", {"train.py": every}), "save-on-every-rank")


def test_a_batchnorm_under_a_parameter_no_call_turns_on_is_not_built(tmp_path):
    """dualBR: `class BasicConv: def __init__(self, cin, cout, norm=False): ... if norm:
    layers.append(nn.BatchNorm2d(cout))`, every caller leaving norm out: no BatchNorm (no
    batchnorm-without-sync). A caller passing norm=True builds one."""
    model = ("import torch.nn as nn\nclass BasicConv(nn.Module):\n    def __init__(self, cin, cout, norm=False):\n"
             "        super().__init__()\n        layers = [nn.Conv2d(cin, cout, 3)]\n        if norm:\n"
             "            layers.append(nn.BatchNorm2d(cout))\n        self.main = nn.Sequential(*layers)\n"
             "    def forward(self, x):\n        return self.main(x)\nclass Net(nn.Module):\n"
             "    def __init__(self):\n        super().__init__()\n        self.a = BasicConv(3, 8ARG)\n"
             "    def forward(self, x):\n        return self.a(x)\n")
    train = DDP + "from model import Net\ndist.init_process_group('gloo')\ntorch.manual_seed(0)\nmodel = DDP(Net())\n"
    off = _project(tmp_path / "off", {"model.py": model.replace("ARG", ""), "train.py": train})
    assert not _rules(off, "batchnorm-without-sync")
    on = _project(tmp_path / "on", {"model.py": model.replace("ARG", ", norm=True"), "train.py": train})
    assert _rules(on, "batchnorm-without-sync")


def test_a_sampler_class_bound_to_a_name_is_a_sampler(tmp_path):
    """MGN: `sampler_class = DistributedSampler`, then `test_sampler = sampler_class(test_dataset, ...)` for
    validation, whose loss is all-reduced: the padding counts duplicates (eval-padding-duplicates)."""
    src = (DDP + "from torch.utils.data import DataLoader, DistributedSampler\ndef main():\n"
           "    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n    model = DDP(torch.nn.Linear(2, 2))\n"
           "    sampler_class = DistributedSampler\n    test_dataset = [torch.ones(2)] * 5\n"
           "    test_sampler = sampler_class(test_dataset, shuffle=True)\n"
           "    test_loader = DataLoader(test_dataset, sampler=test_sampler)\n    validate(model, test_loader)\n"
           "def validate(model, test_loader):\n    with torch.no_grad():\n        for x in test_loader:\n"
           "            val_loss = model(x).sum()\n            dist.all_reduce(val_loss)\n"
           "if __name__ == '__main__':\n    main()\n")
    assert [f.line for f in _rules(_project(tmp_path / "bound", {"train.py": src}), "eval-padding-duplicates")] == [10]
    unpadded = src.replace("shuffle=True)", "shuffle=True, drop_last=True)")
    assert not _rules(_project(tmp_path / "dropped", {"train.py": unpadded}), "eval-padding-duplicates")


def test_a_project_sampler_told_not_to_pad_counts_nothing_twice(tmp_path):
    """RobustNet: the project's `DistributedSampler(val_set, pad=False, ...)`, a class that pads only when asked:
    no duplicates (no eval-padding-duplicates); asked to pad, it does."""
    sampler = ("import math, torch\nfrom torch.utils.data import Sampler\nclass DistributedSampler(Sampler):\n"
               "    def __init__(self, dataset, pad=False):\n        self.n, self.pad = len(dataset), pad\n"
               "        self.total_size = math.ceil(self.n / 2) * 2 if pad else self.n\n    def __iter__(self):\n"
               "        idx = list(range(self.n))\n        if self.pad:\n"
               "            idx += idx[:self.total_size - self.n]\n"
               "        return iter(idx[dist_rank()::2])\n")
    src = (DDP + "from torch.utils.data import DataLoader\nfrom sampler import DistributedSampler\n"
           "if __name__ == '__main__':\n    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
           "    model = DDP(torch.nn.Linear(2, 2))\n    val_set = [torch.ones(2)] * 5\n"
           "    val_sampler = DistributedSampler(val_set, pad=PAD)\n"
           "    val_loader = DataLoader(val_set, sampler=val_sampler)\n    with torch.no_grad():\n"
           "        for x in val_loader:\n            val_loss = model(x).sum()\n"
           "            dist.all_reduce(val_loss)\n")
    off = _project(tmp_path / "off", {"sampler.py": sampler, "train.py": src.replace("PAD", "False")})
    assert not _rules(off, "eval-padding-duplicates")
    on = _project(tmp_path / "on", {"sampler.py": sampler, "train.py": src.replace("PAD", "True")})
    assert _rules(on, "eval-padding-duplicates")


def test_shuffle_beside_a_sampler_name_of_another_function_is_no_clash(tmp_path):
    """RobustNet: one builder's `val_sampler = DistributedSampler(val_set)`, another's `val_sampler = None` then
    `DataLoader(val_set, shuffle=True, sampler=val_sampler)`: no sampler-with-shuffle there; with the
    DistributedSampler in the same function, torch raises."""
    src = (DDP + "from torch.utils.data import DataLoader, DistributedSampler\ndef first(val_set):\n"
           "    val_sampler = DistributedSampler(val_set)\n    return DataLoader(val_set, sampler=val_sampler)\n"
           "def second(val_set):\n    val_sampler = SECOND\n"
           "    return DataLoader(val_set, shuffle=True, sampler=val_sampler)\n"
           "if __name__ == '__main__':\n    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
           "    model = DDP(torch.nn.Linear(2, 2))\n    first([1, 2])\n    second([1, 2])\n")
    assert not _rules(_project(tmp_path / "none", {"train.py": src.replace("SECOND", "None")}), "sampler-with-shuffle")
    clash = src.replace("SECOND", "DistributedSampler(val_set)")
    assert _rules(_project(tmp_path / "clash", {"train.py": clash}), "sampler-with-shuffle")


def test_an_option_the_code_turns_on_is_on_and_an_options_record_is_no_loss(tmp_path):
    """RobustNet: `--use_wtloss` (store_true) is set by the code itself (`if args.wt_layer[i] == 2:
    args.use_wtloss = True`), so rank 0's `if args.use_wtloss: print('Whitening Loss', wt_loss)` runs
    (rank0-local-loss). And `args.best_record['val_loss'] = ...` in a helper makes no loss of `args`, nor of
    `i = train(..., args.max_iter)` (no every-rank-prints-loss for `print('#### iteration', i)`)."""
    src = (DDP + "import argparse\np = argparse.ArgumentParser()\np.add_argument('--use_wtloss', "
           "action='store_true')\np.add_argument('--wt_layer', nargs='*', type=int, default=[0])\n"
           "p.add_argument('--max_iter', type=int, default=10)\nargs = p.parse_args()\nargs.best_record = {}\n"
           "for w in args.wt_layer:\n    if w == 2:\n        TURN\n"
           "def record(args, val_loss):\n    args.best_record['val_loss'] = val_loss\n"
           "def train(model, max_iter):\n    for i in range(max_iter):\n        out = model(torch.ones(2))\n"
           "        total_loss, wt_loss = out.sum(), out.mean()\n        total_loss.backward()\n"
           "        if dist.get_rank() == 0 and args.use_wtloss:\n            print('Whitening Loss', wt_loss)\n"
           "    return i\ndef main():\n    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
           "    model = DDP(torch.nn.Linear(2, 2))\n    i = 0\n    print('#### iteration', i)\n"
           "    i = train(model, args.max_iter)\n    record(args, 0.0)\nif __name__ == '__main__':\n    main()\n")
    turned = _project(tmp_path / "turned", {"train.py": src.replace("TURN", "args.use_wtloss = True")})
    assert _rules(turned, "rank0-local-loss") and not _rules(turned, "every-rank-prints-loss")
    left = _project(tmp_path / "left", {"train.py": src.replace("TURN", "pass")})
    assert not _rules(left, "rank0-local-loss")


def test_a_checkpoint_of_the_wrapper_the_project_loads_back_into_the_wrapper_is_a_round_trip(tmp_path):
    """RobustNet: the script always wraps (`net = network.warp_network_in_dataparallel(net, ...)`, DDP at one
    process too), rank 0's `evaluate_eval(args, net, ...)` saves `net.state_dict()`, and `load_weights(net, ...)`
    hands it through restore_snapshot to forgiving_state_restore's `net.load_state_dict(...)`: the prefix
    round-trips, and the single run's file has it too (no save-without-module). Without the load back, the
    plain model cannot read the file."""
    files = {
        "utils/misc.py": ("import torch\ndef evaluate_eval(args, net, optimizer, val_loss, epoch):\n"
                          "    torch.save({'state_dict': net.state_dict(), 'epoch': epoch}, 'last.pth')\n"),
        "network/__init__.py": ("import torch\ndef warp_network_in_dataparallel(net, gpuid):\n"
                                "    return torch.nn.parallel.DistributedDataParallel(net, device_ids=[gpuid])\n"),
        "optimizer.py": ("import torch\ndef load_weights(net, snapshot):\n    return restore_snapshot(net, snapshot)\n"
                         "def restore_snapshot(net, snapshot):\n    ckpt = torch.load(snapshot, map_location='cpu')\n"
                         "    return forgiving_state_restore(net, ckpt['state_dict'])\n"
                         "def forgiving_state_restore(net, loaded):\n    net.load_state_dict(loaded)\n"
                         "    return net\n"),
    }
    train = ("import argparse\nimport torch\nimport network\nimport optimizer\nfrom utils.misc import evaluate_eval\n"
             "p = argparse.ArgumentParser()\np.add_argument('--snapshot')\n"
             "p.add_argument('--local_rank', type=int, default=0)\nargs = p.parse_args()\n"
             "torch.distributed.init_process_group(backend='nccl')\ntorch.manual_seed(0)\ndef main():\n"
             "    net = torch.nn.Linear(2, 2)\n    optim = torch.optim.SGD(net.parameters(), lr=0.1)\n"
             "    net = network.warp_network_in_dataparallel(net, args.local_rank)\n    LOAD\n"
             "    for epoch in range(2):\n        net(torch.ones(2)).sum().backward()\n"
             "        if args.local_rank == 0:\n            evaluate_eval(args, net, optim, 0.0, epoch)\n"
             "if __name__ == '__main__':\n    main()\n")
    back = _project(tmp_path / "back", {**files, "train.py": train.replace(
        "LOAD", "if args.snapshot:\n        optimizer.load_weights(net, args.snapshot)")})
    assert not _rules(back, "save-without-module")
    never = _project(tmp_path / "never", {**files, "train.py": train.replace("LOAD", "pass")})
    assert _rules(never, "save-without-module")


def test_a_log_in_a_helper_only_rank_0_calls_names_the_guarded_call(tmp_path):
    """ViPT: `if self.settings.local_rank in [-1, 0]: self._write_tensorboard()`, whose
    `self.tensorboard_writer.write_epoch(self.stats, ...)` logs rank 0's own stats: the rank0-local-loss finding
    names the guarded call and its `if` as related places."""
    src = (DDP + "class Trainer:\n    def __init__(self, rank):\n        self.rank = rank\n        self.stats = {}\n"
           "        dist.init_process_group('gloo')\n        torch.manual_seed(0)\n"
           "        self.model = DDP(torch.nn.Linear(2, 2))\n    def train_epoch(self):\n"
           "        for i in range(4):\n            loss = self.model(torch.ones(2)).sum()\n"
           "            loss.backward()\n"
           "            self.stats['loss'] = loss.item()\n        if self.rank in [-1, 0]:\n"
           "            self._write_tensorboard()\n    def _write_tensorboard(self):\n"
           "        print('epoch stats', self.stats)\nif __name__ == '__main__':\n"
           "    Trainer(dist.get_rank()).train_epoch()\n")
    found = _rules(_project(tmp_path, {"train.py": src}), "rank0-local-loss")
    assert [sorted(r[1] for r in f.related if r[1] in (15, 16)) for f in found] == [[15, 16]]
