"""Issue 35: classes of round 524-529's first look (docs/measured/cpu2/audit_heldout_round524.txt), fixed after
it, each quiet and loud; each test fails at the first look's code (92088dd)."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_no_seed_names_where_an_attribute_model_is_built(tmp_path):
    """MPP: `self.model = build_avit(params)`, then `self.model = DistributedDataParallel(self.model, ...)`, and
    nothing seeds torch: the finding names the build line, where the unseeded init happens. Seeded, nothing."""
    train = (DDP + "def build(params):\n    return torch.nn.Linear(2, 2)\nclass Trainer:\n"
             "    def __init__(self, params):\n        SEED\n        self.model = build(params)\n"
             "        self.model = DDP(self.model)\n    def train(self):\n"
             "        self.model(torch.ones(2)).sum().backward()\nif __name__ == '__main__':\n"
             "    dist.init_process_group('gloo')\n    Trainer({}).train()\n")
    unseeded = train.replace("SEED", "pass")
    build_line = unseeded.splitlines().index("        self.model = build(params)") + 1
    found = _rules(_project(tmp_path / "unseeded", {"train_basic.py": unseeded}), "no-seed")
    assert any(r[1] == build_line for f in found for r in f.related)
    seeded = train.replace("SEED", "torch.manual_seed(0)")
    assert not _rules(_project(tmp_path / "seeded", {"train_basic.py": seeded}), "no-seed")


def test_a_statistic_of_what_the_loss_is_computed_from_is_a_loss(tmp_path):
    """MPP: `raw_loss = ...; loss = raw_loss.mean() / accum; log_nrmse = raw_loss.sqrt().mean()`, and rank 0
    prints log_nrmse: rank 0's own micro-batch statistic (rank0-local-loss). All-reduced first, nothing."""
    train = (DDP + "def main(rank):\n    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
             "    model = DDP(torch.nn.Linear(2, 2))\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
             "    for step in range(10):\n        out = model(torch.ones(4, 2))\n"
             "        raw_loss = (out - 1).pow(2).mean(1)\n        loss = raw_loss.mean() / 2\n"
             "        log_nrmse = raw_loss.sqrt().mean()\n        REDUCE\n        loss.backward()\n"
             "        opt.step()\n        if rank == 0:\n            print(f'Train Loss {log_nrmse.item()}')\n"
             "if __name__ == '__main__':\n    main(0)\n")
    own = train.replace("REDUCE", "pass")
    assert _rules(_project(tmp_path / "own", {"train.py": own}), "rank0-local-loss")
    reduced = train.replace("REDUCE", "dist.all_reduce(log_nrmse)\n        log_nrmse = log_nrmse / 2")
    assert not _rules(_project(tmp_path / "reduced", {"train.py": reduced}), "rank0-local-loss")


def test_a_sampler_built_in_the_keywords_arm_names_the_loop_over_its_loader(tmp_path):
    """PriorGrad: `DataLoader(dataset, sampler=DistributedSampler(dataset) if is_distributed else None, ...)`
    returned by from_path, handed to the learner as self.dataset and iterated in `while True: for features in
    self.dataset:` with no set_epoch: the finding names that loop (where set_epoch goes)."""
    data = ("import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\n"
            "def from_path(data, is_distributed=False):\n    return DataLoader(data, batch_size=4, "
            "shuffle=not is_distributed, sampler=DistributedSampler(data) if is_distributed else None)\n")
    learner = (DDP + "from dataset import from_path\nclass Learner:\n    def __init__(self, model, dataset):\n"
               "        self.model, self.dataset = model, dataset\n"
               "        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    def train(self):\n"
               "        while True:\n            SET\n            for features in self.dataset:\n"
               "                self.opt.zero_grad()\n                self.model(features).sum().backward()\n"
               "                self.opt.step()\ndef train_distributed(rank):\n"
               "    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
               "    dataset = from_path(torch.ones(16, 2), is_distributed=True)\n"
               "    Learner(DDP(torch.nn.Linear(2, 2)), dataset).train()\n"
               "if __name__ == '__main__':\n    train_distributed(0)\n")
    missing = learner.replace("SET", "pass")
    loop_line = missing.splitlines().index("            for features in self.dataset:") + 1
    found = _rules(_project(tmp_path / "missing", {"dataset.py": data, "learner.py": missing}), "set-epoch-missing")
    assert any(r[0].endswith("learner.py") and r[1] == loop_line for f in found for r in f.related)
    set_ = learner.replace("SET", "self.dataset.sampler.set_epoch(0)")
    assert not _rules(_project(tmp_path / "set", {"dataset.py": data, "learner.py": set_}), "set-epoch-missing")


