"""Issue 35: classes of round 276-281's first look (docs/measured/cpu2/audit_heldout_round276.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (4cd208e)."""

from test_audit import _project
from test_audit_classes189 import _line
from test_audit_classes246 import HEAD, SEED_ONLY, STEP, _rules


def test_a_yacs_config_rank_in_capitals_guards(tmp_path):
    """GluonCV: launch.py sets `cfg.DDP_CONFIG.GPU_WORLD_RANK` in the spawned worker; the training function reads
    it: `if cfg.DDP_CONFIG.GPU_WORLD_RANK == 0: save_model(...)` is rank 0's save, and `if step % 10 == 0 and
    cfg.DDP_CONFIG.GPU_WORLD_RANK == 0: print(...loss...)` rank 0's log of its own loss. Under the distributed
    switch, true on every rank, the save is every rank's."""
    launch = ("import torch.distributed as dist\ndef launch_job(cfg, fn):\n    dist.init_process_group('gloo')\n"
              "    cfg.DDP_CONFIG.GPU_WORLD_RANK = dist.get_rank()\n    fn(cfg)\n")
    train = SEED_ONLY + ("from launch import launch_job\n"
                         "def save_model(model):\n    torch.save(model.module.state_dict(), 'ckpt.pth')\n"
                         "def main_worker(cfg):\n    model = DDP(torch.nn.Linear(2, 2))\n"
                         "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    for step in range(3):\n"
                         + "".join("    " + x + "\n" for x in STEP.splitlines()) +
                         "        if step % 10 == 0 and cfg.DDP_CONFIG.GPU_WORLD_RANK == 0:\n"
                         "            print('loss', loss.item())\n    if GUARD:\n        save_model(model)\n"
                         "launch_job(None, main_worker)\n")
    loud = train.replace("GUARD", "cfg.DDP_CONFIG.GPU_WORLD_RANK == 0")
    root = _project(tmp_path / "rank", {"train.py": loud, "launch.py": launch})
    assert not _rules(root, "save-on-every-rank")
    assert [h.line for h in _rules(root, "rank0-local-loss")] == [_line(loud, "print('loss'")]
    every = train.replace("GUARD", "cfg.DDP_CONFIG.DISTRIBUTED")
    assert _rules(_project(tmp_path / "every", {"train.py": every, "launch.py": launch}), "save-on-every-rank")


def test_a_log_text_built_with_len_is_no_loss(tmp_path):
    """GluonCV: `print_string = 'Epoch: [{0}][{1}/{2}]'.format(epoch, step + 1, len(dataloader))`, logged, then
    `print_string = 'loss: {loss:.5f}'.format(loss=losses.avg)`, logged: the finding is the loss line's log, not
    the first log of the block. A text that calls a loss function is still read as one."""
    train = SEED_ONLY + ("import logging\nlogging.basicConfig(level=logging.INFO)\nlogger = logging.getLogger()\n"
                         "dist.init_process_group('gloo')\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                         "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nloader = [torch.ones(2)]\n"
                         "for step, x in enumerate(loader):\n" + STEP + "    if dist.get_rank() == 0:\n"
                         "        print_string = 'Epoch: [{0}/{1}]'.format(step + 1, len(loader))\n"
                         "        logger.info(print_string)\n"
                         "        print_string = 'loss: {:.5f}'.format(loss.item())\n"
                         "        logger.info(print_string)\n")
    hits = _rules(_project(tmp_path / "p", {"train.py": train}), "rank0-local-loss")
    assert [h.line for h in hits] == [_line(train, "logger.info(print_string)") + 2]


