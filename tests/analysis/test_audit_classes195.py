"""Issue 35: classes of round 195-200's first look (docs/measured/cpu2/audit_heldout_round195.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (a15c869's, committed as 88b4ecb)."""

from pathlib import Path

from test_audit import _project
from test_audit_classes135 import SEEDED
from test_audit_classes189 import _found, _has, _line, _places

from lab_utils.analysis import audit

LOOP = ("model = DDP(torch.nn.Linear(2, 2))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x in range(3):\n    loss = model(torch.ones(2)).sum()\n    opt.zero_grad()\n    loss.backward()\n"
        "    opt.step()\n")


def test_a_count_of_the_models_parameters_is_no_ranks_own_value(tmp_path):
    """PointTAD: `n_parameters = sum(p.numel() for p in model.parameters())` goes into the logged record beside the
    reduced training loss; model.parameters() runs no forward, so the record is as reduced as the loss in it. A
    forward's output in the record is this rank's own."""
    train = SEEDED + LOOP + ("    train_loss = loss.detach()\n    dist.all_reduce(train_loss)\n"
                             "n_parameters = EXTRA\n"
                             "if rank == 0:\n    log_stats = {'train_loss': train_loss, 'n': n_parameters}\n"
                             "    print(log_stats)\n")

    def reduced(extra: str, where: Path) -> set[str]:
        root = _project(where, {"train.py": train.replace("EXTRA", extra)})
        files, top, named = audit._expand([root])
        p = audit.Project(files, top, named)
        return audit.Facts(p).reduced_names(p.modules["train.py"], p.modules["train.py"].tree)

    assert "log_stats" in reduced("sum(p.numel() for p in model.parameters())", tmp_path / "a")
    assert "log_stats" not in reduced("model(torch.ones(2)).sum()", tmp_path / "b")


CHECKPOINTER = ("import torch\nLOADER\nclass Checkpointer:\n    def __init__(self, model):\n"
                "        self.model = model\n"
                "    def save(self):\n        torch.save({'model': self.model.state_dict()}, 'c.pt')\n"
                "    def load(self, f):\n        ckpt = torch.load(f, map_location='cpu')\n        LOAD\n")


