"""Issue 35: classes of round 264-269's first look (docs/measured/cpu2/audit_heldout_round264.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (49c1bfd)."""

from test_audit import _project
from test_audit_classes189 import _line
from test_audit_classes246 import HEAD, _rules


def test_a_project_helper_that_returns_the_gpu_count(tmp_path):
    """EfficientViT: `def get_dist_size() -> int: return int(os.environ["WORLD_SIZE"])`, then `init_lr = base_lr *
    get_dist_size()`: the lr grows with the GPU count. A helper that returns the rank does not grow it."""
    dist_utils = "import os\ndef get_dist_size():\n    return int(os.environ['WORLD_SIZE'])\n"
    train = HEAD + ("import os\nfrom dist_utils import get_dist_size\ntorch.manual_seed(0)\n"
                    "dist.init_process_group('gloo')\nmodel = DDP(torch.nn.Linear(2, 2))\nbase_lr = 0.1\n"
                    "init_lr = base_lr * get_dist_size()\nopt = torch.optim.SGD(model.parameters(), lr=init_lr)\n")
    hits = _rules(_project(tmp_path / "loud", {"train.py": train, "dist_utils.py": dist_utils}),
                  "lr-grows-with-world-size")
    assert [h.line for h in hits] == [_line(train, "init_lr = base_lr")]
    rank = {"train.py": train, "dist_utils.py": dist_utils.replace("WORLD_SIZE", "RANK")}
    assert not _rules(_project(tmp_path / "quiet", rank), "lr-grows-with-world-size")


def test_a_spawn_that_names_its_function_by_keyword(tmp_path):
    """CVNets: `device_setup(opts)` seeds torch in the parent, then `torch.multiprocessing.spawn(fn=
    distributed_worker, args=(...), nprocs=n)`: the workers build the model unseeded (seed-before-spawn). A worker
    that seeds itself is fine."""
    train = HEAD + ("import torch.multiprocessing as mp\ndef worker(rank):\n{seed}    dist.init_process_group('gloo')\n"
                    "    model = DDP(torch.nn.Linear(2, 2))\n"
                    "def main():\n    torch.manual_seed(0)\n    mp.spawn(fn=worker, nprocs=2)\n"
                    "if __name__ == '__main__':\n    main()\n")
    loud = train.format(seed="")
    assert [h.line for h in _rules(_project(tmp_path / "loud", {"train.py": loud}), "seed-before-spawn")] == [
        _line(loud, "mp.spawn(")]
    quiet = train.format(seed="    torch.manual_seed(0)\n")
    assert not _rules(_project(tmp_path / "quiet", {"train.py": quiet}), "seed-before-spawn")
