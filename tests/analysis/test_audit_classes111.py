"""Issue 35, held-out batches 111-116 (tests/outside/heldout_labels.json): each class of mistake the first look
showed (docs/measured/cpu2/audit_heldout_round111.txt), fixed as a class, quiet and loud."""

from test_audit import DDP_HEAD, _project

from lab_utils.analysis import audit

SEEDED = DDP_HEAD + "torch.manual_seed(0)\n"
LOOP = ("model = DDP(Net())\nopt = torch.optim.SGD(model.parameters(), 0.1)\nfor step, (x, y) in "
        "enumerate(loader):\n    loss = model(x).mean() / {count}\n    loss.backward()\n"
        "    if (step + 1) % {count} == 0:\n        opt.step()\n        opt.zero_grad()\n")


def _rules(found, path_end: str = "") -> list[str]:
    return [f.rule for f in found if f.path.endswith(path_end)]


def test_an_accumulation_count_a_config_read_leaves_at_one(tmp_path):
    """OpenOCR's `self.accumulation_steps = self.cfg['Global'].get('accumulation_steps', 1)` with no YAML setting
    the key: every micro-batch steps, nothing accumulates. A YAML that sets 4 accumulates."""
    trainer = (SEEDED + "class Trainer:\n    def __init__(self, cfg):\n        self.cfg = cfg\n"
               "        self.accumulation_steps = self.cfg['Global'].get('accumulation_steps', 1)\n"
               "    def train(self):\n" + "".join("        " + line + "\n" for line in LOOP.format(
                   count="self.accumulation_steps").splitlines()) + "Trainer(cfg).train()\n")
    quiet = _project(tmp_path / "q", {"train.py": trainer, "configs/a.yml": "Global:\n  epochs: 2\n"})
    loud = _project(tmp_path / "l", {"train.py": trainer, "configs/a.yml": "Global:\n  accumulation_steps: 4\n"})
    assert "accumulation-without-no-sync" not in _rules(audit.audit_paths([quiet]))
    assert "accumulation-without-no-sync" in _rules(audit.audit_paths([loud]))


def test_a_count_in_a_dict_the_module_builds_and_a_parameter_a_yaml_fills(tmp_path):
    """VQ-Diffusion's `op_sc['optimizer']['step_iteration']` from `{'step_iteration': op_cfg.get('step_iteration',
    1)}` with `step_iteration: 1` in the YAML; AnimateDiff's `gradient_accumulation_steps: int = 1` of a main
    called as `main(**config)`: both 1 in the default run. A YAML value of 2 accumulates."""
    vq = (SEEDED + "def run(op_cfg, loader):\n    op_sc = {'optimizer': {'step_iteration': op_cfg.get("
          "'step_iteration', 1)}}\n" + "".join("    " + line + "\n" for line in LOOP.format(
              count="op_sc['optimizer']['step_iteration']").splitlines()) + "run(cfg, loader)\n")
    anim = (SEEDED + "import yaml\ndef main(name, gradient_accumulation_steps: int = 1, lr=1e-4):\n" + "".join(
        "    " + line + "\n" for line in LOOP.format(count="gradient_accumulation_steps").splitlines())
        + "config = yaml.safe_load(open('c.yaml'))\nmain(name='x', **config)\n")
    for name, script, key in (("vq", vq, "step_iteration"), ("anim", anim, "gradient_accumulation_steps")):
        quiet = _project(tmp_path / f"{name}q", {"train.py": script, "configs/c.yaml": f"solver:\n  {key}: 1\n"})
        loud = _project(tmp_path / f"{name}l", {"train.py": script, "configs/c.yaml": f"solver:\n  {key}: 2\n"})
        assert "accumulation-without-no-sync" not in _rules(audit.audit_paths([quiet])), name
        assert "accumulation-without-no-sync" in _rules(audit.audit_paths([loud])), name


