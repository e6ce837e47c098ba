"""Issue 35: classes of mistakes fixed at the stop that labelled held-out batches 135-140: misses of earlier batches
fixed before that round's first look, then the classes the first look showed
(docs/measured/cpu2/audit_heldout_round135.txt), each quiet and loud."""

from pathlib import Path

from test_audit import DDP_HEAD, _project

from lab_utils.analysis import audit

SEEDED = DDP_HEAD + "torch.manual_seed(0)\n"


def _rules(found, path_end: str = "") -> list[str]:
    return [f.rule for f in found if f.path.endswith(path_end)]


def _places(finding) -> set[tuple[str, int]]:
    return {(Path(p).name, line) for p, line in ((finding.path, finding.line), *finding.related)}


CHECKPOINTER = ("import torch\n"
                "class Checkpointer:\n    def __init__(self, model, save_dir):\n{unwrap}"
                "        self.model = model\n        self.save_dir = save_dir\n"
                "    def save(self, name):\n        torch.save({{'model': self.model.state_dict()}}, name)\n"
                "class DetectronCheckpointer(Checkpointer):\n    def __init__(self, cfg, model, save_dir):\n"
                "        super().__init__(model, save_dir)\n")


def test_a_wrapper_handed_to_a_constructor_in_another_file(tmp_path):
    """FCOS, MaskTextSpotter, WaffleIron: `checkpointer = DetectronCheckpointer(cfg, model, out)` after `model =
    DDP(model)` in train_net.py; the base class keeps the parameter in `self.model`, and its save writes
    `self.model.state_dict()`: module. keys. The finding names where the wrapper was handed over. A constructor
    that unwraps first (fast-reid's `if isinstance(model, DistributedDataParallel): model = model.module`) is
    quiet."""
    train = (SEEDED + "from checkpoint import DetectronCheckpointer\nmodel = DDP(Net())\n"
             "checkpointer = DetectronCheckpointer(cfg, model, 'out')\nif rank == 0:\n"
             "    checkpointer.save('model_final')\n")
    loud = audit.audit_paths([_project(tmp_path / "l", {
        "train.py": train, "checkpoint.py": CHECKPOINTER.format(unwrap="")})])
    found = [f for f in loud if f.rule == "save-without-module"]
    assert found and found[0].path.endswith("checkpoint.py") and "train.py:10" in found[0].message, found
    quiet = audit.audit_paths([_project(tmp_path / "q", {"train.py": train, "checkpoint.py": CHECKPOINTER.format(
        unwrap="        if isinstance(model, DistributedDataParallel):\n            model = model.module\n")})])
    assert "save-without-module" not in _rules(quiet)


def test_a_save_that_tries_the_module_first(tmp_path):
    """MotionDiffuse: `try: state['encoder'] = self.encoder.module.state_dict() except: state['encoder'] =
    self.encoder.state_dict()`: the handler runs only when nothing is wrapped. Saving the wrapper's state_dict
    without the try is loud."""
    body = ("class Trainer:\n    def __init__(self, encoder):\n        self.encoder = encoder\n"
            "    def save(self, name):\n        state = {{}}\n{save}        torch.save(state, name)\n")
    tried = ("        try:\n            state['encoder'] = self.encoder.module.state_dict()\n"
             "        except AttributeError:\n            state['encoder'] = self.encoder.state_dict()\n")
    train = (SEEDED + "from trainer import Trainer\nmodel = DDP(Net())\nt = Trainer(model)\n"
             "if rank == 0:\n    t.save('x')\n")
    quiet = _project(tmp_path / "q", {"train.py": train, "trainer.py": "import torch\n" + body.format(save=tried)})
    assert "save-without-module" not in _rules(audit.audit_paths([quiet]))
    loud = _project(tmp_path / "l", {"train.py": train, "trainer.py": "import torch\n" + body.format(
        save="        state['encoder'] = self.encoder.state_dict()\n")})
    assert "save-without-module" in _rules(audit.audit_paths([loud]))


def test_accumulation_where_the_gradients_are_all_reduced_by_hand(tmp_path):
    """DialoGPT: no DDP wrap; the script all-reduces the `.grad`s itself once per optimizer step, so no backward
    all-reduces and no_sync has nothing to skip. With a DDP wrap it is loud, and names the backward line."""
    loop = ("for step, x in enumerate(loader):\n    loss = model(x).mean()\n    loss.backward()\n"
            "    if step % args.gradient_accumulation_steps == 0:\n{sync}        opt.step()\n        opt.zero_grad()\n")
    by_hand = ("        grads = [p.grad.data for p in model.parameters()]\n"
               "        for g in grads:\n            dist.all_reduce(g)\n")
    quiet = SEEDED + "model = Net()\n" + loop.format(sync=by_hand)
    assert "accumulation-without-no-sync" not in _rules(audit.audit_paths([_project(tmp_path / "q", {
        "train.py": quiet})]))
    loud = [f for f in audit.audit_paths([_project(tmp_path / "l", {
        "train.py": SEEDED + "model = DDP(Net())\n" + loop.format(sync="")})])
            if f.rule == "accumulation-without-no-sync"]
    assert loud and ("train.py", 11) in _places(loud[0]), loud


