"""Issue 35: three faults of this stop's own changes, found by the full regression at 6eadfcb3 (over every held-out
project, diffed against 39fa5c6's): each test fails at d501609f, the code before their fix."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_an_arm_choosing_among_engines_that_all_set_up_a_group_is_no_switch(tmp_path):
    """WeNet, CosyVoice: `if args.train_engine in ['torch_ddp', 'torch_fsdp']: dist.init_process_group(...)` (and
    DeepSpeed's own set-up otherwise): every engine sets up a group, so a barrier after it is no
    collective-outside-switch. (d6c9d24's arm rule took any arm that sets up the group for the switch; it now
    needs a count of GPUs in the test, GET's `len(args.gpus) > 1`.)"""
    src = (DDP + "import argparse\nif __name__ == '__main__':\n    p = argparse.ArgumentParser()\n"
           "    p.add_argument('--train_engine', default='torch_ddp')\n    args = p.parse_args()\n"
           "    if args.train_engine in ['torch_ddp', 'torch_fsdp']:\n        dist.init_process_group('nccl')\n"
           "    torch.manual_seed(0)\n    model = DDP(torch.nn.Linear(2, 2))\n"
           "    model(torch.ones(2)).sum().backward()\n    dist.barrier()\n")
    assert not _rules(_project(tmp_path, {"train.py": src}), "collective-outside-switch")


def test_a_flag_named_distribute_is_the_distributed_switch(tmp_path):
    """LibFewShot: `if n_gpu_use > 1: dist.init_process_group(...)`, and the trainer's `elif self.distribute:
    dist.barrier()`: the barrier runs only where the group exists (no collective-outside-switch)."""
    src = (DDP + "class Trainer:\n    def __init__(self, n_gpu_use):\n        self.distribute = n_gpu_use > 1\n"
           "        if n_gpu_use > 1:\n            dist.init_process_group('nccl')\n        torch.manual_seed(0)\n"
           "        self.model = torch.nn.Linear(2, 2)\n        if self.distribute:\n"
           "            self.model = DDP(self.model)\n    def train(self):\n"
           "        self.model(torch.ones(2)).sum().backward()\n"
           "        if self.distribute:\n            dist.barrier()\n"
           "if __name__ == '__main__':\n    Trainer(torch.cuda.device_count()).train()\n")
    assert not _rules(_project(tmp_path, {"train.py": src}), "collective-outside-switch")


def test_a_seed_test_inside_main_is_shown_at_the_test(tmp_path):
    """SlotCon: `def main(args): if args.seed is not None: torch.manual_seed(args.seed)` with --seed defaulting to
    None: no-seed at the test (line 6), not at the script's `main(args)` call (5a918afe moved every such finding
    to the helper's caller; only a seeding helper's, OpenNMT's set_random_seed, moves now)."""
    src = (DDP + "import argparse\ndef main(args):\n    dist.init_process_group('gloo')\n"
           "    if args.seed is not None:\n"
           "        torch.manual_seed(args.seed)\n    model = DDP(torch.nn.Linear(2, 2))\n"
           "    model(torch.ones(2)).sum().backward()\nif __name__ == '__main__':\n"
           "    p = argparse.ArgumentParser()\n    p.add_argument('--seed', type=int, default=None)\n"
           "    main(p.parse_args())\n")
    assert [f.line for f in _rules(_project(tmp_path, {"main_pretrain.py": src}), "no-seed")] == [6]