def test_one_optimizer_accumulates_while_another_steps_every_micro_batch():
    """so-vits-svc: the generator's optim_g steps every accum_step micro-batches, the discriminator's optim_d every
    one: the generator accumulates (found at its gate, not at the lr divided by the count). Both stepping every
    micro-batch: nothing accumulates."""
    body = ("model = DDP(Net())\noptim_g = torch.optim.AdamW(model.parameters())\noptim_d = torch.optim.AdamW("
            "disc.parameters())\nfor step, x in enumerate(loader):\n    model(x).mean().backward()\n{gate}"
            "        optim_g.step()\n        optim_g.zero_grad()\n    optim_d.zero_grad()\n"
            "    disc(x).mean().backward()\n    optim_d.step()\n")
    gate = "    if (step + 1) % accum_step == 0:\n"
    loud = SEEDED + "accum_step = 2\nlr = base_lr / accum_step\n" + body.format(gate=gate)
    quiet = SEEDED + body.format(gate="    if True:\n")
    found = [f for f in audit.audit_source(loud) if f.rule == "accumulation-without-no-sync"]
    assert [f.line for f in found] == [loud.splitlines().index("    if (step + 1) % accum_step == 0:") + 1], found
    assert "accumulation-without-no-sync" not in _rules(audit.audit_source(quiet))


def test_a_second_entry_point_the_launch_script_never_runs(tmp_path):
    """UniMatch V2: train.sh sets `method='unimatch_v2'` and runs `$method.py`; supervised.py (listed only in a
    comment) is not the documented run, except for the evaluate() that unimatch_v2.py imports from it. Launched
    by the script, its own main is judged."""
    supervised = (DDP_HEAD + "def evaluate(model, loader):\n    return 0\n"
                  "def main():\n    model = DDP(Net())\n    torch.save(model.state_dict(), 'x.pt')\n"
                  "if __name__ == '__main__':\n    main()\n")
    semi = (SEEDED + "from supervised import evaluate\ndef main():\n    model = DDP(Net())\n"
            "    torch.save(model.module.state_dict(), 'x.pt') if rank == 0 else None\n"
            "if __name__ == '__main__':\n    main()\n")
    script = ("#!/bin/bash\n# method: ['unimatch_v2', 'fixmatch', 'supervised']\nmethod='{m}'\n"
              "python -m torch.distributed.launch --nproc_per_node=$1 \\\n    $method.py --config x.yaml\n")
    files = {"supervised.py": supervised, "unimatch_v2.py": semi}
    quiet = _project(tmp_path / "q", {**files, "scripts/train.sh": script.format(m="unimatch_v2")})
    loud = _project(tmp_path / "l", {**files, "scripts/train.sh": script.format(m="supervised")})
    assert _rules(audit.audit_paths([quiet]), "supervised.py") == []
    assert "save-without-module" in _rules(audit.audit_paths([loud]), "supervised.py")


def test_results_keyed_by_sample_id_count_a_padded_duplicate_once():
    """DETR's evaluate: `res = {target['image_id'].item(): output ...}`, `coco_evaluator.update(res)`: a padded
    duplicate overwrites its first copy in the evaluator's merge. Results appended in a list are counted twice."""
    body = (SEEDED + "model = DDP(Net())\nval_sampler = DistributedSampler(val_set, shuffle=False)\nval_loader = "
            "DataLoader(val_set, sampler=val_sampler)\ndef evaluate(model, val_loader, coco_evaluator):\n"
            "    for x, targets in val_loader:\n        results = model(x)\n{keep}"
            "    stats = torch.tensor([1.0])\n    dist.all_reduce(stats)\n    return stats\n"
            "evaluate(model, val_loader, CocoEvaluator())\n")
    quiet = body.format(keep="        res = {t['image_id'].item(): o for t, o in zip(targets, results)}\n"
                             "        coco_evaluator.update(res)\n")
    loud = body.format(keep="        coco_evaluator.update(list(results))\n")
    assert "eval-padding-duplicates" not in _rules(audit.audit_source(quiet))
    assert "eval-padding-duplicates" in _rules(audit.audit_source(loud))
    # TadTR: the evaluator is the project's own, and its update appends every window's detections: counted twice
    own = ("class ActionEvaluator:\n    def __init__(self):\n        self.dets = []\n    def update(self, res):\n"
           "        for k, v in res.items():\n            self.dets.append(v)\n")
    appended = own + quiet.replace("CocoEvaluator", "ActionEvaluator")
    assert "eval-padding-duplicates" in _rules(audit.audit_source(appended))


