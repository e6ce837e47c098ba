"""Issue 35: classes of round 159-164's first look (docs/measured/cpu2/audit_heldout_round159.txt) and of the rounds
after it, fixed after their first looks, each quiet and loud."""

from test_audit import _project, rules
from test_audit_classes135 import SEEDED

from lab_utils.analysis import audit


def _rules(found, name: str | None = None) -> list[str]:
    return [f.rule for f in found if name is None or f.path.endswith(name)]


EVAL = (SEEDED + "from torch.utils.data import DataLoader, DistributedSampler\n{imports}"
        "model = DDP(Net())\nval_set = Data()\nval_loader = DataLoader(val_set, sampler=DistributedSampler(val_set, "
        "shuffle=False))\ndef run_val(model, val_loaders):\n    val_result = []\n"
        "    for name, val_loader in zip(['val'], val_loaders):\n        result = inference(model, val_loader)\n"
        "        val_result.append(result)\n    values = []\n    for each in val_result:\n"
        "        values.append(each[0])\n    gathered = all_gather(torch.tensor(values).cpu())\n"
        "    gathered = [t.view(-1) for t in gathered]\n    valid = torch.cat(gathered)\n"
        "    val_result = float(valid[valid >= 0].mean())\n    return val_result\n"
        "run_val(model, [val_loader])\n")
OWN = ("def inference(model, loader):\n    correct = torch.zeros(1)\n    for x, y in loader:\n"
       "        correct += (model(x).argmax(1) == y).sum()\n    return (correct / len(loader.dataset),)\n")


def test_a_metric_an_unseen_evaluation_returned_is_not_a_count_of_the_padding(tmp_path):
    """maskrcnn-benchmark's scene-graph trainers (Scene-Graph-Benchmark, PySGG, CAPN): `dataset_result =
    inference(cfg, model, loader, ...)` from maskrcnn_benchmark/engine/inference.py, a file their copies lack, then
    the per-rank results are all_gathered: whether the padded duplicates are counted is decided inside inference
    (which gathers the predictions keyed by image id), so no finding. The same loop over the project's own
    inference, which counts each rank's padded shard, is the finding."""
    unseen = EVAL.format(imports="from maskrcnn_benchmark.engine.inference import inference\n"
                                 "from maskrcnn_benchmark.utils.comm import all_gather\n")
    quiet = _project(tmp_path / "q", {"train.py": unseen})
    assert "eval-padding-duplicates" not in _rules(audit.audit_paths([quiet]))
    own = EVAL.format(imports="from comm import all_gather\nfrom engine import inference\n")
    loud = _project(tmp_path / "l", {"train.py": own, "engine.py": "import torch\n" + OWN,
                                     "comm.py": "import torch.distributed as dist\ndef all_gather(t):\n"
                                                "    out = [t.clone() for _ in range(2)]\n"
                                                "    dist.all_gather(out, t)\n    return out\n"})
    assert "eval-padding-duplicates" in _rules(audit.audit_paths([loud])), [
        (f.rule, f.line) for f in audit.audit_paths([loud])]


def test_a_switch_handed_to_a_parameter_is_not_a_rank():
    """OpenDCVC: `train_one_epoch(..., distributed=(args.local_rank != -1))`, then `if distributed:
    dist.all_reduce(stats)` inside: true on every rank of the DDP run, so every rank joins the collective. A
    parameter handed the rank's own test (`args.local_rank != 0`) is every rank but 0: the others never join."""
    body = (SEEDED + "import argparse\nparser = argparse.ArgumentParser()\n"
            "parser.add_argument('--local_rank', type=int, default=-1)\nargs = parser.parse_args()\n"
            "args.local_rank = int(os.environ['LOCAL_RANK'])\n"
            "def train_one_epoch(model, loader, distributed=False):\n    total = 0.0\n    for x in loader:\n"
            "        total += float(model(x).mean())\n    if distributed:\n        t = torch.tensor([total])\n"
            "        dist.all_reduce(t)\n        total = t.item()\n    return total\n"
            "model = DDP(Net())\ntrain_one_epoch(model, loader, distributed=(args.local_rank {op}))\n")
    assert "collective-under-rank0" not in _rules(audit.audit_source(body.format(op="!= -1")))
    assert "collective-under-rank0" in _rules(audit.audit_source(body.format(op="!= 0")))
    # ... and `not distributed or (distributed and dist.get_rank() == 0)` stays rank 0's guard: the running loss
    # printed under it is rank 0's own
    shown = body.replace("        total += float(model(x).mean())\n", "        loss = model(x).mean()\n"
                         "        total += loss.item()\n        if not distributed or (distributed and "
                         "dist.get_rank() == 0):\n            print(loss.item())\n        loss.backward()\n")
    assert "rank0-local-loss" in _rules(audit.audit_source(shown.format(op="!= -1")))


