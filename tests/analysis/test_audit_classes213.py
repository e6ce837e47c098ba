"""Issue 35: classes of round 213-217's first look (docs/measured/cpu2/audit_heldout_round213.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (4a8012c)."""

from test_audit import _project
from test_audit_classes135 import SEEDED
from test_audit_classes189 import _has, _line, _places

STEP = ("model = DDP(torch.nn.Linear(2, 2))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for epoch in range(3):\n    loss = model(torch.ones(2)).sum()\n    opt.zero_grad()\n    loss.backward()\n"
        "    opt.step()\n")


def test_a_switch_function_that_asks_the_launcher_makes_no_leaky_guard(tmp_path):
    """SynTBPR: `is_master()` is `not is_using_distributed() or get_rank() == 0`, and is_using_distributed()
    answers from dist.is_initialized() and the launcher's RANK/WORLD_SIZE/LOCAL_RANK: true in every launched run,
    so the guard is rank 0's. A switch that returns an option (`args.distributed`) leaks under torchrun."""
    utils = ("import os\nimport torch.distributed as dist\ndef is_using_distributed():\n"
             "    if dist.is_available() and dist.is_initialized():\n        return True\n"
             "    if 'RANK' in os.environ and 'WORLD_SIZE' in os.environ:\n"
             "        return int(os.environ['WORLD_SIZE']) > 1\n    return False\n"
             "def is_option_distributed(args):\n    return args.distributed\n"
             "def is_master(args):\n    return not SWITCH or dist.get_rank() == 0\n")
    train = SEEDED + "from utils import is_master\n" + STEP + (
        "    if is_master(args):\n        torch.save(model.module.state_dict(), 'best.pth')\n")
    for switch, want in (("is_using_distributed()", False), ("is_option_distributed(args)", True)):
        root = _project(tmp_path / switch[:6], {"train.py": train, "utils.py": utils.replace("SWITCH", switch)})
        assert _has(root, "save-on-every-rank") is want


def test_an_autograd_gather_applied_in_another_module_under_the_switch_is_switched(tmp_path):
    """SynTBPR: AllGather (an autograd.Function whose forward calls dist.all_gather) lives in shared_modules.py
    and is applied in the model after `if not is_using_distributed(): return input`: the one-process run never
    reaches the collective. Applied unconditionally, it does."""
    gather = ("import torch\nimport torch.distributed as dist\nclass AllGather(torch.autograd.Function):\n"
              "    @staticmethod\n    def forward(ctx, x):\n        out = [torch.zeros_like(x) for _ in range(2)]\n"
              "        dist.all_gather(out, x)\n        return torch.cat(out)\n"
              "    @staticmethod\n    def backward(ctx, g):\n        dist.all_reduce(g)\n        return g[:1]\n")
    model = ("import torch\nfrom shared import AllGather\nclass Net(torch.nn.Module):\n"
             "    def __init__(self, distributed):\n        super().__init__()\n"
             "        self.distributed = distributed\n"
             "        self.fc = torch.nn.Linear(2, 2)\n    def gather(self, x):\n        GUARD\n"
             "        return AllGather.apply(x)\n    def forward(self, x):\n        return self.gather(self.fc(x))\n")
    train = ("import argparse, torch, torch.distributed as dist\n"
             "from torch.nn.parallel import DistributedDataParallel as DDP\nfrom model import Net\n"
             "torch.manual_seed(0)\nparser = argparse.ArgumentParser()\n"
             "parser.add_argument('--distributed', action='store_true')\nargs = parser.parse_args()\n"
             "net = Net(args.distributed)\nif args.distributed:\n    dist.init_process_group('gloo')\n"
             "    net = DDP(net)\nopt = torch.optim.SGD(net.parameters(), lr=0.1)\nfor step in range(3):\n"
             "    loss = net(torch.ones(1, 2)).sum()\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n")
    for guard, want in (("if not self.distributed:\n            return x", False), ("pass", True)):
        root = _project(tmp_path / str(want), {"train.py": train, "model.py": model.replace("GUARD", guard),
                                               "shared.py": gather})
        assert _has(root, "collective-outside-switch") is want


