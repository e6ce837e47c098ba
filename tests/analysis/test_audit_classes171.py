"""Issue 35: classes found after round 165-170's fixes and in round 171-176's first look
(docs/measured/cpu2/audit_heldout_round171.txt), fixed after it, each quiet and loud."""

from pathlib import Path

from test_audit import _project
from test_audit_classes135 import SEEDED
from test_audit_classes147 import METER

from lab_utils.analysis import audit


def _places(finding) -> set[tuple[str, int]]:
    return {(Path(p).name, line) for p, line in ((finding.path, finding.line), *finding.related)}


def test_a_meter_feed_names_the_call_that_prints_it(tmp_path):
    """SpikingResformer-style engines (ESR-SNN's engine_finetune.py): `metric_logger.update(loss=...)` sits in one
    of two arms (an option's arm first, the default's second), and `for ... in metric_logger.log_every(...)` in
    the loop header prints it on rank 0. The message says log_every prints what the feed hands it, so the finding
    carries log_every's line as one of its places: a reader (or a label) pointing at the printing line or at the
    other arm's feed is pointing at this defect."""
    train = (SEEDED + "from logger import MetricLogger\nmodel = DDP(Net())\nlogger = MetricLogger()\n"
             "for x, y in logger.log_every(loader, 10):\n    loss = criterion(model(x), y)\n"
             "    loss.backward()\n    opt.step()\n"
             "    if args.suppress:\n        logger.update(loss=loss.item(), extra=0.0)\n"
             "    else:\n        logger.update(loss=loss.item())\n")
    found = audit.audit_paths([_project(tmp_path, {"train.py": train, "logger.py": METER})])
    hits = [f for f in found if f.rule == "rank0-local-loss"]
    header = next(i for i, line in enumerate(train.splitlines(), 1) if "log_every(loader" in line)
    assert len(hits) == 1 and ("train.py", header) in _places(hits[0]), [(f.rule, f.line, f.related) for f in found]


def test_a_file_of_the_folder_that_does_not_parse_leaves_the_rest_audited(tmp_path):
    """SPOS's train_imagenet.py misses a comma at line 149: auditing the folder stopped with an AuditError, so the
    project's other files (its checkpoint loader's torch.load on every rank) went unread. A file found in a folder,
    or through an import, that is not Python is left out and named; a file the user names is still an error."""
    import subprocess
    import sys

    import pytest

    ddp = SEEDED + "model = DDP(Net())\nstate = torch.load('last.pt')\nmodel.module.load_state_dict(state)\n"
    root = _project(tmp_path, {"train.py": ddp, "broken.py": "import torch\ndef f(:\n    pass\n"})
    skipped: list[str] = []
    found = audit.audit_paths([root], skipped)
    assert "load-without-map-location" in [f.rule for f in found]
    assert len(skipped) == 1 and "broken.py:2: not Python" in skipped[0]
    with pytest.raises(audit.AuditError, match="broken.py:2: not Python"):
        audit.audit_paths([root / "broken.py", root / "train.py"])
    cli = subprocess.run([sys.executable, "-m", "lab_utils.cli", "audit", str(root)], capture_output=True, text=True)
    assert cli.returncode == 1 and "not audited: " in cli.stderr and "broken.py:2" in cli.stderr
    assert "1 file(s) not audited" in cli.stdout


TRAINERS = ("import torch, torch.distributed as dist\n"
            "__all__ = ['Trainer', 'DartsTrainer']\n"
            "class Trainer:\n    def __init__(self, model):\n        self.model = model\n"
            "    def train_epoch(self, epoch):\n        self.saving(epoch)\n"
            "    def saving(self, epoch):\n        torch.save(self.model.module.state_dict(), f'ck{epoch}.pt')\n"
            "class DartsTrainer(Trainer):\n    def train_epoch(self, epoch):\n        self.saving(epoch)\n")