def test_a_classmethod_reaches_its_class_through_cls(tmp_path):
    """ffcv-imagenet: `ImageNetTrainer.launch_from_args()` spawns `cls._exec_wrapper`, which calls `cls.exec(...)`,
    which builds `trainer = cls(gpu=gpu)` and calls `trainer.train()`; the model is built and wrapped in a method
    its __init__ calls. A seed there is the run's seed; without one, the no-seed finding names the wrap."""
    text = ("import torch, torch.distributed as dist, torch.multiprocessing as mp\n"
            "from torch.nn.parallel import DistributedDataParallel as DDP\n"
            "class Trainer:\n    def __init__(self, gpu):\n        self.gpu = gpu\n"
            "        dist.init_process_group('gloo', rank=gpu, world_size=2)\n{seed}"
            "        self.model = self.create_model()\n"
            "    def create_model(self):\n        model = torch.nn.Linear(4, 4)\n"
            "        model = DDP(model)\n        return model\n"
            "    def train(self):\n        self.model(torch.ones(1, 4)).sum().backward()\n"
            "    @classmethod\n    def launch(cls):\n        mp.spawn(cls._exec_wrapper, nprocs=2)\n"
            "    @classmethod\n    def _exec_wrapper(cls, *args):\n        cls.exec(*args)\n"
            "    @classmethod\n    def exec(cls, gpu):\n        trainer = cls(gpu=gpu)\n        trainer.train()\n"
            "if __name__ == '__main__':\n    Trainer.launch()\n")
    seeded = _project(tmp_path / "q", {"train.py": text.format(seed="        torch.manual_seed(0)\n")})
    assert "no-seed" not in _rules(audit.audit_paths([seeded]))
    bare = audit.audit_paths([_project(tmp_path / "l", {"train.py": text.format(seed="")})])
    found = [f for f in bare if f.rule == "no-seed"]
    assert found and any(line == 10 for _, line in found[0].related), [(f.rule, f.line, f.related) for f in bare]


ALIASED = ("import torch.distributed as dist\n"
           "class MetricLogger:\n    def __init__(self):\n        self.meters = {}\n"
           "    def update(self, **kwargs):\n        for k, v in kwargs.items():\n            self.meters[k] = v\n"
           "    def __str__(self):\n        return str(self.meters)\n"
           "    def log_every(self, iterable, print_freq):\n        print_func = {bound}\n"
           "        for i, obj in enumerate(iterable):\n            yield obj\n"
           "            if i % print_freq == 0 and dist.get_rank() == 0:\n                print_func(str(self))\n")


def test_a_meter_prints_through_a_local_alias_of_print(tmp_path):
    """eP-ALM's ALBEF-style MetricLogger.log_every: `print_func = print` (or the accelerator's print), then
    `print_func(log_msg.format(..., meters=str(self)))` on rank 0: the meter fed `loss.item()` every step is rank 0's
    own loss on the console. A name bound to something that is no log (`self.meters.get`) prints nothing."""
    train = (SEEDED + "from logger import MetricLogger\nmodel = DDP(Net())\nlogger = MetricLogger()\n"
             "for x, y in logger.log_every(loader, 10):\n    loss = criterion(model(x), y)\n"
             "    loss.backward()\n    opt.step()\n    logger.update(loss=loss.item())\n")
    loud = audit.audit_paths([_project(tmp_path / "l", {"train.py": train, "logger.py": ALIASED.replace(
        "{bound}", "print")})])
    assert "rank0-local-loss" in _rules(loud), [(f.rule, f.line) for f in loud]
    quiet = audit.audit_paths([_project(tmp_path / "q", {"train.py": train, "logger.py": ALIASED.replace(
        "{bound}", "self.meters.get")})])
    assert "rank0-local-loss" not in _rules(quiet)


