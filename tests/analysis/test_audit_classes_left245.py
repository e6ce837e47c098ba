"""Issue 35: classes the rounds up to 245 left (the closing note of that stop), fixed before round 246's first
look; every test but the last fails at ffdfd65."""

from test_audit import _project
from test_audit_classes135 import SEEDED
from test_audit_classes189 import _found, _line

STEP = "    loss = model(torch.ones(2)).sum()\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"


def test_a_progress_bar_only_rank_0_wraps_around_its_loader(tmp_path):
    """dyMEAN: `t_iter = tqdm(loader) if self._is_main_proc() else loader`, then `t_iter.set_postfix(loss=...)`
    behind `hasattr(t_iter, 'set_postfix')`: rank 0's bar shows its own micro-batch's loss. The main-process test is
    `local_rank == 0 or local_rank == -1`, where -1 is what the one-process arm of the set-up sets (`else:
    local_rank = -1` beside init_process_group): rank 0 alone passes it in a distributed run.
    Where the bar is every rank's (no rank test), it is every rank's print, not rank 0's."""
    train = SEEDED + (
        "from tqdm import tqdm\nimport os\nif int(os.environ.get('WORLD_SIZE', 1)) > 1:\n"
        "    local_rank = int(os.environ['LOCAL_RANK'])\n    dist.init_process_group('gloo')\nelse:\n"
        "    local_rank = -1\nmodel = DDP(torch.nn.Linear(2, 2))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "def is_main():\n    return local_rank == 0 or local_rank == -1\nloader = [1, 2]\n"
        "t_iter = tqdm(loader) if is_main() else loader\nfor batch in t_iter:\n" + STEP +
        "    if hasattr(t_iter, 'set_postfix'):\n        t_iter.set_postfix(loss=loss.item())\n")
    hits = [f for f in _found(_project(tmp_path / "loud", {"train.py": train})) if f.rule == "rank0-local-loss"]
    assert [h.line for h in hits] == [_line(train, "set_postfix(loss")]
    quiet = train.replace("tqdm(loader) if is_main() else loader", "tqdm(loader)")
    assert not [f for f in _found(_project(tmp_path / "quiet", {"train.py": quiet})) if f.rule == "rank0-local-loss"]


