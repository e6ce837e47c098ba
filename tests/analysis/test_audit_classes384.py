"""Issue 35: classes of round 384-389's first look (docs/measured/cpu2/audit_heldout_round384.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (d15952d)."""

from test_audit import _project
from test_audit_classes189 import _line
from test_audit_classes246 import SEED_ONLY, _rules

SETUP = ("dist.init_process_group('gloo')\nrank = dist.get_rank()\n"
         "model = DDP(torch.nn.Linear(2, 2))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n")
STEP = "    loss = model(torch.ones(2)).sum()\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"


def _places(found, text, part):
    line = _line(text, part)
    return any(ln == line for f in found for _, ln in ((f.path, f.line), *f.related))


def test_a_trainer_built_by_a_factory_saves_on_every_rank(tmp_path):
    """RT-ODLab: `trainer = build_trainer(args, ...)`, whose arms return YoloTrainer(...) or YoloxTrainer(...), then
    `trainer.train(model)`; YoloTrainer.train torch.saves with no rank guard: every rank writes the file
    (save-on-every-rank). The same save under `if rank == 0:` is quiet."""
    engine = ("import torch\nclass YoloTrainer:\n    def __init__(self, args):\n        self.args = args\n"
              "    def train(self, model, rank):\n        for epoch in range(2):\n"
              "GUARD            torch.save({'model': model.module.state_dict()}, 'last.pth')\n"
              "class YoloxTrainer(YoloTrainer):\n    pass\ndef build_trainer(args, kind):\n    if kind == 'yolo':\n"
              "        return YoloTrainer(args)\n    return YoloxTrainer(args)\n")
    train = SEED_ONLY + SETUP + "from engine import build_trainer\ntrainer = build_trainer({}, 'yolo')\n" \
        "trainer.train(model, rank)\n"
    loud = engine.replace("GUARD", "")
    assert _rules(_project(tmp_path / "loud", {"train.py": train, "engine.py": loud}), "save-on-every-rank")
    quiet = engine.replace("GUARD            torch", "            if rank == 0:\n                torch")
    assert not _rules(_project(tmp_path / "quiet", {"train.py": train, "engine.py": quiet}), "save-on-every-rank")


def test_objects_gathered_to_rank_0_and_merged_by_key(tmp_path):
    """scimon's T5 trainer: `dist.gather_object(quesid2ans, output if rank == 0 else None, dst=0)`, then
    `for d in output: merged.update(d)` over a padding DistributedSampler: a padded duplicate overwrites its own
    key, nothing is counted twice (no eval-padding-duplicates). Summing the gathered numbers counts it: found."""
    train = SEED_ONLY + SETUP + (
        "from torch.utils.data import DataLoader, DistributedSampler\nval_data = torch.ones(9, 2)\n"
        "val_loader = DataLoader(val_data, batch_size=2, sampler=DistributedSampler(val_data, shuffle=False))\n"
        "def evaluate(loader):\n    answers = {}\n    for i, x in enumerate(loader):\n"
        "        answers[i] = model(x).sum().item()\n    return answers\n"
        "answers = evaluate(val_loader)\noutput = [None, None]\n"
        "dist.gather_object(answers, output if rank == 0 else None, dst=0)\nif rank == 0:\nMERGE")
    merged = train.replace("MERGE", "    merged = {}\n    for d in output:\n        merged.update(d)\n"
                                    "    print(len(merged))\n")
    assert not _rules(_project(tmp_path / "merged", {"train.py": merged}), "eval-padding-duplicates")
    summed = train.replace("MERGE", "    print(sum(sum(d.values()) for d in output))\n")
    assert _rules(_project(tmp_path / "summed", {"train.py": summed}), "eval-padding-duplicates")


