"""Issue 35: classes of round 644-649's first look (docs/measured/cpu2/audit_heldout_round644.txt), fixed after
it, quiet and loud; each test fails at the first look's code (6eadfcb3). The round's other false alarms and misses
are left, said in docs/results.md."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_a_batchnorm_built_only_under_an_attribute_off_by_default(tmp_path):
    """DiG: RecModel's `self.use_feat_distill = getattr(args, 'use_feat_distill', False)`, then `if
    self.use_feat_distill: self.feat_proj = self._build_mlp(...)`, whose MLP holds BatchNorm1d; the rest of the
    model has none: the default run builds no BatchNorm (no batchnorm-without-sync). On by default, it does."""
    model = ("import torch.nn as nn\nclass RecModel(nn.Module):\n    def __init__(self, args):\n"
             "        super().__init__()\n        self.encoder = nn.Linear(4, 4)\n"
             "        self.use_feat_distill = getattr(args, 'use_feat_distill', DEFAULT)\n"
             "        if self.use_feat_distill:\n            self.feat_proj = self._build_mlp(4)\n"
             "    def _build_mlp(self, dim):\n        return nn.Sequential(nn.Linear(dim, dim), nn.BatchNorm1d(dim))\n"
             "    def forward(self, x):\n        return self.encoder(x)\n")
    main = (DDP + "import argparse\nfrom models import RecModel\nif __name__ == '__main__':\n"
            "    args = argparse.ArgumentParser().parse_args()\n    dist.init_process_group('gloo')\n"
            "    torch.manual_seed(0)\n    model = RecModel(args)\n    model = DDP(model)\n"
            "    model(torch.ones(2, 4)).sum().backward()\n")
    off = _project(tmp_path / "off", {"models.py": model.replace("DEFAULT", "False"), "main.py": main})
    assert not _rules(off, "batchnorm-without-sync")
    on = _project(tmp_path / "on", {"models.py": model.replace("DEFAULT", "True"), "main.py": main})
    assert _rules(on, "batchnorm-without-sync")


def test_a_seed_under_a_config_key_whose_yaml_default_fails(tmp_path):
    """VIRT: `if cfg['SEED'] >= 0: set_seed(cfg['SEED'])` with `SEED: -1` in configs/Base.yaml: the default run
    never seeds (no-seed, at the test). `SEED: 0` seeds."""
    src = (DDP + "import yaml, random\ndef set_seed(seed):\n    random.seed(seed)\n    torch.manual_seed(seed)\n"
           "if __name__ == '__main__':\n    cfg = yaml.safe_load(open('configs/Base.yaml'))\n"
           "    dist.init_process_group('gloo')\n    if cfg['SEED'] >= 0:\n        set_seed(cfg['SEED'])\n"
           "    model = DDP(torch.nn.Linear(2, 2))\n    model(torch.ones(2)).sum().backward()\n")
    unset = _project(tmp_path / "unset", {"main.py": src, "configs/Base.yaml": "SEED: -1\n"})
    assert [f.line for f in _rules(unset, "no-seed")] == [10]
    seeded = _project(tmp_path / "seeded", {"main.py": src, "configs/Base.yaml": "SEED: 0\n"})
    assert not _rules(seeded, "no-seed")