SUPERNET = (SEEDED + "from trainer import Trainer\n"
            "class BigNASTrainer(Trainer):\n    def train_epoch(self, epoch):\n        if rank == 0:\n"
            "            self.saving(epoch)\n"
            "t = BigNASTrainer(DDP(Net()))\nfor epoch in range(3):\n    t.train_epoch(epoch)\n")


def test_a_save_helper_called_unguarded_only_off_the_run(tmp_path):
    """XNAS: the base Trainer.saving is called unguarded by the base train_epoch (which BigNASTrainer, the one
    class the script builds, replaces) and by DartsTrainer (named only in `__all__`), and under `if rank == 0:` by
    BigNASTrainer: every call the run makes is rank 0's, so no save-on-every-rank. A second subclass the script
    does build, calling saving unguarded, makes every rank save."""
    quiet = _project(tmp_path / "q", {"train.py": SUPERNET, "trainer.py": TRAINERS})
    assert "save-on-every-rank" not in [f.rule for f in audit.audit_paths([quiet])]
    loud = _project(tmp_path / "l", {"train.py": SUPERNET + "d = DartsTrainer(DDP(Net()))\nd.train_epoch(0)\n",
                                     "trainer.py": TRAINERS})
    (loud / "train.py").write_text((loud / "train.py").read_text().replace(
        "from trainer import Trainer", "from trainer import Trainer, DartsTrainer"))
    assert "save-on-every-rank" in [f.rule for f in audit.audit_paths([loud])]


MOCO = (SEEDED + "class {cls}:\n"
        "    @staticmethod\n    def _global_gather(x):\n        out = [torch.ones_like(x) for _ in range(2)]\n"
        "        dist.all_gather(out, x)\n        return torch.cat(out)\n"
        "    def _train_moco(self, model, model_ema, loader):\n        for x, _ in loader:\n"
        "            q = model(x)\n            with torch.no_grad():\n                k = model_ema(x)\n"
        "            all_k = self._global_gather(k)\n            loss = (q * all_k[:q.shape[0]]).sum()\n"
        "            loss.backward()\n"
        "{cls}()._train_moco(DDP(Net()), Net(), loader)\n")


def test_a_trainer_named_for_contrast_is_no_loss():
    """Re-IQA's ContrastTrainer._train_moco gathers the momentum encoder's no-grad keys: the class's name says
    'contrast' because of what it trains, not because the gather sits in a loss. A loss class (`ContrastLoss`)
    gathering is one; the trainer's gather is left to check by hand."""
    def severities(cls):
        return [f.severity for f in audit.audit_source(MOCO.format(cls=cls)) if f.rule == "gather-without-grad"]
    assert severities("ContrastLoss") == ["defect"]
    assert "defect" not in severities("ContrastTrainer")


REFUSE = ("import torch, torch.distributed as dist\nif args.distributed:\n    dist.init_process_group('gloo')\n"
          "{refuse}def reduce(t):\n    return dist.all_reduce(t)\ndef loss_fn(x):\n    reduce(x)\n"
          "    return x.sum()\nloss_fn(x)\n")


def test_a_script_that_refuses_one_process_has_no_one_process_run():
    """Re-IQA's main: `if args.multiprocessing_distributed: mp.spawn(...) else: raise NotImplementedError('Currently
    only DDP training')`: a collective outside `if args.distributed:` never meets a run without the group. The
    same script without the refusal has that run, and the collective breaks it."""
    refuse = "if not args.distributed:\n    raise NotImplementedError('Currently only DDP training')\n"
    assert "collective-outside-switch" not in [f.rule for f in audit.audit_source(REFUSE.format(refuse=refuse))]
    assert "collective-outside-switch" in [f.rule for f in audit.audit_source(REFUSE.format(refuse=""))]


