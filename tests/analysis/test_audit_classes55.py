"""Issue 35, held-out batches 55-58 (tests/outside/heldout_labels.json): each class of mistake the first look
showed (docs/measured/cpu2/audit_heldout_batch55..58.txt), fixed as a class, with a script or a small project where
the rule must stay quiet and one where it must fire."""

from test_audit import DDP_HEAD, _project, rules

from lab_utils.analysis import audit

SEEDED = DDP_HEAD + "torch.manual_seed(0)\n"


def found(root) -> list[str]:
    return [f.rule for f in audit.audit_paths([root])]


def test_an_accumulation_count_held_by_a_local_or_a_parameter_that_defaults_to_one():
    """AudioMAE: `accum_iter = args.accum_iter` (default 1), then a loss-scaler helper told
    `update_grad=(i + 1) % accum_iter == 0`: the default run steps every micro-batch, no accumulation."""
    body = ("import argparse\np = argparse.ArgumentParser()\np.add_argument('--accum_iter', default={n}, type=int)\n"
            "args = p.parse_args()\nmodel = DDP(Net())\ndef train_one_epoch(model, loader, args):\n"
            "    accum_iter = args.accum_iter\n    for i, (x, y) in enumerate(loader):\n"
            "        loss = crit(model(x), y) / accum_iter\n"
            "        loss_scaler(loss, opt, update_grad=(i + 1) % accum_iter == 0)\n"
            "train_one_epoch(model, loader, args)\n")
    assert "accumulation-without-no-sync" not in rules(body.format(n=1))
    assert "accumulation-without-no-sync" in rules(body.format(n=4))


def test_an_accumulation_count_handed_from_a_yaml_key(tmp_path):
    """MSST: `int(getattr(config.training, 'gradient_accumulation_steps', 1))` handed to train_one_epoch as a
    parameter: 1 in every YAML config of the project means no accumulation; 4 in one means accumulation."""
    script = (SEEDED + "def train_one_epoch(model, opt, gradient_accumulation_steps, loader):\n"
              "    for i, (x, y) in enumerate(loader):\n        loss = crit(model(x), y)\n"
              "        loss /= gradient_accumulation_steps\n        loss.backward()\n"
              "        if (i + 1) % gradient_accumulation_steps == 0 or i == len(loader) - 1:\n"
              "            opt.step()\n            opt.zero_grad()\n"
              "model = DDP(Net())\n"
              "gradient_accumulation_steps = int(getattr(config.training, 'gradient_accumulation_steps', 1))\n"
              "for epoch in range(2):\n    train_one_epoch(model, opt, gradient_accumulation_steps, loader)\n")
    quiet = _project(tmp_path / "one", {"train.py": script,
                                        "configs/a.yaml": "training:\n  gradient_accumulation_steps: 1\n"})
    loud = _project(tmp_path / "four", {"train.py": script,
                                        "configs/a.yaml": "training:\n  gradient_accumulation_steps: 4\n"})
    assert "accumulation-without-no-sync" not in found(quiet)
    assert "accumulation-without-no-sync" in found(loud)


def test_a_wall_clock_seed_and_a_seeding_helper_judged_by_its_seed_parameter():
    """MSST's DDP set-up replaces the seed by `(seed + int(time.time())) % 55535 + 10000` before seeding: rank 0's
    seed is not the single run's (and ranks started in different seconds differ). Its first parameter is the rank,
    which it does not seed with: the call `init_env(rank, world_size, args.seed)` is no per-rank seed."""
    helper = ("import time\ndef init_env(rank, world_size, seed=0):\n{clock}    torch.manual_seed(seed)\n"
              "init_env(rank, world_size, args.seed)\nmodel = DDP(Net())\n")
    assert "seed-per-rank" not in rules(helper.format(clock=""), DDP_HEAD)
    assert "seed-per-rank" in rules(helper.format(clock="    seed = (seed + int(time.time())) % 55535 + 10000\n"),
                                    DDP_HEAD)
    # a clock only as the fallback of an unset seed is not judged
    fallback = "import time\nseed = args.seed if args.seed is not None else int(time.time())\n"
    assert "seed-per-rank" not in rules(fallback + "torch.manual_seed(seed)\nmodel = DDP(Net())\n", DDP_HEAD)


