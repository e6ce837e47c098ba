"""Issue 35: classes of round 602-607's first look (docs/measured/cpu2/audit_heldout_round602.txt), fixed after
it, quiet and loud; each test fails at the first look's code (cf387d1). The round's other false alarms and misses
are left, said in docs/results.md."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_a_builders_validation_and_test_samplers_are_one_padding_finding(tmp_path):
    """InternImage: build_loader makes `sampler_val = DistributedSampler(dataset_val, shuffle=False)` and, beside it,
    `sampler_test = DistributedSampler(dataset_test, shuffle=False)`: one eval-padding-duplicates finding, the
    other sampler named as a related place."""
    build = ("import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\n"
             "def build_loader(dataset_val, dataset_test):\n    sampler_val = DistributedSampler(dataset_val, "
             "shuffle=False)\n    sampler_test = DistributedSampler(dataset_test, shuffle=False)\n"
             "    return DataLoader(dataset_val, sampler=sampler_val), DataLoader(dataset_test, sampler=sampler_test)\n"
             "")
    main = (DDP + "from build import build_loader\ndef validate(model, loader):\n    with torch.no_grad():\n"
            "        for x in loader:\n            acc = model(x).sum()\n            dist.all_reduce(acc)\n"
            "if __name__ == '__main__':\n    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
            "    model = DDP(torch.nn.Linear(2, 2))\n    val_loader, test_loader = build_loader([torch.ones(2)] * 5, "
            "[torch.ones(2)] * 5)\n    validate(model, val_loader)\n")
    found = _rules(_project(tmp_path, {"build.py": build, "main.py": main}), "eval-padding-duplicates")
    assert [(f.line, 5 in [r[1] for r in f.related]) for f in found] == [(4, True)]


def test_an_evaluation_over_the_classes_own_unsharded_loader_is_the_whole_sets(tmp_path):
    """AudioClassification-Pytorch: `self.test_loader = DataLoader(dataset=self.test_dataset, shuffle=False,
    **data_loader_args)` (no sampler; `= None` in __init__), and rank 0's `self.eval_loss, self.eval_acc =
    self.evaluate()` over it: the whole set's loss, the single run's (no rank0-local-loss). A test loader with a
    DistributedSampler is a shard."""
    src = (DDP + "from torch.utils.data import DataLoader, DistributedSampler\nclass Trainer:\n"
           "    def __init__(self):\n        self.test_loader = None\n        dist.init_process_group('gloo')\n"
           "        torch.manual_seed(0)\n        self.model = DDP(torch.nn.Linear(2, 2))\n"
           "        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)\n    def setup(self, data):\n"
           "        self.test_loader = DataLoader(dataset=data, shuffle=False, SAMPLER**{})\n"
           "    def evaluate(self):\n        losses = []\n        with torch.no_grad():\n"
           "            for x in self.test_loader:\n                losses.append(self.model(x).sum().item())\n"
           "        return sum(losses) / len(losses), 0.0\n    def train(self):\n        for epoch in range(2):\n"
           "            loss = self.model(torch.ones(2)).sum()\n            self.opt.zero_grad()\n"
           "            loss.backward()\n"
           "            self.opt.step()\n            if dist.get_rank() == 0:\n"
           "                self.eval_loss, self.eval_acc = self.evaluate()\n"
           "                print('Test loss: {:.5f}'.format(self.eval_loss))\nif __name__ == '__main__':\n"
           "    t = Trainer()\n    t.setup([torch.ones(2)] * 4)\n    t.train()\n")
    whole = _project(tmp_path / "whole", {"train.py": src.replace("SAMPLER", "")})
    assert not _rules(whole, "rank0-local-loss")
    shard = _project(tmp_path / "shard", {"train.py": src.replace("SAMPLER", "sampler=DistributedSampler(data), ")})
    assert _rules(shard, "rank0-local-loss")


def test_a_data_modules_augmentation_wrapper_is_no_candidate_model(tmp_path):
    """InternImage: the script wraps `build_model(config)` from a models/build.py these files lack; the one model
    class here builds a BatchNorm (through `build_norm_layer(..., 'BN')`), and dataset/build.py's test-time
    augmentation `class TTA(nn.Module)` has none: the likely model has BatchNorm (batchnorm-without-sync). A model
    class without BatchNorm leaves it quiet."""
    model = ("import torch.nn as nn\ndef build_norm_layer(dim, norm_layer):\n    if norm_layer == 'BN':\n"
             "        return nn.BatchNorm2d(dim)\n    return nn.LayerNorm(dim)\nclass InternImage(nn.Module):\n"
             "    def __init__(self):\n        super().__init__()\n        self.head = build_norm_layer(8, 'NORM')\n"
             "    def forward(self, x):\n        return self.head(x)\n")
    tta = ("import torch.nn as nn\nclass TTA(nn.Module):\n    def __init__(self, size):\n        super().__init__()\n"
           "        self.size = size\n    def forward(self, x):\n        return x\n")
    main = (DDP + "from models.build import build_model\nif __name__ == '__main__':\n"
            "    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
            "    model = build_model({'type': 'intern_image'})\n    model = DDP(model)\n")
    bn = _project(tmp_path / "bn", {"models/intern_image.py": model.replace("NORM", "BN"),
                                     "dataset/build.py": tta, "main.py": main})
    assert _rules(bn, "batchnorm-without-sync")
    plain = model.replace("        return nn.BatchNorm2d(dim)\n", "        return nn.LayerNorm(dim)\n")
    ln = _project(tmp_path / "ln", {"models/intern_image.py": plain.replace("NORM", "BN"),
                                     "dataset/build.py": tta, "main.py": main})
    assert not _rules(ln, "batchnorm-without-sync")