def test_an_lr_scaling_helper_names_where_it_is_called(tmp_path):
    """FSCIL: `lr_scaler(cfg, batch_size)` multiplies the lr by get_world_size() in utils.py; the finding also
    names the call in the model file that builds the optimizer from it."""
    utils = ("import torch.distributed as dist\ndef lr_scaler(cfg, batch_size):\n"
             "    cfg.lr = cfg.lr * batch_size * dist.get_world_size() / 1024.0\n    return cfg\n")
    train = (SEEDED + "from utils import lr_scaler\nmodel = DDP(Net())\ncfg = lr_scaler(cfg, 256)\n"
             "opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)\n")
    found = [f for f in audit.audit_paths([_project(tmp_path, {"utils.py": utils, "train.py": train})])
             if f.rule == "lr-grows-with-world-size"]
    assert found and ("train.py", 10) in _places(found[0]) and ("utils.py", 3) in _places(found[0]), found


def test_a_set_epoch_that_runs_once_where_the_loader_is_built(tmp_path):
    """SEMamba: `sampler.set_epoch(cfg['training_cfg']['training_epochs'])` in create_dataloader, called once
    before the epoch loop: every epoch repeats one order. The same call in the epoch loop is quiet."""
    build = ("def create_dataloader(ds, cfg):\n    sampler = DistributedSampler(ds)\n{once}"
             "    return DataLoader(ds, sampler=sampler)\n")
    loop = ("loader = create_dataloader(ds, cfg)\nmodel = DDP(Net())\nfor epoch in range(10):\n{each}"
            "    for x in loader:\n        model(x).mean().backward()\n")
    loud = SEEDED + build.format(once="    sampler.set_epoch(cfg['training_cfg']['training_epochs'])\n") + \
        loop.format(each="")
    quiet = SEEDED + build.format(once="") + loop.format(each="    loader.sampler.set_epoch(epoch)\n")
    found = [f for f in audit.audit_paths([_project(tmp_path / "l", {"train.py": loud})])
             if f.rule == "set-epoch-missing"]
    assert found and "runs once" in found[0].message and ("train.py", 10) in _places(found[0]), found
    assert "set-epoch-missing" not in _rules(audit.audit_paths([_project(tmp_path / "q", {"train.py": quiet})]))


SPAWNED = ("import torch, torch.multiprocessing as mp, torch.distributed as dist\n"
           "from torch.nn.parallel import DistributedDataParallel as DDP\n{top}"
           "def worker(rank):\n    dist.init_process_group('gloo', rank=rank, world_size=2)\n"
           "    model = DDP(Net())\nif __name__ == '__main__':\n{guarded}    mp.spawn(worker, nprocs=2)\n")


def test_a_top_level_seed_runs_again_in_every_spawned_worker(tmp_path):
    """MVSFormer: `torch.manual_seed(SEED)` under the imports, outside the main guard: each spawned worker
    re-imports the script as __mp_main__ and runs it, so the workers are seeded. The same seed inside the main
    guard seeds the parent only."""
    quiet = SPAWNED.format(top="SEED = 123\ntorch.manual_seed(SEED)\n", guarded="")
    loud = SPAWNED.format(top="", guarded="    torch.manual_seed(123)\n")
    assert "seed-before-spawn" not in _rules(audit.audit_paths([_project(tmp_path / "q", {"train.py": quiet})]))
    assert "seed-before-spawn" in _rules(audit.audit_paths([_project(tmp_path / "l", {"train.py": loud})]))


PROGRESS = ("import sys\nclass Logger:\n    def __init__(self, rank=0):\n        self.rank = rank\n"
            "    def add_line(self, content):\n        if self.rank == 0:\n            print(content)\n"
            "            sys.stdout.flush()\n"
            "class AverageMeter:\n    def __init__(self, name):\n        self.name, self.val = name, 0\n"
            "    def update(self, val, n=1):\n        self.val = val\n"
            "    def __str__(self):\n        return f'{self.name} {self.val}'\n"
            "class ProgressMeter:\n    def __init__(self, meters, logger=None, tb_writter=None):\n"
            "        self.meters, self.logger, self.tb_writter = meters, logger, tb_writter\n"
            "    def display(self, batch):\n        line = '\\t'.join(str(m) for m in self.meters)\n"
            "        if self.logger is None:\n            print(line)\n        else:\n"
            "            self.logger.add_line(line)\n        if self.tb_writter is not None:\n"
            "            for m in self.meters:\n                self.tb_writter.add_scalar(m.name, m.val, batch)\n")


