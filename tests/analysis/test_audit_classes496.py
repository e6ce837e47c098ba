"""Issue 35: classes of round 496-501's first look (docs/measured/cpu2/audit_heldout_round496.txt), fixed after
it, each quiet and loud; the test fails at the first look's code (230b171). The round's other fixes (a gather helper
handed only detached values, a module function named nowhere, an evaluation loader every caller drops) have no
fixture here: small projects of those shapes get no finding at 230b171 either; the held-out copies (contrastors,
VAEBM) are where they show.)"""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_a_trainer_taken_from_a_registry_whose_base_seeds(tmp_path):
    """contrastors: `trainer_cls = TRAINER_REGISTRY[model_type]; trainer = trainer_cls(config); trainer.train()`,
    and the project's BaseTrainer.__init__ calls set_seed (torch.manual_seed): the run is seeded where the audit
    cannot link the class. With no trainer seeding, no-seed stays."""
    trainers = ("import torch, random\nclass BaseTrainer:\n    def __init__(self, config):\n        SEED\n"
                "    def train(self):\n        pass\nclass TextTrainer(BaseTrainer):\n    pass\n"
                "TRAINER_REGISTRY = {'text': TextTrainer}\n")
    train = (DDP + "from trainers import TRAINER_REGISTRY\nif __name__ == '__main__':\n"
             "    dist.init_process_group('gloo')\n    trainer_cls = TRAINER_REGISTRY['text']\n"
             "    trainer = trainer_cls({})\n    trainer.train()\n    model = DDP(torch.nn.Linear(2, 2))\n")
    seeded = {"train.py": train, "trainers.py": trainers.replace("SEED", "torch.manual_seed(0)")}
    assert not _rules(_project(tmp_path / "seeded", seeded), "no-seed")
    unseeded = {"train.py": train, "trainers.py": trainers.replace("SEED", "random.seed(0)")}
    assert _rules(_project(tmp_path / "unseeded", unseeded), "no-seed")
