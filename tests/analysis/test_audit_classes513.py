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


def test_a_model_of_buffer_free_layers_with_pixel_unshuffle_size_and_a_raise(tmp_path):
    """MUSE: rank 0 alone runs the DDP-wrapped generator for validation; the generator's layers are Conv2d,
    nn.PixelUnshuffle (torch spells it with a small s), a `torch.Size(shape)` and a `raise ValueError(...)` in its
    builders: no buffer to broadcast, so no hang (no ddp-forward-under-rank0). With a BatchNorm2d it has buffers."""
    model = ("import torch, torch.nn as nn\nclass Gen(nn.Module):\n    def __init__(self, c, shape=(8,)):\n"
             "        super().__init__()\n        if c < 1:\n            raise ValueError('c')\n"
             "        self.shape = torch.Size(shape)\n        self.down = nn.Sequential(nn.Conv2d(c, c, 3), "
             "nn.PixelUnshuffle(2))\n        LAYER\n    def forward(self, x):\n        return self.down(x)\n")
    train = (DDP + "from model import Gen\ndef train(rank):\n    dist.init_process_group('gloo')\n"
             "    torch.manual_seed(0)\n    generator = Gen(3)\n    generator = DDP(generator)\n"
             "    opt = torch.optim.SGD(generator.parameters(), lr=0.1)\n    for step in range(10):\n"
             "        opt.zero_grad()\n        generator(torch.ones(1, 3, 8, 8)).sum().backward()\n"
             "        opt.step()\n        if rank == 0:\n            with torch.no_grad():\n"
             "                generator(torch.ones(1, 3, 8, 8))\nif __name__ == '__main__':\n    train(0)\n")
    free = {"train.py": train, "model.py": model.replace("LAYER", "self.act = nn.Identity()")}
    assert not _rules(_project(tmp_path / "free", free), "ddp-forward-under-rank0")
    held = {"train.py": train, "model.py": model.replace("LAYER", "self.bn = nn.BatchNorm2d(c)")}
    assert _rules(_project(tmp_path / "held", held), "ddp-forward-under-rank0")
