"""Issue 35: classes of round 240-245's first look (docs/measured/cpu2/audit_heldout_round240.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (4df171d)."""

from test_audit import _project
from test_audit_classes135 import SEEDED
from test_audit_classes189 import _found, _has, _line

LOOP = ("for step in range(4):\n    loss = model(torch.ones(2)).sum()\n    opt.zero_grad()\n    loss.backward()\n"
        "    opt.step()\n")


def test_no_seed_is_shown_at_a_methods_set_up(tmp_path):
    """sssegmentation: Trainer.__init__ sets up the group in a few lines and start() builds the segmentor; the
    seed belongs in the trainer, so no-seed is reported at the init_process_group line, not at the script's
    `client = Trainer(...)`."""
    train = ("import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
             "class Trainer:\n    def __init__(self):\n        dist.init_process_group('gloo')\n"
             "    def start(self):\n        model = DDP(torch.nn.Linear(2, 2))\n"
             "if __name__ == '__main__':\n    client = Trainer()\n    client.start()\n")
    root = _project(tmp_path, {"train.py": train})
    assert [f.line for f in _found(root) if f.rule == "no-seed"] == [_line(train, "init_process_group")]


def test_a_main_process_helper_without_underscores(tmp_path):
    """sssegmentation's `ismainprocess()`, `str(os.environ['RANK']) in ['0']`: rank 0's guard around the save.
    A save outside it is every rank's."""
    util = ("import os\ndef ismainprocess():\n    return str(os.environ['RANK']) in ['0']\n"
            "def checkrank():\n    return str(os.environ['RANK']) in ['0']\n")
    train = SEEDED + "from util import GUARD\nmodel = DDP(torch.nn.Linear(2, 2))\n" + (
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n") + LOOP + (
        "    if GUARD():\n        torch.save(model.module.state_dict(), 'm.pt')\n")
    for guard in ("ismainprocess", "checkrank"):  # (by name, and by its body's `in ['0']`)
        root = _project(tmp_path / guard, {"train.py": train.replace("GUARD", guard), "util.py": util})
        assert not _has(root, "save-on-every-rank"), guard
    loud = train.replace("    if GUARD():\n        torch.save", "    if True:\n        torch.save")
    assert _has(_project(tmp_path / "loud", {"train.py": loud.replace("GUARD", "ismainprocess"),
                                             "util.py": util}), "save-on-every-rank")


def test_rank_0_forwards_of_one_function_are_one_finding(tmp_path):
    """ALIGNN: rank 0 alone runs the test loop through `net(...)` and then `best_model(...)` over each split, all
    DDP-wrapped with buffers: one defect (evaluate through .module), one finding naming the other calls."""
    train = SEEDED + ("class Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                      "        self.lin = torch.nn.Linear(2, 2)\n        self.register_buffer('b', torch.zeros(2))\n"
                      "    def forward(self, x):\n        return self.lin(x) + self.b\n"
                      "net = DDP(Net())\nbest_model = DDP(Net())\nopt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
                      "def train_and_test():\n    for step in range(2):\n        net(torch.ones(2)).sum().backward()\n"
                      "    if rank == 0:\n        a = net(torch.ones(2))\n        b = best_model(torch.ones(2))\n"
                      "        c = best_model(torch.zeros(2))\ntrain_and_test()\n")
    hits = [f for f in _found(_project(tmp_path, {"train.py": train})) if f.rule == "ddp-forward-under-rank0"]
    assert [h.line for h in hits] == [_line(train, "a = net(")] and len(hits[0].related) == 2


def test_a_switch_the_launch_script_passes_makes_its_or_guard_rank_0s(tmp_path):
    """ProVLAE: `torch.save(...)` under `params.local_rank == 0 or not params.distributed` (a dataclass field, here
    an option named `--spread`), and the launch script runs `torchrun ... train.py --distributed`: in the documented
    run the flag is on, so rank 0 alone saves.
    Without a script that passes it, a torchrun launch leaves the flag off and every rank saves."""
    train = ("import argparse, os, torch, torch.distributed as dist\n"
             "from torch.nn.parallel import DistributedDataParallel as DDP\ntorch.manual_seed(0)\n"
             "p = argparse.ArgumentParser()\np.add_argument('--spread', action='store_true')\n"
             "params = p.parse_args()\nparams.local_rank = int(os.environ.get('LOCAL_RANK', 0))\n"
             "dist.init_process_group('gloo')\nmodel = DDP(torch.nn.Linear(2, 2))\n"
             "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n" + LOOP +
             "    if params.local_rank == 0 or not params.spread:\n"
             "        torch.save(model.module.state_dict(), 'c.pt')\n")
    script = "torchrun --nproc_per_node=2 train.py --spread\n"
    assert not _has(_project(tmp_path / "s", {"train.py": train, "run.sh": script}), "save-on-every-rank")
    assert _has(_project(tmp_path / "n", {"train.py": train}), "save-on-every-rank")
