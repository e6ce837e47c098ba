"""Issue 35: classes of round 414-419's first look (docs/measured/cpu2/audit_heldout_round414.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (ccb7c27, at f6fab42)."""

from test_audit import _project
from test_audit_classes246 import _rules

SPAWNED = ("import os, torch, torch.distributed as dist, torch.multiprocessing as mp\n"
           "from torch.nn.parallel import DistributedDataParallel as DDP\n")


def test_a_text_printed_before_it_is_written_holds_no_loss(tmp_path):
    """rfpp's train.py: `log = f'gradient_accumulation_steps: {n}'`, `print(log)`, then `f.write(log)` on rank 0;
    the same name holds the step's loss text further down. The first write logs no loss; the loss line's own
    write is the finding (rank0-local-loss), not the early one."""
    train = (SPAWNED + "def train(rank):\n    torch.manual_seed(0)\n    dist.init_process_group('gloo')\n"
             "    model = DDP(torch.nn.Linear(2, 2))\n    n = 4\n    if rank == 0:\n"
             "        log = f'gradient_accumulation_steps: {n}'\n        print(log)\n"
             "        with open('log.txt', 'a') as f:\n            f.write(log)\n"
             "    for step in range(10):\n        loss = model(torch.ones(2)).sum()\n        loss.backward()\n"
             "        if rank == 0:\n            log = f'step {step} loss {loss.item():.4f}'\n"
             "            print(log)\n            with open('log.txt', 'a') as f:\n                f.write(log)\n"
             "if __name__ == '__main__':\n    mp.spawn(train, nprocs=2)\n")
    hits = _rules(_project(tmp_path / "p", {"train.py": train}), "rank0-local-loss")
    assert hits and all(h.line > 12 for h in hits), [(h.line, h.message) for h in hits]


def test_a_port_option_handed_on_through_a_local_name(tmp_path):
    """rfpp: `port = arg.port` (--port defaults to 12354), then `ddp_setup(rank, port)`, whose
    `os.environ['MASTER_PORT'] = str(port)`: the rendezvous port is fixed (hard-coded-master-port). A port read
    from the environment first is quiet."""
    train = (SPAWNED + "import argparse\ndef ddp_setup(rank, port):\n    os.environ['MASTER_PORT'] = str(port)\n"
             "    dist.init_process_group('gloo', rank=rank, world_size=2)\n"
             "def main(rank, arg):\n    torch.manual_seed(0)\n    port = CHOSEN\n    ddp_setup(rank, port)\n"
             "    model = DDP(torch.nn.Linear(2, 2))\nif __name__ == '__main__':\n"
             "    parser = argparse.ArgumentParser()\n    parser.add_argument('--port', type=int, default=12354)\n"
             "    mp.spawn(main, args=(parser.parse_args(),), nprocs=2)\n")
    assert _rules(_project(tmp_path / "fixed", {"train.py": train.replace("CHOSEN", "arg.port")}),
                  "hard-coded-master-port")
    env = train.replace("CHOSEN", "os.environ.get('MASTER_PORT', arg.port)")
    assert not _rules(_project(tmp_path / "env", {"train.py": env}), "hard-coded-master-port")


def test_no_seed_names_the_scripts_own_broadcast_of_the_init(tmp_path):
    """modded-nanogpt: no DDP wrap; `for param in model.parameters(): dist.broadcast(param.detach(), 0)` copies
    rank 0's unseeded init to the others. The no-seed finding names that broadcast as a related place, where the
    consequence happens."""
    train = ("import torch, torch.distributed as dist\ndist.init_process_group('gloo')\n"
             "model = torch.nn.Linear(2, 2)\nfor param in model.parameters():\n    dist.broadcast(param.detach(), 0)\n"
             "for step in range(3):\n    model(torch.ones(2)).sum().backward()\n"
             "    for p in model.parameters():\n        dist.all_reduce(p.grad)\n")
    hits = _rules(_project(tmp_path / "p", {"train.py": train}), "no-seed")
    assert hits and any(line == 5 for h in hits for _, line in h.related), [(h.line, h.related) for h in hits]


def test_gradients_reduced_by_a_method_handed_each_grad(tmp_path):
    """modded-nanogpt's optimizer: `self._launch_reduce(param, param.grad)`, whose `dist.all_reduce(grad, ...)`,
    with no DDP wrap: no backward all-reduces, so accumulating micro-batches needs no no_sync (quiet). The same
    loop under a DDP wrap is accumulation-without-no-sync."""
    train = ("import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
             "class Opt:\n    def __init__(self, params):\n        self.params = list(params)\n"
             "    def _launch_reduce(self, param, grad):\n        dist.all_reduce(grad, op=dist.ReduceOp.AVG)\n"
             "    def step(self):\n        for param in self.params:\n"
             "            self._launch_reduce(param, param.grad)\n"
             "torch.manual_seed(0)\ndist.init_process_group('gloo')\nmodel = WRAP\nopt = Opt(model.parameters())\n"
             "accum = 4\nfor step in range(10):\n    for i in range(accum):\n"
             "        (model(torch.ones(2)).sum() / accum).backward()\n    opt.step()\n")
    plain = train.replace("WRAP", "torch.nn.Linear(2, 2)")
    assert not _rules(_project(tmp_path / "plain", {"train.py": plain}), "accumulation-without-no-sync")
    wrapped = train.replace("WRAP", "DDP(torch.nn.Linear(2, 2))").replace(
        "            self._launch_reduce(param, param.grad)\n", "            pass\n")
    assert _rules(_project(tmp_path / "wrapped", {"train.py": wrapped}), "accumulation-without-no-sync")


