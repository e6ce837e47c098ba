"""Issue 35, held-out batches 105-110 (tests/outside/heldout_labels.json): each class of mistake the first look
showed (docs/measured/cpu2/audit_heldout_batch105..110.txt), fixed as a class, quiet and loud."""

from test_audit import DDP_HEAD, _project

from lab_utils.analysis import audit

SEEDED = DDP_HEAD + "torch.manual_seed(0)\n"


def _rules(found, path_end: str = "") -> list[str]:
    return [f.rule for f in found if f.path.endswith(path_end)]


def test_the_other_ranks_leave_before_the_save():
    """adaptive-span: `if rank == 0: loss = stats[0] / world_size` `else: continue`, inside `if distributed:`,
    then save_checkpoint(...): past that if only rank 0 goes on, so the save is rank 0's alone."""
    body = ("model = DDP(Net())\nfor it in range(10):\n    stats = torch.zeros(2)\n    if distributed:\n"
            "        dist.reduce(stats, 0)\n        if rank == 0:\n            loss = stats[0] / world_size\n"
            "{other}    torch.save(model.module.state_dict(), 'ckpt.pt')\n")
    quiet = SEEDED + "distributed = True\n" + body.format(other="        else:\n            continue\n")
    loud = SEEDED + "distributed = True\n" + body.format(other="")
    assert "save-on-every-rank" not in _rules(audit.audit_source(quiet))
    assert "save-on-every-rank" in _rules(audit.audit_source(loud))


def test_a_config_objects_attribute_set_off_in_a_python_config(tmp_path):
    """SwinFace's configs/config_train.py: `config = edict()`, `config.resume = False`; train.py loads a
    per-rank checkpoint only `if cfg.resume:`. Off in the default run; set True, the load is judged."""
    conf = "from easydict import EasyDict as edict\nconfig = edict()\nconfig.resume = {value}\n"
    train = (SEEDED + "from configs.config_train import config as cfg\nmodel = DDP(Net())\nif cfg.resume:\n"
             "    ckpt = torch.load('checkpoint.pt')\n    model.module.load_state_dict(ckpt)\n")
    quiet = _project(tmp_path / "q", {"configs/config_train.py": conf.format(value="False"), "train.py": train})
    loud = _project(tmp_path / "l", {"configs/config_train.py": conf.format(value="True"), "train.py": train})
    assert "load-without-map-location" not in _rules(audit.audit_paths([quiet]))
    assert "load-without-map-location" in _rules(audit.audit_paths([loud]))


def test_a_call_site_that_the_helpers_finding_names_is_one_defect(tmp_path):
    """SwinFace's `callback_logging(global_step, loss_am, ...)` in train.py hands the unreduced meters to a
    helper that logs them on rank 0: the helper's finding names the call as its related place, and the call is
    not a second finding."""
    helper = ("import torch.distributed as dist\nclass CallBackLogging:\n    def __init__(self):\n"
              "        self.rank = dist.get_rank()\n    def __call__(self, step, loss):\n"
              "        if self.rank == 0:\n            print('step', step, 'loss %.4f' % loss.avg)\n")
    train = (SEEDED + "from utils.callbacks import CallBackLogging\ncallback_logging = CallBackLogging()\n"
             "class AverageMeter:\n    def __init__(self):\n        self.avg = 0\n    def update(self, v):\n"
             "        self.avg = v\nmodel = DDP(Net())\nloss_am = AverageMeter()\nfor step, (x, y) in "
             "enumerate(loader):\n    loss = model(x).mean()\n    loss.backward()\n    loss_am.update(loss.item())\n"
             "    callback_logging(step, loss_am)\n")
    root = _project(tmp_path, {"utils/callbacks.py": helper, "train.py": train})
    found = [f for f in audit.audit_paths([root]) if f.rule == "rank0-local-loss"]
    assert [(f.path.endswith("callbacks.py"), [n for _, n in f.related]) for f in found] == [(True, [21, 16, 6])], \
        [(f.path, f.line, f.related) for f in found]


def test_options_off_by_default_in_their_other_spellings(tmp_path):
    """MeshGraphormer's `if args.run_eval_only==True and ...` (store_true) and `if args.resume_checkpoint!=None`
    (default None, required=False); UPR-Net's `RESUME = args.resume` at module level then `if RESUME:` (default
    False): the loads under them never run in the default run. Given a default, they do."""
    head = SEEDED + "import argparse\nparser = argparse.ArgumentParser()\n"
    cases = {
        "eq_true": ("parser.add_argument('--run_eval_only', default={d}, action='store_true')\n"
                    "args = parser.parse_args()\nmodel = DDP(Net())\nif args.run_eval_only==True:\n"
                    "    model.module.load_state_dict(torch.load('model.pth'))\n"),
        "ne_none": ("parser.add_argument('--resume_checkpoint', default={d}, type=str, required=False)\n"
                    "args = parser.parse_args()\nmodel = DDP(Net())\nif args.resume_checkpoint!=None:\n"
                    "    model.module.load_state_dict(torch.load(args.resume_checkpoint))\n"),
        "global": ("parser.add_argument('--resume', default={d}, type=bool)\nargs = parser.parse_args()\n"
                   "RESUME = args.resume\ndef train(model):\n    if RESUME:\n"
                   "        model.module.load_state_dict(torch.load('optimizer-ckpt.pth'))\n"
                   "train(DDP(Net()))\n"),
    }
    off = {"eq_true": "False", "ne_none": "None", "global": "False"}
    on = {"eq_true": "True", "ne_none": "'ckpt.pth'", "global": "True"}
    for name, body in cases.items():
        assert "load-without-map-location" not in _rules(audit.audit_source(head + body.format(d=off[name]))), name
        assert "load-without-map-location" in _rules(audit.audit_source(head + body.format(d=on[name]))), name