def test_the_distributed_switch_and_flags_the_launch_script_passes_are_on(tmp_path):
    """P5: the whole training runs under `if args.distributed:` (a store_true option the launch script passes):
    that is the run judged, so its unguarded save counts. A store_true flag a launch script of the project passes
    is on too."""
    body = ("import argparse\np = argparse.ArgumentParser()\np.add_argument('--distributed', action='store_true')\n"
            "args = p.parse_args()\ndef main():\n    model = DDP(Net())\n    for x in loader:\n"
            "        model(x).sum().backward()\n{guard}    torch.save(model.module.state_dict(), 'epoch.pth')\n"
            "if args.distributed:\n    main()\n")
    assert "save-on-every-rank" not in rules(body.format(guard="    if rank == 0:\n    "))
    assert "save-on-every-rank" in rules(body.format(guard=""))
    script = (SEEDED + "import argparse\np = argparse.ArgumentParser()\np.add_argument('--keep', action='store_true')\n"
              "args = p.parse_args()\nmodel = DDP(Net())\nfor x in loader:\n    model(x).sum().backward()\n"
              "if args.keep:\n    torch.save(model.module.state_dict(), 'epoch.pth')\n")
    quiet = _project(tmp_path / "plain", {"train.py": script, "run.sh": "torchrun --standalone train.py\n"})
    loud = _project(tmp_path / "keep", {"train.py": script, "run.sh": "torchrun --standalone train.py --keep\n"})
    assert "save-on-every-rank" not in found(quiet)
    assert "save-on-every-rank" in found(loud)


def test_a_wrapper_a_subclass_holds_in_its_base_classes_methods(tmp_path):
    """P5: TrainerBase.save writes `self.model.state_dict()`; its subclass Trainer sets `self.model =
    DDP(self.model)` in __init__: the base's save writes the wrapper's `module.` keys."""
    base = ("import torch\nclass TrainerBase:\n    def __init__(self, args):\n        self.args = args\n"
            "    def save(self, name):\n        torch.save(self.model{inner}.state_dict(), name + '.pth')\n")
    script = (SEEDED + "from trainer_base import TrainerBase\nclass Trainer(TrainerBase):\n"
              "    def __init__(self, args):\n        super().__init__(args)\n        self.model = Net()\n"
              "        self.model = DDP(self.model)\n    def train(self):\n        for x in loader:\n"
              "            self.model(x).sum().backward()\n        if rank == 0:\n            self.save('last')\n"
              "Trainer(None).train()\n")
    quiet = _project(tmp_path / "inner", {"trainer_base.py": base.format(inner=".module"), "train.py": script})
    loud = _project(tmp_path / "wrapper", {"trainer_base.py": base.format(inner=""), "train.py": script})
    assert "save-without-module" not in found(quiet)
    assert "save-without-module" in found(loud)


def test_a_name_reused_for_the_reduced_summary_after_the_loop():
    """P5: `results = train_step(batch)` in the loop feeds the meter the progress bar shows; `results =
    reduce_dict(epoch_results)` after the loop is another value. The bar shows rank 0's own loss; the summary
    printed from the reduced results (and a text grown by `+= '\\n'`) is the global one."""
    loop = ("model = DDP(Net())\nloss_meter = LossMeter()\npbar = tqdm(total=10)\nfor epoch in range(2):\n"
            "    for batch in loader:\n        results = model(batch)\n        results['loss'].backward()\n"
            "{step}"
            "    results = reduce_dict(epoch_results)\n    if rank == 0:\n"
            "        losses_str = f\"Train Loss: {{results['loss']:.3f}}\"\n        losses_str += '\\n'\n"
            "        print(losses_str)\n")
    bar = ("        if rank == 0:\n            loss_meter.update(results['loss'])\n"
           "            desc_str = f'Epoch {epoch} |'\n            desc_str += f' loss {loss_meter.val:.3f}'\n"
           "            pbar.set_description(desc_str)\n")
    assert "rank0-local-loss" not in rules(loop.format(step=""))
    assert "rank0-local-loss" in rules(loop.format(step=bar))


def test_the_arm_of_a_choice_the_default_run_takes():
    """YOLOX: `save_model = self.ema_model.ema if self.use_model_ema else self.model` with use_model_ema = exp.ema
    = True: the EMA's plain module is saved, not the wrapper."""
    src = ("class Exp:\n    def __init__(self):\n        self.ema = {ema}\nclass Trainer:\n"
           "    def __init__(self, exp):\n        self.use_model_ema = exp.ema\n        self.model = DDP(Net())\n"
           "        self.ema_model = ModelEMA(self.model)\n    def save_ckpt(self):\n        if rank == 0:\n"
           "            save_model = self.ema_model.ema if self.use_model_ema else self.model\n"
           "            torch.save({{'model': save_model.state_dict()}}, 'last.pth')\nTrainer(Exp()).save_ckpt()\n")
    assert "save-without-module" not in rules(src.format(ema="True"))
    assert "save-without-module" in rules(src.format(ema="False"))