def test_a_progress_meter_that_hands_its_line_to_a_rank0_logger(tmp_path):
    """DepthContrast, AVID-CMA: `progress = utils.logger.ProgressMeter(..., [loss_meter], logger=logger)`, whose
    display prints only without a logger and otherwise hands the line to Logger.add_line, which prints on rank 0:
    rank 0 logs its own micro-batch's loss (not every rank). A meter fed the all-reduced loss is quiet."""
    train = (SEEDED + "import utils.logger\nfrom utils.logger import AverageMeter, Logger\n"
             "logger = Logger(rank=rank)\nmodel = DDP(Net())\nloss_meter = AverageMeter('Loss')\n"
             "progress = utils.logger.ProgressMeter([loss_meter], logger=logger, tb_writter=None)\n"
             "for i, x in enumerate(loader):\n    loss = model(x).mean()\n    loss.backward()\n{sync}"
             "    loss_meter.update({value})\n    progress.display(i)\n")
    files = {"utils/__init__.py": "", "utils/logger.py": PROGRESS}
    loud = _rules(audit.audit_paths([_project(tmp_path / "l", {**files, "train.py": train.format(
        sync="", value="loss.item()")})]))
    assert "rank0-local-loss" in loud and "every-rank-prints-loss" not in loud, loud
    quiet = _rules(audit.audit_paths([_project(tmp_path / "q", {**files, "train.py": train.format(
        sync="    reduced = loss.detach().clone()\n    dist.all_reduce(reduced)\n    reduced /= world_size\n",
        value="reduced.item()")})]))
    assert "rank0-local-loss" not in quiet and "every-rank-prints-loss" not in quiet, quiet


def test_a_save_under_a_decorator_that_runs_it_on_rank0(tmp_path):
    """SALMONN: `@main_process def save_checkpoint(self, ...)`, the project's decorator calling the function only
    when `rank == 0`: one writer. Without the decorator every rank writes."""
    dist_utils = ("import functools, torch.distributed as dist\ndef get_dist_info():\n"
                  "    return dist.get_rank(), dist.get_world_size()\n"
                  "def main_process(func):\n    @functools.wraps(func)\n    def wrapper(*args, **kwargs):\n"
                  "        rank, _ = get_dist_info()\n        if rank == 0:\n            return func(*args, **kwargs)\n"
                  "    return wrapper\n")
    runner = ("import torch\nfrom dist_utils import main_process\nclass Runner:\n    def __init__(self, model):\n"
              "        self.model = model\n{deco}    def save_checkpoint(self, epoch):\n"
              "        torch.save(self.model.module.state_dict(), f'ckpt_{{epoch}}.pth')\n"
              "    def train(self):\n        for epoch in range(3):\n            self.save_checkpoint(epoch)\n")
    train = SEEDED + "from runner import Runner\nrunner = Runner(DDP(Net()))\nrunner.train()\n"
    quiet = _project(tmp_path / "q", {"dist_utils.py": dist_utils, "train.py": train,
                                      "runner.py": runner.format(deco="    @main_process\n")})
    loud = _project(tmp_path / "l", {"dist_utils.py": dist_utils, "train.py": train,
                                     "runner.py": runner.format(deco="")})
    assert "save-on-every-rank" not in _rules(audit.audit_paths([quiet]))
    assert "save-on-every-rank" in _rules(audit.audit_paths([loud]))


def test_a_private_method_nothing_names(tmp_path):
    """MVSFormer: `_resume_checkpoint`'s torch.load without map_location, whose one call is commented out: the
    run never executes it. Called, it is loud."""
    base = ("import torch\nimport torch.distributed as dist\nclass BaseTrainer:\n"
            "    def __init__(self, model, resume=None):\n        self.model, self.rank = model, dist.get_rank()\n"
            "{call}    def _resume_checkpoint(self, path):\n"
            "        ckpt = torch.load(path)\n        self.model.load_state_dict(ckpt['state_dict'])\n")
    train = SEEDED + "from base_trainer import BaseTrainer\nBaseTrainer(DDP(Net()), resume=args.resume)\n"
    quiet = _project(tmp_path / "q", {"train.py": train, "base_trainer.py": base.format(
        call="        # self._resume_checkpoint(resume)\n")})
    loud = _project(tmp_path / "l", {"train.py": train, "base_trainer.py": base.format(
        call="        self._resume_checkpoint(resume)\n")})
    assert "load-without-map-location" not in _rules(audit.audit_paths([quiet]))
    assert "load-without-map-location" in _rules(audit.audit_paths([loud]))


