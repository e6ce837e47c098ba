"""Issue 35: classes of round 620-625's first look (docs/measured/cpu2/audit_heldout_round620.txt), fixed after
it, quiet and loud; each test fails at the first look's code (39fa5c6). The round's other false alarms and misses
are left, said in docs/results.md."""

from test_audit import _project
from test_audit_classes246 import _rules

from lab_utils.analysis.audit import _expand
from lab_utils.analysis.audit.hierarchy import replaced_where_built
from lab_utils.analysis.audit.project import Project

TRAINERS = ("import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
            "class BASE:\n    def __init__(self):\n        dist.init_process_group('gloo')\n"
            "        torch.manual_seed(0)\n        self.rank = dist.get_rank()\n"
            "        self.model = DDP(torch.nn.Linear(2, 2))\n"
            "        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)\n"
            "    def log_step(self, loss):\n        if self.rank == 0:\n            print('loss', loss.item())\n"
            "    def train(self):\n        for step in range(3):\n            loss = self.model(torch.ones(2)).sum()\n"
            "            self.opt.zero_grad()\n            loss.backward()\n            self.opt.step()\n"
            "            self.log_step(loss.detach())\nclass TrainerMid(BASE):\n    pass\n"
            "class TrainerDistill(TrainerMid):\n    OVERRIDE\n")
REDUCED = ("def log_step(self, loss):\n        dist.all_reduce(loss)\n        loss = loss / dist.get_world_size()\n"
           "        if self.rank == 0:\n            print('loss', loss.item())")


def _replaced(root, main_src: str, base: str, override: str) -> bool:
    """hierarchy.replaced_where_built for the base class's log_step, the project written under `root`."""
    root = _project(root, {"trainer.py": TRAINERS.replace("BASE", base).replace("OVERRIDE", override),
                           "main.py": main_src})
    p = Project(*_expand([root]))
    m = next(mm for mm in p.modules.values() if mm.rel == "trainer.py")
    return replaced_where_built(p, m, m.functions[f"{base}.log_step"])


def test_a_base_method_every_built_grandchild_replaces_is_off_the_run(tmp_path):
    """SinSR: `from trainer import TrainerDistillDifIR as TrainerDistill` builds the grandchild of TrainerBase, whose
    log_step_train it replaces: the base's method (a rank-0 log of a local loss) never runs. A grandchild that keeps
    the base's method runs it."""
    main = "from trainer import TrainerDistill as Distill\nif __name__ == '__main__':\n    Distill().train()\n"
    assert _replaced(tmp_path / "replaced", main, "TrainerBase", REDUCED)
    assert not _replaced(tmp_path / "kept", main, "TrainerBase", "pass")


def test_a_class_bound_to_the_base_classes_name_builds_the_subclass(tmp_path):
    """GET: `Trainer = trainers.AffinityTrainer` ... `Trainer(model, ...)`: the name called is the base class's
    (abs_trainer's `class Trainer`), but what it builds is the subclass, whose method replaces the base's."""
    main = ("import trainer as trainers\nif __name__ == '__main__':\n    Trainer = trainers.TrainerDistill\n"
            "    Trainer().train()\n")
    assert _replaced(tmp_path / "replaced", main, "Trainer", REDUCED)
    assert not _replaced(tmp_path / "kept", main, "Trainer", "pass")


SETUP = ("import os, argparse\nimport torch, torch.distributed as dist\n"
         "from torch.utils.data import DataLoader, DistributedSampler\n"
         "from torch.nn.parallel import DistributedDataParallel as DDP\n"
         "if __name__ == '__main__':\n    p = argparse.ArgumentParser()\n"
         "    p.add_argument('--gpus', type=int, nargs='+', default=[0])\n    args = p.parse_args()\n"
         "    data = [torch.ones(2)] * 8\n    torch.manual_seed(0)\n    TOP_INIT\n    if len(args.gpus) > 1:\n"
         "        local_rank = int(os.environ['LOCAL_RANK'])\n        ARM_INIT\n"
         "        INSIDE\n    else:\n        local_rank = -1\n        OUTSIDE\n    AFTER\n"
         "    model = torch.nn.Linear(2, 2)\n    if local_rank != -1:\n        model = DDP(model)\n"
         "    loader = DataLoader(data, sampler=sampler)\n    for epoch in range(2):\n"
         "        if sampler is not None and local_rank != -1:\n            sampler.set_epoch(epoch)\n"
         "        for x in loader:\n            model(x).sum().backward()\n")


