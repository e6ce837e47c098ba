"""Issue 35: classes of mistakes fixed at the stop that labelled held-out batches 147-152: misses of earlier batches
fixed before that round's first look, then the classes the first look showed, each quiet and loud."""

from pathlib import Path

from test_audit import DDP_HEAD, _project

from lab_utils.analysis import audit

SEEDED = DDP_HEAD + "torch.manual_seed(0)\n"


def _places(finding) -> set[tuple[str, int]]:
    return {(Path(p).name, line) for p, line in ((finding.path, finding.line), *finding.related)}


TRAINER = ("import torch\n"
           "class Trainer:\n    def __init__(self, args):\n        self.args = args\n"
           "    def fit(self, model, loader):\n        for epoch in range(3):\n"
           "            self.train_epoch(model, loader)\n        if self.args.local_rank == 0:\n"
           "            self.save_model(model)\n"
           "    def train_epoch(self, model, loader):\n        for x in loader:\n"
           "            model(x).sum().backward()\n"
           "    def save_model(self, model):\n{unwrap}        torch.save(model.state_dict(), 'model.pth')\n")


def test_a_wrapper_handed_on_through_methods_to_a_save(tmp_path):
    """KPGT: `trainer.fit(model, train_loader)` after `model = DDP(model)`; fit hands its `model` to
    `self.save_model(model)`, which saves `model.state_dict()`: module. keys, two calls away from the script. The
    finding names the save's line. A save_model that unwraps first (`model = model.module`) is quiet."""
    train = (SEEDED + "from trainer import Trainer\nmodel = DDP(Net())\ntrainer = Trainer(args)\n"
             "trainer.fit(model, loader)\n")
    loud = audit.audit_paths([_project(tmp_path / "l", {"train.py": train, "trainer.py": TRAINER.format(unwrap="")})])
    hits = [f for f in loud if f.rule == "save-without-module"]
    assert hits and ("trainer.py", 14) in _places(hits[0]), [(f.rule, f.line, f.message) for f in loud]
    quiet = audit.audit_paths([_project(tmp_path / "q", {
        "train.py": train, "trainer.py": TRAINER.format(unwrap="        model = model.module\n")})])
    assert "save-without-module" not in [f.rule for f in quiet]


def test_a_quoted_port_exported_by_a_launch_script(tmp_path):
    """MT-DNN's run_glue_finetuning.sh: `export MASTER_PORT="8787"`, then `--master_port $MASTER_PORT` in the
    launcher's arguments: the quotes change nothing, the port is fixed. A fallback the environment overrides
    (`${MASTER_PORT:-8787}`) is quiet."""
    script = ("#!/bin/bash\nexport MASTER_ADDR=localhost\nexport MASTER_PORT={port}\n"
              "python -m torch.distributed.launch --nproc_per_node 2 --master_port $MASTER_PORT train.py\n")
    loud = audit.audit_paths([_project(tmp_path / "l", {"train.py": SEEDED, "run.sh": script.format(port='"8787"')})])
    hits = [f for f in loud if f.rule == "hard-coded-master-port"]
    assert hits and hits[0].line == 3 and "MASTER_PORT=8787" in hits[0].message, [(f.rule, f.line) for f in loud]
    quiet = audit.audit_paths([_project(tmp_path / "q", {
        "train.py": SEEDED, "run.sh": script.format(port='"${MASTER_PORT:-8787}"')})])
    assert "hard-coded-master-port" not in [f.rule for f in quiet]


def test_an_empty_yaml_key_read_for_its_truth(tmp_path):
    """MolMCL: `if config['model']['checkpoint']: torch.load(config['model']['checkpoint'])` with `checkpoint:`
    left empty in the project's only YAML (an empty value is YAML's null): the load never runs in the default
    run. A path given, or a `checkpoint:` that opens a section of deeper lines, keeps the finding."""
    train = (SEEDED + "import yaml\nconfig = yaml.safe_load(open('config/pretrain.yaml'))\nmodel = DDP(Net())\n"
             "if config['model']['checkpoint']:\n    model.module.load_state_dict(torch.load("
             "config['model']['checkpoint'])['wrapper'])\n")
    yaml_text = "model:\n  name: gps\n  checkpoint: {value}  # for continued training\n{below}  dim: 300\n"

    def found(value, below=""):
        root = _project(tmp_path / f"p{len(value)}{len(below)}", {
            "train.py": train, "config/pretrain.yaml": yaml_text.format(value=value, below=below)})
        return [f.rule for f in audit.audit_paths([root])]
    assert "load-without-map-location" not in found("")
    assert "load-without-map-location" not in found("null")
    assert "load-without-map-location" in found("ckpt/last.pt")
    assert "load-without-map-location" in found("", below="    path: ckpt/last.pt\n")


LOOP = ("from segm.losses import weight_reduce_loss\n"
        "for x, y in loader:\n    loss = criterion(model(x), y)\n"
        "    loss = {reduce}\n    loss.backward()\n    opt.step()\n"
        "    if rank == 0:\n        print(f'loss {{loss.item():.4f}}')\n")


