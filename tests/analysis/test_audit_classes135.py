"""Issue 35: classes of mistakes fixed at the stop that labelled held-out batches 135-140: misses of earlier batches
fixed before that round's first look, then the classes the first look showed
(docs/measured/cpu2/audit_heldout_round135.txt), each quiet and loud."""

from pathlib import Path

from test_audit import DDP_HEAD, _project

from lab_utils.analysis import audit

SEEDED = DDP_HEAD + "torch.manual_seed(0)\n"


def _rules(found, path_end: str = "") -> list[str]:
    return [f.rule for f in found if f.path.endswith(path_end)]


def _places(finding) -> set[tuple[str, int]]:
    return {(Path(p).name, line) for p, line in ((finding.path, finding.line), *finding.related)}


CHECKPOINTER = ("import torch\n"
                "class Checkpointer:\n    def __init__(self, model, save_dir):\n{unwrap}"
                "        self.model = model\n        self.save_dir = save_dir\n"
                "    def save(self, name):\n        torch.save({{'model': self.model.state_dict()}}, name)\n"
                "class DetectronCheckpointer(Checkpointer):\n    def __init__(self, cfg, model, save_dir):\n"
                "        super().__init__(model, save_dir)\n")


def test_a_wrapper_handed_to_a_constructor_in_another_file(tmp_path):
    """FCOS, MaskTextSpotter, WaffleIron: `checkpointer = DetectronCheckpointer(cfg, model, out)` after `model =
    DDP(model)` in train_net.py; the base class keeps the parameter in `self.model`, and its save writes
    `self.model.state_dict()`: module. keys. The finding names where the wrapper was handed over. A constructor
    that unwraps first (fast-reid's `if isinstance(model, DistributedDataParallel): model = model.module`) is
    quiet."""
    train = (SEEDED + "from checkpoint import DetectronCheckpointer\nmodel = DDP(Net())\n"
             "checkpointer = DetectronCheckpointer(cfg, model, 'out')\nif rank == 0:\n"
             "    checkpointer.save('model_final')\n")
    loud = audit.audit_paths([_project(tmp_path / "l", {
        "train.py": train, "checkpoint.py": CHECKPOINTER.format(unwrap="")})])
    found = [f for f in loud if f.rule == "save-without-module"]
    assert found and found[0].path.endswith("checkpoint.py") and "train.py:10" in found[0].message, found
    quiet = audit.audit_paths([_project(tmp_path / "q", {"train.py": train, "checkpoint.py": CHECKPOINTER.format(
        unwrap="        if isinstance(model, DistributedDataParallel):\n            model = model.module\n")})])
    assert "save-without-module" not in _rules(quiet)


def test_a_save_that_tries_the_module_first(tmp_path):
    """MotionDiffuse: `try: state['encoder'] = self.encoder.module.state_dict() except: state['encoder'] =
    self.encoder.state_dict()`: the handler runs only when nothing is wrapped. Saving the wrapper's state_dict
    without the try is loud."""
    body = ("class Trainer:\n    def __init__(self, encoder):\n        self.encoder = encoder\n"
            "    def save(self, name):\n        state = {{}}\n{save}        torch.save(state, name)\n")
    tried = ("        try:\n            state['encoder'] = self.encoder.module.state_dict()\n"
             "        except AttributeError:\n            state['encoder'] = self.encoder.state_dict()\n")
    train = (SEEDED + "from trainer import Trainer\nmodel = DDP(Net())\nt = Trainer(model)\n"
             "if rank == 0:\n    t.save('x')\n")
    quiet = _project(tmp_path / "q", {"train.py": train, "trainer.py": "import torch\n" + body.format(save=tried)})
    assert "save-without-module" not in _rules(audit.audit_paths([quiet]))
    loud = _project(tmp_path / "l", {"train.py": train, "trainer.py": "import torch\n" + body.format(
        save="        state['encoder'] = self.encoder.state_dict()\n")})
    assert "save-without-module" in _rules(audit.audit_paths([loud]))