def test_a_bare_loss_logged_beside_a_called_criterion_attribute_is_still_the_loss(tmp_path):
    """revisitSR: the trainer calls its criterion `self.loss(sr, hr)`, and log_train prints `loss.item()` of the
    bare `loss` it is handed: the value, not the criterion. Reduced before the log, it is the global batch's."""
    train = SEEDED + (
        "class Trainer:\n    def __init__(self, model, loss):\n        self.model, self.loss = model, loss\n"
        "        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    def train(self):\n"
        "        for i in range(3):\n            loss = self.loss(self.model(torch.ones(2)), torch.zeros(2))\n"
        "            self.opt.zero_grad()\n            loss.backward()\n            self.opt.step()\n"
        "            REDUCE\n"
        "            if rank == 0 and i % 10 == 0:\n                self.log_train(i, loss)\n"
        "    def log_train(self, i, loss):\n        print('[Iteration %05d] Loss: %.5f' % (i + 1, loss.item()))\n"
        "Trainer(DDP(torch.nn.Linear(2, 2)), torch.nn.MSELoss()).train()\n")
    for reduce, want in (("pass", True), ("dist.all_reduce(loss); loss /= world_size", False)):
        assert _has(_project(tmp_path / str(want), {"train.py": train.replace("REDUCE", reduce)}),
                    "rank0-local-loss") is want


def test_an_object_handed_to_a_constructor_is_that_class_and_its_save_writes_on_every_rank(tmp_path):
    """revisitSR: `checkpoint = utility.checkpoint(cfg)` is handed to `Trainer(..., checkpoint)`, whose __init__
    keeps it as `self.ckp`; `self.ckp.save(...)` in test() runs on every rank and reaches torch.save twice: one
    finding, named at the call and at the writes. Under a rank-0 guard it is no finding."""
    utility = ("import torch\nclass checkpoint:\n    def __init__(self, cfg):\n        self.log = torch.zeros(1)\n"
               "    def save(self, trainer, it):\n        self.save_model(trainer, it)\n"
               "        torch.save(self.log, 'psnr_log.pt')\n    def save_model(self, trainer, it):\n"
               "        torch.save({'state_dict': trainer.model.module.state_dict()}, 'model_latest.pth')\n")
    trainer = ("import torch\nclass Trainer:\n    def __init__(self, model, rank, ckp=None):\n"
               "        self.model, self.rank, self.ckp = model, rank, ckp\n"
               "        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    def train(self):\n"
               "        for i in range(3):\n            loss = self.model(torch.ones(2)).sum()\n"
               "            self.opt.zero_grad()\n            loss.backward()\n            self.opt.step()\n"
               "        self.test(3)\n    def test(self, it):\n        GUARD\n            self.ckp.save(self, it)\n")
    main = SEEDED + ("import utility, trainer\ncheckpoint = utility.checkpoint(None)\n"
                     "t = trainer.Trainer(DDP(torch.nn.Linear(2, 2)), rank, checkpoint)\nt.train()\n")
    for guard, want in (("if True:", True), ("if self.rank == 0:", False)):
        root = _project(tmp_path / str(want), {"main.py": main, "utility.py": utility,
                                               "trainer.py": trainer.replace("GUARD", guard)})
        assert _has(root, "save-on-every-rank") is want
        if want:
            assert ("utility.py", _line(utility, "'model_latest.pth'")) in _places(root, "save-on-every-rank")


def test_a_child_of_a_project_logger_set_up_with_a_console_on_rank_0_alone_is_rank_0s(tmp_path):
    """IRRA: train.py sets up 'IRRA' with a project setup_logger that returns before its StreamHandler on every
    rank but 0; processor.py logs the running loss through getLogger('IRRA.train'): rank 0's own micro-batch's
    loss. A setup that adds the console on every rank makes it no rank-0 log."""
    logger = ("import logging, sys\ndef setup_logger(name, distributed_rank=0):\n"
              "    logger = logging.getLogger(name)\n    logger.setLevel(logging.DEBUG)\n    EARLY\n"
              "    logger.addHandler(logging.StreamHandler(stream=sys.stdout))\n    return logger\n")
    processor = ("import logging, torch\ndef do_train(model, opt):\n    logger = logging.getLogger('IRRA.train')\n"
                 "    for it in range(3):\n        loss = model(torch.ones(2)).sum()\n        opt.zero_grad()\n"
                 "        loss.backward()\n        opt.step()\n        logger.info(f'loss: {loss.item():.4f}')\n")
    train = SEEDED + ("from logger import setup_logger\nfrom processor import do_train\n"
                      "log = setup_logger('IRRA', distributed_rank=rank)\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                      "do_train(model, torch.optim.SGD(model.parameters(), lr=0.1))\n")
    for early, want in (("if distributed_rank > 0:\n        return logger", True), ("pass", False)):
        root = _project(tmp_path / str(want), {"train.py": train, "processor.py": processor,
                                               "logger.py": logger.replace("EARLY", early)})
        assert _has(root, "rank0-local-loss") is want
