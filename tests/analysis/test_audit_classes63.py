"""Issue 35, held-out batches 63-68 (tests/outside/heldout_labels.json): each class of mistake the first look
showed (docs/measured/cpu2/audit_heldout_batch63..68.txt), fixed as a class, quiet and loud."""

from test_audit import DDP_HEAD, _project, rules

from lab_utils.analysis import audit

SEEDED = DDP_HEAD + "torch.manual_seed(0)\n"


def found(root) -> list:
    return [f.rule for f in audit.audit_paths([root])]


def test_a_rank0_forward_through_a_parameter_and_through_a_method_of_the_same_object():
    """VQ-VAE-2: `train(i, loader, model, ...)` is handed the DDP wrapper and its `if dist.is_primary():` branch
    runs `model(sample)`. DifFace: rank 0's validation() calls `self.feed_data(data, phase='val')`, which runs the
    wrapped `self.model(...)` in its 'val' arm."""
    param = ("def train(loader, model):\n    for x in loader:\n        model(x).sum().backward()\n"
             "        if rank == 0:\n            with torch.no_grad():\n                out = {call}(x)\n"
             "model = DDP(nn.BatchNorm1d(4))\nfor epoch in range(2):\n    train(loader, model)\n")
    assert "ddp-forward-under-rank0" in rules(param.format(call="model"))
    assert "ddp-forward-under-rank0" not in rules(param.format(call="model.module"))
    method = ("class Trainer:\n    def __init__(self):\n        self.model = DDP(nn.BatchNorm1d(4))\n"
              "    def feed(self, x, phase='train'):\n        if phase == '{arm}':\n            return self.model(x)\n"
              "        return self.model.module(x)\n    def validation(self, x):\n"
              "        return self.feed(x, phase='val')\n    def train(self):\n        for x in loader:\n"
              "            self.feed(x).sum().backward()\n            if rank == 0:\n"
              "                self.validation(x)\n"
              "Trainer().train()\n")
    assert "ddp-forward-under-rank0" in rules(method.format(arm="val"))
    assert "ddp-forward-under-rank0" not in rules(method.format(arm="train"))


def test_a_class_table_picks_the_class_that_runs():
    """UER-py: `str2trainer[args.data_processor](args)` with --data_processor 'bert': only BertTrainer (and its
    bases) runs, MlmTrainer's rank-0 log is not the default run's."""
    classes = ("class Base:\n    def fit(self, model):\n        for x in loader:\n            loss = model(x)\n"
               "            loss.backward()\n            self.report(loss)\n"
               "class BertTrainer(Base):\n    def report(self, loss):\n        pass\n"
               "class MlmTrainer(Base):\n    def report(self, loss):\n        if rank == 0:\n"
               "            print(loss.item())\n")
    script = ("import argparse\np = argparse.ArgumentParser()\np.add_argument('--kind', default='{kind}')\n"
              "args = p.parse_args()\n" + classes +
              "TABLE = {{'bert': BertTrainer, 'mlm': MlmTrainer}}\nTABLE[args.kind]().fit(DDP(Net()))\n")
    assert "rank0-local-loss" not in rules(script.format(kind="bert"), SEEDED)
    assert "rank0-local-loss" in rules(script.format(kind="mlm"), SEEDED)


