"""Issue 35: a class of round 548-553's first look (docs/measured/cpu2/audit_heldout_round548.txt), fixed after
it, quiet and loud; the test fails at the first look's code (13e9010). The round's other false alarms (XLM's
rank-0 `scores` print, YOLOX's padded validation sampler) and misses are left, said in docs/results.md."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist, time\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_a_meter_of_how_long_the_loss_took_is_no_loss(tmp_path):
    """ContrastiveSeg: `loss_start_time = time.time()`, `self.loss_time.update(time.time() - loss_start_time)`,
    and rank 0 prints `loss_time.avg` beside the reduced loss: a duration, not rank 0's loss (no
    rank0-local-loss). A meter fed the step's loss is."""
    train = (DDP + "class Meter:\n    def __init__(self):\n        self.sum, self.n = 0.0, 0\n"
             "    def update(self, v):\n        self.sum, self.n = self.sum + v, self.n + 1\n"
             "class Trainer:\n    def __init__(self):\n        self.model = DDP(torch.nn.Linear(2, 2))\n"
             "        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)\n        self.METER = Meter()\n"
             "    def train(self, rank):\n        for i in range(10):\n            loss_start_time = time.time()\n"
             "            loss = self.model(torch.ones(2)).sum()\n            FEED\n            self.opt.zero_grad()\n"
             "            loss.backward()\n            self.opt.step()\n            if rank == 0:\n"
             "                print('Loss Time {:.3f}'.format(self.METER.sum))\n"
             "if __name__ == '__main__':\n    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
             "    Trainer().train(dist.get_rank())\n")
    timed = train.replace("METER", "loss_time").replace(
        "FEED", "self.loss_time.update(time.time() - loss_start_time)")
    assert not _rules(_project(tmp_path / "timed", {"trainer.py": timed}), "rank0-local-loss")
    fed = train.replace("METER", "train_losses").replace("FEED", "self.train_losses.update(loss.item())")
    assert _rules(_project(tmp_path / "fed", {"trainer.py": fed}), "rank0-local-loss")