def test_an_arm_that_sets_up_the_group_is_the_distributed_switch(tmp_path):
    """GET: `if len(args.gpus) > 1: ... init_process_group(...); sampler = DistributedSampler(...)`, else
    `local_rank = -1; sampler = None`, and `if sampler is not None and local_rank != -1: sampler.set_epoch(epoch)`:
    the sampler exists only where set_epoch runs (no set-epoch-missing). Built outside that arm, in every run,
    it is."""
    src = SETUP.replace("ARM_INIT", "dist.init_process_group('gloo')").replace("TOP_INIT", "pass")
    one = _project(tmp_path / "one", {"train.py": src.replace("INSIDE", "sampler = DistributedSampler(data)").replace(
        "OUTSIDE", "sampler = None").replace("AFTER", "pass")})
    assert not _rules(one, "set-epoch-missing")
    # (built outside the arm that sets up the group, in every run: CrossViT's, as the loud side)
    both = _project(tmp_path / "both", {"main.py": (
        "import argparse\nimport torch, torch.distributed as dist\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "from torch.utils.data import DataLoader, DistributedSampler\np = argparse.ArgumentParser()\n"
        "p.add_argument('--gpus', type=int, nargs='+', default=[0])\nargs = p.parse_args()\n"
        "if len(args.gpus) > 1:\n    dist.init_process_group('gloo')\ntorch.manual_seed(0)\n"
        "data = [torch.ones(2)] * 8\nsampler = DistributedSampler(data, num_replicas=1, rank=0)\n"
        "loader = DataLoader(data, sampler=sampler)\nmodel = torch.nn.Linear(2, 2)\nif dist.is_initialized():\n"
        "    model = DDP(model)\nfor epoch in range(3):\n    if dist.is_initialized():\n"
        "        sampler.set_epoch(epoch)\n    for x in loader:\n        model(x).sum().backward()\n")})
    assert _rules(both, "set-epoch-missing")


SAMPLER = ("import math\nimport torch\nclass ARBatchSampler(torch.utils.data.Sampler):\n"
           "    def __init__(self, data, batch_size):\n        self.data, self.batch_size = data, batch_size\n"
           "class DistributedARBatchSampler(ARBatchSampler):\n"
           "    def __init__(self, data, batch_size, num_replicas, rank):\n"
           "        super().__init__(data, batch_size)\n        self.num_replicas, self.rank = num_replicas, rank\n"
           "        self.num_batches = math.ceil(len(data) / batch_size / num_replicas)\n"
           "    def __len__(self):\n        return self.num_batches\n    def __iter__(self):\n"
           "        g = torch.Generator()\n        g.manual_seed(0)\n"
           "        indices = list(torch.randperm(len(self.data) // self.batch_size, generator=g))\n"
           "        PAD\n        offset = self.num_batches * self.rank\n"
           "        for i in indices[offset:offset + self.num_batches]:\n"
           "            yield list(range(i * self.batch_size, (i + 1) * self.batch_size))\n")
SCRIPT = ("import torch, torch.distributed as dist\nfrom torch.utils.data import DataLoader\n"
          "from torch.nn.parallel import DistributedDataParallel as DDP\n"
          "from sampler import DistributedARBatchSampler\n"
          "def validate(model, loader):\n    total = torch.zeros(1)\n    with torch.no_grad():\n"
          "        for x in loader:\n            total += model(x).sum()\n"
          "    dist.all_reduce(total)\n    return total\n"
          "if __name__ == '__main__':\n    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
          "    model = DDP(torch.nn.Linear(2, 2))\n    val_db = [torch.ones(2)] * 9\n"
          "    val_sampler = DistributedARBatchSampler(val_db, 2, dist.get_world_size(), dist.get_rank())\n"
          "    val_dl = DataLoader(val_db, batch_sampler=val_sampler)\n    validate(model, val_dl)\n")


def test_a_project_batch_sampler_named_distributed_that_pads_in_evaluation(tmp_path):
    """seamseg: `DistributedARBatchSampler` (on its own ARBatchSampler, no torch DistributedSampler base) pads the
    batch list with `indices += indices[:...]`, and validation sums its metrics over ranks: eval-padding-duplicates.
    Without the padding line it is quiet."""
    pad = "indices += indices[:(self.num_batches * self.num_replicas - len(indices))]"
    padded = _project(tmp_path / "pad", {"sampler.py": SAMPLER.replace("PAD", pad), "train.py": SCRIPT})
    assert [f.line for f in _rules(padded, "eval-padding-duplicates")] == [17]
    plain = _project(tmp_path / "plain", {"sampler.py": SAMPLER.replace("PAD", "pass"), "train.py": SCRIPT})
    assert not _rules(plain, "eval-padding-duplicates")