def test_an_instance_record_fed_reduced_losses_and_a_reduced_result_s_field(tmp_path):
    """X-Temporal: reduce_update_metrics() all-reduces the loss before `self.metrics['losses'].update(
    reduced_loss.item())`, and train() logs `self.metrics['losses'].avg` on rank 0; evaluate() returns
    `Top1Metric(...)` built from all-reduced sums, and train() logs `metric.loss`. Neither is rank 0's own loss.
    Fed the unreduced loss, the record is."""
    helper = HEAD + (
        "class Meter:\n    def update(self, v):\n        self.avg = v\n"
        "class Top1Metric:\n    def __init__(self, top1, loss):\n        self.top1, self.loss = top1, loss\n"
        "class Helper:\n    def __init__(self, model):\n        self.model = DDP(model)\n"
        "        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)\n"
        "        self.metrics = {'losses': Meter()}\n        self.rank = dist.get_rank()\n"
        "    def reduce_update_metrics(self, loss):\n        reduced_loss = loss.clone()\nREDUCE"
        "        self.metrics['losses'].update(reduced_loss.item())\n"
        "    def evaluate(self):\n        loss_sum = torch.zeros(1)\n        total = torch.ones(1)\n"
        "        dist.all_reduce(loss_sum)\n        dist.all_reduce(total)\n"
        "        metric = Top1Metric(0.0, loss_sum.item() / total.item())\n        return metric\n"
        "    def train(self):\n        for it in range(3):\n            loss = self.model(torch.ones(2)).sum()\n"
        "            self.opt.zero_grad()\n            loss.backward()\n            self.opt.step()\n"
        "            self.reduce_update_metrics(loss)\n"
        "            if self.rank == 0:\n                print('loss', self.metrics['losses'].avg)\n"
        "            metric = self.evaluate()\n            if self.rank == 0:\n"
        "                print('val', metric.loss)\n")
    train = SEED_ONLY + ("from helper import Helper\ndist.init_process_group('gloo')\n"
                         "Helper(torch.nn.Linear(2, 2)).train()\n")
    quiet = helper.replace("REDUCE", "        dist.all_reduce(reduced_loss)\n")
    assert not _rules(_project(tmp_path / "quiet", {"train.py": train, "helper.py": quiet}), "rank0-local-loss")
    loud = helper.replace("REDUCE", "")
    hits = _rules(_project(tmp_path / "loud", {"train.py": train, "helper.py": loud}), "rank0-local-loss")
    assert [h.line for h in hits] == [_line(loud, "print('loss'")]


def test_a_model_picked_by_getattr_from_a_package_the_copies_lack(tmp_path):
    """HSAKD: `import models`, `model = getattr(models, args.arch)` with --arch resnet18_imagenet_aux, then `net =
    model(num_classes=1000)` wrapped in DDP: a ResNet has BatchNorm. A 'vit_base' arch is not judged."""
    train = SEED_ONLY + ("import argparse\nimport models\np = argparse.ArgumentParser()\n"
                         "p.add_argument('--arch', default='ARCH')\nargs = p.parse_args()\n"
                         "def main_worker(gpu):\n    dist.init_process_group('gloo')\n"
                         "    model = getattr(models, args.arch)\n    net = model(num_classes=1000)\n"
                         "    net = DDP(net)\nmain_worker(0)\n")
    loud = train.replace("ARCH", "resnet18_imagenet_aux")
    assert [h.line for h in _rules(_project(tmp_path / "loud", {"train.py": loud}), "batchnorm-without-sync")] == [
        _line(loud, "net = DDP(")]
    quiet = train.replace("ARCH", "vit_base")
    assert not _rules(_project(tmp_path / "quiet", {"train.py": quiet}), "batchnorm-without-sync")


def test_a_base_record_a_subclass_fills_by_key(tmp_path):
    """KAN-TTS: GAN_Trainer.train_step does `self.total_train_loss['train/' + k] += loss.item()`, and the base
    Trainer's check_log_interval, which only rank 0 runs, logs `self.total_train_loss[key]`: rank 0's own loss.
    Filled with a reduced value, it is not."""
    trainer = HEAD + (
        "from collections import defaultdict\nclass Trainer:\n    def __init__(self, model):\n"
        "        self.model = DDP(model)\n        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)\n"
        "        self.total_train_loss = defaultdict(float)\n        self.rank = dist.get_rank()\n"
        "    def check_log_interval(self):\n        for key in self.total_train_loss.keys():\n"
        "            print(f'{key} = {self.total_train_loss[key]:.4f}')\n"
        "        self.total_train_loss = defaultdict(float)\n"
        "    def train_epoch(self, loader):\n        for batch in loader:\n            self.train_step(batch)\n"
        "            if self.rank == 0:\n                self.check_log_interval()\n"
        "class GAN_Trainer(Trainer):\n    def train_step(self, batch):\n"
        "        gen_loss = self.model(batch).sum()\n        self.opt.zero_grad()\n        gen_loss.backward()\n"
        "        self.opt.step()\nREDUCE        self.total_train_loss['train/generator_loss'] += gen_loss.item()\n")
    train = SEED_ONLY + ("from trainer import GAN_Trainer\ndist.init_process_group('gloo')\n"
                         "GAN_Trainer(torch.nn.Linear(2, 2)).train_epoch([torch.ones(2)])\n")
    loud = trainer.replace("REDUCE", "")
    hits = _rules(_project(tmp_path / "loud", {"train.py": train, "trainer.py": loud}), "rank0-local-loss")
    assert [h.line for h in hits] == [_line(loud, "print(f'{key}")]
    quiet = trainer.replace("REDUCE", "        dist.all_reduce(gen_loss)\n")
    assert not _rules(_project(tmp_path / "quiet", {"train.py": train, "trainer.py": quiet}), "rank0-local-loss")