def test_a_config_target_picks_the_trainer_that_runs(tmp_path):
    """DifFace: `target: trainer.TrainerSR` in the config; TrainerDiffusion beside it (same base), named nowhere
    else, does not run, so its rank-0 log is no finding; a config naming TrainerDiffusion makes it one."""
    trainer = ("import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
               "class TrainerBase:\n    def __init__(self, cfg):\n        self.rank = dist.get_rank()\n"
               "        self.model = DDP(Net())\n    def train(self):\n        for x in loader:\n"
               "            self.step(x)\nclass TrainerSR(TrainerBase):\n    def step(self, x):\n"
               "        self.model(x).sum().backward()\nclass TrainerDiffusion(TrainerBase):\n    def step(self, x):\n"
               "        loss = self.model(x).sum()\n        loss.backward()\n        if self.rank == 0:\n"
               "            print(loss.item())\n")
    main = ("import torch, torch.distributed as dist\ntorch.manual_seed(0)\ndist.init_process_group('nccl')\n"
            "if __name__ == '__main__':\n    cfg = load_yaml('configs/train.yaml')\n"
            "    get_obj_from_str(cfg.trainer.target)(cfg).train()\n")
    sr = _project(tmp_path / "sr", {"trainer.py": trainer, "main.py": main,
                                    "configs/train.yaml": "trainer:\n  target: trainer.TrainerSR\n"})
    diff = _project(tmp_path / "diff", {"trainer.py": trainer, "main.py": main,
                                        "configs/train.yaml": "trainer:\n  target: trainer.TrainerDiffusion\n"})
    assert "rank0-local-loss" not in found(sr)
    assert "rank0-local-loss" in found(diff)


def test_an_option_default_port_computed_in_the_script_and_named_where_the_group_starts(tmp_path):
    """VQ-VAE-2: `--dist_url default=f"tcp://127.0.0.1:{port}"` with `port = 2 ** 15 + hash(os.getuid()) % 2 **
    14`: one fixed port per user. A port drawn from the environment is no finding."""
    src = ("import argparse, os\nimport torch, torch.distributed as dist\n"
           "from torch.nn.parallel import DistributedDataParallel as DDP\ntorch.manual_seed(0)\n"
           "def worker(args):\n    dist.init_process_group('nccl', init_method=args.dist_url)\n"
           "    model = DDP(Net())\nport = {port}\np = argparse.ArgumentParser()\n"
           "p.add_argument('--dist_url', default=f'tcp://127.0.0.1:{{port}}')\nworker(p.parse_args())\n")
    fixed = [f for f in audit.audit_source(src.format(port="2 ** 15 + hash(os.getuid()) % 2 ** 14"))
             if f.rule == "hard-coded-master-port"]
    assert fixed and fixed[0].related, fixed  # (and where init_process_group takes it)
    assert not [f for f in audit.audit_source(src.format(port="int(os.environ.get('PORT', 29500))"))
                if f.rule == "hard-coded-master-port"]


def test_launch_scripts_ending_in_bash_and_a_python_port_that_overrides_them(tmp_path):
    """RoboFlamingo launches with `pt_run_*.bash` (`torchrun --master_port=6042`). VoCo's train.sh passes
    --master_port=28802, but voco_train.py sets `os.environ['MASTER_PORT'] = '28890'` over it: one finding, the
    Python one."""
    script = SEEDED + "model = DDP(Net())\n"
    bash = _project(tmp_path / "bash", {"train.py": script, "run.bash": "torchrun --master_port=6042 train.py\n"})
    assert "hard-coded-master-port" in found(bash)
    both = _project(tmp_path / "both", {
        "train.py": "import os\nos.environ['MASTER_PORT'] = '28890'\n" + script,
        "train.sh": "torchrun --master_port=28802 train.py\n"})
    ports = [f for f in audit.audit_paths([both]) if f.rule == "hard-coded-master-port"]
    assert len(ports) == 1 and ports[0].path.endswith("train.py"), ports