def test_a_config_get_whose_key_no_yaml_sets(tmp_path):
    """SEMamba: `if cfg['training_cfg'].get('use_pretrainedD', False): ... torch.load(...)` and the recipe YAML
    never sets the key: the default run skips the load. A YAML that turns it on makes it loud."""
    train = (SEEDED + "import yaml\ncfg = yaml.safe_load(open('recipe.yaml'))\nmodel = DDP(Net())\n"
             "if cfg['training_cfg'].get('use_pretrainedD', False):\n"
             "    model.module.load_state_dict(torch.load('ckpts/pretrained_discriminator.pth'))\n")
    quiet = _project(tmp_path / "q", {"train.py": train, "recipe.yaml": "training_cfg:\n  batch_size: 4\n"})
    loud = _project(tmp_path / "l", {"train.py": train,
                                     "recipe.yaml": "training_cfg:\n  batch_size: 4\n  use_pretrainedD: true\n"})
    assert "load-without-map-location" not in _rules(audit.audit_paths([quiet]))
    assert "load-without-map-location" in _rules(audit.audit_paths([loud]))


def test_an_accumulation_count_over_the_divided_batch(tmp_path):
    """SatlasPretrain: `batch_size = cfg['BatchSize'] // world_size` and `accumulate_freq =
    cfg['EffectiveBatchSize'] // batch_size // world_size`: micro x accum x world_size is the target at any world
    size. Both divided from their own totals shrinks the global batch."""
    src = SEEDED + "batch_size = cfg['BatchSize'] // world_size\naccumulate_freq = {accum}\nmodel = DDP(Net())\n"
    quiet = src.format(accum="cfg['EffectiveBatchSize'] // batch_size // world_size")
    loud = src.format(accum="cfg['AccumulateSteps'] // world_size")
    assert "batch-and-accum-divided" not in _rules(audit.audit_paths([_project(tmp_path / "q", {"train.py": quiet})]))
    assert "batch-and-accum-divided" in _rules(audit.audit_paths([_project(tmp_path / "l", {"train.py": loud})]))


def test_an_accumulation_count_a_registry_built_task_is_handed(tmp_path):
    """TimeChat: `_train_inner_loop(..., accum_grad_iters=1)` gets train_epoch's parameter, which the runner hands
    `self.accum_grad_iters` (its YAML's run_cfg key, 4) through `self.task.train_epoch(...)` on a task its
    registry builds: the parameter's callers decide, not its default. With no YAML key (MiniGPT-4) it is 1."""
    task = ("import torch\nclass BaseTask:\n    def train_epoch(self, model, loader, opt, accum_grad_iters=1):\n"
            "        return self._train_inner_loop(model, loader, opt, accum_grad_iters=accum_grad_iters)\n"
            "    def _train_inner_loop(self, model, loader, opt, accum_grad_iters=1):\n"
            "        for i, x in enumerate(loader):\n            loss = model(x).mean()\n"
            "            loss.backward()\n            if (i + 1) % accum_grad_iters == 0:\n"
            "                opt.step()\n                opt.zero_grad()\n")
    runner = ("class Runner:\n    def __init__(self, config, task, model):\n"
              "        self.config, self.task, self.model = config, task, model\n    @property\n"
              "    def accum_grad_iters(self):\n        return int(self.config.run_cfg.get('accum_grad_iters', 1))\n"
              "    def train(self, loader, opt):\n"
              "        self.task.train_epoch(self.model, loader, opt, accum_grad_iters=self.accum_grad_iters)\n")
    train = (SEEDED + "from runner import Runner\nimport tasks\nmodel = DDP(Net())\n"
             "runner = Runner(cfg, tasks.setup_task(cfg), model)\nrunner.train(loader, opt)\n")
    files = {"tasks/__init__.py": "from tasks.base_task import BaseTask\n", "tasks/base_task.py": task,
             "runner.py": runner, "train.py": train}
    loud = _project(tmp_path / "l", {**files, "configs/train.yaml": "run:\n  accum_grad_iters: 4\n"})
    quiet = _project(tmp_path / "q", {**files, "configs/train.yaml": "run:\n  batch_size_train: 4\n"})
    assert "accumulation-without-no-sync" in _rules(audit.audit_paths([loud]))
    assert "accumulation-without-no-sync" not in _rules(audit.audit_paths([quiet]))


