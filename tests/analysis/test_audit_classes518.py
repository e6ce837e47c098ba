"""Issue 35: classes of round 518-523's first look (docs/measured/cpu2/audit_heldout_round518.txt), fixed after
it, each quiet and loud; each test fails at the first look's code (7bf8984)."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_a_writers_tag_from_the_loss_record_is_no_loss(tmp_path):
    """DiffMoE: `for k, v in running_loss.items(): avg_loss = torch.tensor(v); dist.all_reduce(avg_loss); avg_loss
    = avg_loss.item() / world_size; if rank == 0: writer.add_scalar(k, avg_loss, step)`: the tag `k` is a key of
    the record, not its value; the value written is reduced (no rank0-local-loss). Without the all_reduce, rank 0
    writes its own."""
    train = (DDP + "from torch.utils.tensorboard import SummaryWriter\ndef main(rank):\n"
             "    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n    model = DDP(torch.nn.Linear(2, 2))\n"
             "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    writer = SummaryWriter('logs')\n"
             "    running_loss = {}\n    for step in range(100):\n"
             "        loss_dict = {'mse': model(torch.ones(2)).sum()}\n"
             "        loss_dict['mse'].backward()\n        opt.step()\n        for k, v in loss_dict.items():\n"
             "            running_loss[k] = running_loss.get(k, 0) + v.item()\n        if step % 10 == 0:\n"
             "            for k, v in running_loss.items():\n                avg_loss = torch.tensor(v / 10)\n"
             "                REDUCE\n                avg_loss = avg_loss.item() / dist.get_world_size()\n"
             "                if rank == 0:\n                    writer.add_scalar(k, avg_loss, step)\n"
             "            running_loss = {}\nif __name__ == '__main__':\n    main(0)\n")
    reduced = train.replace("REDUCE", "dist.all_reduce(avg_loss, op=dist.ReduceOp.SUM)")
    assert not _rules(_project(tmp_path / "reduced", {"train.py": reduced}), "rank0-local-loss")
    own = train.replace("REDUCE", "pass")
    assert _rules(_project(tmp_path / "own", {"train.py": own}), "rank0-local-loss")