def test_gradient_norms_gathered_for_a_sanity_check(tmp_path):
    """MeanFlow's gradient_sanity_check: `monitor = p.grad.norm()`, `dist.all_gather(monitor_list, monitor)`,
    `torch.stack(monitor_list)`: a parameter's gradient, which no graph records (no gather-without-grad).
    Gathering the features the step's loss is built from is found."""
    train = SEED_ONLY + SETUP + (
        "def check(model, x):\n    monitor = WHAT\n"
        "    monitor_list = [torch.zeros_like(monitor) for _ in range(dist.get_world_size())]\n"
        "    dist.all_gather(monitor_list, monitor)\n    return torch.cat(monitor_list)\n"
        "for step in range(3):\n    x = torch.ones(4, 2)\n    feats = check(model, x)\n"
        "    loss = (feats @ feats.t()).sum()\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n")
    grad = train.replace("WHAT", "next(model.parameters()).grad.norm()")
    assert not _rules(_project(tmp_path / "grad", {"train.py": grad}), "gather-without-grad")
    feats = train.replace("WHAT", "model(x)")
    assert _rules(_project(tmp_path / "feats", {"train.py": feats}), "gather-without-grad")


def test_a_torchmetrics_meter_handed_in_by_a_typed_parameter(tmp_path):
    """MeanFlow: `def train_one_epoch(model, loader, meters: dict[str, MeanMetric])`, `batch_loss =
    meters['batch_loss']`, `batch_loss.update(loss.item())`, then rank 0 logs `batch_loss.compute().detach().cpu()
    .numpy()`: a torchmetrics compute() syncs every rank's state first, so the logged loss is the global one (no
    rank0-local-loss). The same meter as a plain AverageMeter of the project is rank 0's own: found."""
    train = SEED_ONLY + SETUP + (
        "IMPORT\ndef train_one_epoch(model, loader, meters: TYPE):\n    batch_loss = meters['batch_loss']\n"
        "    for x in loader:\n        loss = model(x).sum()\n        opt.zero_grad()\n        loss.backward()\n"
        "        opt.step()\n        batch_loss.update(loss.item())\n"
        "        loss_ave = batch_loss.compute().detach().cpu().numpy()\n        if rank == 0:\n"
        "            print('loss', loss_ave)\n"
        "train_one_epoch(model, [torch.ones(2)] * 3, {'batch_loss': METER})\n")
    metric = (train.replace("IMPORT", "from torchmetrics.aggregation import MeanMetric")
              .replace("TYPE", "dict[str, MeanMetric]").replace("METER", "MeanMetric()"))
    assert not _rules(_project(tmp_path / "metric", {"train.py": metric}), "rank0-local-loss")
    avg = ("class AverageMeter:\n    def __init__(self):\n        self.total, self.n = 0.0, 0\n"
           "    def update(self, v):\n        self.total += v\n        self.n += 1\n"
           "    def compute(self):\n        return torch.tensor(self.total / self.n)\n")
    plain = train.replace("IMPORT", avg).replace("TYPE", "dict").replace("METER", "AverageMeter()")
    assert _rules(_project(tmp_path / "plain", {"train.py": plain}), "rank0-local-loss")


def test_a_master_port_beside_torchrun_standalone(tmp_path):
    """MeanFlow's scripts: `torchrun --standalone --nproc_per_node=8 --master_port=12345 train.py`: --standalone
    rendezvouses on localhost:0, a free port, so the --master_port is never used (no hard-coded-master-port). The
    same line without --standalone fixes the port: found."""
    train = SEED_ONLY + SETUP
    standalone = "torchrun --standalone --nproc_per_node=8 --master_port=12345 train.py\n"
    assert not _rules(_project(tmp_path / "standalone", {"train.py": train, "run.sh": standalone}),
                      "hard-coded-master-port")
    static = "torchrun --nproc_per_node=8 --master_port=12345 train.py\n"
    assert _rules(_project(tmp_path / "static", {"train.py": train, "run.sh": static}), "hard-coded-master-port")