def test_functions_called_only_in_arms_the_default_settings_skip(tmp_path):
    """RoboFlamingo: `if args.head_type == "diffusion": train_diff(...) else: train_lstm(...)` with --head_type
    'lstm', under a launch script that does not pass it: train_diff does not run, its rank-0 log is no finding.
    A script that passes `--head_type diffusion` runs it; with no launch script among the files the default
    decides nothing (a README's command may pass the option)."""
    src = SEEDED + (
        "import argparse\np = argparse.ArgumentParser()\np.add_argument('--head_type', default='lstm')\n"
        "args = p.parse_args()\nmodel = DDP(Net())\n"
        "def train_diff(model):\n    for x in loader:\n        loss = model(x)\n        loss.backward()\n"
        "        if rank == 0:\n            print(loss.item())\n"
        "def train_lstm(model):\n    for x in loader:\n        loss = model(x)\n        loss.backward()\n"
        "if args.head_type == 'diffusion':\n    train_diff(model)\nelse:\n    train_lstm(model)\n")
    lstm = _project(tmp_path / "lstm", {"train.py": src, "run.sh": "torchrun train.py --fusion_mode post\n"})
    diffusion = _project(tmp_path / "d", {"train.py": src, "run.sh": "torchrun train.py --head_type diffusion\n"})
    unknown = _project(tmp_path / "u", {"train.py": src})
    assert "rank0-local-loss" not in found(lstm)
    assert "rank0-local-loss" in found(diffusion)
    assert "rank0-local-loss" in found(unknown)


def test_one_finding_per_switch_and_per_function():
    """ANCE: barriers after each step, at the end and in evaluation, all outside `if args.local_rank != -1:`: one
    finding naming the others. RoboFlamingo: wandb.log of one loss and a print of its parts in one function: one
    finding. A DDP wrap outside the switch is left out (the one-process run stops at the wrap, before any work)."""
    head = ("import argparse, torch, torch.distributed as dist\n"
            "from torch.nn.parallel import DistributedDataParallel as DDP\ntorch.manual_seed(0)\n"
            "p = argparse.ArgumentParser()\np.add_argument('--local_rank', type=int, default=-1)\n"
            "args = p.parse_args()\nif args.local_rank != -1:\n    dist.init_process_group('nccl')\n")
    body = ("model = DDP(Net())\nfor x in loader:\n    model(x).sum().backward()\n    dist.barrier()\n"
            "dist.barrier()\n")
    hits = [f for f in audit.audit_source(head + body) if f.rule == "collective-outside-switch"]
    assert len(hits) == 1 and hits[0].related, hits
    assert "collective-outside-switch" not in [f.rule for f in audit.audit_source(
        head + "model = DDP(Net())\nfor x in loader:\n    model(x).sum().backward()\n")]
    logs = ("model = DDP(Net())\nfor x in loader:\n    loss, part = model(x)\n    loss.backward()\n"
            "    if rank == 0:\n        wandb.log({'loss': (loss / 2).item()})\n"
            "        print(loss.item(), part.item())\n")
    assert rules(logs).count("rank0-local-loss") == 1


def test_values_not_loggers_a_list_of_names_and_the_one_process_arm():
    """3D Diffuser Actor: `best_loss = self.save_checkpoint(..., new_loss, best_loss)` under rank 0 returns a
    value, not a logger: handing it on logs nothing. UniMatch: `metrics = ['abs_rel', ...]` rebinds a name that
    held losses before its metric names are written out. VoCo: the running-average print in the else of `if
    args.distributed:` runs in one process only."""
    value = ("model = DDP(Net())\nbest_loss = None\ndef save_checkpoint(model, new_loss, best_loss):\n"
             "    torch.save(model.module.state_dict(), 'best.pth')\n    return new_loss\n"
             "for x in loader:\n    loss = model(x)\n    loss.backward()\n    new_loss = all_gather_mean(loss)\n"
             "    if rank == 0:\n        best_loss = save_checkpoint(model, new_loss, best_loss)\n"
             "        {use}\n")
    assert "rank0-local-loss" not in rules(value.format(use="pass"))
    names = ("model = DDP(Net())\nfor x in loader:\n    loss = model(x)\n    loss.backward()\n"
             "    metrics = {{}}\n    metrics['total_loss'] = loss.item()\n    if rank == 0:\n        {rebind}\n"
             "        shown = [m for m in metrics]\n        print(shown)\n")
    assert "rank0-local-loss" not in rules(names.format(rebind="metrics = ['abs_rel', 'rmse']"))
    assert "rank0-local-loss" in rules(names.format(rebind="pass"))
    arm = ("import argparse\np = argparse.ArgumentParser()\np.add_argument('--distributed', action='store_true')\n"
           "args = p.parse_args()\nmodel = DDP(Net())\nfor x in loader:\n    loss = model(x)\n    loss.backward()\n"
           "    if args.distributed:\n        pass\n    else:\n        print(loss.item())\n")
    assert "every-rank-prints-loss" not in rules(arm, SEEDED)


