"""Issue 35: classes of round 554-559's first look (docs/measured/cpu2/audit_heldout_round554.txt), fixed after
it, quiet and loud; each test fails at the first look's code (b6a6093). The round's other false alarms and misses
are left, said in docs/results.md."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_a_meter_handed_to_the_subclass_step_names_where_the_loss_goes_in(tmp_path):
    """OBoW: the base solver's epoch loop hands its local `metric_logger` to `self.train_step(batch, metric_logger)`,
    which the run's subclass overrides with `metric_logger["loss"].update(loss.item())`; rank 0 prints the meter
    (rank0-local-loss). The finding names the subclass's update line as a related place, where the labeller and
    the reader look; a step that feeds the meter no loss is not named."""
    solver = ("import torch\nclass Meter(dict):\n    def __missing__(self, k):\n        self[k] = Avg()\n"
              "        return self[k]\n    def log_every(self, it, rank):\n        for x in it:\n"
              "            if rank == 0:\n                print(self)\n            yield x\n"
              "class Avg:\n    def update(self, v):\n        self.v = v\n"
              "class Solver:\n    def run_epoch(self, loader, rank):\n        metric_logger = Meter()\n"
              "        for batch in metric_logger.log_every(loader, rank):\n"
              "            self.train_step(batch, metric_logger)\n"
              "    def train_step(self, batch, metric_logger):\n        raise NotImplementedError\n")
    builder = ("import torch\nfrom solver import Solver\nclass MySolver(Solver):\n"
               "    def __init__(self, model, opt):\n        self.model, self.opt = model, opt\n"
               "    def train_step(self, batch, metric_logger):\n        loss = self.model(batch).sum()\n"
               "        self.opt.zero_grad()\n        loss.backward()\n        self.opt.step()\n"
               "        metric_logger[KEY].update(VALUE)\n")
    main = (DDP + "from builder import MySolver\nif __name__ == '__main__':\n    dist.init_process_group('gloo')\n"
            "    torch.manual_seed(0)\n    model = DDP(torch.nn.Linear(2, 2))\n"
            "    s = MySolver(model, torch.optim.SGD(model.parameters(), lr=0.1))\n"
            "    s.run_epoch([torch.ones(2)] * 4, dist.get_rank())\n")

    def related(case, key, value):
        root = _project(tmp_path / case, {"solver.py": solver, "main.py": main,
                                          "builder.py": builder.replace("KEY", key).replace("VALUE", value)})
        return [(r[0].rsplit("/", 1)[-1], r[1]) for f in _rules(root, "rank0-local-loss") for r in f.related]

    assert ("builder.py", 11) in related("loss", "'loss'", "loss.item()")
    assert ("builder.py", 11) not in related("rate", "'iter_per_s'", "1.0")


def test_a_validation_loader_sharded_in_the_distributed_arm_is_no_whole_set(tmp_path):
    """OpenCOOD: `if opt.distributed: val_loader = DataLoader(val_set, sampler=DistributedSampler(val_set))`,
    `else: val_loader = DataLoader(val_set, shuffle=False)`; rank 0 prints the mean validation loss: in the DDP
    run a shard's (rank0-local-loss). Built without a sampler in both arms, every rank goes over the whole set."""
    train = (DDP + "import statistics, sys\nfrom torch.utils.data import DataLoader, DistributedSampler\n"
             "def main():\n    distributed = len(sys.argv) > 1\n    if distributed:\n"
             "        dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
             "    data = [torch.ones(2)] * 8\n    model = torch.nn.Linear(2, 2)\n    if distributed:\n"
             "        model = DDP(model)\n        val_loader = DataLoader(data, SHARDED)\n    else:\n"
             "        val_loader = DataLoader(data, shuffle=False)\n"
             "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    for epoch in range(2):\n"
             "        for x in data:\n            loss = model(x).sum()\n            opt.zero_grad()\n"
             "            loss.backward()\n            opt.step()\n        valid_ave_loss = []\n"
             "        with torch.no_grad():\n            for x in val_loader:\n"
             "                final_loss = model(x).sum()\n                valid_ave_loss.append(final_loss.item())\n"
             "        valid_ave_loss = statistics.mean(valid_ave_loss)\n"
             "        if not distributed or dist.get_rank() == 0:\n"
             "            print('validation loss %f' % valid_ave_loss)\n"
             "if __name__ == '__main__':\n    main()\n")
    sharded = train.replace("SHARDED", "sampler=DistributedSampler(data, shuffle=False)")
    assert [f.line for f in _rules(_project(tmp_path / "sharded", {"train.py": sharded}), "rank0-local-loss")] == [31]
    whole = train.replace("SHARDED", "shuffle=False")
    assert not _rules(_project(tmp_path / "whole", {"train.py": whole}), "rank0-local-loss")


