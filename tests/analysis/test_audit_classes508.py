"""Issue 35: classes of round 508-512's first look (docs/measured/cpu2/audit_heldout_round508.txt), fixed after
it, each quiet and loud; each test fails at the first look's code (5d74659)."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_an_evaluation_over_a_loader_with_no_sampler_is_every_ranks_whole_set(tmp_path):
    """Densecap: `train_loader, valid_loader, ... = get_dataset(args)`, the valid loader a DataLoader with no
    sampler, then `valid_loss = valid(model, valid_loader)` and every rank prints it: each rank evaluated the whole
    set with the same weights, so each prints the single run's number (no every-rank-prints-loss). Handed a
    DistributedSampler, each rank evaluates its own shard, and the printed val loss is that shard's."""
    train = (DDP + "from torch.utils.data import DataLoader, DistributedSampler\n"
             "def get_dataset(data):\n    train_loader = DataLoader(data, batch_size=4, "
             "sampler=DistributedSampler(data))\n    valid_loader = DataLoader(data, batch_size=4, SAMPLER)\n"
             "    return train_loader, valid_loader\n"
             "def valid(model, loader):\n    total = 0.0\n    for x in loader:\n"
             "        total += model(x).sum().item()\n    return total / len(loader)\n"
             "def main():\n    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
             "    model = DDP(torch.nn.Linear(2, 2))\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
             "    train_loader, valid_loader = get_dataset(torch.ones(16, 2))\n    for epoch in range(3):\n"
             "        train_loader.sampler.set_epoch(epoch)\n        for x in train_loader:\n"
             "            opt.zero_grad()\n            model(x).sum().backward()\n            opt.step()\n"
             "        valid_loss = valid(model, valid_loader)\n        print('val loss', valid_loss)\n"
             "if __name__ == '__main__':\n    main()\n")
    whole = train.replace("SAMPLER", "shuffle=False")
    assert not _rules(_project(tmp_path / "whole", {"train.py": whole}), "every-rank-prints-loss")
    shard = train.replace("SAMPLER", "sampler=DistributedSampler(data, shuffle=False)")
    assert _rules(_project(tmp_path / "shard", {"train.py": shard}), "every-rank-prints-loss")


def test_set_epoch_missing_names_the_epoch_loop_of_a_loader_held_by_a_data_class(tmp_path):
    """Depth-Anything: `class DepthDataLoader: def __init__(self, config, mode): if mode == 'train': self.data =
    DataLoader(..., sampler=DistributedSampler(...))`, then `train_loader = DepthDataLoader(config, 'train').data`
    handed to a trainer whose epoch loop runs `pbar = tqdm(enumerate(self.train_loader)) if rank0 else ...`: the
    finding names that epoch loop, where set_epoch goes (not the prefetch pass over the loader before it, nor the
    'online_eval' loader's validation loop). With set_epoch in the loop, nothing is reported."""
    data = ("import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\nclass DepthDataLoader:\n"
            "    def __init__(self, config, mode):\n        samples = torch.ones(16, 2)\n"
            "        if mode == 'train':\n            self.train_sampler = DistributedSampler(samples)\n"
            "            self.data = DataLoader(samples, batch_size=4, sampler=self.train_sampler)\n"
            "        elif mode == 'online_eval':\n            self.data = DataLoader(samples, 1)\n")
    trainer = ("import torch\nfrom tqdm import tqdm\nclass Trainer:\n"
               "    def __init__(self, model, train_loader, test_loader, rank):\n        self.model = model\n"
               "        self.train_loader, self.test_loader, self.rank = train_loader, test_loader, rank\n"
               "        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    def validate(self):\n"
               "        for x in tqdm(self.test_loader):\n            self.model(x)\n    def train(self):\n"
               "        for x in tqdm(self.train_loader):\n            pass\n"
               "        for epoch in range(10):\n            SET\n"
               "            pbar = tqdm(enumerate(self.train_loader)) if self.rank == 0 else "
               "enumerate(self.train_loader)\n            for i, x in pbar:\n                self.opt.zero_grad()\n"
               "                self.model(x).sum().backward()\n                self.opt.step()\n"
               "                if i % 100 == 0:\n                    self.validate()\n")
    main = ("import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
            "from data_mono import DepthDataLoader\nfrom trainer import Trainer\ndef main(config):\n"
            "    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
            "    model = DDP(torch.nn.Linear(2, 2))\n    train_loader = DepthDataLoader(config, 'train').data\n"
            "    test_loader = DepthDataLoader(config, 'online_eval').data\n"
            "    Trainer(model, train_loader, test_loader, dist.get_rank()).train()\n"
            "if __name__ == '__main__':\n    main({})\n")
    loop_line = trainer.splitlines().index("        for epoch in range(10):") + 1
    missing = {"main.py": main, "data_mono.py": data, "trainer.py": trainer.replace("SET", "pass")}
    found = _rules(_project(tmp_path / "missing", missing), "set-epoch-missing")
    assert any(r[0].endswith("trainer.py") and r[1] == loop_line for f in found for r in f.related)
    set_ = {"main.py": main, "data_mono.py": data,
            "trainer.py": trainer.replace("SET", "self.train_loader.sampler.set_epoch(epoch)")}
    assert not _rules(_project(tmp_path / "set", set_), "set-epoch-missing")


def test_names_bound_from_each_other_end_the_whole_set_search(tmp_path):
    """The full regression at 4853e2a: whole_sets followed a name to its bindings and back (`a = b` ... `b = a`)
    until Python's recursion limit. Such names hold no loader; the audit finishes and reports the print."""
    train = (DDP + "def main(a):\n    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
             "    model = DDP(torch.nn.Linear(2, 2))\n    b = a\n    a = b\n"
             "    for x in a:\n        loss = model(x).sum()\n        loss.backward()\n"
             "        print('loss', loss.item())\nif __name__ == '__main__':\n    main([torch.ones(2)])\n")
    assert _rules(_project(tmp_path / "cycle", {"train.py": train}), "every-rank-prints-loss")


def test_a_seed_a_yaml_config_leaves_null_skips_the_seeding(tmp_path):
    """CNMT (Pythia): `seed = self.config.seed; if seed is None: return` before torch.manual_seed(seed), with
    `seed: null` in the project's base.yml: the default run never seeds (no-seed). With `seed: 1` it does."""
    train = (DDP + "import yaml\nclass Trainer:\n    def __init__(self, config):\n        self.config = config\n"
             "    def config_based_setup(self):\n        seed = self.config.seed\n        if seed is None:\n"
             "            return\n        torch.manual_seed(seed)\n    def train(self):\n"
             "        dist.init_process_group('gloo')\n        self.config_based_setup()\n"
             "        model = DDP(torch.nn.Linear(2, 2))\n        model(torch.ones(2)).sum().backward()\n"
             "if __name__ == '__main__':\n    config = yaml.safe_load(open('configs/base.yml'))\n"
             "    Trainer(config).train()\n")
    null = {"train.py": train, "configs/base.yml": "training:\n    seed: null\n    batch_size: 512\n"}
    assert _rules(_project(tmp_path / "null", null), "no-seed")
    given = {"train.py": train, "configs/base.yml": "training:\n    seed: 1\n    batch_size: 512\n"}
    assert not _rules(_project(tmp_path / "given", given), "no-seed")
