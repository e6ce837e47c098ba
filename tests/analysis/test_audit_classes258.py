"""Issue 35: classes of round 258-263's first look (docs/measured/cpu2/audit_heldout_round258.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (1659081)."""

from test_audit import _project
from test_audit_classes135 import SEEDED
from test_audit_classes189 import _line
from test_audit_classes246 import HEAD, SET_UP, STEP, _rules


def test_a_meter_fed_the_all_reduced_loss_holds_the_global_loss(tmp_path):
    """open_lm: `global_loss_tensor = total_loss.detach().clone()`, `dist.all_reduce(global_loss_tensor, op=AVG)`
    under `if args.world_size > 1:`, then rank 0 feeds `losses_m.update(global_loss_tensor.item(), n)` to a meter
    that prints: the meter holds the global loss. Fed the unreduced loss, it holds rank 0's own."""
    meter = ("class AverageMeter:\n    def __init__(self):\n        self.val = 0\n"
             "    def update(self, v, n=1):\n        self.val = v\n        print('loss', v)\n")
    train = SEEDED + "from meter import AverageMeter\n" + SET_UP + (
        "losses_m = AverageMeter()\nfor step in range(3):\n" + STEP +
        "    global_loss_tensor = loss.detach().clone()\n    if world_size > 1:\n"
        "        dist.all_reduce(global_loss_tensor)\n        global_loss_tensor /= world_size\n"
        "    if rank == 0:\n        losses_m.update(global_loss_tensor.item(), 2)\n")
    files = {"train.py": train, "meter.py": meter}
    assert not _rules(_project(tmp_path / "quiet", files), "rank0-local-loss")
    raw = {**files, "train.py": train.replace("losses_m.update(global_loss_tensor.item(), 2)",
                                              "losses_m.update(loss.item(), 2)")}
    assert _rules(_project(tmp_path / "loud", raw), "rank0-local-loss")


def test_no_seed_names_the_spawn_that_hands_the_parents_model_on(tmp_path):
    """ODTK: main() builds the model in the parent and hands it to `torch.multiprocessing.spawn(worker, args=(...,
    model, ...))`; nothing seeds torch: the no-seed finding names the spawn, where the unseeded model leaves for the
    ranks."""
    train = HEAD + ("import torch.multiprocessing as mp\ndef worker(rank, model):\n"
                    "    dist.init_process_group('gloo')\n    model = DDP(model)\n"
                    "def main():\n    model = torch.nn.Linear(2, 2)\n    mp.spawn(worker, args=(model,), nprocs=2)\n"
                    "if __name__ == '__main__':\n    main()\n")
    hits = _rules(_project(tmp_path, {"train.py": train}), "no-seed")
    assert len(hits) == 1 and _line(train, "mp.spawn(") in {n for _, n in hits[0].related}
