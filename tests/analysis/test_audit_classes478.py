"""Issue 35: classes of round 478-483's first look (docs/measured/cpu2/audit_heldout_round478.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (7330fa7)."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_a_port_parameter_moved_on_until_a_socket_finds_it_free(tmp_path):
    """PccAI: `setup(rank, world_size, master_address, master_port)` probes `connect_ex((addr, master_port))` and
    runs `master_port += 1` until it finds a free port, then sets MASTER_PORT: no fixed port (--master_port's
    29500 is where the search starts). Without the search the option's default is the port."""
    train = (DDP + "import os, socket, argparse\nimport torch.multiprocessing as mp\n"
             "parser = argparse.ArgumentParser()\nparser.add_argument('--master_port', type=int, default=29500)\n"
             "def setup(rank, world_size, master_port):\nSEARCH"
             "    os.environ['MASTER_PORT'] = str(master_port)\n    os.environ['MASTER_ADDR'] = '127.0.0.1'\n"
             "    dist.init_process_group('gloo', rank=rank, world_size=world_size)\n"
             "def train_main(rank, opt):\n    setup(rank, 2, opt.master_port)\n    torch.manual_seed(0)\n"
             "    model = DDP(torch.nn.Linear(2, 2))\nif __name__ == '__main__':\n"
             "    mp.spawn(train_main, nprocs=2, args=(parser.parse_args(),))\n")
    search = ("    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n    while True:\n"
              "        if s.connect_ex(('127.0.0.1', master_port)) != 0:\n            break\n"
              "        master_port += 1\n")
    searched = train.replace("SEARCH", search)
    assert not _rules(_project(tmp_path / "searched", {"train.py": searched}), "hard-coded-master-port")
    fixed = train.replace("SEARCH", "")
    assert _rules(_project(tmp_path / "fixed", {"train.py": fixed}), "hard-coded-master-port")


def test_a_module_global_root_logger_on_every_rank(tmp_path):
    """PccAI: `pccai/utils/logger.py` keeps `log = logging.getLogger()` after `logging.basicConfig(handlers=[
    StreamHandler(sys.stdout)])`, on every rank; the trainer logs the step loss with `logger.log.info(message)`:
    every rank's line. Created on rank 0 alone, the line is rank 0's (rank0-local-loss, not this rule)."""
    logger = ("import logging, sys\nlog = None\ndef create_logger():\n"
              "    logging.basicConfig(level=logging.INFO, handlers=[logging.StreamHandler(sys.stdout)])\n"
              "    global log\n    log = logging.getLogger()\n")
    train = (DDP + "import logger\ndef train(rank):\n    dist.init_process_group('gloo', rank=rank, world_size=2)\n"
             "    GUARDlogger.create_logger()\n    torch.manual_seed(0)\n    model = DDP(torch.nn.Linear(2, 2))\n"
             "    for step in range(100):\n        loss = model(torch.ones(2)).sum()\n        loss.backward()\n"
             "        message = 'loss: %f' % loss.item()\n        logger.log.info(message)\n"
             "if __name__ == '__main__':\n    torch.multiprocessing.spawn(train, nprocs=2)\n")
    every = {"train.py": train.replace("GUARD", ""), "logger.py": logger}
    assert _rules(_project(tmp_path / "every", every), "every-rank-prints-loss")
    rank0 = {"train.py": train.replace("GUARD", "if rank == 0:\n        "), "logger.py": logger}
    assert not _rules(_project(tmp_path / "rank0", rank0), "every-rank-prints-loss")


def test_a_short_option_a_launch_script_passes(tmp_path):
    """YOWOv2: `parser.add_argument('-accu', '--accumulate', default=1)` and train_ucf.sh passes `-accu 16`: the
    default run accumulates 16 micro-batches, every one all-reducing. With `-accu 1` in the script, it steps every
    micro-batch."""
    train = (DDP + "import argparse\nparser = argparse.ArgumentParser()\n"
             "parser.add_argument('-accu', '--accumulate', default=1, type=int)\nargs = parser.parse_args()\n"
             "dist.init_process_group('gloo')\ntorch.manual_seed(0)\nmodel = DDP(torch.nn.Linear(2, 2))\n"
             "opt = torch.optim.SGD(model.parameters(), lr=0.1)\naccumulate = args.accumulate\n"
             "for ni, x in enumerate([torch.ones(2)] * 64):\n    losses = model(x).sum()\n    losses /= accumulate\n"
             "    losses.backward()\n    if ni % accumulate == 0:\n        opt.step()\n        opt.zero_grad()\n")
    script = "torchrun --nproc_per_node 2 train.py \\\n        -bs 8 \\\n        -accu N \\\n        -K 16\n"
    sixteen = {"train.py": train, "train_ucf.sh": script.replace("N", "16")}
    assert _rules(_project(tmp_path / "sixteen", sixteen), "accumulation-without-no-sync")
    one = {"train.py": train, "train_ucf.sh": script.replace("N", "1")}
    assert not _rules(_project(tmp_path / "one", one), "accumulation-without-no-sync")
