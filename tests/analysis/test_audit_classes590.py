"""Issue 35: classes of round 590-595's first look (docs/measured/cpu2/audit_heldout_round590.txt), fixed after
it, quiet and loud; each test fails at the first look's code (75b1dd5). The round's other false alarms and misses
are left, said in docs/results.md."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_an_option_a_dict_of_defaults_sets_false_is_off_by_default(tmp_path):
    """CTM (guided-diffusion's parser): `defaults = dict(large_log=False)`, `add_dict_to_argparser(parser,
    defaults)`, and `if args.large_log: print('GAN learning', loss)` on every rank: off in the default run (no
    every-rank-prints-loss). With large_log=True it prints."""
    src = (DDP + "import argparse\ndef add_dict_to_argparser(parser, d):\n    for k, v in d.items():\n"
           "        parser.add_argument(f'--{k}', default=v, type=type(v))\ndef train_defaults():\n"
           "    return dict(large_log=LARGE, lr=1e-4)\ndef create_argparser():\n    defaults = dict(data='x')\n"
           "    defaults.update(train_defaults())\n    parser = argparse.ArgumentParser()\n"
           "    add_dict_to_argparser(parser, defaults)\n    return parser\nif __name__ == '__main__':\n"
           "    args = create_argparser().parse_args()\n    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
           "    model = DDP(torch.nn.Linear(2, 2))\n    for i in range(4):\n        loss = model(torch.ones(2)).sum()\n"
           "        loss.backward()\n        if args.large_log:\n            print('GAN learning', loss)\n")
    off = _project(tmp_path / "off", {"train.py": src.replace("LARGE", "False")})
    assert not _rules(off, "every-rank-prints-loss")
    on = _project(tmp_path / "on", {"train.py": src.replace("LARGE", "True")})
    assert _rules(on, "every-rank-prints-loss")


def test_a_constant_handed_at_a_rank_0_call_is_no_rank_0_object(tmp_path):
    """CTM: rank 0 alone calls `self.save(save_full=False)`; the others reach `self.save()` too. `save_full` is a
    value, not an object only rank 0 holds, so the barrier under `if save_full:` runs on every rank that calls
    save() with it true (no collective-under-rank0). A barrier under a rank-0 guard still hangs."""
    src = (DDP + "class Trainer:\n    def __init__(self):\n        dist.init_process_group('gloo')\n"
           "        torch.manual_seed(0)\n        self.model = DDP(torch.nn.Linear(2, 2))\n    def run(self):\n"
           "        for step in range(4):\n            self.model(torch.ones(2)).sum().backward()\n"
           "            if dist.get_rank() == 0:\n                self.save(save_full=False)\n            self.save()\n"
           "    def save(self, save_full=True):\n        if dist.get_rank() == 0:\n"
           "            torch.save(self.model.module.state_dict(), 'm.pt')\n        if GUARD:\n"
           "            dist.barrier()\nif __name__ == '__main__':\n    Trainer().run()\n")
    assert not _rules(_project(tmp_path / "value", {"train.py": src.replace("GUARD", "save_full")}),
                      "collective-under-rank0")
    assert _rules(_project(tmp_path / "rank", {"train.py": src.replace("GUARD", "dist.get_rank() == 0")}),
                  "collective-under-rank0")


def test_a_kv_logger_fed_every_value_of_a_loss_dict_logs_losses(tmp_path):
    """CTM: `def log_loss_dict(losses): for key, values in losses.items(): logger.logkv_mean(f'{key} mean',
    values.mean().item())`, a baselines logger configured without a communicator: rank 0's dumpkvs writes its own
    means (rank0-local-loss). A dict of other values logs no loss."""
    logger = ("class Logger:\n    def __init__(self, comm=None):\n        self.comm, self.name2val = comm, {}\n"
              "    def logkv_mean(self, k, v):\n        self.name2val[k] = v\n    def dumpkvs(self):\n"
              "        if self.comm is None:\n            d = self.name2val\n        print(d)\n"
              "CURRENT = Logger()\n"
              "def configure(dir=None, comm=None):\n    global CURRENT\n    CURRENT = Logger(comm)\n"
              "def logkv_mean(k, v):\n    CURRENT.logkv_mean(k, v)\ndef dumpkvs():\n    CURRENT.dumpkvs()\n")
    train = (DDP + "import logger\ndef log_dict(NAME):\n    for key, values in NAME.items():\n"
             "        logger.logkv_mean(f'{key} mean', values.mean().item())\nif __name__ == '__main__':\n"
             "    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n    logger.configure(dir='out')\n"
             "    model = DDP(torch.nn.Linear(2, 2))\n    for step in range(4):\n        out = model(torch.ones(2))\n"
             "        out.sum().backward()\n        log_dict({'consistency': out})\n        logger.dumpkvs()\n")
    losses = _project(tmp_path / "losses", {"logger.py": logger, "train.py": train.replace("NAME", "losses")})
    assert _rules(losses, "rank0-local-loss")
    sizes = _project(tmp_path / "sizes", {"logger.py": logger, "train.py": train.replace("NAME", "sizes")})
    assert not _rules(sizes, "rank0-local-loss")


def test_a_master_port_computed_from_local_constants_is_fixed(tmp_path):
    """CTM: `num = 9; port = str(65535 - num); os.environ['MASTER_PORT'] = port` (65526): hard-coded-master-port.
    A port read from the environment is not."""
    src = (DDP + "import os\ndef setup_dist():\n    num = 9\n    port = VALUE\n    os.environ['MASTER_ADDR'] = "
           "'127.0.0.1'\n    os.environ['MASTER_PORT'] = port\n    dist.init_process_group('gloo')\n"
           "if __name__ == '__main__':\n    setup_dist()\n    torch.manual_seed(0)\n"
           "    model = DDP(torch.nn.Linear(2, 2))\n")
    fixed = _project(tmp_path / "fixed", {"train.py": src.replace("VALUE", "str(65535 - num)")})
    assert [f.line for f in _rules(fixed, "hard-coded-master-port")] == [8]
    env = _project(tmp_path / "env", {"train.py": src.replace("VALUE", "os.environ.get('PORT', str(65535 - num))")})
    assert not [f for f in _rules(env, "hard-coded-master-port") if f.line == 8]


def test_no_seed_names_the_if_that_picks_the_setup(tmp_path):
    """CTM: `if args.use_MPI: setup_dist(...)` `else: setup_dist_without_MPI(...)`: the no-seed finding at the
    default arm's setup also names the `if` that picks it, where a reader points."""
    src = (DDP + "import argparse\np = argparse.ArgumentParser()\np.add_argument('--use_MPI', action='store_true')\n"
           "def setup_dist():\n    dist.init_process_group('gloo')\ndef setup_dist_without_MPI():\n"
           "    dist.init_process_group('gloo')\ndef main():\n    args = p.parse_args()\n    if args.use_MPI:\n"
           "        setup_dist()\n    else:\n        setup_dist_without_MPI()\n    model = DDP(torch.nn.Linear(2, 2))\n"
           "if __name__ == '__main__':\n    main()\n")
    found = _rules(_project(tmp_path, {"train.py": src}), "no-seed")
    assert [12 in [r[1] for r in f.related] for f in found] == [True]


def test_a_closure_a_factory_returns_handed_a_rank_0_value_does_not_crash(tmp_path):
    """The full regression at 851aea3 stopped with StopIteration: a nested def a factory returns (resolved since
    16ca760) was looked up among the module's functions when rank 0 alone called it with a writer. It is skipped:
    its callers are unknown."""
    fns = ("import torch\ndef make_step(model):\n    def step(x, writer):\n        loss = model(x).sum()\n"
           ""
           "        loss.backward()\n        if writer is not None:\n"
           "            writer.add_scalar('loss', loss.item())\n"
           "    return step\n")
    train = (DDP + "from torch.utils.tensorboard import SummaryWriter\nimport fns\ndef main():\n"
             "    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n    model = DDP(torch.nn.Linear(2, 2))\n"
             "    step = fns.make_step(model)\n    writer = SummaryWriter() if dist.get_rank() == 0 else None\n"
             "    for x in [torch.ones(2)] * 4:\n        if dist.get_rank() == 0:\n            step(x, writer)\n"
             "        else:\n            step(x, None)\nif __name__ == '__main__':\n    main()\n")
    _rules(_project(tmp_path, {"fns.py": fns, "train.py": train}), "rank0-local-loss")