def test_a_seed_under_a_test_its_setting_fails():
    """YOLOX: torch is seeded only `if exp.seed is not None:` and the Exp's default `self.seed = None` is never
    set: no seed in the default run."""
    src = ("import random\nclass Exp:\n    def __init__(self):\n        self.seed = {seed}\nexp = Exp()\n"
           "if exp.seed is not None:\n    random.seed(exp.seed)\n    torch.manual_seed(exp.seed)\nmodel = DDP(Net())\n")
    assert "no-seed" not in rules(src.format(seed="0"), DDP_HEAD)
    assert "no-seed" in rules(src.format(seed="None"), DDP_HEAD)


def test_a_base_loader_builder_the_runs_subclass_replaces(tmp_path):
    """YOLOX: the base Exp's get_eval_loader and the experiment file's override both build a padding
    DistributedSampler; the run uses the override: one defect, one finding, whose related places name the unseen
    helper `gather(data_list, dst=0)` that brings the predictions together."""
    base = ("import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\nclass BaseExp:\n"
            "    def get_eval_loader(self, batch_size, is_distributed):\n        valdataset = make_val()\n"
            "        sampler = DistributedSampler(valdataset, shuffle=False)\n"
            "        return DataLoader(valdataset, sampler=sampler)\n")
    exp = ("from torch.utils.data import DataLoader, DistributedSampler\nfrom base_exp import BaseExp\n"
           "class Exp(BaseExp):\n    def get_eval_loader(self, batch_size, is_distributed):\n"
           "        valdataset = make_mot_val()\n        sampler = DistributedSampler(valdataset, shuffle=False)\n"
           "        return DataLoader(valdataset, sampler=sampler)\n")
    evaluator = ("import torch\nfrom yolox.utils import gather\ndef evaluate(model, val_loader, distributed):\n"
                 "    data_list = []\n    with torch.no_grad():\n        for x in val_loader:\n"
                 "            data_list.extend(model(x))\n    if distributed:\n"
                 "        data_list = gather(data_list, dst=0)\n    return score(data_list)\n")
    script = (SEEDED + "from exp import Exp\nfrom evaluator import evaluate\nexp = Exp()\nmodel = DDP(Net())\n"
              "val_loader = exp.get_eval_loader(8, True)\nfor x in loader:\n    model(x).sum().backward()\n"
              "evaluate(model, val_loader, True)\n")
    root = _project(tmp_path, {"base_exp.py": base, "exp.py": exp, "evaluator.py": evaluator, "train.py": script})
    hits = [f for f in audit.audit_paths([root]) if f.rule == "eval-padding-duplicates"]
    assert [(h.path.split("/")[-1], h.line) for h in hits] == [("exp.py", 6)], hits
    assert ("evaluator.py", 9) in {(p.split("/")[-1], line) for p, line in hits[0].related}


def test_a_model_factory_that_tunes_its_batchnorm_layers():
    """YOLOX: `model = self.exp.get_model()` (the Exp is loaded at run time) whose get_model sets eps and momentum
    on every nn.BatchNorm2d of the model: the model has BatchNorm; converting it to SyncBatchNorm is the fix."""
    src = ("import torch.nn as nn\nclass Exp:\n    def get_model(self):\n        def init_yolo(M):\n"
           "            for m in M.modules():\n                if isinstance(m, nn.BatchNorm2d):\n"
           "                    m.eps = 1e-3\n        self.model = build()\n        self.model.apply(init_yolo)\n"
           "        return self.model\nclass Trainer:\n    def __init__(self, exp):\n        self.exp = exp\n"
           "    def before_train(self):\n        model = self.exp.get_model()\n{sync}"
           "        model = DDP(model)\n")
    assert "batchnorm-without-sync" not in rules(src.format(
        sync="        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)\n"))
    assert "batchnorm-without-sync" in rules(src.format(sync=""))
    frozen = src.replace("nn.BatchNorm2d", "FrozenBatchNorm2d").format(sync="")
    assert "batchnorm-without-sync" not in rules(frozen)


