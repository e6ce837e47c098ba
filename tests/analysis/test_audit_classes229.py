"""Issue 35: classes of round 229-234's first look (docs/measured/cpu2/audit_heldout_round229.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (8ca7ab5)."""

from test_audit import _project
from test_audit_classes135 import SEEDED
from test_audit_classes189 import _found, _has, _line, _places

STEP = "model = DDP(torch.nn.Linear(2, 2))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
LOOP = ("for epoch in range(2):\n    for x in loader:\n        loss = model(x).sum()\n        opt.zero_grad()\n"
        "        loss.backward()\n        opt.step()\n")


def test_a_name_imported_from_a_package_is_found_in_a_module_below_it(tmp_path):
    """hysts' `from pytorch_image_classification import create_dataloader`, defined in
    pytorch_image_classification/datasets/dataloader.py (the package's __init__.py that re-exports it not
    copied): the script's call is where the missing set_epoch is reported. Its evaluation split's sampler, in the
    `else:` of `if is_train:`, is not what that call (is_train=True) builds."""
    loader = ("import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\n"
              "def create_dataloader(ds, is_train):\n    if is_train:\n        s = DistributedSampler(ds)\n"
              "        return DataLoader(ds, sampler=s)\n    else:\n        t = DistributedSampler(ds)\n"
              "        return DataLoader(ds, sampler=t)\n")
    train = SEEDED + "from pkg import create_dataloader\n" + STEP + (
        "loader = create_dataloader(list(range(8)), is_train=True)\n") + LOOP
    root = _project(tmp_path, {"train.py": train, "pkg/data/loader.py": loader})
    assert ("train.py", _line(train, "create_dataloader(list")) in _places(root, "set-epoch-missing")
    assert not _has(root, "eval-padding-duplicates")


def test_a_short_main_that_builds_after_the_setup_is_where_the_seed_goes(tmp_path):
    """DAMO-YOLO: main() of eleven statements sets up the group, then builds its Trainer: no set-up helper, so
    no-seed is reported at its init_process_group, not at the `main()` call under the main guard. A helper that
    only sets up is reported at its call, as before."""
    head = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
    init = "def build():\n    return DDP(torch.nn.Linear(2, 2))\ndef main():\n    dist.init_process_group('gloo')\n"
    for rest, want in (("    model = build()\nif __name__ == '__main__':\n    main()\n",
                        "init_process_group"),
                       ("    torch.cuda.set_device(0)\nif __name__ == '__main__':\n    main()\n"
                        "    model = DDP(torch.nn.Linear(2, 2))\n", "    main()")):
        train = head + init + rest
        root = _project(tmp_path / want[:6].strip(), {"train.py": train})
        assert [f.line for f in _found(root) if f.rule == "no-seed"] == [_line(train, want)]


def test_local_rank_minus_one_that_decides_the_setup_makes_or_rank_0_a_rank_0_guard(tmp_path):
    """bertorch: `if args.local_rank == -1: device = ... else: init_process_group(...)`, then saves and logs under
    `args.local_rank == -1 or args.local_rank == 0`: -1 is the undistributed run, so rank 0 alone passes. Without
    the setup decided by that test the guard still leaks under torchrun."""
    head = ("import argparse, torch, torch.distributed as dist\n"
            "from torch.nn.parallel import DistributedDataParallel as DDP\ntorch.manual_seed(0)\n"
            "p = argparse.ArgumentParser()\np.add_argument('--local_rank', type=int, default=-1)\n"
            "args = p.parse_args()\n")
    setup = ("if args.local_rank == -1:\n    device = 'cpu'\nelse:\n    dist.init_process_group('gloo')\n",
             "dist.init_process_group('gloo')\n")
    body = ("model = DDP(torch.nn.Linear(2, 2))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "for step in range(4):\n    loss = model(torch.ones(2)).sum()\n    opt.zero_grad()\n"
            "    loss.backward()\n    opt.step()\n    if args.local_rank == -1 or args.local_rank == 0:\n"
            "        print('loss', loss.item())\n"
            "        torch.save(model.module.state_dict(), 'm.pt')\n")
    for s, want in zip(setup, (False, True), strict=True):
        root = _project(tmp_path / str(want), {"train.py": head + s + body})
        assert _has(root, "save-on-every-rank") is want
        assert _has(root, "rank0-local-loss") is not want