def test_a_loader_that_strips_module_by_a_helper_argument(tmp_path):
    """HiSup (maskrcnn-benchmark): `strip_prefix_if_present(loaded_state_dict, prefix="module.")` in the project's
    loader: a prefixed checkpoint loads into the plain model. A loader that loads the keys as they are does not."""
    train = SEEDED + ("from ckpt import Checkpointer\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                      "c = Checkpointer(model)\nif rank == 0:\n    c.save()\n")
    strip = ("def strip_prefix_if_present(sd, prefix):\n    return {k[len(prefix):] if k.startswith(prefix) else k: v "
             "for k, v in sd.items()}")
    quiet = CHECKPOINTER.replace("LOADER", strip).replace(
        "LOAD", "self.model.load_state_dict(strip_prefix_if_present(ckpt['model'], prefix='module.'))")
    loud = CHECKPOINTER.replace("LOADER", "").replace("LOAD", "self.model.load_state_dict(ckpt['model'])")
    assert not _has(_project(tmp_path / "a", {"train.py": train, "ckpt.py": quiet}), "save-without-module")
    assert _has(_project(tmp_path / "b", {"train.py": train, "ckpt.py": loud}), "save-without-module")


def test_a_loader_of_the_project_these_files_lack_may_strip_module(tmp_path):
    """MMN: the checkpointer loads with `load_state_dict(self.model, checkpoint.pop("model"))`, a function of the
    project's model_serialization module, which these files lack (maskrcnn-benchmark's strips 'module.'): the
    prefixed save is a check by hand, not a defect."""
    train = SEEDED + ("from mmx.ckpt import Checkpointer\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                      "c = Checkpointer(model)\nif rank == 0:\n    c.save()\n")
    quiet = CHECKPOINTER.replace("LOADER", "from mmx.serialization import load_state_dict").replace(
        "LOAD", "load_state_dict(self.model, ckpt.pop('model'))")
    loud = CHECKPOINTER.replace("LOADER", "").replace("LOAD", "self.model.load_state_dict(ckpt.pop('model'))")
    def severities(files: dict, where: Path) -> list[str]:
        return [f.severity for f in _found(_project(where, files)) if f.rule == "save-without-module"]

    assert severities({"train.py": train, "mmx/ckpt.py": quiet}, tmp_path / "a") == ["check-by-hand"]
    assert severities({"train.py": train, "mmx/ckpt.py": loud}, tmp_path / "b") == ["defect"]


def test_a_log_inside_a_library_method_names_the_scripts_guarded_call(tmp_path):
    """DROID-SLAM: train.py calls `logger.push(metrics)` under `if gpu == 0:`; push calls _print_training_status,
    which prints the running loss: the finding names the script's call, where the fix goes."""
    logger = ("class Logger:\n    def __init__(self):\n        self.running_loss = {}\n"
              "    def _print_status(self):\n        print(self.running_loss)\n"
              "    def push(self, metrics):\n        for k in metrics:\n"
              "            self.running_loss[k] = self.running_loss.get(k, 0.0) + metrics[k]\n"
              "        self._print_status()\n")
    train = SEEDED + "from logger import Logger\nlog = Logger()\n" + LOOP + (
        "    metrics = {'geo': loss.item()}\n    if rank == 0:\n        log.push(metrics)\n")
    places = _places(_project(tmp_path, {"train.py": train, "logger.py": logger}), "rank0-local-loss")
    assert ("train.py", _line(train, "log.push(")) in places


TRAINER = ("class Trainer:\n    def __init__(self, network):\n        self.network = network\n"
           "    def val(self, batch):\n        return CALL(batch)\n")


def test_rank0_validating_through_an_object_whose_attribute_the_script_wrapped(tmp_path):
    """E2EC: `trainer.network = DDP(trainer.network, ...)` in the script, the trainer from a factory these files
    lack; rank 0 alone runs `trainer.val(...)`, which calls `self.network(batch)`: the wrapper's forward."""
    train = SEEDED + ("from lib.make import make_trainer\nnet = torch.nn.BatchNorm1d(2)\n"
                      "trainer = make_trainer(net)\ntrainer.network = DDP(trainer.network)\n"
                      "if rank == 0:\n    trainer.val(torch.ones(2, 2))\n")
    loud = {"train.py": train, "lib/trainer.py": TRAINER.replace("CALL", "self.network")}
    quiet = {"train.py": train, "lib/trainer.py": TRAINER.replace("CALL", "self.network.module")}
    assert _has(_project(tmp_path / "a", loud), "ddp-forward-under-rank0")
    assert not _has(_project(tmp_path / "b", quiet), "ddp-forward-under-rank0")


HEAD = ("import torch.nn as nn\nclass Head(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.norm = NORM\n    def forward(self, x):\n        return self.norm(x)\n"
        "def build_head(cfg):\n    return Head()\n")


def test_a_class_built_only_by_a_builder_nothing_here_calls_is_the_model(tmp_path):
    """MMN: `model = build_model(cfg)` from a module these files lack; the files hold ProposalConv (BatchNorm2d),
    built only by build_proposal_conv, which the absent model file calls."""
    train = SEEDED + "from mmx.modeling import build_model\nmodel = build_model(None)\nmodel = DDP(model)\n"
    loud = {"train.py": train, "mmx/modeling/head.py": HEAD.replace("NORM", "nn.BatchNorm2d(4)")}
    quiet = {"train.py": train, "mmx/modeling/head.py": HEAD.replace("NORM", "nn.LayerNorm(4)")}
    assert _has(_project(tmp_path / "a", loud), "batchnorm-without-sync")
    assert not _has(_project(tmp_path / "b", quiet), "batchnorm-without-sync")


def test_the_first_slot_of_a_detr_style_builder_is_the_model(tmp_path):
    """PointTAD: `model, criterion, postprocessors = build_model(args)` from models/__init__.py, which these
    files lack; models/pointtad.py's build(args) builds the I3D backbone (BatchNorm3d) and the model around it."""
    models = ("import torch.nn as nn\nclass Backbone(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
              "        self.bn = NORM\nclass Net(nn.Module):\n    def __init__(self, backbone):\n"
              "        super().__init__()\n        self.backbone = backbone\n"
              "class PostProcess(nn.Module):\n    pass\n"
              "def build(args):\n    backbone = Backbone()\n    return Net(backbone), None, PostProcess()\n")
    train = SEEDED + ("from models import build_model\nmodel, criterion, post = build_model(None)\n"
                      "model = DDP(model)\n")
    loud = {"train.py": train, "models/net.py": models.replace("NORM", "nn.BatchNorm3d(4)")}
    quiet = {"train.py": train, "models/net.py": models.replace("NORM", "nn.GroupNorm(2, 4)")}
    assert _has(_project(tmp_path / "a", loud), "batchnorm-without-sync")
    assert not _has(_project(tmp_path / "b", quiet), "batchnorm-without-sync")


def test_a_norm_helper_binding_plain_batchnorm(tmp_path):
    """HiSup: the model class comes from a module these files lack; backbones/bn_helper.py binds
    `BatchNorm2d_class = BatchNorm2d = torch.nn.BatchNorm2d` for the backbones' layers."""
    train = SEEDED + ("from hs.detector import Detector\nmodel = Detector(None)\nmodel = model.to('cpu')\n"
                      "model = DDP(model)\n")
    helper = "import torch\nBatchNorm2d_class = BatchNorm2d = NORM\n"
    loud = {"train.py": train, "hs/bn_helper.py": helper.replace("NORM", "torch.nn.BatchNorm2d")}
    quiet = {"train.py": train, "hs/bn_helper.py": helper.replace("NORM", "torch.nn.SyncBatchNorm")}
    assert _has(_project(tmp_path / "a", loud), "batchnorm-without-sync")
    assert not _has(_project(tmp_path / "b", quiet), "batchnorm-without-sync")


def test_a_recorder_fed_the_losses_by_a_named_update_prints_them(tmp_path):
    """E2EC: `recorder.update_loss_stats(loss_stats)` on every rank, then `print(... str(recorder) ...)`: every
    rank prints its own losses."""
    train = SEEDED + ("class Recorder:\n    def __init__(self):\n        self.stats = {}\n"
                      "    def UPDATE(self, d):\n        self.stats.update(d)\n"
                      "    def __str__(self):\n        return str(self.stats)\n"
                      "recorder = Recorder()\n") + LOOP + (
        "    recorder.UPDATE({'loss': loss.detach()})\n    state = 'eta {} {}'.format(1, str(recorder))\n"
        "    print(state)\n")
    assert _has(_project(tmp_path / "a", {"train.py": train.replace("UPDATE", "update_loss_stats")}),
                "every-rank-prints-loss")
    assert not _has(_project(tmp_path / "b", {"train.py": train.replace("UPDATE", "update_lr_stats")}),
                    "every-rank-prints-loss")


def test_a_loss_module_named_reducer_reduces_over_no_ranks(tmp_path):
    """HiSup: `loss_reducer = LossReducer(cfg)`, `total_loss = loss_reducer(loss_dict)` sums the loss terms;
    rank 0 logs `total_loss.item()` unreduced. A reduction over ranks (reduce_dict) is another matter."""
    train = SEEDED + ("from hs.losses import LossReducer\nfrom hs.comm import reduce_dict\n"
                      "model = DDP(torch.nn.Linear(2, 2))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                      "loss_reducer = LossReducer(None)\nfor x in range(3):\n"
                      "    loss_dict = {'a': model(torch.ones(2)).sum()}\n    total_loss = REDUCE(loss_dict)\n"
                      "    opt.zero_grad()\n    total_loss.backward()\n    opt.step()\n"
                      "    if rank == 0:\n        print(total_loss.item())\n")
    assert _has(_project(tmp_path / "a", {"train.py": train.replace("REDUCE", "loss_reducer")}), "rank0-local-loss")
    assert not _has(_project(tmp_path / "b", {"train.py": train.replace("REDUCE", "reduce_dict")}),
                    "rank0-local-loss")


def test_a_child_of_a_logger_an_unseen_setup_gave_the_rank(tmp_path):
    """MMN: the script calls `setup_logger("mmn", output_dir, get_rank())` (a module these files lack, which adds no
    console off rank 0); the trainer logs its meters through `logging.getLogger("mmn.trainer")`."""
    trainer = ("import logging\nimport torch\ndef do_train(model, opt):\n    logger = logging.getLogger(NAME)\n"
               "    for x in range(3):\n        loss = model(torch.ones(2)).sum()\n        opt.zero_grad()\n"
               "        loss.backward()\n        opt.step()\n        logger.info('loss {}'.format(loss.item()))\n")
    train = SEEDED + ("from mmx.logger import setup_logger\nfrom mmx.engine.trainer import do_train\n"
                      "logger = setup_logger('mmx', '.', dist.get_rank())\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                      "do_train(model, torch.optim.SGD(model.parameters(), lr=0.1))\n")
    loud = {"train.py": train, "mmx/engine/trainer.py": trainer.replace("NAME", "'mmx.trainer'")}
    other = {"train.py": train, "mmx/engine/trainer.py": trainer.replace("NAME", "'other.trainer'")}
    assert _has(_project(tmp_path / "a", loud), "rank0-local-loss")
    assert not _has(_project(tmp_path / "b", other), "rank0-local-loss")


def test_a_closure_that_hands_its_arguments_to_a_rank0_log(tmp_path):
    """nanodrz: `def wandb_log(*args, **kwargs): if is_main_process: wandb.log(*args, **kwargs)` in train(), then
    `wandb_log({"train/loss": loss}, step=step)`: rank 0 logs its own micro-batch's loss."""
    train = SEEDED + ("import wandb\ndef train():\n    def wandb_log(*args, **kwargs):\n        if GUARD:\n"
                      "            wandb.log(*args, **kwargs)\n    model = DDP(torch.nn.Linear(2, 2))\n"
                      "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    for x in range(3):\n"
                      "        loss = model(torch.ones(2)).sum()\n        opt.zero_grad()\n        loss.backward()\n"
                      "        opt.step()\n        metrics = {'train/loss': loss.item()}\n        wandb_log(metrics)\n"
                      "train()\n")
    assert _has(_project(tmp_path / "a", {"train.py": train.replace("GUARD", "rank == 0")}), "rank0-local-loss")
    assert not _has(_project(tmp_path / "b", {"train.py": train.replace("GUARD", "True")}), "rank0-local-loss")


def test_a_filtered_copy_of_the_wrappers_state_dict_is_saved(tmp_path):
    """nanodrz: `{k: v for k, v in model.state_dict().items() if not k.startswith("dac.")}` saved by rank 0: the
    copy keeps the 'module.' keys. Iterating the state dict to broadcast it saves nothing."""
    train = SEEDED + "model = DDP(torch.nn.Linear(2, 2))\nif rank == 0:\n    BODY\n"
    saved = ("ckpt = {'model': {k: v for k, v in model.state_dict().items() if not k.startswith('dac.')}}\n"
             "    torch.save(ckpt, 'c.pt')")
    read = "for k, v in model.state_dict().items():\n        print(k)"
    assert _has(_project(tmp_path / "a", {"train.py": train.replace("BODY", saved)}), "save-without-module")
    assert not _has(_project(tmp_path / "b", {"train.py": train.replace("BODY", read)}), "save-without-module")


def test_losses_that_sum_by_default_or_by_size_average(tmp_path):
    """The handwritten-OCR samples: warp-ctc's `CTCLoss()` sums over the batch (size_average=False by default), and
    the launcher's `args.world_size = ngpus_per_node * args.world_size` scales no loss; torch's own CTCLoss means."""
    train = SEEDED + ("import argparse\nIMPORT\nargs = argparse.Namespace(world_size=1, rank=0)\n"
                      "args.world_size = 2 * args.world_size\nargs.rank = args.rank * 2 + 1\n"
                      "criterion = CTCLoss()\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                      "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor x in range(3):\n"
                      "    loss = criterion(model(torch.ones(2)), None, None, None)\n    opt.zero_grad()\n"
                      "    loss.backward()\n    opt.step()\n")
    assert _has(_project(tmp_path / "a", {"train.py": train.replace("IMPORT", "from warpctc_pytorch import CTCLoss")}),
                "sum-loss-unscaled")
    assert not _has(_project(tmp_path / "b", {"train.py": train.replace("IMPORT", "from torch.nn import CTCLoss")}),
                    "sum-loss-unscaled")
    legacy = SEEDED + LOOP.replace("model(torch.ones(2)).sum()", "crit(model(torch.ones(2)), torch.zeros(2))")
    legacy = legacy.replace("model = DDP", "crit = torch.nn.MSELoss(size_average=False)\nmodel = DDP")
    assert _has(_project(tmp_path / "c", {"train.py": legacy}), "sum-loss-unscaled")