def test_a_loader_gone_over_once_has_no_epoch_to_repeat():
    """FADA's iteration-based training: `for i, (src, tgt) in enumerate(zip(src_loader, tgt_loader))`, once, in no
    loop (the datasets are sized to the iterations): one pass is one epoch, so no set_epoch is missing. The same
    pass inside an epoch loop repeats epoch 0's order."""
    body = ("src_sampler = DistributedSampler(src)\ntgt_sampler = DistributedSampler(tgt)\n"
            "src_loader = DataLoader(src, sampler=src_sampler)\ntgt_loader = DataLoader(tgt, sampler=tgt_sampler)\n"
            "model = DDP(Net())\ndef train():\n{loop}")
    once = "    for i, (s, t) in enumerate(zip(src_loader, tgt_loader)):\n        model(s).sum().backward()\ntrain()\n"
    assert "set-epoch-missing" not in rules(body.format(loop=once))
    epochs = ("    for epoch in range(10):\n        for i, (s, t) in enumerate(zip(src_loader, tgt_loader)):\n"
              "            model(s).sum().backward()\ntrain()\n")
    assert "set-epoch-missing" in rules(body.format(loop=epochs))
    called = once.replace("train()\n", "for epoch in range(10):\n    train()\n")
    assert "set-epoch-missing" in rules(body.format(loop=called))


def test_a_torchvision_backbone_built_in_a_project_class_has_batchnorm(tmp_path):
    """EZ-VSL: `self.imgnet = resnet18(pretrained=True)` with `from torchvision.models import resnet18`, in the
    __init__ of the class the script wraps in DDP: the ResNet's BatchNorm2d layers normalise each rank's half-batch.
    A ViT backbone (no BatchNorm) is quiet, and so is a Faster R-CNN (its backbone's norm is frozen)."""
    model = ("import torch.nn as nn\nfrom torchvision.models{sub} import {arch}\nclass Net(nn.Module):\n"
             "    def __init__(self):\n        super().__init__()\n        self.imgnet = {arch}(pretrained=True)\n"
             "    def forward(self, x):\n        return self.imgnet(x)\n")
    train = SEEDED + "from model import Net\nmodel = DDP(Net())\nfor x in loader:\n    model(x).sum().backward()\n"

    def found(sub, arch, name):
        return _rules(audit.audit_paths([_project(tmp_path / name, {"train.py": train, "model.py": model.format(
            sub=sub, arch=arch)})]))
    assert "batchnorm-without-sync" in found("", "resnet18", "r")
    assert "batchnorm-without-sync" not in found("", "vit_b_16", "v")
    assert "batchnorm-without-sync" not in found(".detection", "fasterrcnn_resnet50_fpn", "d")


def test_a_gathered_value_only_read_out_misses_no_gradient():
    """DPO's all_gather_if_needed: a plain all_gather helper whose every caller only reads the result out
    (`metrics['rewards'] = rewards.cpu().numpy().tolist()`, generated tokens to `tokenizer.batch_decode`): nothing
    it returns enters a loss, so its missing gradient has no consequence. A caller that puts the gathered features
    into the loss it backwards is the finding."""
    body = ("def gather(values):\n    out = [torch.empty_like(values) for _ in range(world_size)]\n"
            "    dist.all_gather(out, values)\n    return torch.cat(out)\n"
            "model = DDP(Net())\nfor x in loader:\n    feats = model(x)\n{use}    loss.backward()\n")
    read = ("    loss = feats.pow(2).mean()\n    rewards = gather(feats)\n"
            "    metrics = {'rewards': rewards.cpu().numpy().tolist()}\n")
    assert "gather-without-grad" not in rules(body.format(use=read))
    used = "    everyone = gather(feats)\n    loss = (feats @ everyone.T).logsumexp(1).mean()\n"
    assert "gather-without-grad" in rules(body.format(use=used))


def test_how_often_and_under_which_key_a_loss_is_logged_is_no_loss():
    """img2pose: `running_losses[loss_name] / self.tensorboard_loss_every` written on the main process, the losses
    reduced first (reduce_dict): `tensorboard_loss_every` (a step count) and `loss_name` (a key) are no loss values
    left unreduced. The same log of a loss nothing reduced is the finding."""
    body = ("def reduce_dict(d):\n    for v in d.values():\n        dist.all_reduce(v)\n    return d\n"
            "model = DDP(Net())\nrunning_losses = {{}}\ntensorboard_loss_every = 10\n"
            "for step, x in enumerate(loader):\n    losses = model(x)\n    loss = sum(losses.values())\n"
            "    loss.backward()\n    opt.step()\n{reduce}    for loss_name in losses.keys():\n"
            "        running_losses[loss_name] = losses[loss_name].item()\n"
            "    if step % tensorboard_loss_every == 0 and rank == 0:\n"
            "        for loss_name in running_losses.keys():\n"
            "            writer.add_scalar(loss_name, running_losses[loss_name] / tensorboard_loss_every, step)\n")
    assert "rank0-local-loss" not in rules(body.format(reduce="    losses = reduce_dict(losses)\n"))
    assert "rank0-local-loss" in rules(body.format(reduce=""))