def test_no_seed_names_where_the_caller_builds_the_model(tmp_path):
    """Re-IQA: `model, model_ema = build_model(args)` in main_worker, then `trainer.wrap_up(model, ...)`, whose
    `model = DDP(model, ...)` broadcasts the unseeded init: the build is where the seed goes, a related place."""
    script = (DDP_HEAD := SEEDED.replace("torch.manual_seed(0)\n", "")) + (
        "from trainer import Trainer\ndef main_worker(args):\n    trainer = Trainer()\n"
        "    model, model_ema = build_model(args)\n    model = trainer.wrap_up(model)\nmain_worker(None)\n")
    trainer = ("from torch.nn.parallel import DistributedDataParallel as DDP\nclass Trainer:\n"
               "    def wrap_up(self, model):\n        model = DDP(model)\n        return model\n")
    found = audit.audit_paths([_project(tmp_path, {"main.py": script, "trainer.py": trainer})])
    hit = next(f for f in found if f.rule == "no-seed")
    build = next(i for i, line in enumerate(script.splitlines(), 1) if "build_model(args)" in line)
    assert ("main.py", build) in _places(hit) and DDP_HEAD


LOADER = ("class InfiniteDataLoader:\n    def __init__(self, data_loader):\n        self.data_loader = data_loader\n"
          "        self.data_iter = iter(data_loader)\n    def __next__(self):\n        try:\n"
          "            return next(self.data_iter)\n        except StopIteration:\n"
          "{advance}            self.data_iter = iter(self.data_loader)\n            return next(self.data_iter)\n")


def test_a_loader_that_moves_the_sampler_epoch_itself(tmp_path):
    """BSQ-ViT's InfiniteDataLoader: `self.data_loader.sampler.epoch += 1` at each new pass is what set_epoch
    does (it assigns the attribute), so no set-epoch-missing. The same loader that only restarts the iterator
    repeats epoch 0's order."""
    script = (SEEDED + "from loader import InfiniteDataLoader\nmodel = DDP(Net())\n"
              "train_loader = DataLoader(data, sampler=DistributedSampler(data))\n"
              "train_loader = InfiniteDataLoader(train_loader)\nfor step in range(1000):\n"
              "    x = next(train_loader)\n    model(x).sum().backward()\n")
    def found(name, advance):
        root = _project(tmp_path / name, {"train.py": script, "loader.py": LOADER.format(advance=advance)})
        return [f.rule for f in audit.audit_paths([root])]
    assert "set-epoch-missing" not in found("q", "            self.data_loader.sampler.epoch += 1\n")
    assert "set-epoch-missing" in found("l", "")


EVAL_CUT = (SEEDED + "import numpy as np\nmodel = DDP(Net())\nval_loader = DataLoader(val_set, "
            "sampler=DistributedSampler(val_set, shuffle=False))\n"
            "def evaluate(model, loader):\n    scores = [[] for _ in range(world_size)]\n    for x, y in loader:\n"
            "        s = (model(x) - y).abs().mean(1)\n        got = [torch.zeros_like(s) for _ in range(world_size)]\n"
            "        dist.all_gather(got, s)\n        for j in range(world_size):\n"
            "            scores[j].append(got[j].cpu())\n"
            "    allv = np.concatenate([torch.cat(v).numpy() for v in scores]){cut}\n    return allv.mean()\n"
            "evaluate(model, val_loader)\n")


def test_gathered_scores_cut_back_to_the_set_size_drop_the_padding():
    """BSQ-ViT's evaluate(): the per-rank PSNRs are all_gathered, reordered and cut with
    `[:config.evaluation.fid.num_samples]`: the padded tail is gone, so no eval-padding-duplicates. Without the
    cut the duplicates are averaged in."""
    def found(cut):
        return [f.rule for f in audit.audit_source(EVAL_CUT.format(cut=cut))]
    assert "eval-padding-duplicates" not in found("[:cfg.evaluation.num_samples]")
    assert "eval-padding-duplicates" not in found("[:len(val_set)]")
    assert "eval-padding-duplicates" in found("")