def test_an_imported_modules_own_main_guard_seeds_nothing(tmp_path):
    """face-parsing: loss.py seeds torch in its `if __name__ == '__main__':` self-test; train.py imports
    OhemCELoss from it and seeds nothing: the import does not run the guard (no-seed). A seed at loss.py's top
    level does run on import."""
    loss = ("import torch\nclass OhemCELoss(torch.nn.Module):\n    def forward(self, x, y):\n"
            "        return torch.nn.functional.cross_entropy(x, y)\nWHERE\n")
    train = (DDP + "from loss import OhemCELoss\ndef train():\n    dist.init_process_group('gloo')\n"
             "    net = torch.nn.Linear(2, 2)\n    net = DDP(net)\n    crit = OhemCELoss()\n"
             "    crit(net(torch.ones(4, 2)), torch.zeros(4, dtype=torch.long)).backward()\n"
             "if __name__ == '__main__':\n    train()\n")
    guarded = {"train.py": train, "loss.py": loss.replace("WHERE", "if __name__ == '__main__':\n"
                                                                    "    torch.manual_seed(15)")}
    assert _rules(_project(tmp_path / "guarded", guarded), "no-seed")
    top = {"train.py": train, "loss.py": loss.replace("WHERE", "torch.manual_seed(15)")}
    assert not _rules(_project(tmp_path / "top", top), "no-seed")


def test_a_whole_set_validation_loss_handed_on_through_two_functions(tmp_path):
    """Side-output U2: `v_loss = evaluate_epoch(model, val_loader)` over a loader with no sampler (its
    `**vkwargs` a dict without one), handed to train_epoch(..., v_loss) and from there to write_summary(...,
    v_loss), which logs it on rank 0: every rank's number is the whole set's (no rank0-local-loss). Over a sharded
    loader it is rank 0's shard."""
    train = (DDP + "from torch.utils.data import DataLoader, DistributedSampler\n"
             "def loaders(data):\n    vkwargs = {'batch_size': 4, 'num_workers': 0}\n"
             "    val_loader = DataLoader(data, shuffle=False, VAL**vkwargs)\n"
             "    return DataLoader(data, sampler=DistributedSampler(data)), val_loader\n"
             "def evaluate_epoch(model, val_loader):\n    total = 0.0\n    with torch.no_grad():\n"
             "        for x in val_loader:\n            total += model(x).sum().item()\n    return total\n"
             "def write_summary(rank, t_loss, v_loss):\n    if rank == 0:\n"
             "        print('valLoss %1.3f' % v_loss)\n"
             "def train_epoch(rank, model, opt, loader, v_loss):\n    for x in loader:\n        opt.zero_grad()\n"
             "        loss = model(x).sum()\n        loss.backward()\n        opt.step()\n"
             "        write_summary(rank, 0.0, v_loss)\n"
             "def train(rank, model, opt, train_loader, val_loader):\n    for epoch in range(3):\n"
             "        train_loader.sampler.set_epoch(epoch)\n        v_loss = evaluate_epoch(model, val_loader)\n"
             "        train_epoch(rank, model, opt, train_loader, v_loss)\n"
             "def main(rank):\n    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
             "    model = DDP(torch.nn.Linear(2, 2))\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
             "    train_loader, val_loader = loaders(torch.ones(16, 2))\n"
             "    train(rank, model, opt, train_loader, val_loader)\nif __name__ == '__main__':\n    main(0)\n")
    whole = train.replace("VAL", "")
    assert not _rules(_project(tmp_path / "whole", {"train.py": whole}), "rank0-local-loss")
    shard = train.replace("VAL", "sampler=DistributedSampler(data, shuffle=False), ")
    assert _rules(_project(tmp_path / "shard", {"train.py": shard}), "rank0-local-loss")