def test_a_text_last_set_from_no_loss_is_no_loss_log(tmp_path):
    """SimpleAICV: `log_info` holds the config's items, then a resume message read off the checkpoint, and only
    later the loss; each `logger.info(log_info)` logs what was set just before it. The loss line itself, reduced
    through `[loss] = all_reduce_helper(variables=[loss])` (a list target), is the global batch's."""
    helper = ("import torch, torch.distributed as dist\ndef all_reduce_vars(variables):\n"
              "    for i in range(len(variables)):\n        dist.all_reduce(variables[i])\n    return variables\n")
    train = SEEDED + "import logging\nfrom helper import all_reduce_vars\nlogger = logging.getLogger()\n" + STEP + (
        "cfg = {'lr': 0.1}\nfor key, value in cfg.items():\n    log_info = f'{key}: {value}'\n"
        "    logger.info(log_info) if rank == 0 else None\nckpt = torch.load('c.pt', map_location='cpu')\n"
        "best, test_loss = ckpt['best'], ckpt['test_loss']\nlog_info = f'resumed: {best} {test_loss}'\n"
        "logger.info(log_info) if rank == 0 else None\nfor step in range(4):\n"
        "    loss = model(torch.ones(2)).sum()\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
        "    REDUCE\n    log_info = f'loss: {loss:.4f}'\n    logger.info(log_info) if rank == 0 else None\n")
    quiet = _project(tmp_path / "q", {"train.py": train.replace("REDUCE", "[loss] = all_reduce_vars([loss])"),
                                      "helper.py": helper})
    assert not _has(quiet, "rank0-local-loss")
    loud = _project(tmp_path / "l", {"train.py": train.replace("REDUCE", "pass"), "helper.py": helper})
    last = max(i for i, s in enumerate(train.splitlines(), 1) if "logger.info(log_info)" in s)
    assert [f.line for f in _found(loud) if f.rule == "rank0-local-loss"] == [last]


def test_a_rank_handed_into_kwargs_is_a_rank(tmp_path):
    """MonoSDF: `MonoSDFTrainRunner(..., gpu_index=opt.local_rank)` and `self.GPU_INDEX = kwargs['gpu_index']`;
    `if self.GPU_INDEX == 0:` around the save and the loss print is rank 0's guard."""
    runner = ("import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\nclass Runner:\n"
              "    def __init__(self, **kwargs):\n        self.GPU_INDEX = kwargs['gpu_index']\n"
              "        self.model = DDP(torch.nn.Linear(2, 2))\n"
              "        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)\n    def run(self):\n"
              "        for step in range(4):\n            loss = self.model(torch.ones(2)).sum()\n"
              "            self.opt.zero_grad()\n            loss.backward()\n            self.opt.step()\n"
              "            if self.GPU_INDEX == 0:\n                print('loss', loss.item())\n"
              "                torch.save(self.model.module.state_dict(), 'm.pt')\n")
    train = ("import os, torch, torch.distributed as dist\nfrom runner import Runner\ntorch.manual_seed(0)\n"
             "local_rank = int(os.environ['LOCAL_RANK'])\ndist.init_process_group('gloo')\n"
             "Runner(gpu_index=local_rank).run()\n")
    root = _project(tmp_path, {"train.py": train, "runner.py": runner})
    assert not _has(root, "save-on-every-rank") and not _has(root, "every-rank-prints-loss")
    assert _has(root, "rank0-local-loss")


def test_a_script_does_not_import_another_programs_module_of_the_same_name(tmp_path):
    """MedCoSS: Dim_2/Chest_XR/main.py imports its own `engine` (not copied); Dim_3/VSseg/ holds another
    program's engine.py and train.py, whose loader strips 'module.': the Chest_XR save of the wrapper's
    state_dict() is still a finding. With the stripping loader in its own folder there is none."""
    other = {"b/VSseg/train.py": "import engine\nif __name__ == '__main__':\n    engine.run()\n",
             "b/VSseg/engine.py": "import torch\ndef run():\n    pass\n"}
    strip = ("import torch\ndef load(m, path):\n    sd = torch.load(path, map_location='cpu')\n"
             "    m.load_state_dict({k.replace('module.', ''): v for k, v in sd.items()})\n")
    main = SEEDED + "import engine\n" + STEP + (
        "for step in range(2):\n    if rank == 0:\n        torch.save(model.state_dict(), 'm.pt')\n")
    loud = _project(tmp_path / "l", {**other, "b/VSseg/utils.py": strip, "a/XR/main.py": main})
    assert _has(loud, "save-without-module")
    quiet = _project(tmp_path / "q", {**other, "a/XR/utils.py": strip, "a/XR/main.py": main})
    assert not _has(quiet, "save-without-module")