def test_a_rank_compared_with_the_reduce_rank_is_rank0():
    """DiffCardGCN: `if dist.get_rank() == args.reduce_rank:` (an option whose default is 0, the rank its
    dist.reduce sends to) guards its prints: they are rank 0's own loss, not every rank's."""
    body = (SEEDED + "model = DDP(Net())\nfor x, y in loader:\n    loss = criterion(model(x), y)\n"
            "    loss.backward()\n    opt.step()\n    if dist.get_rank() == args.{name}:\n"
            "        print('loss', loss.item())\n")
    reduce_rank = [f.rule for f in audit.audit_source(body.format(name="reduce_rank"))]
    assert "rank0-local-loss" in reduce_rank and "every-rank-prints-loss" not in reduce_rank


def test_two_saves_of_the_wrapper_in_one_function_are_one_finding():
    """DiffCardGCN writes epoch_N.bin and best_epoch.bin from `model_pos.state_dict()` of the DDP wrapper in
    one loop body: one fix (save model_pos.module), one finding at the first, the second a related place."""
    body = (SEEDED + "model_pos = DDP(Net())\nfor epoch in range(3):\n    if rank == 0:\n"
            "        torch.save({'model_pos': model_pos.state_dict()}, f'epoch_{epoch}.bin')\n"
            "        if better:\n            torch.save({'model_pos': model_pos.state_dict()}, 'best.bin')\n")
    hits = [f for f in audit.audit_source(body) if f.rule == "save-without-module"]
    assert len(hits) == 1 and len(hits[0].related) == 1


def test_the_one_process_call_decides_rank_0s_seed():
    """CLIP-EBC: `run(local_rank, nprocs, args)` seeds `args.seed + local_rank`; main calls `mp.spawn(run, ...)`
    or, on one GPU, `run(0, 1, args)`: the single run's local_rank is 0, as rank 0's, though a `--local_rank`
    option defaults to -1. A one-process call handing -1 makes rank 0's seed another than the single run's."""
    body = ("import argparse, torch, torch.multiprocessing as mp, torch.distributed as dist\n"
            "from torch.nn.parallel import DistributedDataParallel as DDP\n"
            "parser = argparse.ArgumentParser()\nparser.add_argument('--local_rank', type=int, default=-1)\n"
            "parser.add_argument('--seed', type=int, default=42)\n"
            "def run(local_rank, nprocs, args):\n    torch.manual_seed(args.seed + local_rank)\n"
            "    dist.init_process_group('nccl', rank=local_rank, world_size=nprocs)\n    model = DDP(Net())\n"
            "def main():\n    args = parser.parse_args()\n    if torch.cuda.device_count() > 1:\n"
            "        mp.spawn(run, nprocs=2, args=(2, args))\n    else:\n        run({single}, 1, args)\n"
            "main()\n")
    assert "seed-per-rank" not in [f.rule for f in audit.audit_source(body.format(single="0"))]
    assert "seed-per-rank" in [f.rule for f in audit.audit_source(body.format(single="-1"))]


def test_a_regulariser_of_the_weights_is_every_ranks_number():
    """AtomNAS logs `loss_l2 = optim.cal_l2_loss(model, FLAGS.weight_decay, ...)` and `loss_bn_l1 =
    prune.cal_bn_l1_loss(get_prune_weights(model), FLAGS.penalty, rho)` on the master: functions of the weights,
    which DDP keeps equal, so rank 0's value is every rank's. The batch loss logged the same way is rank 0's own."""
    body = (SEEDED + "model = DDP(Net())\nfor x, y in loader:\n    loss = criterion(model(x), y)\n"
            "    loss_l2 = cal_l2_loss(model, FLAGS.weight_decay)\n"
            "    loss_bn = cal_bn_l1_loss(get_prune_weights(model), FLAGS.penalty, rho)\n"
            "    (loss + loss_l2 + loss_bn).backward()\n    opt.step()\n    if rank == 0:\n"
            "        writer.add_scalar('train/{name}', {name}.item(), step)\n")
    assert "rank0-local-loss" not in [f.rule for f in audit.audit_source(body.format(name="loss_l2"))]
    assert "rank0-local-loss" not in [f.rule for f in audit.audit_source(body.format(name="loss_bn"))]
    assert "rank0-local-loss" in [f.rule for f in audit.audit_source(body.format(name="loss"))]


