"""Issue 35: classes of round 530-535's first look (docs/measured/cpu2/audit_heldout_round530.txt), fixed after
it, each quiet and loud; each test fails at the first look's code (98b3047)."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_a_user_id_port_formatted_into_the_dist_url(tmp_path):
    """SMOKE, fast-reid (detectron2's default_argument_parser): `port = 2 ** 15 + 2 ** 14 + hash(os.getuid()) %
    2 ** 14` then `default="tcp://127.0.0.1:{}".format(port)`: every job of one user gets the same port
    (hard-coded-master-port). A port read from the environment is the launcher's."""
    train = (DDP + "import argparse, os\nparser = argparse.ArgumentParser()\nport = PORT\n"
             "parser.add_argument('--dist-url', default='tcp://127.0.0.1:{}'.format(port))\n"
             "args = parser.parse_args()\ntorch.manual_seed(0)\n"
             "dist.init_process_group('nccl', init_method=args.dist_url, world_size=2, rank=0)\n"
             "model = DDP(torch.nn.Linear(2, 2))\nmodel(torch.ones(2)).sum().backward()\n")
    uid = train.replace("PORT", "2 ** 15 + 2 ** 14 + hash(os.getuid()) % 2 ** 14")
    assert _rules(_project(tmp_path / "uid", {"train_net.py": uid}), "hard-coded-master-port")
    env = train.replace("PORT", "os.environ.get('MASTER_PORT', '29500')")
    assert not _rules(_project(tmp_path / "env", {"train_net.py": env}), "hard-coded-master-port")


def test_a_sum_loss_divided_by_a_constant_stays_a_sum(tmp_path):
    """SMOKE: `F.l1_loss(..., reduction="sum") / (self.loss_weight[1] * self.max_objs)`, both set in __init__:
    a sum over the rank's own objects, so DDP's average halves it at 2 ranks (sum-loss-unscaled, one finding for
    the function's three terms). Divided by the batch's own count, it is a mean."""
    loss = ("import torch\nimport torch.nn.functional as F\nclass SMOKELoss:\n"
            "    def __init__(self, cfg):\n        self.loss_weight = cfg['weights']\n        self.max_objs = 30\n"
            "    def __call__(self, pred, target):\n        n = target.numel()\n"
            "        a = F.l1_loss(pred[0], target, reduction='sum') / (DIV)\n"
            "        b = F.l1_loss(pred[1], target, reduction='sum') / (DIV)\n        return a + b\n")
    train = (DDP + "from loss import SMOKELoss\ndef main():\n    dist.init_process_group('gloo')\n"
             "    torch.manual_seed(0)\n    model = DDP(torch.nn.Linear(2, 2))\n"
             "    crit = SMOKELoss({'weights': [1.0, 1.0]})\n    out = model(torch.ones(2))\n"
             "    crit([out, out], torch.ones(2)).backward()\nif __name__ == '__main__':\n    main()\n")
    fixed = {"train.py": train, "loss.py": loss.replace("DIV", "self.loss_weight[1] * self.max_objs")}
    assert len(_rules(_project(tmp_path / "fixed", fixed), "sum-loss-unscaled")) == 1
    mean = {"train.py": train, "loss.py": loss.replace("DIV", "n")}
    assert not _rules(_project(tmp_path / "mean", mean), "sum-loss-unscaled")


def test_a_no_sync_entered_after_the_forward(tmp_path):
    """The from-scratch GPT: `logits = model(inputs)`, then `with model.no_sync() if not is_last else
    nullcontext(): loss.backward()`: DDP decides in forward whether the backward all-reduces, so every micro-batch
    still does (accumulation-without-no-sync). The forward inside the block skips the all-reduce."""
    train = (DDP + "from contextlib import nullcontext\ndef main(accum=16):\n    dist.init_process_group('gloo')\n"
             "    torch.manual_seed(0)\n    model = DDP(torch.nn.Linear(2, 2))\n"
             "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    for step in range(10):\n"
             "        for k in range(accum):\n            is_last = k == accum - 1\nBODY"
             "        opt.step()\n        opt.zero_grad()\nif __name__ == '__main__':\n    main()\n")
    outside = train.replace("BODY", "            loss = model(torch.ones(2)).sum()\n"
                                    "            with model.no_sync() if not is_last else nullcontext():\n"
                                    "                (loss / accum).backward()\n")
    assert _rules(_project(tmp_path / "outside", {"ddp_train.py": outside}), "accumulation-without-no-sync")
    inside = train.replace("BODY", "            with model.no_sync() if not is_last else nullcontext():\n"
                                   "                loss = model(torch.ones(2)).sum()\n"
                                   "                (loss / accum).backward()\n")
    assert not _rules(_project(tmp_path / "inside", {"ddp_train.py": inside}), "accumulation-without-no-sync")


def test_tqdm_write_on_every_rank_prints_the_loss(tmp_path):
    """Accel-RF: `tqdm.write(f"Loss: {loss.item()}")` outside the rank guard: every rank prints its own loss
    (every-rank-prints-loss). Under `if rank == 0:` it is rank 0's line."""
    train = (DDP + "from tqdm import tqdm\ndef main(rank):\n    dist.init_process_group('gloo')\n"
             "    torch.manual_seed(0)\n    model = DDP(torch.nn.Linear(2, 2))\n"
             "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    for i in range(100):\n"
             "        loss = model(torch.ones(2)).sum()\n        opt.zero_grad()\n        loss.backward()\n"
             "        opt.step()\n        GUARD\n            tqdm.write(f'Iter: {i} Loss: {loss.item()}')\n"
             "if __name__ == '__main__':\n    main(0)\n")
    every = train.replace("GUARD", "if i % 10 == 0:")
    assert _rules(_project(tmp_path / "every", {"run_nerf.py": every}), "every-rank-prints-loss")
    rank0 = train.replace("GUARD", "if rank == 0:")
    assert not _rules(_project(tmp_path / "rank0", {"run_nerf.py": rank0}), "every-rank-prints-loss")
