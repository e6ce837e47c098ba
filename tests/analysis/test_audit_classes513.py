"""Issue 35: classes of round 513-516's first look (docs/measured/cpu2/audit_heldout_round513.txt), fixed after
it, each quiet and loud; each test fails at the first look's code (4853e2a)."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_a_batchnorm_default_the_body_never_reads_builds_no_batchnorm(tmp_path):
    """MUSE: `class DWConv2d_BN(nn.Module): def __init__(self, in_ch, out_ch, norm_layer=nn.BatchNorm2d, ...)`
    whose body builds convolutions and never reads norm_layer: the wrapped model has no BatchNorm (no
    batchnorm-without-sync). When the body builds `self.bn = norm_layer(out_ch)`, it has."""
    model = ("import torch.nn as nn\nclass DWConv2d_BN(nn.Module):\n"
             "    def __init__(self, in_ch, out_ch, norm_layer=nn.BatchNorm2d):\n        super().__init__()\n"
             "        self.conv = nn.Conv2d(in_ch, out_ch, 3)\n        BUILD\n"
             "    def forward(self, x):\n        return self.conv(x)\n")
    train = (DDP + "from model import DWConv2d_BN\ndef main():\n    dist.init_process_group('gloo')\n"
             "    torch.manual_seed(0)\n    model = DDP(DWConv2d_BN(3, 8))\n"
             "    model(torch.ones(1, 3, 8, 8)).sum().backward()\nif __name__ == '__main__':\n    main()\n")
    unused = {"train.py": train, "model.py": model.replace("BUILD", "pass")}
    assert not _rules(_project(tmp_path / "unused", unused), "batchnorm-without-sync")
    built = {"train.py": train, "model.py": model.replace("BUILD", "self.bn = norm_layer(out_ch)")}
    assert _rules(_project(tmp_path / "built", built), "batchnorm-without-sync")
