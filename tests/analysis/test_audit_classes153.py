"""Issue 35: classes of round 153-158's first look (docs/measured/cpu2/audit_heldout_round153.txt), fixed after it,
each quiet and loud."""

from test_audit import _project, rules
from test_audit_classes135 import SEEDED

from lab_utils.analysis import audit

MODELS = ("import torch.nn as nn\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
          "def model_to_gpu(model, opt):\n    if opt.isTrain:\n        model.cuda(opt.gpu)\n"
          "        model = DDP(model, device_ids=[opt.gpu])\n    else:\n        model = nn.DataParallel(model)\n"
          "    return model\n"
          "def create_model(opt):\n    modelG = Generator()\n    if not opt.isTrain:\n        return modelG\n"
          "    modelD = {wrap}(Discriminator())\n    modelG = model_to_gpu(modelG, opt)\n"
          "    return [modelG, modelD]\n")


def test_models_a_builder_returns_wrapped_in_a_list(tmp_path):
    """MoCoGAN-HD: create_model returns `[modelG, modelD_img, modelD_3d]`, each from model_to_gpu, whose
    training arm assigns `model = DDP(model, ...)` and returns it: the script's `modelG, modelD = create_model(args)`
    holds wrappers, so `torch.save(modelD.state_dict(), ...)` saves `module.` keys. A builder that returns the
    discriminator unwrapped is quiet for it."""
    train = (SEEDED + "from models import create_model\nmodelG, modelD = create_model(args)\n"
             "if rank == 0:\n    torch.save(modelD.state_dict(), 'modelD.pth')\n")
    loud = audit.audit_paths([_project(tmp_path / "l", {"train.py": train, "models.py": MODELS.format(
        wrap="model_to_gpu")})])
    assert "save-without-module" in [f.rule for f in loud], [(f.rule, f.line) for f in loud]
    quiet = audit.audit_paths([_project(tmp_path / "q", {"train.py": train, "models.py": MODELS.format(wrap="")})])
    assert "save-without-module" not in [f.rule for f in quiet]


def test_an_mmcv_runner_hook_sets_the_epoch():
    """PYSKL: `runner.register_hook(DistSamplerSeedHook())`: mmcv's hook calls the sampler's set_epoch before every
    epoch, though no project line does."""
    body = ("loader = DataLoader(ds, batch_size=8, sampler=DistributedSampler(ds, shuffle=True))\n"
            "for epoch in range(3):\n    for x in loader:\n        model(x).sum().backward()\n")
    assert "set-epoch-missing" in rules(body)
    hooked = "from mmcv.runner import DistSamplerSeedHook\nrunner.register_hook(DistSamplerSeedHook())\n"
    assert "set-epoch-missing" not in rules(hooked + body)


def test_a_sampler_seed_parameter_every_caller_fills_without_the_rank():
    """NWM: train() has `seed = args.global_seed * world_size + rank` of its own, and evaluate(..., seed) builds
    `DistributedSampler(..., seed=seed)` with every caller handing it `args.global_seed`: the same seed on every
    rank. A caller that hands it the per-rank seed is the finding."""
    body = ("def evaluate(model, data, seed):\n    sampler = DistributedSampler(data, seed=seed, shuffle=False)\n"
            "def train(args):\n    seed = args.global_seed * world_size + rank\n    evaluate(model, data, {arg})\n")
    assert "sampler-seed-per-rank" not in rules(body.format(arg="args.global_seed"))
    assert "sampler-seed-per-rank" in rules(body.format(arg="seed"))


CHECKPOINT = ("import torch\nclass Checkpointer:\n"
              "    def __init__(self, model, optimizer=None, save_dir='', save_to_disk=None):\n"
              "        self.model = model\n        self.save_dir = save_dir\n        self.save_to_disk = save_to_disk\n"
              "    def save(self, name):\n        if not self.save_dir:\n            return\n"
              "        if not self.save_to_disk:\n            return\n"
              "        torch.save({'model': self.model.module.state_dict()}, name)\n"
              "class DetectronCheckpointer(Checkpointer):\n"
              "    def __init__(self, cfg, model, optimizer=None, save_dir='', save_to_disk=None):\n"
              "        super(DetectronCheckpointer, self).__init__(model, optimizer, save_dir, save_to_disk)\n"
              "        self.cfg = cfg\n")


def test_a_rank0_flag_handed_through_a_subclass_constructor(tmp_path):
    """maskrcnn-benchmark (Scene-Graph-Benchmark, PySGG, CAPN): `save_to_disk = get_rank() == 0`, handed to
    DetectronCheckpointer, which hands it on through `super(DetectronCheckpointer, self).__init__(...)` to
    Checkpointer, whose save() returns `if not self.save_to_disk:`: rank 0 alone writes. Read against the subclass's
    own parameters, the flag landed on `save_dir` and the save looked like every rank's. Handing it `True` is loud."""
    train = (SEEDED + "from checkpoint import DetectronCheckpointer\nmodel = DDP(Net())\n"
             "save_to_disk = {flag}\n"
             "checkpointer = DetectronCheckpointer(cfg, model, opt, 'out', save_to_disk)\n"
             "for it in range(10):\n    checkpointer.save('model_{{:07d}}'.format(it))\n")
    quiet = audit.audit_paths([_project(tmp_path / "q", {"train.py": train.format(flag="dist.get_rank() == 0"),
                                                          "checkpoint.py": CHECKPOINT})])
    assert "save-on-every-rank" not in [f.rule for f in quiet], [(f.rule, f.line) for f in quiet]
    loud = audit.audit_paths([_project(tmp_path / "l", {"train.py": train.format(flag="True"),
                                                         "checkpoint.py": CHECKPOINT})])
    assert "save-on-every-rank" in [f.rule for f in loud], [(f.rule, f.line) for f in loud]