def test_a_forward_that_returns_logits_reduces_no_loss(tmp_path):
    """MoCo (once `moco.builder.MoCo(...)` resolves to its class): the forward gathers the keys for shuffle-BN and
    hands each rank back its own rows (`return x_gather[idx_this]`), then returns logits: the loss the script
    computes from them is this rank's own, and rank 0's print shows it. A forward that returns a loss it
    all-reduced (Barlow Twins) logs the global value."""
    builder = ("import torch, torch.distributed as dist\ndef concat_all_gather(t):\n"
               "    out = [torch.zeros_like(t) for _ in range(2)]\n    dist.all_gather(out, t)\n"
               "    return torch.cat(out)\nclass MoCo(torch.nn.Module):\n    def _unshuffle(self, x, idx):\n"
               "        x_gather = concat_all_gather(x)\n        return x_gather[idx]\n"
               "    def forward(self, q, k, idx):\n        k = self._unshuffle(k, idx)\n{ret}")
    train = (SEEDED + "import builtins\nimport moco.builder\nif rank != 0:\n"
             "    builtins.print = lambda *a, **k: None\nmodel = moco.builder.MoCo()\nmodel = DDP(model)\n"
             "for q, k, idx in loader:\n{use}    loss.backward()\n    print(f'loss {{loss.item()}}')\n")
    logits = (builder.format(ret="        logits = q @ k.T\n        return logits, torch.zeros(len(q))\n"),
              train.format(use="    output, target = model(q, k, idx)\n    loss = criterion(output, target)\n"))
    reduced = (builder.format(ret="        loss = (q @ k.T).mean()\n        dist.all_reduce(loss)\n"
                                  "        return loss\n"),
               train.format(use="    loss = model(q, k, idx)\n"))
    for (b, t), expect in ((logits, True), (reduced, False)):
        found = _rules(audit.audit_paths([_project(tmp_path / str(expect), {
            "moco/__init__.py": "", "moco/builder.py": b, "train.py": t})]))
        assert ("rank0-local-loss" in found) == expect, (expect, found)


def test_a_port_option_names_the_init_method_line(tmp_path):
    """USB: `--dist-url` defaults to 'tcp://127.0.0.1:11111' and `dist.init_process_group(\\n backend=...,\\n
    init_method=args.dist_url, ...)` spans lines: the finding names the init_method line too."""
    train = ("import argparse, torch, torch.distributed as dist\nfrom torch.nn.parallel import "
             "DistributedDataParallel as DDP\np = argparse.ArgumentParser()\n"
             "p.add_argument('--dist-url', default='tcp://127.0.0.1:11111', type=str)\nargs = p.parse_args()\n"
             "torch.manual_seed(0)\ndist.init_process_group(\n    backend='nccl',\n    init_method=args.dist_url,\n"
             "    world_size=2, rank=0)\nmodel = DDP(Net())\n")
    found = [f for f in audit.audit_paths([_project(tmp_path, {"train.py": train})])
             if f.rule == "hard-coded-master-port"]
    assert found and ("train.py", 9) in _places(found[0]), found


def test_an_iterator_remade_after_set_epoch_when_it_runs_out(tmp_path):
    """CoMatch: train() makes `it = iter(labeled_loader)` once, then `except StopIteration:
    labeled_loader.sampler.set_epoch(...)`, `it = iter(labeled_loader)`: the new iterator draws the new order.
    Without the re-made iterator, the set_epoch inside the loop reaches nothing."""
    body = (SEEDED + "model = DDP(Net())\nsampler = DistributedSampler(ds)\nlabeled_loader = DataLoader(ds, "
            "sampler=sampler)\ndef train(epoch):\n    sampler.set_epoch(epoch)\n"
            "    it = iter(labeled_loader)\n    for i, u in enumerate(unlabeled):\n        try:\n"
            "            x = next(it)\n        except StopIteration:\n"
            "            labeled_loader.sampler.set_epoch(epoch * 100 + i)\n{remake}"
            "            x = next(it)\n        model(x).mean().backward()\nfor epoch in range(3):\n    train(epoch)\n")
    quiet = body.format(remake="            it = iter(labeled_loader)\n")
    loud = body.format(remake="")
    assert "set-epoch-late" not in _rules(audit.audit_paths([_project(tmp_path / "q", {"train.py": quiet})]))
    assert "set-epoch-late" in _rules(audit.audit_paths([_project(tmp_path / "l", {"train.py": loud})]))