def test_timms_ordered_sampler_pads_and_an_untyped_evaluator_gathers(tmp_path):
    """EfficientDet: the validation loader gets timm's OrderedDistributedSampler (it pads), and validate() hands
    each batch to `evaluator.add_predictions(...)`, the project's one method of that name, which all-gathers the
    detections: the duplicates are counted. One finding, at the evaluation split's call, not also at the caller
    of the helper that builds both splits."""
    loader = ("import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\n"
              "from timm.data.distributed_sampler import OrderedDistributedSampler\n"
              "def create_loader(ds, is_training):\n    if is_training:\n        s = DistributedSampler(ds)\n"
              "    else:\n        s = OrderedDistributedSampler(ds)\n    return DataLoader(ds, sampler=s)\n")
    evaluator = ("import torch.distributed as dist\nclass Evaluator:\n    def add_predictions(self, det):\n"
                 "        out = [None, None]\n        dist.all_gather(out, det)\n")
    train = SEEDED + "from loader import create_loader\nfrom evaluator import Evaluator\n" + STEP + (
        "def build():\n    loader_train = create_loader(list(range(8)), is_training=True)\n"
        "    loader_eval = create_loader(list(range(8)), is_training=False)\n    return loader_train, loader_eval\n"
        "def validate(model, loader, evaluator):\n    for x in loader:\n        evaluator.add_predictions(model(x))\n"
        "loader, loader_eval = build()\nfor epoch in range(2):\n    validate(model, loader_eval, Evaluator())\n")
    root = _project(tmp_path, {"train.py": train, "loader.py": loader, "evaluator.py": evaluator})
    hits = [f for f in _found(root) if f.rule == "eval-padding-duplicates"]
    assert [h.line for h in hits] == [_line(train, "loader_eval = create_loader")]


def test_an_aliased_plain_gather_and_a_switch_set_beside_the_wrap(tmp_path):
    """HyperFuture: `import torch.distributed as torch_dist` then `torch_dist.all_gather(dest, v)` and
    `dest[rank] = v` in the score matrix: gather-without-grad. It runs under `if self.args.parallel == 'ddp':`,
    and `args.parallel = 'ddp'` is set beside `model = DDP(model)` in the arm of the distributed switch: no
    collective outside the switch. A test of another value of it is no switch."""
    train = ("import argparse, torch\nimport torch.distributed as torch_dist\n"
             "from torch.nn.parallel import DistributedDataParallel as DDP\ntorch.manual_seed(0)\n"
             "p = argparse.ArgumentParser()\np.add_argument('--local_rank', type=int, default=-1)\n"
             "args = p.parse_args()\nif args.local_rank != -1:\n    torch_dist.init_process_group('gloo')\n"
             "model = torch.nn.Linear(2, 2)\nif args.local_rank != -1:\n    model = DDP(model)\n"
             "    args.parallel = 'ddp'\nelse:\n    args.parallel = 'none'\n"
             "opt = torch.optim.SGD(model.parameters(), lr=0.1)\ndef gather(v):\n"
             "    dest = [torch.empty_like(v) for _ in range(torch_dist.get_world_size())]\n"
             "    torch_dist.all_gather(dest, v)\n    dest[torch_dist.get_rank()] = v\n    return torch.cat(dest)\n"
             "for step in range(4):\n    z = model(torch.ones(4, 2))\n    if args.parallel == 'WHICH':\n"
             "        z = gather(z)\n    loss = (z @ z.t()).logsumexp(1).mean()\n    opt.zero_grad()\n"
             "    loss.backward()\n    opt.step()\n")
    root = _project(tmp_path / "ddp", {"train.py": train.replace("WHICH", "ddp")})
    assert _has(root, "gather-without-grad") and not _has(root, "collective-outside-switch")
    assert _has(_project(tmp_path / "dp", {"train.py": train.replace("WHICH", "dp")}), "collective-outside-switch")