def test_guards_from_the_full_regression_at_89570ab(tmp_path):
    """What the full regression at 89570ab (995 + 15 projects) showed this stop's own changes would break: a NaN
    abort's `return -1` under rank 0's print guard (BTS, NeWCRFs, PixelFormer) is no loop exit that decides the
    run's length; SSD's `losses_reduced = sum(loss for loss in loss_dict_reduced.values())` reads the generator's
    own `loss`, not the step's; a scheduler's get_lr returning `lr * multiplier` is no lr helper naming the world
    size (RQ-VAE). The loud twins: a step count's return, an unreduced sum, and `return base_lr * world_size`."""
    nan = (DDP + "import numpy as np\ndef train(rank, steps):\n    dist.init_process_group('gloo')\n"
           "    torch.manual_seed(0)\n    model = DDP(torch.nn.Linear(2, 2))\n"
           "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    step = 0\n    while True:\n"
           "        loss = model(torch.ones(2)).sum()\n        loss.backward()\n        opt.step()\n"
           "        step += 1\n        dist.barrier()\n        if rank == 0:\n            TEST\n"
           "                return -1\nif __name__ == '__main__':\n    train(0, 100)\n")
    abort = nan.replace("TEST", "if np.isnan(loss.cpu().item()):")
    assert not _rules(_project(tmp_path / "nan", {"train.py": abort}), "collective-under-rank0")
    done = nan.replace("TEST", "if step > steps:")
    assert _rules(_project(tmp_path / "done", {"train.py": done}), "collective-under-rank0")
    ssd = (DDP + "import logging\nlogger = logging.getLogger('ssd')\ndef reduce_loss_dict(d):\n"
           "    for v in d.values():\n        dist.all_reduce(v)\n    return d\n"
           "def do_train(model, loader, opt, rank):\n    for images in loader:\n"
           "        loss_dict = model(images)\n        loss = sum(loss for loss in loss_dict.values())\n"
           "        loss_dict_reduced = reduce_loss_dict(loss_dict)\n        LOGGED\n"
           "        opt.zero_grad()\n        loss.backward()\n        opt.step()\n        if rank == 0:\n"
           "            logger.info('loss %f', losses_reduced)\ndef main(rank):\n"
           "    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n    model = DDP(torch.nn.Linear(2, 2))\n"
           "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
           "    do_train(model, [torch.ones(2)] * 4, opt, rank)\nif __name__ == '__main__':\n    main(0)\n")
    reduced = ssd.replace("LOGGED", "losses_reduced = sum(loss for loss in loss_dict_reduced.values())")
    assert not _rules(_project(tmp_path / "ssd", {"trainer.py": reduced}), "rank0-local-loss")
    own = ssd.replace("LOGGED", "losses_reduced = sum(loss for loss in loss_dict.values())")
    assert _rules(_project(tmp_path / "own", {"trainer.py": own}), "rank0-local-loss")
    sched = (DDP + "class Warmup(torch.optim.lr_scheduler._LRScheduler):\n"
             "    def __init__(self, opt, multiplier):\n        self.multiplier = multiplier\n"
             "        super().__init__(opt)\n    def get_lr(self):\n        multiplier = self.multiplier\n"
             "        return [lr * FACTOR for lr in self.base_lrs]\ndef create(opt, world_size, mode='fix'):\n"
             "    multiplier = 1.0\n    if mode == 'linear':\n        multiplier = multiplier * world_size\n"
             "    return Warmup(opt, multiplier)\ndef main():\n    dist.init_process_group('gloo')\n"
             "    torch.manual_seed(0)\n    model = DDP(torch.nn.Linear(2, 2))\n"
             "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    s = create(opt, dist.get_world_size())\n"
             "    model(torch.ones(2)).sum().backward()\n    opt.step()\n    s.step()\n"
             "if __name__ == '__main__':\n    main()\n")
    fixed = sched.replace("FACTOR", "multiplier")
    assert not _rules(_project(tmp_path / "sched", {"main.py": fixed}), "lr-grows-with-world-size")
    grows = sched.replace("FACTOR", "dist.get_world_size()")
    assert _rules(_project(tmp_path / "grows", {"main.py": grows}), "lr-grows-with-world-size")