def test_a_config_key_the_yaml_names_picks_its_arm(tmp_path):
    """OpenOCR's build_dataloader: `if 'sampler' in config[mode]:` a project batch sampler, `elif distributed:`
    DistributedSampler. The YAML names a sampler, so the DistributedSampler is never built and no set_epoch is
    owed; a YAML without one builds it."""
    data = ("import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\n"
            "def build_dataloader(config, mode, dataset):\n    sampler = None\n    if 'sampler' in config[mode]:\n"
            "        sampler = make_sampler(dataset)\n    elif config['Global']['distributed']:\n"
            "        sampler = DistributedSampler(dataset=dataset, shuffle=True)\n"
            "    return DataLoader(dataset, sampler=sampler)\n")
    train = (SEEDED + "from data import build_dataloader\nmodel = DDP(Net())\nloader = build_dataloader(config, "
             "'Train', ds)\nfor epoch in range(10):\n    for x in loader:\n        model(x).mean().backward()\n")
    quiet = _project(tmp_path / "q", {"data.py": data, "train.py": train,
                                      "a.yml": "Train:\n  sampler:\n    name: RatioSampler\n"})
    loud = _project(tmp_path / "l", {"data.py": data, "train.py": train, "a.yml": "Train:\n  dataset: x\n"})
    assert "set-epoch-missing" not in _rules(audit.audit_paths([quiet]))
    assert "set-epoch-missing" in _rules(audit.audit_paths([loud]))
    # UniTS: `'anomaly_detection' in config['task_name']` looks for a substring in a value, not for a key
    value = _project(tmp_path / "v", {"data.py": data.replace("'sampler' in config[mode]", "'sampler' in "
                                                              "config['task_name']"), "train.py": train,
                                      "a.yml": "task_name: long_term\nsampler:\n  name: x\n"})
    assert "set-epoch-missing" in _rules(audit.audit_paths([value]))


def test_one_epoch_runs_no_epoch_boundary(tmp_path):
    """TorchSSL: `for epoch in range(args.epoch)`, `--epoch default=1`: the run trains by iterations in one epoch,
    so a missing set_epoch repeats nothing. Two epochs repeat epoch 0's order."""
    script = (SEEDED + "import argparse\np = argparse.ArgumentParser()\np.add_argument('--epoch', type=int, "
              "default={n})\nargs = p.parse_args()\nmodel = DDP(Net())\nsampler = DistributedSampler(ds)\n"
              "loader = DataLoader(ds, sampler=sampler)\nfor epoch in range(args.epoch):\n    for x in loader:\n"
              "        model(x).mean().backward()\n")
    assert "set-epoch-missing" not in _rules(audit.audit_source(script.format(n=1)))
    assert "set-epoch-missing" in _rules(audit.audit_source(script.format(n=2)))


def test_set_epoch_missing_names_where_the_loader_is_iterated(tmp_path):
    """IDDM: get_dataset() builds the DistributedSampler and returns the loader; the subclass trainer keeps it as
    self.dataloader, and the base class's epoch loop calls before_iter(), which wraps `tqdm(self.dataloader)`: the
    finding at the sampler names the builder's call and that iteration as its related places."""
    data = ("from torch.utils.data import DataLoader, DistributedSampler\ndef get_dataset(ds):\n"
            "    sampler = DistributedSampler(ds)\n    return DataLoader(ds, sampler=sampler)\n")
    base = ("class Base:\n    def train(self):\n        for epoch in range(10):\n            self.before_iter()\n"
            "            for x in self.pbar:\n                self.step(x)\n")
    trainer = (SEEDED + "from tqdm import tqdm\nfrom data import get_dataset\nfrom base import Base\nclass DM(Base):\n"
               "    def __init__(self):\n        self.model = DDP(Net())\n        self.dataloader = get_dataset(ds)\n"
               "    def before_iter(self):\n        self.pbar = tqdm(self.dataloader)\n"
               "    def step(self, x):\n        self.model(x).mean().backward()\n"
               "if __name__ == '__main__':\n    trainer = DM()\n    trainer.train()\n")
    root = _project(tmp_path, {"data.py": data, "base.py": base, "dm.py": trainer})
    found = [f for f in audit.audit_paths([root]) if f.rule == "set-epoch-missing"]
    lines = trainer.splitlines()
    want = [lines.index("        self.dataloader = get_dataset(ds)") + 1,
            lines.index("        self.pbar = tqdm(self.dataloader)") + 1]
    assert len(found) == 1 and [n for p, n in found[0].related if p.endswith("dm.py")] == want, \
        [(f.path, f.line, f.related) for f in found]


