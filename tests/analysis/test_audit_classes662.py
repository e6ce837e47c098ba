"""Issue 35: classes of round 662-667's first look (docs/measured/cpu2/audit_heldout_round662.txt), fixed after
it, quiet and loud; each test fails at the first look's code (48b3afd7). The round's other misses are left, said in
docs/results.md."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_no_sync_through_a_name_bound_to_the_method(tmp_path):
    """MASR: `loss_dict = self.model(...)`, then `context = self.model.no_sync` (or nullcontext) and `with
    context(): loss.backward()`: the forward ran outside no_sync, so every micro-batch still all-reduces
    (accumulation-without-no-sync at the with). The forward inside the with is quiet."""
    src = (DDP + "from contextlib import nullcontext\nif __name__ == '__main__':\n    dist.init_process_group('gloo')\n"
           "    torch.manual_seed(0)\n    model = DDP(torch.nn.Linear(2, 2))\n"
           "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    accum_grad = 4\n"
           "    for batch_id in range(8):\n        FORWARD_OUT\n        if batch_id % accum_grad != 0:\n"
           "            context = model.no_sync\n        else:\n            context = nullcontext\n"
           "        with context():\n            FORWARD_IN\n            (loss / accum_grad).backward()\n"
           "        if batch_id % accum_grad == 0:\n            opt.step()\n            opt.zero_grad()\n")
    forward = "loss = model(torch.ones(2)).sum()"
    out = _project(tmp_path / "out", {"t.py": src.replace("FORWARD_OUT", forward).replace("FORWARD_IN", "pass")})
    assert [f.line for f in _rules(out, "accumulation-without-no-sync")] == [16]
    inside = _project(tmp_path / "in", {"t.py": src.replace("FORWARD_OUT", "pass").replace("FORWARD_IN", forward)})
    assert not _rules(inside, "accumulation-without-no-sync")


MISC = ("import os, torch\nimport torch.distributed as dist\ndef init_distributed_mode(args):\n"
        "    if args.dist_on_itp:\n        args.rank = int(os.environ['OMPI_COMM_WORLD_RANK'])\n"
        "    elif 'RANK' in os.environ and 'WORLD_SIZE' in os.environ:\n        args.rank = int(os.environ['RANK'])\n"
        "    else:\n        args.distributed = False\n        return\n    args.distributed = True\n"
        "    dist.init_process_group(backend='gloo', rank=args.rank)\n")
MAIN = (DDP + "import argparse\nimport misc\ndef main(args):\n    misc.init_distributed_mode(args)\n"
        "    torch.manual_seed(0)\n    model = torch.nn.Linear(2, 2)\n    if args.distributed:\n"
        "        model = DDP(model)\n    model(torch.ones(2)).sum().backward()\n    BARRIER\n"
        "if __name__ == '__main__':\n    p = argparse.ArgumentParser()\n"
        "    p.add_argument('--dist_on_itp', action='store_true')\n    main(p.parse_args())\n")


def test_an_mpi_launcher_arm_before_the_environment_arms_is_a_launch_test(tmp_path):
    """AdaptFormer (MAE's util/misc.py): `if args.dist_on_itp: args.rank = int(os.environ['OMPI_COMM_WORLD_RANK'])
    elif 'RANK' in os.environ ...: else: args.distributed = False; return`, then init_process_group: the group is
    set up only under a launcher, so the unguarded `torch.distributed.barrier()` after training raises in the
    single-process run (collective-outside-switch). Under `if args.distributed:` it is quiet."""
    loud = _project(tmp_path / "bare", {"misc.py": MISC, "main.py": MAIN.replace("BARRIER", "dist.barrier()")})
    assert [f.line for f in _rules(loud, "collective-outside-switch")] == [12]
    quiet = _project(tmp_path / "guarded", {"misc.py": MISC, "main.py": MAIN.replace(
        "BARRIER", "if args.distributed:\n        dist.barrier()")})
    assert not _rules(quiet, "collective-outside-switch")
