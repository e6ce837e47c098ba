"""Issue 35: a class of round 366-371's first look (docs/measured/cpu2/audit_heldout_round366.txt), fixed after
it, quiet and loud; the test fails at the first look's code (beb8fce)."""

from test_audit import _project
from test_audit_classes246 import SEED_ONLY, _rules


def test_a_helper_every_rank_calls_does_not_meet_rank_0s_last_call(tmp_path):
    """TRELLIS: `self.snapshot()` every i_sample steps on every rank, then `if self.is_master:
    self.snapshot(suffix='final')` after the loop, and snapshot() gathers the samples (`dist.gather`): the final
    call is rank 0's alone, and rank 1, already past run(), never joins it (collective-under-rank0). The periodic
    calls meet each other, not that one. Two direct barriers, `if rank != 0: dist.barrier()` and `if rank == 0:
    dist.barrier()`, do meet: quiet."""
    train = SEED_ONLY + ("def snapshot(model):\n    t = model(torch.ones(2)).detach()\n    out = [torch.zeros(2)] * 2\n"
                         "    dist.gather(t, out if dist.get_rank() == 0 else [], dst=0)\n"
                         "dist.init_process_group('gloo')\nrank = dist.get_rank()\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                         "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor step in range(4):\n"
                         "    loss = model(torch.ones(2)).sum()\n    opt.zero_grad()\n    loss.backward()\n"
                         "    opt.step()\n"
                         "    if step % 2 == 0:\n        snapshot(model.module)\nEND")
    final = train.replace("END", "if rank == 0:\n    snapshot(model.module)\n")
    hits = _rules(_project(tmp_path / "final", {"train.py": final}), "collective-under-rank0")
    assert [h.line for h in hits] == [len(final.splitlines())]  # (the last line: rank 0's final snapshot)
    paired = train.replace("END", "if rank != 0:\n    dist.barrier()\nif rank == 0:\n    dist.barrier()\n")
    assert not _rules(_project(tmp_path / "paired", {"train.py": paired}), "collective-under-rank0")