def test_a_module_flag_the_model_turns_on_builds_sync_batchnorm(tmp_path):
    """RepLKNet: `use_sync_bn = False`, `def enable_sync_bn(): global use_sync_bn; use_sync_bn = True`, `def
    get_bn(c): if use_sync_bn: return nn.SyncBatchNorm(c) else: return nn.BatchNorm2d(c)`, and the model's
    __init__ calls enable_sync_bn() under its `use_sync_bn=True` parameter: the layers are SyncBatchNorm (no
    batchnorm-without-sync). With the parameter's default False the BatchNorm arm is built."""
    model = ("import torch.nn as nn\nuse_sync_bn = False\ndef enable_sync_bn():\n    global use_sync_bn\n"
             "    use_sync_bn = True\ndef get_bn(c):\n    if use_sync_bn:\n        return nn.SyncBatchNorm(c)\n"
             "    else:\n        return nn.BatchNorm2d(c)\nclass Net(nn.Module):\n"
             "    def __init__(self, use_sync_bn=DEFAULT):\n        super().__init__()\n        if use_sync_bn:\n"
             "            enable_sync_bn()\n        self.conv = nn.Conv2d(3, 8, 3)\n        self.bn = get_bn(8)\n"
             "    def forward(self, x):\n        return self.bn(self.conv(x))\n")
    main = (DDP + "from model import Net\nif __name__ == '__main__':\n    dist.init_process_group('gloo')\n"
            "    torch.manual_seed(0)\n    model = DDP(Net())\n")
    on = _project(tmp_path / "on", {"model.py": model.replace("DEFAULT", "True"), "main.py": main})
    assert not _rules(on, "batchnorm-without-sync")
    off = _project(tmp_path / "off", {"model.py": model.replace("DEFAULT", "False"), "main.py": main})
    assert _rules(off, "batchnorm-without-sync")


def test_a_log_helper_whose_body_is_rank_0s_prints_on_rank_0_only(tmp_path):
    """SurroundDepth: `self.log_time(batch_idx, duration, loss)` on every rank, whose body is all under `if
    self.local_rank == 0:` and prints through `self.log_print(...)`, a helper other unguarded code calls too:
    rank 0 alone prints its own loss (rank0-local-loss, not every-rank-prints-loss). Without the guard every
    rank prints."""
    train = (DDP + "import os\nclass Trainer:\n    def __init__(self):\n"
             "        self.local_rank = int(os.environ['LOCAL_RANK'])\n        dist.init_process_group('gloo')\n"
             "        torch.manual_seed(0)\n        self.model = DDP(torch.nn.Linear(2, 2))\n"
             "        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)\n"
             "    def train(self):\n        self.log_print('start')\n        for i in range(10):\n"
             "            loss = self.model(torch.ones(2)).sum()\n            self.opt.zero_grad()\n"
             "            loss.backward()\n            self.opt.step()\n            self.log_time(i, loss.item())\n"
             "    def log_time(self, i, loss):\n        GUARD\n            s = 'batch {} | loss: {:.5f}'\n"
             "            self.log_print(s.format(i, loss))\n    def log_print(self, text):\n        print(text)\n"
             "if __name__ == '__main__':\n    Trainer().train()\n")
    guarded = _project(tmp_path / "guarded", {"train.py": train.replace("GUARD", "if self.local_rank == 0:")})
    assert _rules(guarded, "rank0-local-loss") and not _rules(guarded, "every-rank-prints-loss")
    every = _project(tmp_path / "every", {"train.py": train.replace("GUARD", "if True:")})
    assert _rules(every, "every-rank-prints-loss")
