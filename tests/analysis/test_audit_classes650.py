"""Issue 35: classes of round 650-655's first look (docs/measured/cpu2/audit_heldout_round650.txt), fixed after
it, quiet and loud; each test fails at the first look's code (94b92d6d). The round's other false alarms and misses
are left, said in docs/results.md."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_a_record_whose_loss_key_holds_the_losss_name(tmp_path):
    """VoiceprintRecognition's save_checkpoint: `use_loss = configs.loss_conf.get('use_loss', 'AAMLoss')`, then
    rank 0 writes `json.dumps({"last_epoch": epoch, "loss": use_loss})`: the loss's name, no value (no
    rank0-local-loss). A record holding the step's loss value is one."""
    src = (DDP + "import json\ndef save_checkpoint(configs, epoch, loss_value):\n"
           "    use_loss = configs.get('use_loss', 'AAMLoss')\n    data = {'last_epoch': epoch, 'loss': VALUE}\n"
           "    with open('model.state', 'w') as f:\n        f.write(json.dumps(data))\n"
           "if __name__ == '__main__':\n    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
           "    model = DDP(torch.nn.Linear(2, 2))\n    for epoch in range(2):\n"
           "        loss = model(torch.ones(2)).sum()\n        loss.backward()\n        if dist.get_rank() == 0:\n"
           "            save_checkpoint({}, epoch, loss.item())\n")
    assert not _rules(_project(tmp_path / "name", {"t.py": src.replace("VALUE", "use_loss")}), "rank0-local-loss")
    assert _rules(_project(tmp_path / "value", {"t.py": src.replace("VALUE", "loss_value")}), "rank0-local-loss")


def test_the_else_of_an_isinstance_ddp_test_holds_no_wrapper(tmp_path):
    """VoiceprintRecognition: `if isinstance(self.model, DistributedDataParallel): eval_model = self.model.module
    ... else: eval_model = self.model if len(self.model) == 1 else self.model[0]`, and rank 0 alone runs
    `eval_model(x)` in evaluate(): the else arm runs only unwrapped (no ddp-forward-under-rank0). A copy made
    outside the test is the wrapper."""
    src = (DDP + "import torch.nn as nn\nclass Trainer:\n    def __init__(self):\n"
           "        dist.init_process_group('gloo')\n        torch.manual_seed(0)\n"
           "        self.model = DDP(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)))\n    def evaluate(self):\n"
           "        PICK\n        with torch.no_grad():\n            return eval_model(torch.ones(2, 2))\n"
           "    def train(self):\n        self.model(torch.ones(2, 2)).sum().backward()\n"
           "        if dist.get_rank() == 0:\n            self.evaluate()\nif __name__ == '__main__':\n"
           "    Trainer().train()\n")
    arms = ("if isinstance(self.model, DDP):\n            eval_model = self.model.module\n        else:\n"
            "            eval_model = self.model")
    assert not _rules(_project(tmp_path / "arms", {"t.py": src.replace("PICK", arms)}), "ddp-forward-under-rank0")
    assert _rules(_project(tmp_path / "copy", {"t.py": src.replace("PICK", "eval_model = self.model")}),
                  "ddp-forward-under-rank0")


def test_an_exit_call_in_rank_0s_block_inside_the_training_loop(tmp_path):
    """GraphFormers: inside the epoch loop, `if local_rank == 0: ... if best_count >= 2: ... exit()`, then
    `dist.barrier()`: rank 0 alone leaves, the others wait at the barrier forever (collective-under-rank0 at the
    exit's test). An exit every rank takes is quiet."""
    src = (DDP + "def train(local_rank):\n    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
           "    model = DDP(torch.nn.Linear(2, 2))\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
           "    best_count = 0\n    for ep in range(100):\n        model(torch.ones(2)).sum().backward()\n"
           "        opt.step()\n        GUARD\n            best_count += 1\n            if best_count >= 2:\n"
           "                exit()\n        dist.barrier()\nif __name__ == '__main__':\n    train(dist.get_rank())\n")
    loud = _rules(_project(tmp_path / "rank0", {"t.py": src.replace("GUARD", "if local_rank == 0:")}),
                  "collective-under-rank0")
    assert [f.line for f in loud] == [14]
    assert not _rules(_project(tmp_path / "all", {"t.py": src.replace("GUARD", "if ep > 3:")}),
                      "collective-under-rank0")


def test_a_sequential_of_an_unseen_factorys_model_and_a_project_head(tmp_path):
    """VoiceprintRecognition: `self.model = nn.Sequential(self.backbone, classifier)` with `self.backbone =
    build_model(...)` and `classifier = SpeakerIdentification(...)` from modules these files lack, and
    configs/cam++.yml naming CAMPPlus, a project class with BatchNorm: batchnorm-without-sync (check by hand) at
    the wrap. A config naming a class
    without BatchNorm is quiet."""
    models = ("import torch.nn as nn\nclass CAMPPlus(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
              "        self.body = nn.Sequential(nn.Conv1d(4, 4, 1), NORM)\n    def forward(self, x):\n"
              "        return self.body(x)\n")
    trainer = (DDP + "import torch.nn as nn, yaml\nfrom mvector.models import build_model\n"
               "from mvector.models.fc import SpeakerIdentification\nclass Trainer:\n    def __init__(self):\n"
               "        self.configs = yaml.safe_load(open('configs/cam++.yml'))\n"
               "    def setup(self):\n        self.backbone = build_model(configs=self.configs)\n"
               "        classifier = SpeakerIdentification()\n        self.model = nn.Sequential(self.backbone, "
               "classifier)\n    def train(self):\n        dist.init_process_group('gloo')\n"
               "        torch.manual_seed(0)\n        self.setup()\n        self.model = DDP(self.model)\n"
               "        self.model(torch.ones(2, 4, 3)).sum().backward()\nif __name__ == '__main__':\n"
               "    Trainer().train()\n")
    files = {"mvector/trainer.py": trainer, "configs/cam++.yml": "model_conf:\n  model: 'CAMPPlus'\n"}
    bn = _project(tmp_path / "bn", {**files, "mvector/models/campplus.py": models.replace(
        "NORM", "nn.BatchNorm1d(4)")})
    assert [f.line for f in _rules(bn, "batchnorm-without-sync")] == [17]
    ln = _project(tmp_path / "ln", {**files, "mvector/models/campplus.py": models.replace(
        "NORM", "nn.GroupNorm(1, 4)")})
    assert not _rules(ln, "batchnorm-without-sync")