def test_a_port_in_a_bash_array_of_arguments(tmp_path):
    """DiffCardGCN's launch script builds its arguments as a bash array, `"--master_port" "7500"`, and the script
    sets MASTER_PORT from the option: a fixed port, each token quoted. `"--master_port" "$PORT"` is not one."""
    script = SEEDED + "model = DDP(Net())\n"
    def found(name, value):
        root = _project(tmp_path / name, {"train.py": script, "run.sh": (
            f'args=(\n    "--epochs" "100"\n    "--master_port" {value}\n)\npython train.py ${{args[@]}}\n')})
        return [f.rule for f in audit.audit_paths([root]) if f.path.endswith("run.sh")]
    assert found("l", '"7500"') == ["hard-coded-master-port"]
    assert found("q", '"$PORT"') == []


def test_a_gpu_count_named_in_the_singular_or_in_capitals(tmp_path):
    """SMAP: `num_gpu = len(engine.devices)`, then `make_optimizer(cfg, model, num_gpu)` builds Adam with
    `lr=cfg.SOLVER.BASE_LR * num_gpu`; XNAS: `init_lr = cfg.OPTIM.BASE_LR * cfg.NUM_GPUS`, handed to a warm-up
    helper. Both grow the lr with the GPU count; the finding is where the count multiplies it. A per-GPU count
    that divides keeps it."""
    smap = (SEEDED + "num_gpu = world_size\nmodel = DDP(Net())\n"
            "opt = torch.optim.Adam(model.parameters(), lr=BASE * {op})\n")
    assert "lr-grows-with-world-size" in [f.rule for f in audit.audit_source(smap.format(op="num_gpu"))]
    assert "lr-grows-with-world-size" not in [f.rule for f in audit.audit_source(smap.format(op="1"))]
    xnas = (SEEDED + "def warm(init_lr, warmup_lr, t):\n    new_lr = t * (init_lr - warmup_lr) + warmup_lr\n"
            "    return new_lr\ndef adjust(t):\n    init_lr = cfg.OPTIM.BASE_LR * cfg.NUM_GPUS\n"
            "    warmup_lr = init_lr * 0.1\n    return warm(init_lr, warmup_lr, t)\n"
            "model = DDP(Net())\nfor g in opt.param_groups:\n    g['lr'] = adjust(0.5)\n")
    hits = [f for f in audit.audit_source(xnas) if f.rule == "lr-grows-with-world-size"]
    assert hits and "cfg.NUM_GPUS" in xnas.splitlines()[hits[0].line - 1]


def test_a_function_defined_in_the_rank0_block_that_runs_the_wrapper():
    """SkinDDP: inside `if rank == 0:` after training, `def compute_accuracy(model, data_loader, device):` runs
    `model(inputs)`, then `compute_accuracy(model, val_loader, device)` hands it the BatchNorm model's DDP wrapper:
    rank 0's forward broadcasts the buffers and waits for ranks that never come. Handed `model.module`, no."""
    body = (SEEDED + "import torch.nn as nn\nclass Net(nn.Module):\n    def __init__(self):\n"
            "        super().__init__()\n        self.bn = nn.BatchNorm1d(4)\n    def forward(self, x):\n"
            "        return self.bn(x)\ndef main():\n    model = DDP(Net())\n    for x in loader:\n"
            "        model(x).sum().backward()\n    if rank == 0:\n        def compute_accuracy(model, loader):\n"
            "            for x, y in loader:\n                out = model(x)\n            return 1\n"
            "        acc = compute_accuracy({arg}, val_loader)\nmain()\n")
    assert "ddp-forward-under-rank0" in [f.rule for f in audit.audit_source(body.format(arg="model"))]
    assert "ddp-forward-under-rank0" not in [f.rule for f in audit.audit_source(body.format(arg="model.module"))]