def test_a_config_key_every_yaml_leaves_null(tmp_path):
    """AMT's `ckpt_path = self.config.get('resume_state')`, `if ckpt_path is not None: torch.load(...)`, with
    `resume_state: null` in cfgs/AMT-S.yaml: no resume in the default run."""
    trainer = (SEEDED + "class Trainer:\n    def __init__(self, config):\n        self.config = config\n"
               "        self.model = DDP(Net())\n        self.resume()\n    def resume(self):\n"
               "        ckpt_path = self.config.get('resume_state')\n        if ckpt_path is not None:\n"
               "            ckpt = torch.load(self.config['resume_state'])\n"
               "            self.model.module.load_state_dict(ckpt['state_dict'])\nTrainer(cfg)\n")
    quiet = _project(tmp_path / "q", {"cfgs/a.yaml": "lr: 0.1\nresume_state: null\n", "train.py": trainer})
    loud = _project(tmp_path / "l", {"cfgs/a.yaml": "lr: 0.1\nresume_state: runs/last.pth\n", "train.py": trainer})
    assert "load-without-map-location" not in _rules(audit.audit_paths([quiet]))
    assert "load-without-map-location" in _rules(audit.audit_paths([loud]))


def test_rank0_forward_of_a_buffer_free_model_under_its_callers_no_grad(tmp_path):
    """UPR-Net: `Pipeline.inference` calls the DDP-wrapped model, its evaluation calls inference inside `with
    torch.no_grad():` on rank 0 alone, and the model (Conv2d and PReLU layers; softsplat applied in the forward's
    path) holds no buffers: nothing to broadcast. With a BatchNorm built in __init__ it is a finding."""
    model = ("import torch.nn as nn\nimport softsplat\nclass Model(nn.Module):\n    def __init__(self):\n"
             "        super().__init__()\n        self.conv = nn.Conv2d(3, 3, 3)\n        self.act = nn.PReLU()\n"
             "{extra}    def warp(self, x):\n        return softsplat.FunctionSoftsplat(tenInput=x, tenFlow=x)\n"
             "    def forward(self, x):\n        return self.warp(self.act(self.conv(x)))\n")
    pipeline = (SEEDED + "from model import Model\nclass Pipeline:\n    def __init__(self):\n"
                "        self.model = Model()\n        self.model = DDP(self.model)\n"
                "    def inference(self, x):\n        return self.model(x)\n"
                "ppl = Pipeline()\nif rank == 0:\n    with torch.no_grad():\n        ppl.inference(torch.zeros(1))\n")
    quiet = _project(tmp_path / "q", {"model.py": model.format(extra=""), "train.py": pipeline})
    loud = _project(tmp_path / "l", {"model.py": model.format(extra="        self.bn = nn.BatchNorm2d(3)\n"),
                                     "train.py": pipeline})
    assert "ddp-forward-under-rank0" not in _rules(audit.audit_paths([quiet]))
    assert "ddp-forward-under-rank0" in _rules(audit.audit_paths([loud]))


def test_a_function_only_a_comment_names(tmp_path):
    """IELT's settings/setup_functions.py defines ScaleLr (lr x world_size); setup.py star-imports the module and
    its one call is commented out: the run never scales the lr. Called, it does."""
    funcs = ("import torch.distributed as dist\ndef ScaleLr(config):\n"
             "    base_lr = config.lr * config.batch_size * dist.get_world_size() / 512.0\n    return base_lr\n")
    setup = ("from settings.setup_functions import *\nconfig = load()\n{call}\n")
    train = SEEDED + "from setup import config\nmodel = DDP(Net())\n"
    quiet = _project(tmp_path / "q", {"settings/setup_functions.py": funcs, "train.py": train,
                                      "setup.py": setup.format(call="# config.lr = ScaleLr(config)")})
    loud = _project(tmp_path / "l", {"settings/setup_functions.py": funcs, "train.py": train,
                                     "setup.py": setup.format(call="config.lr = ScaleLr(config)")})
    assert "lr-grows-with-world-size" not in _rules(audit.audit_paths([quiet]))
    assert "lr-grows-with-world-size" in _rules(audit.audit_paths([loud]))


