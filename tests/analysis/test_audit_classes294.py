"""Issue 35: classes of round 294-299's first look (docs/measured/cpu2/audit_heldout_round294.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (39d6f1b)."""

from test_audit import _project
from test_audit_classes189 import _line
from test_audit_classes246 import SEED_ONLY, STEP, _rules


def test_a_helper_that_averages_its_argument_in_place(tmp_path):
    """VirTex: `val_loss_dict = {k: v / n ...}`, then `dist.average_across_processes(val_loss_dict)` (a project
    helper: `for k in t: dist.all_reduce(t[k]); t[k] /= world_size`), then rank 0 writes it: the global loss.
    A helper that only reads its argument averages nothing."""
    util = ("import torch.distributed as dist\ndef average_across_processes(t):\n    for k in t:\nBODY")
    train = SEED_ONLY + ("import util\ndist.init_process_group('gloo')\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                         "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor step in range(3):\n" + STEP +
                         "    val_loss = model(torch.ones(2)).sum().detach()\n    val_loss_dict = {'loss': val_loss}\n"
                         "    util.average_across_processes(val_loss_dict)\n    if dist.get_rank() == 0:\n"
                         "        print('val', val_loss_dict)\n")
    quiet = util.replace("BODY", "        dist.all_reduce(t[k])\n        t[k] /= dist.get_world_size()\n")
    assert not _rules(_project(tmp_path / "quiet", {"train.py": train, "util.py": quiet}), "rank0-local-loss")
    loud = util.replace("BODY", "        print(k, t[k])\n")
    hits = _rules(_project(tmp_path / "loud", {"train.py": train, "util.py": loud}), "rank0-local-loss")
    assert [h.line for h in hits] == [_line(train, "print('val'")]


def test_loguru_s_console_on_rank_0_alone(tmp_path):
    """VirTex's common_setup: `logger.remove(0)`, then `if dist.is_master_process(): logger.add(sys.stdout, ...)`;
    every rank's `logger.info(f'[Loss {loss:.3f}]')` shows rank 0's alone: rank0-local-loss. With the stdout sink
    on every rank, every rank's line shows."""
    setup = ("import sys\nimport torch.distributed as dist\nfrom loguru import logger\ndef common_setup():\n"
             "    logger.remove(0)\nGUARD        logger.add(sys.stdout, format='{message}')\n")
    train = SEED_ONLY + ("from loguru import logger\nfrom common import common_setup\n"
                         "dist.init_process_group('gloo')\ncommon_setup()\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                         "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor step in range(3):\n" + STEP +
                         "    logger.info(f'[Loss {loss:.3f}]')\n")
    rank0 = setup.replace("GUARD", "    if dist.get_rank() == 0:\n")
    hits = _rules(_project(tmp_path / "rank0", {"train.py": train, "common.py": rank0}), "rank0-local-loss")
    assert [h.line for h in hits] == [_line(train, "logger.info(")]
    every = setup.replace("GUARD", "    if True:\n")
    assert not _rules(_project(tmp_path / "every", {"train.py": train, "common.py": every}), "rank0-local-loss")
