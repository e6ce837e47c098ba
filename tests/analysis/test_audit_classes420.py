"""Issue 35: classes of round 420-425's first look (docs/measured/cpu2/audit_heldout_round420.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (b62b8dd)."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_set_epoch_under_a_config_constant_that_is_always_true(tmp_path):
    """Pix2Poly: `class CFG: TRAIN_DDP = True` and `if CFG.TRAIN_DDP: train_loader.sampler.set_epoch(epoch)`: a
    constant, not a switch, so set_epoch runs every epoch (quiet). Under a store_true option the sampler, built
    either way, misses it in the run without the option (set-epoch-missing)."""
    train = (DDP + "import argparse\nfrom torch.utils.data import DataLoader, DistributedSampler\n"
             "class CFG:\n    TRAIN_DDP = True\nparser = argparse.ArgumentParser()\n"
             "parser.add_argument('--ddp_epochs', action='store_true')\nargs = parser.parse_args()\n"
             "torch.manual_seed(0)\ndist.init_process_group('gloo')\nmodel = DDP(torch.nn.Linear(2, 2))\n"
             "data = [torch.ones(2)] * 8\nloader = DataLoader(data, sampler=DistributedSampler(data))\n"
             "for epoch in range(3):\n    if TEST:\n        loader.sampler.set_epoch(epoch)\n"
             "    for x in loader:\n        model(x).sum().backward()\n")
    assert not _rules(_project(tmp_path / "const", {"train.py": train.replace("TEST", "CFG.TRAIN_DDP")}),
                      "set-epoch-missing")
    assert _rules(_project(tmp_path / "option", {"train.py": train.replace("TEST", "args.ddp_epochs")}),
                  "set-epoch-missing")


def test_set_epoch_missing_names_the_epoch_loop_around_the_loaders_method(tmp_path):
    """VidSitu: the loader comes from a module the copies lack, `train_epoch` iterates `self.data.train_dl` once
    and fit's `for epoch in mb:` calls it: the set-epoch-missing finding names both places (where set_epoch
    goes)."""
    data = ("from torch.utils.data import DataLoader, DistributedSampler\n"
            "def make_data_sampler(dataset, shuffle):\n"
            "    return DistributedSampler(dataset=dataset, shuffle=shuffle)\n"
            "def get_dataloader(dataset):\n    sampler = make_data_sampler(dataset, True)\n"
            "    return DataLoader(dataset, batch_size=2, sampler=sampler)\n")
    trn = (DDP + "class Learner:\n    def __init__(self, mdl, data):\n        self.mdl, self.data = mdl, data\n"
           "    def train_epoch(self):\n        for batch in self.data.train_dl:\n"
           "            self.mdl(batch).sum().backward()\n"
           "    def fit(self, epochs):\n        for epoch in range(epochs):\n            self.train_epoch()\n")
    main = (DDP + "from unseen_data import get_data\nfrom trn import Learner\nimport dat\ntorch.manual_seed(0)\n"
            "dist.init_process_group('gloo')\nLearner(DDP(torch.nn.Linear(2, 2)), get_data()).fit(3)\n")
    root = _project(tmp_path / "p", {"main.py": main, "trn.py": trn, "dat.py": data})
    hits = _rules(root, "set-epoch-missing")
    assert hits and any(path.endswith("trn.py") and line == 10 for h in hits for path, line in h.related), [
        (h.path, h.line, h.related) for h in hits]


def test_a_log_in_a_method_called_only_under_a_yaml_key_that_is_off(tmp_path):
    """VidSitu: `if cfg.overfit_batch: learn.overfit_batch(...)` with `overfit_batch: false` in the project's YAML:
    the method's loss print never runs in the default run (quiet). With the key true it does
    (every-rank-prints-loss)."""
    train = (DDP + "import yaml\nclass Learner:\n    def __init__(self, mdl):\n        self.mdl = mdl\n"
             "    def overfit_batch(self, epochs):\n        for i in range(epochs):\n"
             "            loss = self.mdl(torch.ones(2)).sum()\n            loss.backward()\n"
             "            print(f'Iter {i} | loss {loss: 0.4f}')\n"
             "cfg = yaml.safe_load(open('configs/cfg.yml'))\ntorch.manual_seed(0)\ndist.init_process_group('gloo')\n"
             "learn = Learner(DDP(torch.nn.Linear(2, 2)))\nif cfg.overfit_batch:\n    learn.overfit_batch(3)\n")
    off = {"train.py": train, "configs/cfg.yml": "overfit_batch: false\nlr: 0.1\n"}
    assert not _rules(_project(tmp_path / "off", off), "every-rank-prints-loss")
    on = {"train.py": train, "configs/cfg.yml": "overfit_batch: true\nlr: 0.1\n"}
    assert _rules(_project(tmp_path / "on", on), "every-rank-prints-loss")


def test_a_fixed_init_method_handed_to_the_projects_launcher(tmp_path):
    """VidSitu: `launch_job(cfg, init_method='tcp://localhost:9997', func=main_fn)`, whose spawned run_job calls
    init_process_group(init_method=init_method): the port is fixed (hard-coded-master-port). 'env://' is quiet."""
    dist_utils = ("import torch\ndef run_job(local_rank, num_proc, func, init_method, cfg):\n"
                  "    torch.distributed.init_process_group(backend='gloo', init_method=init_method,\n"
                  "                                         world_size=num_proc, rank=local_rank)\n    func(cfg)\n"
                  "def launch_job(cfg, init_method, func):\n"
                  "    torch.multiprocessing.spawn(run_job, nprocs=2, args=(2, func, init_method, cfg))\n")
    main = (DDP + "from dist_utils import launch_job\ndef main_fn(cfg):\n    torch.manual_seed(0)\n"
            "    model = DDP(torch.nn.Linear(2, 2))\nif __name__ == '__main__':\n"
            "    launch_job({}, init_method=URL, func=main_fn)\n")
    fixed = {"main.py": main.replace("URL", "'tcp://localhost:9997'"), "dist_utils.py": dist_utils}
    assert _rules(_project(tmp_path / "fixed", fixed), "hard-coded-master-port")
    env = {"main.py": main.replace("URL", "'env://'"), "dist_utils.py": dist_utils}
    assert not _rules(_project(tmp_path / "env", env), "hard-coded-master-port")


def test_a_checkpoint_loaded_in_a_function_a_launcher_is_handed(tmp_path):
    """VidSitu: `checkpoint = torch.load(open(mfile, 'rb'))` (no checkpoint word in the path's text) in a method
    main_fn calls; main_fn is handed to launch_job, whose spawned workers run it: every rank loads onto cuda:0
    (load-without-map-location). With map_location it is quiet."""
    dist_utils = ("import torch\ndef run_job(local_rank, func, cfg):\n"
                  "    torch.distributed.init_process_group(backend='gloo', rank=local_rank, world_size=2)\n"
                  "    func(cfg)\ndef launch_job(cfg, func):\n"
                  "    torch.multiprocessing.spawn(run_job, nprocs=2, args=(func, cfg))\n")
    main = (DDP + "from dist_utils import launch_job\nclass Learner:\n    def __init__(self, mdl):\n"
            "        self.mdl = mdl\n    def load_model_dict(self, mfile):\n        checkpoint = LOAD\n"
            "        to_load = checkpoint['model_state_dict']\n        self.mdl.module.load_state_dict(to_load)\n"
            "def learner_init(cfg):\n    return Learner(DDP(torch.nn.Linear(2, 2)))\n"
            "def main_fn(cfg):\n    torch.manual_seed(0)\n    learn = learner_init(cfg)\n"
            "    learn.load_model_dict(cfg['file'])\nif __name__ == '__main__':\n"
            "    launch_job({'file': 'mdl.pth'}, func=main_fn)\n")
    bare = {"main.py": main.replace("LOAD", "torch.load(open(mfile, 'rb'))"), "dist_utils.py": dist_utils}
    assert _rules(_project(tmp_path / "bare", bare), "load-without-map-location")
    mapped = {"main.py": main.replace("LOAD", "torch.load(open(mfile, 'rb'), map_location='cpu')"),
              "dist_utils.py": dist_utils}
    assert not _rules(_project(tmp_path / "mapped", mapped), "load-without-map-location")


def test_a_property_that_hands_out_the_wrapper(tmp_path):
    """MolRep: `@property def model(self)` returns `self._wrapped_model`, the DDP wrap, and the subclass saves
    `self.model.state_dict()` (save-without-module). The base class's own save, which the wrapping subclass
    replaces and whose property returns the plain model, is not reported."""
    base = ("import torch\nclass Experiment:\n    def __init__(self, model):\n        self._model = model\n"
            "    @property\n    def model(self):\n        return self._model\n"
            "    def _save_checkpoint(self, epoch):\n        torch.save({'model': self.model.state_dict()}, 'b.pth')\n")
    sub = (DDP + "from experiment import Experiment\nclass Pretraining(Experiment):\n"
           "    def __init__(self, model):\n        super().__init__(model)\n        self._wrapped_model = None\n"
           "    @property\n    def model(self):\n        if self._wrapped_model is None:\n"
           "            self._wrapped_model = DDP(self._model)\n        return self._wrapped_model\n"
           "    def _save_checkpoint(self, epoch):\n        if dist.get_rank() == 0:\n"
           "            torch.save({'model': SAVED.state_dict()}, 'p.pth')\n"
           "torch.manual_seed(0)\ndist.init_process_group('gloo')\nexp = Pretraining(torch.nn.Linear(2, 2))\n"
           "exp._save_checkpoint(0)\n")
    wrapped = {"pretrain.py": sub.replace("SAVED", "self.model"), "experiment.py": base}
    hits = _rules(_project(tmp_path / "wrapped", wrapped), "save-without-module")
    assert hits and all(h.path.endswith("pretrain.py") for h in hits), [(h.path, h.line) for h in hits]
    plain = {"pretrain.py": sub.replace("SAVED", "self._model"), "experiment.py": base}
    assert not _rules(_project(tmp_path / "plain", plain), "save-without-module")


def test_the_else_arm_of_a_flag_the_launch_script_passes(tmp_path):
    """New-VRWKV: `if args.distill: main_distill(...) else: main(...)`, and distill-vrwkv7.sh passes --distill:
    main's unreduced loss log is not the run judged (quiet); main_distill's is (rank0-local-loss). Without
    --distill in the launch script main runs and its log is reported."""
    train = (DDP + "import argparse, logging\nlogger = logging.getLogger(__name__)\n"
             "def main(model):\n    for i in range(4):\n        loss = model(torch.ones(2)).sum()\n"
             "        loss.backward()\n        if dist.get_rank() == 0:\n"
             "            logger.info(f'plain loss {loss.item()}')\n"
             "def main_distill(model):\n    for i in range(4):\n        loss = model(torch.ones(2)).pow(2).sum()\n"
             "        loss.backward()\n        if dist.get_rank() == 0:\n"
             "            logger.info(f'distill loss {loss.item()}')\n"
             "parser = argparse.ArgumentParser()\n"
             "parser.add_argument('--distill', action='store_true', default=False)\n"
             "args = parser.parse_args()\ntorch.manual_seed(0)\ndist.init_process_group('gloo')\n"
             "model = DDP(torch.nn.Linear(2, 2))\nif args.distill:\n    main_distill(model)\nelse:\n    main(model)\n")
    script = "torchrun --nproc_per_node=2 train.py --distill\n"
    hits = _rules(_project(tmp_path / "distill", {"train.py": train, "run.sh": script}), "rank0-local-loss")
    assert [h.line for h in hits] == [16], [(h.line, h.message) for h in hits]
    plain = _rules(_project(tmp_path / "plain", {"train.py": train, "run.sh": script.replace(" --distill", "")}),
                   "rank0-local-loss")
    assert 10 in [h.line for h in plain], [(h.line, h.message) for h in plain]