def test_a_flag_switched_off_against_the_main_ranks_name(tmp_path):
    """IDDM's base trainer: `self.save_models = None` in __init__, `self.save_models = True`, then `if
    dist.get_rank() != self.main_gpu: self.save_models = False`; the subclass saves under `if self.save_models:`:
    rank 0's alone. Without the switch-off, every rank saves."""
    base = ("import torch.distributed as dist\nclass Base:\n    def __init__(self):\n        self.save_models = None\n"
            "        self.main_gpu = 0\n    def init_dist(self):\n        self.save_models = True\n"
            "        dist.init_process_group('nccl')\n{off}")
    sub = (SEEDED + "from base import Base\nclass DM(Base):\n    def train(self):\n        self.init_dist()\n"
           "        model = DDP(Net())\n        if self.save_models:\n"
           "            torch.save(model.module.state_dict(), 'm.pt')\n"
           "if __name__ == '__main__':\n    trainer = DM()\n    trainer.train()\n")
    off = "        if dist.get_rank() != self.main_gpu:\n            self.save_models = False\n"
    quiet = _project(tmp_path / "q", {"base.py": base.format(off=off), "dm.py": sub})
    loud = _project(tmp_path / "l", {"base.py": base.format(off=""), "dm.py": sub})
    assert "save-on-every-rank" not in _rules(audit.audit_paths([quiet]))
    assert "save-on-every-rank" in _rules(audit.audit_paths([loud]))


def test_off_flags_in_a_conditional_expression_and_a_required_parameter():
    """DebiasPL's `torch.load(...) if args.use_clip else None` (store_true); AnimateDiff's `use_wandb: bool`, handed
    `args.wandb` (store_true) by its only caller: neither runs in the default run. On by default, both do."""
    script = (DDP_HEAD + "import argparse, wandb\np = argparse.ArgumentParser()\np.add_argument('--use_clip', "
              "action='{a}')\np.add_argument('--wandb', action='{a}')\nargs = p.parse_args()\ntorch.manual_seed(0)\n"
              "def main(use_wandb: bool):\n    model = DDP(Net())\n    preds = torch.load('clip_predictions.pth') "
              "if args.use_clip else None\n    for x in loader:\n        loss = model(x).mean()\n"
              "        loss.backward()\n"
              "        if rank == 0 and use_wandb:\n            wandb.log({{'train_loss': loss.item()}})\n"
              "main(use_wandb=args.wandb)\n")
    quiet, loud = script.format(a="store_true"), script.format(a="store_false")
    for rule in ("load-without-map-location", "rank0-local-loss"):
        assert rule not in _rules(audit.audit_source(quiet)), rule
        assert rule in _rules(audit.audit_source(loud)), rule


def test_a_gathered_metric_built_from_python_values():
    """VAN's cat_ddp_metric: `tensor = torch.tensor(metric).unsqueeze(0).to(self.device)` gathered for metrics:
    a tensor made from Python values carries no gradient, whatever it is moved or reshaped into. The model's own
    features gathered into a loss do."""
    body = (SEEDED + "model = DDP(Net())\ndef gather(x):\n    res = [torch.zeros_like(x) for _ in "
            "range(world_size)]\n    dist.all_gather(res, {x})\n    return torch.cat(res)\n"
            "for b in loader:\n    z = model(b)\n    loss = (z @ gather(z).T).mean()\n    loss.backward()\n")
    assert "gather-without-grad" not in _rules(audit.audit_source(body.format(
        x="torch.tensor(x.tolist()).unsqueeze(0).to(x.device)")))
    assert "gather-without-grad" in _rules(audit.audit_source(body.format(x="x.unsqueeze(0).to(x.device)")))


def test_a_rank_attribute_the_distributed_setup_sets():
    """TiSASRec's is_main_process(): `not hasattr(args, 'local_rank') or args.local_rank == 0`: the setup sets
    args.local_rank in every launched run, so the guard is rank 0's; `not args.multi or ...` leaks."""
    body = (SEEDED + "args.local_rank = rank\ndef is_main_process():\n    return {test} or args.local_rank == 0\n"
            "model = DDP(Net())\nif is_main_process():\n    torch.save(model.module.state_dict(), 'm.pt')\n")
    assert "save-on-every-rank" not in _rules(audit.audit_source(body.format(test="not hasattr(args, 'local_rank')")))
    assert "save-on-every-rank" in _rules(audit.audit_source(body.format(test="not args.multi_gpu")))