def test_a_save_closure_a_resume_left_none_and_an_empty_config_path(tmp_path):
    """VoCo: `def save_ckp(state, path): torch.save(state, path)` inside main, called on every rank: the call is
    the save. `--resume default=None` that no script passes: its load does not run. TFace: `head_resume =
    self.cfg.get('HEAD_RESUME', '')` with `HEAD_RESUME: ""` in the YAML, then `if head_resume != '':
    CkptLoader.load_head(...)`, a static method of an imported class: not run either."""
    closure = ("def main():\n    def save_ckp(state, path):\n        torch.save(state, path)\n"
               "    model = DDP(Net())\n    for x in loader:\n        model(x).sum().backward()\n"
               "    {guard}save_ckp(model.module.state_dict(), 'model.pt')\nmain()\n")
    assert "save-on-every-rank" in rules(closure.format(guard=""))
    assert "save-on-every-rank" not in rules(closure.format(guard="if rank == 0: "))
    resume = ("import argparse\np = argparse.ArgumentParser()\np.add_argument('--resume'{default})\n"
              "args = p.parse_args()\nmodel = DDP(Net())\nif args.resume:\n"
              "    model.module.load_state_dict(torch.load(args.resume))\n")
    assert "load-without-map-location" not in rules(resume.format(default=", default=None"), SEEDED)
    assert "load-without-map-location" in rules(resume.format(default=", default='last.pth'"), SEEDED)
    task = ("import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
            "from util import Loader\ntorch.manual_seed(0)\ndist.init_process_group('nccl')\nclass Task:\n"
            "    def __init__(self, cfg):\n        self.cfg = cfg\n    def prepare(self):\n"
            "        head_resume = self.cfg.get('HEAD_RESUME', '')\n        if head_resume != '':\n"
            "            Loader.load_head(head_resume)\nif __name__ == '__main__':\n"
            "    Task(load_yaml('train.yaml')).prepare()\n    model = DDP(Net())\n")
    loader = ("import torch\nimport torch.distributed as dist\nclass Loader:\n    @staticmethod\n"
              "    def load_head(path):\n"
              "        rank = dist.get_rank()\n"
              "        return torch.load(path, weights_only=True)\n")
    empty = _project(tmp_path / "empty", {"train.py": task, "util/checkpoint.py": loader,
                                          "train.yaml": 'HEAD_RESUME: ""\n'})
    given = _project(tmp_path / "given", {"train.py": task, "util/checkpoint.py": loader,
                                          "train.yaml": 'HEAD_RESUME: "ckpt/head.pth"\n'})
    assert "load-without-map-location" not in found(empty)
    assert "load-without-map-location" in found(given)


def test_a_sampler_that_moves_its_own_epoch_needs_no_set_epoch(tmp_path):
    """TFace's MultiDistributedSampler reseeds each pass with `self.current_epoch[name] += 1`: no set_epoch is
    needed. A project DistributedSampler subclass that keeps the epoch fixed still needs it."""
    sampler = ("class MyDistributedSampler(Sampler):\n    def __init__(self, ds):\n        self.epoch = 0\n"
               "    def __iter__(self):\n        {advance}g = torch.Generator()\n"
               "        g.manual_seed(self.epoch)\n        return iter(torch.randperm(10, generator=g).tolist())\n")
    script = ("model = DDP(Net())\ns = MyDistributedSampler(ds)\nfor epoch in range(3):\n"
              "    for x in DataLoader(ds, sampler=s):\n        model(x).sum().backward()\n")
    assert "set-epoch-missing" not in rules(sampler.format(advance="self.epoch += 1\n        ") + script)
    assert "set-epoch-missing" in rules(sampler.format(advance="") + script)