def test_loguru_set_up_by_an_unseen_helper_handed_the_rank():
    """YOLOX: `setup_logger(file_name, distributed_rank=self.rank)` from yolox.utils (not in these files) keeps
    loguru's console on rank 0; the meter's unreduced losses logged through it are rank 0's own."""
    src = ("from loguru import logger\nfrom yolox.utils import setup_logger, MeterBuffer\n"
           "setup_logger('out', distributed_rank=rank, filename='train_log.txt')\nmeter = MeterBuffer()\n"
           "model = DDP(Net())\nfor i, x in enumerate(loader):\n    outputs = model(x)\n"
           "    outputs['total_loss'].backward()\n{reduce}    meter.update(**outputs)\n"
           "    loss_meter = meter.get_filtered_meter('loss')\n"
           "    loss_str = ', '.join(['{{}}: {{:.3f}}'.format(k, v.latest) for k, v in loss_meter.items()])\n"
           "    logger.info('iter {{}}, {{}}'.format(i, loss_str))\n")
    assert "rank0-local-loss" not in rules(src.format(reduce="    outputs = reduce_dict(outputs)\n"))
    assert "rank0-local-loss" in rules(src.format(reduce=""))


def test_a_reduction_in_a_branch_and_a_value_rewritten_from_itself():
    """SlowFast: `if cfg.NUM_GPUS > 1: loss = du.all_reduce([loss])[0]`, then `loss = loss.item()`: the logged loss
    may be the reduced one (the branch runs at two ranks), and rewriting a value from itself keeps what it held.
    MSST: the `if ddp:` arm feeds the running loss a reduced value, the `else:` arm a local one."""
    src = ("model = DDP(Net())\nfor x in loader:\n    loss = model(x).sum()\n    loss.backward()\n"
           "    if world_size > 1:\n        loss = {reduce}([loss])[0]\n    loss = loss.item()\n"
           "    if rank == 0:\n        print('loss', loss)\n")
    assert "rank0-local-loss" not in rules(src.format(reduce="du.all_reduce"))
    assert "rank0-local-loss" in rules(src.format(reduce="du.stack"))


def test_a_backbone_table_in_a_star_imported_package_and_the_scripts_call(tmp_path):
    """CavaFace: `BACKBONE_DICT[name](size)` with the table in backbone/__init__.py, star-imported by the script,
    whose IR_* classes hold BatchNorm2d. PermaTrack: the wrap sits in a library's set_device, and the script's call
    of it is named as a related place."""
    files = {"backbone/__init__.py": "from backbone.irse import *\nBACKBONE_DICT = {'IR_50': IR_50}\n",
             "backbone/irse.py": ("import torch.nn as nn\nclass IR_50(nn.Module):\n    def __init__(self, size):\n"
                                  "        super().__init__()\n        self.bn = nn.{norm}(64)\n"),
             "train.py": SEEDED + "from backbone import *\nbackbone = BACKBONE_DICT['IR_50'](112)\n"
                         "backbone = DDP(backbone)\nfor x in loader:\n    backbone(x).sum().backward()\n"}
    irse = files["backbone/irse.py"]
    quiet = _project(tmp_path / "ln", {**files, "backbone/irse.py": irse.format(norm="LayerNorm")})
    loud = _project(tmp_path / "bn", {**files, "backbone/irse.py": irse.format(norm="BatchNorm2d")})
    assert "batchnorm-without-sync" not in found(quiet)
    assert "batchnorm-without-sync" in found(loud)
    lib = ("import torch.nn as nn\nfrom torch.nn.parallel import DistributedDataParallel as DDP\nclass Trainer:\n"
           "    def set_device(self, model, device):\n        self.model = DDP(model, device_ids=[device])\n")
    models = ("import torch.nn as nn\nclass Net2(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
              "        self.bn = nn.BatchNorm2d(8)\n")
    script = (SEEDED + "from trainer import Trainer\nfrom models import Net2\nmodel = Net2()\ntrainer = Trainer()\n"
              "trainer.set_device(model, rank)\n")
    root = _project(tmp_path / "lib", {"trainer.py": lib, "models.py": models, "train.py": script})
    hits = [h for h in audit.audit_paths([root]) if h.rule == "batchnorm-without-sync"]
    assert [h.path.split("/")[-1] for h in hits] == ["trainer.py"], hits
    assert any(p.endswith("train.py") for p, _ in hits[0].related), hits