def test_a_sampler_without_set_epoch_names_the_training_loop(tmp_path):
    """mdistiller: make_loader builds `DistributedSampler(dataset, shuffle=shuffle)` and returns the loader through
    a module these files lack (get_dataset); the trainer iterates `enumerate(self.train_loader)` each epoch and
    never calls set_epoch: the finding names that loop, where the labeller puts the fix."""
    common = ("from torch.utils.data import DataLoader, DistributedSampler\n"
              "def make_loader(dataset, batch_size, shuffle):\n"
              "    sampler = DistributedSampler(dataset=dataset, shuffle=shuffle)\n"
              "    return DataLoader(dataset, sampler=sampler, batch_size=batch_size)\n")
    trainer = ("class Trainer:\n    def __init__(self, model, opt, train_loader):\n"
               "        self.model, self.opt, self.train_loader = model, opt, train_loader\n"
               "    def train(self, epochs):\n        for epoch in range(epochs):\n            self.train_epoch()\n"
               "    def train_epoch(self):\n        for idx, data in enumerate(self.train_loader):\n"
               "            loss = self.model(data).sum()\n            self.opt.zero_grad()\n"
               "            loss.backward()\n            self.opt.step()\n")
    train = SEED_ONLY + SETUP + ("from dataset import get_dataset\nfrom trainer import Trainer\n"
                                 "train_loader = get_dataset()\nTrainer(model, opt, train_loader).train(3)\n")
    root = _project(tmp_path / "p", {"train.py": train, "trainer.py": trainer, "common.py": common})
    found = _rules(root, "set-epoch-missing")
    assert found and _places(found, trainer, "for idx, data in enumerate(self.train_loader)")


def test_sync_bn_off_in_a_yaml_config_names_the_config_line(tmp_path):
    """US3L: `if config.TRAIN.SYNC_BN: model = convert_sync_batchnorm(model)`, and the run's YAML config sets
    `SYNC_BN: False`: the finding names that YAML line (where the labeller puts the fix) beside the test."""
    config = "class C:\n    pass\nconfig = C()\nconfig.TRAIN = C()\nconfig.TRAIN.SYNC_BN = False\n"
    train = SEED_ONLY + ("from cfg import config\ndist.init_process_group('gloo')\n"
                         "model = torch.nn.Sequential(torch.nn.Conv2d(3, 3, 1), torch.nn.BatchNorm2d(3))\n"
                         "if config.TRAIN.SYNC_BN:\n    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\n"
                         "model = DDP(model)\n")
    yaml = "TRAIN:\n  EPOCHS: 10\n  SYNC_BN: False\n"
    root = _project(tmp_path / "p", {"train.py": train, "cfg.py": config, "configs/run.yaml": yaml})
    found = _rules(root, "batchnorm-without-sync")
    assert found and any(p.endswith("run.yaml") and ln == 3 for f in found for p, ln in f.related)


def test_a_printer_of_the_file_every_rank_calls_with_its_loss(tmp_path):
    """M3M: `def subprint(rank, content): print(f"Worker {rank}: " + content)`, called by every worker with
    f"... loss = {verbose_loss:.4f}": every rank prints its own loss (every-rank-prints-loss). A printer that
    prints only `if rank == 0:` is rank 0's line instead."""
    train = SEED_ONLY + SETUP + ("def subprint(rank, content):\nBODY"
                                 "for step in range(3):\n" + STEP +
                                 "    verbose_loss = loss.item()\n    subprint(rank, f'loss = {verbose_loss:.4f}')\n")
    every = train.replace("BODY", "    print(f'Worker {rank}: ' + content)\n")
    assert _rules(_project(tmp_path / "every", {"train.py": every}), "every-rank-prints-loss")
    rank0 = train.replace("BODY", "    if rank == 0:\n        print(f'Worker {rank}: ' + content)\n")
    assert not _rules(_project(tmp_path / "rank0", {"train.py": rank0}), "every-rank-prints-loss")