def test_a_sampler_handed_its_dataset_by_keyword():
    """CXR-CLIP: `DistributedSampler(dataset=val_dataset, shuffle=False)` for each validation set, whose loss the
    evaluation all_reduces: the padded duplicates count, keyword or not."""
    body = (SEEDED + "model = DDP(Net())\nval_loader = DataLoader(val_dataset, sampler=DistributedSampler({arg}, "
            "shuffle=False))\ndef validate(model, loader):\n    total = torch.zeros(1)\n    for x, y in loader:\n"
            "        loss = (model(x) - y).pow(2).mean()\n        dist.all_reduce(loss)\n        total += loss\n"
            "    return total\nvalidate(model, val_loader)\n")
    assert "eval-padding-duplicates" in [f.rule for f in audit.audit_source(body.format(arg="dataset=val_dataset"))]
    assert "eval-padding-duplicates" in [f.rule for f in audit.audit_source(body.format(arg="val_dataset"))]
    assert "eval-padding-duplicates" not in [f.rule for f in audit.audit_source(
        body.format(arg="dataset=val_dataset, drop_last=True"))]


def test_a_deepcopy_of_what_is_no_model_copies_no_init():
    """4M seeds `seed + rank`, then `deepcopy(MODALITY_TRANSFORMS_DIVAE)` (a dict of data transforms) before the
    DDP wrap: no rank's init is copied. A deepcopy of the model (an EMA) before the wrap keeps rank 1's own init."""
    body = (SEEDED.replace("torch.manual_seed(0)\n", "") + "from copy import deepcopy\n"
            "torch.manual_seed(42 + rank)\nmodel = Net()\ncopied = deepcopy({what})\nmodel = DDP(model)\n")
    assert "seed-per-rank" not in [f.rule for f in audit.audit_source(body.format(what="MODALITY_TRANSFORMS"))]
    assert "seed-per-rank" in [f.rule for f in audit.audit_source(body.format(what="model"))]


def test_a_meter_built_from_a_package_whose_init_the_copy_lacks(tmp_path):
    """4M: `import fourm.utils as utils`, then `metric_logger = utils.MetricLogger(...)`, whose log_every prints
    rank 0's lines (builtins.print silenced elsewhere); fourm/utils/__init__.py, which re-exports MetricLogger from
    logger.py, is not in the copy. The one module of that folder defining the class is the meter's class."""
    logger = ("class MetricLogger:\n    def __init__(self):\n        self.meters = {}\n"
              "    def update(self, **kw):\n        self.meters.update(kw)\n"
              "    def log_every(self, iterable, freq):\n        for i, x in enumerate(iterable):\n"
              "            yield x\n            if i % freq == 0:\n                print(self.meters)\n")
    dist_utils = ("import builtins\ndef setup_for_distributed(is_master):\n    builtin_print = builtins.print\n"
                  "    def print(*args, **kwargs):\n        if is_master:\n            builtin_print(*args, **kwargs)\n"
                  "    builtins.print = print\n")
    train = (SEEDED + "import pkg.utils as utils\nfrom pkg.utils.dist import setup_for_distributed\n"
             "setup_for_distributed(rank == 0)\nmodel = DDP(Net())\nmetric_logger = utils.MetricLogger()\n"
             "for x, y in metric_logger.log_every(loader, 10):\n    loss = criterion(model(x), y)\n"
             "    loss.backward()\n    opt.step()\n    metric_logger.update(loss=loss.item())\n")
    root = _project(tmp_path, {"train.py": train, "pkg/utils/logger.py": logger, "pkg/utils/dist.py": dist_utils})
    assert "rank0-local-loss" in [f.rule for f in audit.audit_paths([root])]