def test_a_log_method_of_a_base_trainer_writes_on_rank_0_alone(tmp_path):
    """dyMEAN: the subclass's step calls `self.log('loss', loss, step)`, defined by the project's base Trainer as
    `if self._is_main_proc(): self.writer.add_scalar(...)`: rank 0's TensorBoard gets its own micro-batch's loss.
    The base's own step, which the subclass replaces, logs nothing that runs. Where the base's log writes on every
    rank, there is no rank-0 finding."""
    base = ("import torch\nclass Trainer:\n    def __init__(self, model, rank, writer):\n"
            "        self.model, self.rank, self.writer = model, rank, writer\n"
            "        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "    def main(self):\n        return self.rank == 0\n"
            "    def log(self, name, value, step):\n        if self.main():\n"
            "            self.writer.add_scalar(name, value, step)\n"
            "    def train_step(self, batch, step):\n        loss = self.model(batch).sum()\n"
            "        self.log('Loss/train', loss, step)\n        return loss\n"
            "    def fit(self):\n        for step in range(3):\n"
            "            loss = self.train_step(torch.ones(2), step)\n"
            "            self.opt.zero_grad()\n            loss.backward()\n            self.opt.step()\n")
    sub = ("import torch\nfrom trainer import Trainer\nclass MyTrainer(Trainer):\n"
           "    def train_step(self, batch, step):\n        loss = self.model(batch).sum()\n"
           "        self.log('Overall/Loss', loss, step)\n        return loss\n")
    train = SEEDED + ("from torch.utils.tensorboard import SummaryWriter\nfrom my_trainer import MyTrainer\n"
                      "dist.init_process_group('gloo')\nrank = dist.get_rank()\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                      "MyTrainer(model, rank, SummaryWriter()).fit()\n")
    files = {"train.py": train, "trainer.py": base, "my_trainer.py": sub}
    hits = [f for f in _found(_project(tmp_path / "loud", files)) if f.rule == "rank0-local-loss"]
    assert [(h.path.rsplit("/", 1)[-1], h.line) for h in hits] == [("my_trainer.py", _line(sub, "self.log("))]
    every = {**files, "trainer.py": base.replace("if self.main():", "if True:")}
    assert not [f for f in _found(_project(tmp_path / "quiet", every)) if f.rule == "rank0-local-loss"]



def test_a_second_entry_point_that_nothing_imports_is_audited(tmp_path):
    """GNS's train.py (mp.spawn) beside the train_multinode.py that its SLURM script runs, ROSITA's run_rec.py
    beside run_vqa.py: an entry point no module imports from is a run of its own (its README documents it), not a
    library the launched script borrows from, so its defects are found. One the launched script imports from
    (UniMatch V2's supervised.py, test_audit_classes111) is still left to its imported functions."""
    other = (SEEDED + "def evaluate(model):\n    return 0\ndef main():\n    model = DDP(torch.nn.Linear(2, 2))\n"
             "    torch.save(model.state_dict(), 'x.pt')\nif __name__ == '__main__':\n    main()\n")
    launched = (SEEDED + "def main():\n    model = DDP(torch.nn.Linear(2, 2))\n"
                "    torch.save(model.module.state_dict(), 'x.pt') if rank == 0 else None\n"
                "if __name__ == '__main__':\n    main()\n")
    script = "#!/bin/bash\npython -m torch.distributed.launch --nproc_per_node=2 train_multinode.py\n"
    files = {"train.py": other, "train_multinode.py": launched, "run.sh": script}
    found = [f for f in _found(_project(tmp_path / "alone", files)) if f.path.endswith("/train.py")]
    assert "save-without-module" in [f.rule for f in found]
    imported = {**files, "train_multinode.py": launched.replace("def main():", "from train import evaluate\n"
                                                                "def main():")}
    assert not [f for f in _found(_project(tmp_path / "lib", imported)) if f.path.endswith("/train.py")
                and f.rule == "save-without-module"]


def test_a_logging_method_of_the_class_is_followed(tmp_path):
    """InvSR: `self.logging_metric(self.loss_mean, tag='Loss', ...)`, the class's own method writing TensorBoard
    only where rank 0 holds a writer: rank 0's own losses. Printing on every rank, it is no rank-0 log. (This test
    passes at ffdfd65 too: it guards the narrowing of `self.method(...)` lookups to methods named for logging, which
    the full run showed were needed: looking into every method made NeuralOperator's train_one_batch a log.)"""
    train = SEEDED + (
        "class Trainer:\n    def __init__(self, model, rank):\n        self.model, self.rank = model, rank\n"
        "        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    def logging_metric(self, metrics, tag):\n        if self.rank == 0:\n            print(tag, metrics)\n"
        "    def fit(self):\n        for step in range(3):\n            loss = self.model(torch.ones(2)).sum()\n"
        "            self.opt.zero_grad()\n            loss.backward()\n            self.opt.step()\n"
        "            self.logging_metric({'loss': loss.item()}, 'Loss')\n"
        "dist.init_process_group('gloo')\nTrainer(DDP(torch.nn.Linear(2, 2)), dist.get_rank()).fit()\n")
    hits = [f for f in _found(_project(tmp_path / "loud", {"train.py": train})) if f.rule == "rank0-local-loss"]
    assert _line(train, "self.logging_metric({") in {f.line for f in hits} | {n for f in hits for _, n in f.related}
    every = train.replace("if self.rank == 0:", "if True:")
    assert not [f for f in _found(_project(tmp_path / "quiet", {"train.py": every})) if f.rule == "rank0-local-loss"]
