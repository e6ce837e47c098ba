"""Issue 35: classes of round 536-541's first look (docs/measured/cpu2/audit_heldout_round536.txt), fixed after
it, each quiet and loud; each test fails at the first look's code (7942918)."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
TRAIN = (DDP + "import argparse\nparser = argparse.ArgumentParser()\nOPTION"
         "args = parser.parse_args()\ndist.init_process_group('gloo')\ntorch.manual_seed(0)\n"
         "model = DDP(torch.nn.Linear(2, 2))\nmodel(torch.ones(2)).sum().backward()\n")


def test_a_master_port_after_the_script_is_the_scripts_option(tmp_path):
    """Segmentation Benchmark: `torchrun --nproc_per_node=1 \\ train.py \\ ... --master_port 47720`: the option
    comes after train.py, so torchrun never sees it, and train.py declares none (no rendezvous port). When the
    script reads a --master_port of its own (Guyu's), the number is its port."""
    sh = "torchrun --nproc_per_node=1 \\\n         train.py \\\n         --lr 0.02 \\\n         --master_port 47720\n"
    none = {"train.py": TRAIN.replace("OPTION", ""), "scripts/train.sh": sh}
    assert not _rules(_project(tmp_path / "none", none), "hard-coded-master-port")
    read = {"train.py": TRAIN.replace("OPTION", "parser.add_argument('--master_port', default='29500')\n"),
            "scripts/train.sh": sh}
    assert _rules(_project(tmp_path / "read", read), "hard-coded-master-port")


def test_a_port_parameter_filled_from_the_options_dict(tmp_path):
    """Hyperion: `ddp_init(gpu_id, **ddp_args)` with ddp_args taken from the parsed options, and `def ddp_init(...,
    master_port=None): os.environ['MASTER_PORT'] = master_port`, the option --master-port defaulting to '1234'
    (hard-coded-master-port). With no default, the user names the port."""
    ddp = ("import os, torch.distributed as dist\ndef ddp_init(gpu_id, num_gpus, master_port=None):\n"
           "    os.environ['MASTER_ADDR'] = 'localhost'\n    os.environ['MASTER_PORT'] = master_port\n"
           "    dist.init_process_group('nccl', rank=gpu_id, world_size=num_gpus)\n")
    train = (DDP + "import argparse\nimport ddp\nparser = argparse.ArgumentParser()\n"
             "parser.add_argument('--num-gpus', type=int, default=2)\nPORT\n"
             "args = parser.parse_args()\nkwargs = vars(args)\nddp_args = {k: kwargs[k] for k in ('num_gpus', "
             "'master_port')}\nddp.ddp_init(0, **ddp_args)\ntorch.manual_seed(0)\n"
             "model = DDP(torch.nn.Linear(2, 2))\nmodel(torch.ones(2)).sum().backward()\n")
    fixed = {"ddp.py": ddp, "train.py": train.replace("PORT", "parser.add_argument('--master-port', default='1234')")}
    assert _rules(_project(tmp_path / "fixed", fixed), "hard-coded-master-port")
    open_ = {"ddp.py": ddp, "train.py": train.replace("PORT", "parser.add_argument('--master-port')")}
    assert not _rules(_project(tmp_path / "open", open_), "hard-coded-master-port")


def test_a_projects_own_subclass_of_ddp_wraps_like_ddp(tmp_path):
    """Hyperion: `class TorchDDP(nn.parallel.DistributedDataParallel)` (forwarding unknown attributes to
    .module), `self.model = TorchDDP(self.model, ...)`, then `torch.save({'model_state_dict':
    self.model.state_dict()}, ...)`: the keys carry `module.` (save-without-module). A plain class is no wrap."""
    utils = ("import torch.nn as nn\nclass TorchDDP(BASE):\n    def __getattr__(self, name):\n"
             "        try:\n            return super().__getattr__(name)\n        except AttributeError:\n"
             "            return getattr(self.module, name)\n")
    trainer = ("import torch, torch.distributed as dist\nfrom utils import TorchDDP\nclass Trainer:\n"
               "    def __init__(self, model):\n        self.model = TorchDDP(model)\n"
               "    def checkpoint(self, rank):\n        if rank == 0:\n"
               "            torch.save({'model_state_dict': self.model.state_dict()}, 'model.pth')\n"
               "if __name__ == '__main__':\n    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
               "    t = Trainer(torch.nn.Linear(2, 2))\n    t.model(torch.ones(2)).sum().backward()\n"
               "    t.checkpoint(dist.get_rank())\n")
    wrap = {"utils.py": utils.replace("BASE", "nn.parallel.DistributedDataParallel"), "trainer.py": trainer}
    assert _rules(_project(tmp_path / "wrap", wrap), "save-without-module")
    plain = {"utils.py": utils.replace("BASE", "nn.Module"), "trainer.py": trainer}
    assert not _rules(_project(tmp_path / "plain", plain), "save-without-module")


def test_a_commented_command_above_does_not_own_the_next_commands_port(tmp_path):
    """The full regression at 13111ed: RoboFlamingo's script has `#python3 -m torch.distributed.launch ...
    train_calvin.py \\` commented out, then `torchrun ... --master_port=6042 train_calvin.py \\`: the port belongs
    to torchrun (hard-coded-master-port), not to the script the comment names. Without the torchrun line, no port."""
    sh = ("#python3 -m torch.distributed.launch --nproc_per_node=2 --master_port=6042 train.py \\\n"
          "torchrun --nnodes=1 --nproc_per_node=8 --master_port=6042 train.py \\\n    --lr 0.1\n")
    fixed = {"train.py": TRAIN.replace("OPTION", ""), "run.bash": sh}
    assert _rules(_project(tmp_path / "fixed", fixed), "hard-coded-master-port")
    commented = {"train.py": TRAIN.replace("OPTION", ""), "run.bash": sh.splitlines()[0] + "\n"}
    assert not _rules(_project(tmp_path / "commented", commented), "hard-coded-master-port")