def test_a_gather_into_a_memory_bank_buffer_feeds_no_loss(tmp_path):
    """TOIST's ClusterCriterion.update_memory_queue: `all_gather(self.temp_list, feats)`, concatenated, then
    written slot by slot into the registered `feature_bank` buffer; nothing is returned or kept on an attribute
    (quiet). Keeping the concatenation as `self.negatives`, which the loss reads, is gather-without-grad."""
    crit = ("import torch, torch.distributed as dist\nclass ClusterCriterion(torch.nn.Module):\n"
            "    def __init__(self):\n        super().__init__()\n"
            "        self.temp_list = [torch.zeros(4, 3) for _ in range(dist.get_world_size())]\n"
            "        self.register_buffer('feature_bank', torch.randn(16, 3))\n"
            "    def update_memory_queue(self, feats):\n        dist.all_gather(self.temp_list, feats)\n"
            "        gathered = torch.cat(self.temp_list, dim=0)\nSTORE"
            "    def forward(self, feats):\n        self.update_memory_queue(feats)\n"
            "        return (feats @ self.feature_bank.T).logsumexp(1).mean()\n")
    train = ("import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
             "from crit import ClusterCriterion\ntorch.manual_seed(0)\ndist.init_process_group('gloo')\n"
             "model = DDP(torch.nn.Linear(3, 3))\ncriterion = ClusterCriterion()\nfor step in range(3):\n"
             "    loss = criterion(model(torch.ones(4, 3)))\n    loss.backward()\n")
    bank = "        for i in range(len(gathered)):\n            self.feature_bank[i] = gathered[i]\n"
    quiet = {"train.py": train, "crit.py": crit.replace("STORE", bank)}
    assert not _rules(_project(tmp_path / "bank", quiet), "gather-without-grad")
    kept = {"train.py": train, "crit.py": crit.replace("STORE", "        self.negatives = gathered\n")}
    assert _rules(_project(tmp_path / "kept", kept), "gather-without-grad")


def test_an_mmcv_norm_config_of_batchnorm(tmp_path):
    """NeWCRFs and IEBins: the depth model's decoder is built with `norm_cfg = dict(type='BN', requires_grad=True)`
    handed to mmcv's ConvModule, which makes nn.BatchNorm2d; the model is wrapped in DDP unconverted
    (batchnorm-without-sync). `dict(type='SyncBN')` is quiet."""
    model = ("import torch\nfrom mmcv.cnn import ConvModule\n"
             "class Depth(torch.nn.Module):\n"
             "    def __init__(self):\n        super().__init__()\n"
             "        norm_cfg = dict(type='NORM', requires_grad=True)\n"
             "        self.head = ConvModule(8, 8, 3, norm_cfg=norm_cfg)\n"
             "    def forward(self, x):\n        return self.head(x)\n")
    train = ("import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
             "from model import Depth\ntorch.manual_seed(0)\ndist.init_process_group('gloo')\n"
             "model = DDP(Depth())\nfor step in range(3):\n    model(torch.ones(2, 8, 4, 4)).sum().backward()\n")
    bn = {"train.py": train, "model.py": model.replace("NORM", "BN")}
    assert _rules(_project(tmp_path / "bn", bn), "batchnorm-without-sync")
    sync = {"train.py": train, "model.py": model.replace("NORM", "SyncBN")}
    assert not _rules(_project(tmp_path / "sync", sync), "batchnorm-without-sync")


def test_a_process_subgroup_made_outside_the_distributed_switch(tmp_path):
    """IEBins: init_process_group only under `if args.distributed:`, then `group = dist.new_group([...])` outside
    it: new_group needs the default group, so the one-process run raises (collective-outside-switch). Under the
    same switch it is quiet."""
    train = ("import argparse, torch, torch.distributed as dist\n"
             "from torch.nn.parallel import DistributedDataParallel as DDP\nparser = argparse.ArgumentParser()\n"
             "parser.add_argument('--distributed', action='store_true')\nargs = parser.parse_args()\n"
             "torch.manual_seed(0)\nmodel = torch.nn.Linear(2, 2)\nif args.distributed:\n"
             "    dist.init_process_group('gloo')\n    model = DDP(model)\nGROUP"
             "for step in range(3):\n    model(torch.ones(2)).sum().backward()\n")
    loud = train.replace("GROUP", "group = dist.new_group([0, 1])\n")
    assert _rules(_project(tmp_path / "loud", {"train.py": loud}), "collective-outside-switch")
    quiet = train.replace("GROUP", "    group = dist.new_group([0, 1])\n")
    assert not _rules(_project(tmp_path / "quiet", {"train.py": quiet}), "collective-outside-switch")
