"""Issue 35: classes of round 632-637's first look (docs/measured/cpu2/audit_heldout_round632.txt), fixed after
it, quiet and loud; each test fails at the first look's code (3813b7c). The round's other false alarms and misses
are left, said in docs/results.md."""

from test_audit import _project
from test_audit_classes246 import _rules

from lab_utils.analysis.audit import _expand
from lab_utils.analysis.audit.hierarchy import replaced_where_built
from lab_utils.analysis.audit.project import Project

SEEDED = ("import argparse, random\nimport torch, torch.distributed as dist\n"
          "from torch.nn.parallel import DistributedDataParallel as DDP\n"
          "def set_seed(seed):\n    random.seed(seed)\n    torch.manual_seed(seed)\n"
          "if __name__ == '__main__':\n    p = argparse.ArgumentParser()\n"
          "    p.add_argument('--use_seed', default=True, action=argparse.BooleanOptionalAction)\n"
          "    args = p.parse_args()\n    dist.init_process_group('gloo')\n    if args.use_seed:\n"
          "        set_seed(0)\n    model = DDP(torch.nn.Linear(2, 2))\n    model(torch.ones(2)).sum().backward()\n")


def test_a_boolean_optional_seed_flag_its_launch_script_turns_off(tmp_path):
    """DFormer: `--use_seed default=True, action=argparse.BooleanOptionalAction`, `if args.use_seed:
    set_seed(config.seed)`, and train.sh passes `--no-use_seed`: the run the script makes never seeds (no-seed,
    shown at the `if` the default run skips). A script that leaves the flag alone seeds."""
    off = _project(tmp_path / "off", {"utils/train.py": SEEDED,
                                      "train.sh": "torchrun --nproc_per_node=2 utils/train.py --no-use_seed\n"})
    found = _rules(off, "no-seed")
    assert [f.line for f in found] == [12] and "--no-use_seed" in found[0].message
    on = _project(tmp_path / "on", {"utils/train.py": SEEDED,
                                    "train.sh": "torchrun --nproc_per_node=2 utils/train.py\n"})
    assert not _rules(on, "no-seed")


TRAINERS = ("import torch, torch.distributed as dist\nclass Trainer:\n    def __init__(self, config):\n"
            "        self.config = config\n    def _run_epoch(self, epoch):\n        loss = torch.ones(1)\n"
            "        with open('loss.log', 'a') as f:\n            f.write(f'{epoch},{loss.item()}\\n')\n"
            "class DDPTrainer(Trainer):\n    def __init__(self, config, rank):\n        super().__init__(config)\n"
            "        self.rank = rank\n    def _run_epoch(self, epoch):\n        loss = torch.ones(1)\n"
            "        dist.all_reduce(loss)\n        if self.rank == 0:\n            print(epoch, loss.item())\n")
CLI = ("import torch.multiprocessing as mp\nfrom trainer import Trainer, DDPTrainer\nclass CLITrainer:\n"
       "    def __init__(self, config):\n        self.config = config\n    def train(self):\n"
       "        if self.config.use_ddp:\n            self._execute_ddp_training()\n        else:\n"
       "            self._execute_training()\n    def _execute_ddp_training(self):\n"
       "        mp.spawn(self._ddp_fn, nprocs=2)\n    def _ddp_fn(self, rank):\n"
       "        DDPTrainer(self.config, rank)._run_epoch(0)\n    def _execute_training(self):\n"
       "        BUILD\n")


def _base_replaced(root, build: str) -> bool:
    root = _project(root, {"trainer.py": TRAINERS, "cli.py": CLI.replace("BUILD", build)})
    p = Project(*_expand([root]))
    m = next(mm for mm in p.modules.values() if mm.rel == "trainer.py")
    return replaced_where_built(p, m, m.functions["Trainer._run_epoch"])


def test_a_base_class_built_only_for_the_one_process_run_is_off_the_distributed_run(tmp_path):
    """AdvSecureNet: `Trainer(train_config)` only in `_execute_training`, the else of `if
    self.config.device.use_ddp:`; the DDP run builds DDPTrainer, whose _run_epoch replaces the base's (every rank's
    loss.log write is the one-process run's alone). A Trainer the DDP arm builds too runs there."""
    assert _base_replaced(tmp_path / "one", "Trainer(self.config)._run_epoch(0)")
    assert not _base_replaced(tmp_path / "both", "pass\n    def _also(self):\n        Trainer(self.config)")