def test_rank_0_hands_the_wrapper_to_a_sampler_the_copies_lack(tmp_path):
    """LCT: `if rank == 0: with torch.no_grad(): sample = karras_sample(diffusion, generator, model, ...)` with
    karras_sample from a project module these files lack and `model` the DDP wrapper (its UNet has buffers):
    rank 0's forward broadcasts them alone. Handing `model.module` is fine."""
    train = SEED_ONLY + ("from models.karras_diffusion import karras_sample\nfrom models.unet import UNet\n"
                         "dist.init_process_group('gloo')\nrank = dist.get_rank()\nmodel = DDP(UNet())\n"
                         "for epoch in range(2):\n    if rank == 0:\n        with torch.no_grad():\n"
                         "            sample = karras_sample(None, None, MODEL, (4, 3, 32, 32))\n")
    loud = train.replace("MODEL", "model")
    assert [h.line for h in _rules(_project(tmp_path / "loud", {"train.py": loud}), "ddp-forward-under-rank0")] == [
        _line(loud, "karras_sample(None")]
    quiet = train.replace("MODEL", "model.module")
    assert not _rules(_project(tmp_path / "quiet", {"train.py": quiet}), "ddp-forward-under-rank0")


def test_captions_merged_by_video_and_a_logger_that_only_paces(tmp_path):
    """VidChapters: evaluate() iterates a padding DistributedSampler's loader through `metric_logger.log_every`
    (a MetricLogger nothing in evaluate() feeds), all_gathers its dict of captions by video id and merges it with
    `reduce(lambda a, b: a.update(b) or a, all_res, {})`: each video once, so the padding is not counted. Fed
    per-batch scores and synced, the logger counts every padded duplicate."""
    metrics = ("import torch, torch.distributed as dist\nclass MetricLogger:\n    def update(self, **kw):\n"
               "        self.kw = kw\n    def synchronize_between_processes(self):\n"
               "        t = torch.tensor([1.0])\n        dist.all_reduce(t)\n"
               "    def log_every(self, it, n):\n        for x in it:\n            yield x\n")
    util_dist = ("import torch, torch.distributed as dist\ndef all_gather(data):\n"
                 "    out = [None for _ in range(dist.get_world_size())]\n    dist.all_gather_object(out, data)\n"
                 "    return out\n")
    train = SEED_ONLY + (
        "from functools import reduce\nfrom torch.utils.data import DataLoader, DistributedSampler\n"
        "from util import dist as udist\nfrom util.metrics import MetricLogger\n"
        "dist.init_process_group('gloo')\nmodel = DDP(torch.nn.Linear(2, 2))\nval_set = list(range(5))\n"
        "val_loader = DataLoader(val_set, sampler=DistributedSampler(val_set, shuffle=False))\n"
        "def evaluate(model, data_loader):\n    metric_logger = MetricLogger()\n    res = {}\n"
        "    for vid, x in metric_logger.log_every(data_loader, 10):\nFEED"
        "        res[vid] = model(x).argmax().item()\nSYNC    all_res = udist.all_gather(res)\n"
        "    results = reduce(lambda a, b: a.update(b) or a, all_res, {})\n    return results\n"
        "for epoch in range(2):\n    evaluate(model, val_loader)\n")
    files = {"util/__init__.py": "", "util/dist.py": util_dist, "util/metrics.py": metrics}
    quiet = train.replace("FEED", "").replace("SYNC", "")
    assert not _rules(_project(tmp_path / "quiet", dict(files, **{"train.py": quiet})), "eval-padding-duplicates")
    loud = train.replace("FEED", "        metric_logger.update(acc=model(x).sum().item())\n").replace(
        "SYNC", "    metric_logger.synchronize_between_processes()\n")
    assert _rules(_project(tmp_path / "loud", dict(files, **{"train.py": loud})), "eval-padding-duplicates")
