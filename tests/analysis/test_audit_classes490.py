"""Issue 35: classes of round 490-495's first look (docs/measured/cpu2/audit_heldout_round490.txt), fixed after
it, each quiet and loud; the test fails at the first look's code (942c0dd). (The round's other fix, a copy of
torch's own launcher whose --master_port default is torchrun's, has no fixture here: a small copy of the launcher
gets no finding at 942c0dd either; Multi-Singer's full launch.py, a held-out copy, is where it shows.)"""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_a_global_writer_created_on_rank_0_alone(tmp_path):
    """PolarNet, VLN-HAMT (UNITER's utils): `from utils.logger import TB_LOGGER` (a module these files lack), then
    `TB_LOGGER.create(log_dir)` under `if default_gpu:` and `TB_LOGGER.add_scalar('step/loss', loss.item(), step)`
    on every rank: only rank 0's writer was created, so it logs rank 0's own loss. Created on every rank, the
    writes are every rank's (no rank0-local-loss)."""
    train = (DDP + "from utils.logger import TB_LOGGER\ndef main():\n    dist.init_process_group('gloo')\n"
             "    default_gpu = dist.get_rank() == 0\n    torch.manual_seed(0)\n    GUARD\n"
             "        TB_LOGGER.create('logs')\n    model = DDP(torch.nn.Linear(2, 2))\n"
             "    for step in range(100):\n        loss = model(torch.ones(2)).sum()\n        loss.backward()\n"
             "        TB_LOGGER.add_scalar('step/loss', loss.item(), step)\nif __name__ == '__main__':\n    main()\n")
    rank0 = train.replace("GUARD", "if default_gpu:")
    assert _rules(_project(tmp_path / "rank0", {"train.py": rank0}), "rank0-local-loss")
    every = train.replace("GUARD", "if True:")
    assert not _rules(_project(tmp_path / "every", {"train.py": every}), "rank0-local-loss")