def test_an_lr_computed_only_when_an_option_with_a_default_is_none():
    """Spann3R: `if args.lr is None: args.lr = args.blr * eff_batch_size / 256` with `--lr default=5e-5`: the
    option always has a value, so the scaling never runs. With `--lr default=None` it does."""
    body = ("import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('--lr', type=float, "
            "default={d})\nparser.add_argument('--blr', type=float, default=1.5e-4)\n"
            "parser.add_argument('--batch_size', type=int, default=8)\nargs = parser.parse_args()\n"
            "model = DDP(Net())\neff_batch_size = args.batch_size * dist.get_world_size()\nif args.lr is None:\n"
            "    args.lr = args.blr * eff_batch_size / 256\nopt = torch.optim.SGD(model.parameters(), lr=args.lr)\n")
    assert "lr-grows-with-world-size" not in _rules(audit.audit_source(SEEDED + body.format(d="5e-5")))
    assert "lr-grows-with-world-size" in _rules(audit.audit_source(SEEDED + body.format(d="None")))


def test_a_reducing_method_called_through_an_untyped_element(tmp_path):
    """SevenNet: `if self.distributed: self.recorder_all_reduce(recorder)`, which calls `metric.ddp_reduce(dev)`
    on each element of recorder.metrics, whose class's ddp_reduce all-reduces: the collective runs only under the
    switch. Called outside it, the one-process run raises."""
    recorder = ("import torch, torch.distributed as dist\nclass Metric:\n    def ddp_reduce(self, device):\n"
                "        t = torch.tensor(self.total, device=device)\n        dist.all_reduce(t)\n")
    trainer = ("import os, torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel "
               "as DDP\ntorch.manual_seed(0)\nfrom recorder import Metric\ndistributed = 'RANK' in os.environ\n"
               "if distributed:\n    dist.init_process_group('gloo')\nclass Trainer:\n"
               "    def __init__(self):\n        self.distributed = distributed\n        self.metrics = [Metric()]\n"
               "        self.model = DDP(Net()) if distributed else Net()\n    def reduce_all(self):\n"
               "        for metric in self.metrics:\n            metric.ddp_reduce('cpu')\n"
               "    def epoch(self):\n{call}\nTrainer().epoch()\n")
    quiet = _project(tmp_path / "q", {"recorder.py": recorder, "train.py": trainer.format(
        call="        if self.distributed:\n            self.reduce_all()\n")})
    loud = _project(tmp_path / "l", {"recorder.py": recorder, "train.py": trainer.format(
        call="        self.reduce_all()\n")})
    assert "collective-outside-switch" not in _rules(audit.audit_paths([quiet]))
    assert "collective-outside-switch" in _rules(audit.audit_paths([loud]))


def test_a_port_the_options_defaults_compose():
    """CID: `dist_url = args.dist_url + ':{}'.format(args.port)`, --dist-url 'tcp://127.0.0.1' and --port '23459'
    by default, then init_process_group(init_method=dist_url): a fixed port on this host. With the port read from
    the environment it is not."""
    body = ("import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('--dist-url', "
            "default='tcp://127.0.0.1', type=str)\nparser.add_argument('--port', default='23459', type=str)\n"
            "args = parser.parse_args()\ndist_url = args.dist_url + ':{{}}'.format({port})\n"
            "dist.init_process_group('gloo', init_method=dist_url, rank=0, world_size=2)\n"
            "torch.manual_seed(0)\nmodel = DDP(Net())\n")
    head = "import os, torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
    assert "hard-coded-master-port" in _rules(audit.audit_source(head + body.format(port="args.port")))
    assert "hard-coded-master-port" not in _rules(audit.audit_source(
        head + body.format(port="os.environ['MASTER_PORT']")))


def test_sync_bn_off_in_every_experiment_yaml(tmp_path):
    """CID's `if cfg.MODEL.SYNC_BN: convert_sync_batchnorm(model)` with `SYNC_BN: False` in experiments/coco.yaml
    and the defaults file not among these copies: SyncBatchNorm is off in the default run. Set True, it is on."""
    model = ("import torch.nn as nn\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
             "        self.bn = nn.BatchNorm2d(8)\n    def forward(self, x):\n        return self.bn(x)\n")
    train = (SEEDED + "from model import Net\nmodel = Net()\nif cfg.MODEL.SYNC_BN:\n"
             "    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\nmodel = DDP(model)\n")
    yaml = "MODEL:\n  NAME: hrnet\n  SYNC_BN: {v}\n"
    loud = _project(tmp_path / "l", {"model.py": model, "train.py": train,
                                     "experiments/coco.yaml": yaml.format(v="False")})
    quiet = _project(tmp_path / "q", {"model.py": model, "train.py": train,
                                      "experiments/coco.yaml": yaml.format(v="True")})
    assert "batchnorm-without-sync" in _rules(audit.audit_paths([loud]))
    assert "batchnorm-without-sync" not in _rules(audit.audit_paths([quiet]))
