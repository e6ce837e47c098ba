"""Issue 35: classes of round 542-547's first look (docs/measured/cpu2/audit_heldout_round542.txt), fixed after
it, each quiet and loud; each test fails at the first look's code (13111ed)."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_a_seeding_helper_handed_its_seed_by_keyword(tmp_path):
    """RapFlow-TTS: `seed = args.seed * dist.get_world_size() + rank`, then `seed_init(seed=seed)`, a helper that
    runs torch.manual_seed(seed): rank 0 seeds 200 at 2 ranks and 100 alone (seed-per-rank). `args.seed + rank`
    keeps rank 0's seed the single run's."""
    utils = "import torch\ndef seed_init(seed=100):\n    torch.manual_seed(seed)\n"
    train = (DDP + "import argparse\nfrom utils import seed_init\n"
             "def main(args):\n    dist.init_process_group('nccl')\n    rank = dist.get_rank()\n"
             "    seed = SEED\n    seed_init(seed=seed)\n    model = DDP(torch.nn.Linear(2, 2))\n"
             "    model(torch.ones(2)).sum().backward()\nif __name__ == '__main__':\n"
             "    main(argparse.Namespace(seed=100))\n")
    moves = train.replace("SEED", "args.seed * dist.get_world_size() + rank")
    assert _rules(_project(tmp_path / "moves", {"train_multi.py": moves, "utils.py": utils}), "seed-per-rank")
    kept = train.replace("SEED", "args.seed + rank")
    assert not _rules(_project(tmp_path / "kept", {"train_multi.py": kept, "utils.py": utils}), "seed-per-rank")


def test_an_empty_record_handed_to_the_logger_carries_no_loss(tmp_path):
    """FSRE-Depth: log(mode, losses) writes each entry with a writer; its callers hand it the all-reduced record
    or `{}` (an image-only call): no rank0-local-loss. A caller that hands it an unreduced record is."""
    train = (DDP + "from torch.utils.tensorboard import SummaryWriter\n"
             "def reduce_tensor(t, n):\n    rt = t.clone()\n    dist.all_reduce(rt)\n    return rt / n\n"
             "class Trainer:\n    def __init__(self, rank):\n        self.rank = rank\n"
             "        self.writer = SummaryWriter('logs')\n        self.model = DDP(torch.nn.Linear(2, 2))\n"
             "        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)\n    def log(self, mode, losses):\n"
             "        for l, v in losses.items():\n            self.writer.add_scalar(l, v, 0)\n"
             "    def run_epoch(self):\n"
             "        for i in range(10):\n            losses = {'loss': self.model(torch.ones(2)).sum()}\n"
             "            self.opt.zero_grad()\n            losses['loss'].backward()\n            self.opt.step()\n"
             "            for k in losses:\n                losses[k] = reduce_tensor(losses[k].data, 2)\n"
             "            if self.rank == 0:\n                self.log('train', OTHER)\n"
             "                self.log('train', losses)\nif __name__ == '__main__':\n"
             "    dist.init_process_group('gloo')\n"
             "    torch.manual_seed(0)\n    Trainer(dist.get_rank()).run_epoch()\n")
    empty = train.replace("OTHER", "{}")
    assert not _rules(_project(tmp_path / "empty", {"train_ddp.py": empty}), "rank0-local-loss")
    own = train.replace("OTHER", "{'loss': self.model(torch.ones(2)).sum()}")
    assert _rules(_project(tmp_path / "own", {"train_ddp.py": own}), "rank0-local-loss")
