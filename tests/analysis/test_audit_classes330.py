"""Issue 35: classes of round 330-335's first look (docs/measured/cpu2/audit_heldout_round330.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (6069c42)."""

from test_audit import _project
from test_audit_classes189 import _line
from test_audit_classes246 import SEED_ONLY, STEP, _rules

SET_UP = ("dist.init_process_group('gloo')\nrank = dist.get_rank()\nmodel = DDP(torch.nn.Linear(2, 2))\n"
          "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor step in range(3):\n" + STEP)


def test_a_class_called_under_rank_0_runs_its_init_alone(tmp_path):
    """StyleGAN-T: `if flag: return FeatureStats.load(cache_file)`, whose load() builds a FeatureStats; the class's
    append_torch broadcasts, but only a call of that method would: no collective-under-rank0. Rank 0 alone calling
    the method that broadcasts is one."""
    train = SEED_ONLY + ("class Stats:\n    def __init__(self):\n        self.items = []\n"
                         "    def append_all(self, x):\n        dist.broadcast(x, src=0)\n"
                         "        self.items.append(x)\n    @staticmethod\n    def load(path):\n"
                         "        return Stats()\n" + SET_UP + "if rank == 0:\nCALL")
    loaded = train.replace("CALL", "    stats = Stats.load('stats.pkl')\n")
    assert not _rules(_project(tmp_path / "loaded", {"train.py": loaded}), "collective-under-rank0")
    appended = train.replace("CALL", "    stats = Stats()\n    stats.append_all(torch.ones(1))\n")
    hits = _rules(_project(tmp_path / "appended", {"train.py": appended}), "collective-under-rank0")
    assert [h.line for h in hits] == [_line(appended, "stats.append_all(")]


def test_a_model_class_that_converts_its_own_batchnorm(tmp_path):
    """MoBY: `model = build_model(config)` from a models package whose factory the copies lack; the project's model
    class MoBY holds MoBYMLP heads with BatchNorm1d and converts them in its __init__
    (`nn.SyncBatchNorm.convert_sync_batchnorm(self.projector)`, in place): no batchnorm-without-sync. Without the
    conversion the likely model has plain BatchNorm (check by hand)."""
    moby = ("import torch.nn as nn\nclass MLP(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.fc = nn.Linear(2, 2)\n        self.bn = nn.BatchNorm1d(2)\n"
            "class MoBY(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.projector = MLP()\nCONVERT")
    train = SEED_ONLY + ("from models import build_model\ndist.init_process_group('gloo')\n"
                         "model = build_model('moby')\nmodel = DDP(model)\n"
                         "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor step in range(3):\n" + STEP)
    converted = moby.replace("CONVERT", "        nn.SyncBatchNorm.convert_sync_batchnorm(self.projector)\n")
    assert not _rules(_project(tmp_path / "converted", {"train.py": train, "models/moby.py": converted}),
                      "batchnorm-without-sync")
    plain = moby.replace("CONVERT", "")
    hits = _rules(_project(tmp_path / "plain", {"train.py": train, "models/moby.py": plain}), "batchnorm-without-sync")
    assert [h.line for h in hits] == [_line(train, "model = DDP(")]


def test_a_gather_that_only_fills_a_queue_makes_no_loss_global(tmp_path):
    """MoBY: the model's forward returns the contrastive loss of this rank's queries and calls
    `self._dequeue_and_enqueue(keys1, keys2)`, a statement whose helper all-gathers the keys into the negatives'
    queue: the loss is still this rank's, so rank 0 printing it is rank0-local-loss. A forward whose loss is
    computed from what its gather returns (CLIP's all-gathered features) covers every rank's samples: quiet."""
    model = ("import torch, torch.distributed as dist\nimport torch.nn.functional as F\n"
             "def gather_all(x):\n    out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]\n"
             "    dist.all_gather(out, x)\n    return torch.cat(out)\n"
             "class Contrast(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
             "        self.enc = torch.nn.Linear(2, 2)\n        self.queue = torch.zeros(8, 2)\n"
             "    def _enqueue(self, k):\n        k = gather_all(k)\n        self.queue = torch.cat([self.queue, k])\n"
             "    def forward(self, x):\n        q = self.enc(x)\nBODY")
    train = SEED_ONLY + ("from contrast import Contrast\ndist.init_process_group('gloo')\nrank = dist.get_rank()\n"
                         "model = DDP(Contrast())\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                         "for step in range(3):\n    loss = model(torch.ones(4, 2))\n    opt.zero_grad()\n"
                         "    loss.backward()\n    opt.step()\n    if rank == 0:\n        print(loss.item())\n")
    queued = model.replace("BODY", "        self._enqueue(q.detach())\n"
                                   "        loss = (q @ self.queue.T).logsumexp(1).mean()\n        return loss\n")
    hits = _rules(_project(tmp_path / "queued", {"train.py": train, "contrast.py": queued}), "rank0-local-loss")
    assert [h.line for h in hits] == [_line(train, "print(loss.item())")]
    gathered = model.replace("BODY", "        k = gather_all(q)\n        loss = (q @ k.T).logsumexp(1).mean()\n"
                                     "        return loss\n")
    assert not _rules(_project(tmp_path / "gathered", {"train.py": train, "contrast.py": gathered}),
                      "rank0-local-loss")