def test_a_loss_reduced_over_its_own_elements_is_no_average_over_ranks():
    """WeakTr: `loss = weight_reduce_loss(loss, weight=None, reduction="mean")` (mmseg's helper, from a module the
    copies lack) averages the loss over its own pixels; the name says `reduce`, the `reduction=` keyword says over
    what. Rank 0's print of that loss is its own micro-batch's. A helper named for a reduction and handed no
    `reduction` (`reduce_tensor(loss)`, unseen) still reads as one over ranks."""
    head = SEEDED + "model = DDP(Net())\n"
    loud = audit.audit_source(head + LOOP.format(reduce="weight_reduce_loss(loss, weight=None, reduction='mean')"))
    assert "rank0-local-loss" in [f.rule for f in loud], [(f.rule, f.line) for f in loud]
    loud = audit.audit_source(head + LOOP.format(reduce="weight_reduce_loss(loss, None, 'mean')"))
    assert "rank0-local-loss" in [f.rule for f in loud]
    quiet = audit.audit_source(head + LOOP.format(reduce="reduce_tensor(loss)"))
    assert "rank0-local-loss" not in [f.rule for f in quiet]


METER = ("import torch.distributed as dist\n"
         "def printd(x):\n    if dist.get_rank() == 0:\n        print(x)\n"
         "class MetricLogger:\n    def __init__(self):\n        self.meters = {}\n"
         "    def update(self, **kwargs):\n        for k, v in kwargs.items():\n            self.meters[k] = v\n"
         "    def __str__(self):\n        return str(self.meters)\n"
         "    def log_every(self, iterable, print_freq):\n        for i, obj in enumerate(iterable):\n"
         "            yield obj\n            if i % print_freq == 0:\n                printd(str(self))\n")


def test_a_meter_fed_under_an_option_and_on_every_step(tmp_path):
    """WeakTr's engine feeds its MetricLogger `mean_loss` only `if GradientClipping is not None:` and `loss` at the
    end of every step; log_every prints the meter on rank 0 alone (printd), never synchronised. The finding names
    the feed every step runs, the line to change."""
    train = (SEEDED + "from logger import MetricLogger\nmodel = DDP(Net())\nlogger = MetricLogger()\n"
             "for x, y in logger.log_every(loader, 10):\n    loss = criterion(model(x), y)\n"
             "    if clipping is not None:\n        logger.update(mean_loss=loss.mean().item())\n"
             "    loss.backward()\n    opt.step()\n    logger.update(loss=loss.item())\n")
    found = audit.audit_paths([_project(tmp_path, {"train.py": train, "logger.py": METER})])
    hits = [f for f in found if f.rule == "rank0-local-loss"]
    last = train.count("\n")  # the last line of the script: the feed of every step
    assert hits and hits[0].line == last, [(f.rule, f.line) for f in found]


MODEL = ("import torch\nclass ModelBase:\n    def optimize_parameters(self, step):\n        pass\n"
         "    def current_log(self):\n        pass\n"
         "class ModelPlain(ModelBase):\n    def optimize_parameters(self, step):\n        self.optimizer.zero_grad()\n"
         "        l_pix = self.criterion(self.netG(self.L), self.H)\n        l_pix.backward()\n"
         "        self.optimizer.step()\n{log}"
         "    def current_log(self):\n        return self.log_dict\n")


def test_losses_a_model_object_keeps_for_its_getter(tmp_path):
    """KAIR, IRN, IR-SDE: `model = define_Model(opt)` from a factory the copies lack, `model.optimize_parameters(
    step)` backwards the loss and keeps `self.log_dict['G_loss'] = G_loss.item()`, and rank 0 logs
    `model.current_log()` as a message built key by key: the one project method of each name (a base class's
    `pass` aside) says what the untyped object does. BasicSR's `self.log_dict = self.reduce_loss_dict(loss_dict)`
    (all-reduced) is quiet."""
    train = (SEEDED + "import logging\nfrom models.select_model import define_Model\n"
             "logger = logging.getLogger('train')\nmodel = define_Model(opt)\n"
             "for step, data in enumerate(loader):\n    model.feed_data(data)\n    model.optimize_parameters(step)\n"
             "    if rank == 0:\n        logs = model.current_log()\n        message = f'<iter:{step}> '\n"
             "        for k, v in logs.items():\n            message += f'{k}: {v:.3e} '\n"
             "        logger.info(message)\n")
    kept = "        self.log_dict['G_loss'] = l_pix.item()\n"
    loud = audit.audit_paths([_project(tmp_path / "l", {"train.py": train, "models/model_plain.py": MODEL.format(
        log=kept)})])
    assert "rank0-local-loss" in [f.rule for f in loud], [(f.rule, f.line) for f in loud]
    quiet = audit.audit_paths([_project(tmp_path / "q", {
        "train.py": train, "models/model_plain.py": MODEL.format(
            log="        self.log_dict = self.reduce_loss_dict({'l_pix': l_pix})\n")})])
    assert "rank0-local-loss" not in [f.rule for f in quiet], [(f.rule, f.line) for f in quiet]