def test_wandb_switched_off_except_on_rank0_logs_rank0s_loss():
    """RoMa: `wandb_mode = "online" if wandb_log and rank == 0 else "disabled"`, `wandb.init(..., mode=wandb_mode)`:
    every rank calls wandb.log(loss), and the dashboard gets rank 0's own micro-batch loss. A run that every rank
    logs to (no rank in the mode) is not rank 0's alone."""
    body = ("import wandb\nwandb_mode = 'online' if args.log and rank == 0 else {off}\n"
            "wandb.init(project='p', mode=wandb_mode)\nmodel = DDP(Net())\nfor x in loader:\n"
            "    loss = model(x).mean()\n    loss.backward()\n    opt.step()\n    wandb.log({{'loss': loss.item()}})\n")
    assert "rank0-local-loss" in rules(body.format(off="'disabled'"))
    assert "rank0-local-loss" not in rules(body.format(off="'online'"))


def test_a_sum_loss_stored_and_never_read_steps_nothing():
    """img2pose's Config keeps `self.pose_loss = MSELoss(reduction="sum")`, which no line reads again: no loss it
    would compute reaches a backward. The same object called in the training loop is the finding."""
    body = ("class Config:\n    def __init__(self):\n        self.pose_loss = torch.nn.MSELoss(reduction='sum')\n"
            "cfg = Config()\nmodel = DDP(Net())\nfor x, y in loader:\n{loss}    loss.backward()\n    opt.step()\n")
    assert "sum-loss-unscaled" not in rules(body.format(loss="    loss = (model(x) - y).pow(2).mean()\n"))
    assert "sum-loss-unscaled" in rules(body.format(loss="    loss = cfg.pose_loss(model(x), y)\n"))


def test_a_builder_asked_without_its_distributed_arm_pads_nothing(tmp_path):
    """eP-ALM: `get_loader(..., mode='val', distributed=False)` for the validation split, where get_loader makes the
    DistributedSampler only `if distributed and mode == 'train':`; the validation loop then reduces a metric. No
    padding sampler serves that split. The same call with `distributed=True` and a builder that pads every split is
    the finding."""
    data = ("import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\n"
            "def get_loader(ds, mode='train', distributed=False):\n"
            "    if distributed and {test}:\n        sampler = DistributedSampler(ds, shuffle=False)\n"
            "    else:\n        sampler = None\n    return DataLoader(ds, sampler=sampler)\n")
    train = (SEEDED + "from data import get_loader\nmodel = DDP(Net())\n"
             "val_loader = get_loader(val_set, mode='val', distributed={flag})\n"
             "def evaluate(model, loader):\n    correct = torch.zeros(1)\n    for x, y in loader:\n"
             "        correct += (model(x).argmax(1) == y).sum()\n    dist.all_reduce(correct)\n    return correct\n"
             "evaluate(model, val_loader)\n")
    quiet = _project(tmp_path / "q", {"train.py": train.format(flag="False"), "data.py": data.format(
        test="mode == 'train'")})
    assert "eval-padding-duplicates" not in _rules(audit.audit_paths([quiet]))
    loud = _project(tmp_path / "l", {"train.py": train.format(flag="True"), "data.py": data.format(test="True")})
    assert "eval-padding-duplicates" in _rules(audit.audit_paths([loud])), [
        (f.rule, f.line) for f in audit.audit_paths([loud])]


def test_loads_of_one_function_are_one_finding_and_a_ranks_own_file_maps_home():
    """CogKGE's trainer loads Model.pkl, Optimizer.pkl and Lr_Scheduler.pkl one after another without map_location:
    one defect (one resume), one finding at the first load, naming the others. llm-baselines loads
    `worker_{rank}.pt`, which that rank saved from its own GPU: its tensors map back to the rank's own device."""
    loads = ("model = DDP(Net())\ndef resume(path):\n    model.load_state_dict(torch.load(path + '/model.pth'))\n"
             "    opt.load_state_dict(torch.load(path + '/optimizer.pth'))\n"
             "    sched.load_state_dict(torch.load(path + '/scheduler.pth'))\nresume(args.ckpt)\n")
    found = [f for f in audit.audit_source(SEEDED + loads) if f.rule == "load-without-map-location"]
    assert len(found) == 1 and len(found[0].related) == 2, [(f.line, f.related) for f in found]
    own = "model = DDP(Net())\nstate = torch.load(f'ckpt/worker_{rank}.pt')\nmodel.load_state_dict(state)\n"
    assert "load-without-map-location" not in rules(own)
    assert "load-without-map-location" in rules(own.replace("worker_{rank}", "worker_0"))
