"""Issue 35: classes of round 390-395's first look (docs/measured/cpu2/audit_heldout_round390.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (6c76db4)."""

from test_audit import _project
from test_audit_classes246 import SEED_ONLY, _rules

SETUP = ("dist.init_process_group('gloo')\nrank = dist.get_rank()\n"
         "model = DDP(torch.nn.Linear(2, 2))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n")


def test_a_seed_in_main_before_a_method_that_spawns(tmp_path):
    """RoseTTAFold2: `torch.manual_seed(args.seed)` in __main__, then `train = Trainer(...)`,
    `train.run_model_training()`, whose `mp.spawn(self.train_model, ...)` starts workers that never seed torch
    (seed-before-spawn). A train_model that seeds itself is quiet."""
    train = ("import torch, torch.multiprocessing as mp\nimport torch.distributed as dist\n"
             "from torch.nn.parallel import DistributedDataParallel as DDP\nclass Trainer:\n"
             "    def run_model_training(self, world_size):\n"
             "        mp.spawn(self.train_model, args=(world_size,), nprocs=world_size)\n"
             "    def train_model(self, rank, world_size):\n"
             "        dist.init_process_group('gloo', rank=rank, world_size=world_size)\nSEED"
             "        model = DDP(torch.nn.Linear(2, 2))\n        model(torch.ones(2)).sum().backward()\n"
             "if __name__ == '__main__':\n    torch.manual_seed(0)\n    train = Trainer()\n"
             "    train.run_model_training(2)\n")
    parent = _project(tmp_path / "parent", {"train.py": train.replace("SEED", "")})
    assert _rules(parent, "seed-before-spawn")
    worker = _project(tmp_path / "worker", {"train.py": train.replace("SEED", "        torch.manual_seed(0)\n")})
    assert not _rules(worker, "seed-before-spawn")


def test_an_evaluation_set_cut_to_a_multiple_of_the_world_size(tmp_path):
    """RoseTTAFold2: `n_valid = (n_valid // world_size) * world_size`, `valid_set = Dataset(keys[:n_valid])`, then
    a padding DistributedSampler and a reduced metric: nothing is padded, so nothing is counted twice (no
    eval-padding-duplicates). The uncut set is found."""
    train = SEED_ONLY + SETUP + (
        "from torch.utils.data import DataLoader, DistributedSampler, TensorDataset\n"
        "world_size = dist.get_world_size()\nkeys = torch.ones(9, 2)\nn_valid = len(keys)\nCUT"
        "valid_set = TensorDataset(keys[:n_valid])\n"
        "valid_loader = DataLoader(valid_set, batch_size=2, sampler=DistributedSampler(valid_set))\n"
        "def validate(loader):\n    total = torch.zeros(1)\n    for x, in loader:\n        total += model(x).sum()\n"
        "    dist.all_reduce(total)\n    return total\nprint(validate(valid_loader))\n")
    cut = train.replace("CUT", "n_valid = (n_valid // world_size) * world_size\n")
    assert not _rules(_project(tmp_path / "cut", {"train.py": cut}), "eval-padding-duplicates")
    assert _rules(_project(tmp_path / "whole", {"train.py": train.replace("CUT", "")}), "eval-padding-duplicates")


def test_a_per_sample_load_handed_to_a_dataset(tmp_path):
    """RoseTTAFold2: `def loader_pdb(item, params): ... torch.load(params['DIR'] + item + '.pt')`, handed by name
    to `Dataset(keys, loader_pdb, ...)`, whose __getitem__ calls it: data read per sample, not a checkpoint onto
    the rank's GPU (no load-without-map-location). A resume load in the script is found."""
    data = ("import torch\nimport torch.distributed as dist\ndef loader_pdb(item, params):\n"
            "    print(dist.get_rank(), item)\n    return torch.load(params['DIR'] + item + '.pt')\n"
            "class Dataset(torch.utils.data.Dataset):\n    def __init__(self, keys, loader, params):\n"
            "        self.keys, self.loader, self.params = keys, loader, params\n"
            "    def __len__(self):\n        return len(self.keys)\n"
            "    def __getitem__(self, i):\n        return self.loader(self.keys[i], self.params)\n")
    train = SEED_ONLY + SETUP + ("from data import Dataset, loader_pdb\nds = Dataset(['a'], loader_pdb, {'DIR': ''})\n"
                                 "RESUME")
    quiet = _project(tmp_path / "quiet", {"train.py": train.replace("RESUME", ""), "data.py": data})
    assert not _rules(quiet, "load-without-map-location")
    loud = train.replace("RESUME", "model.load_state_dict(torch.load('checkpoint.pth'))\n")
    assert _rules(_project(tmp_path / "loud", {"train.py": loud, "data.py": data}), "load-without-map-location")


def test_a_state_dict_filled_to_load_a_checkpoint(tmp_path):
    """LN3Diff's EMA resume: `sd = model.state_dict()` of the DDP model, `sd[k] = v` for the loaded checkpoint's
    matching keys, then `ema = trainer.state_dict_to_master_params(sd)`: a dict filled to load, never saved (no
    save-without-module). Saving the wrapper's state_dict is found."""
    train = SEED_ONLY + SETUP + (
        "def state_dict_to_master_params(sd):\n    return list(sd.values())\n"
        "state_dict = torch.load('ema.pt', map_location='cpu')\n"
        "sd = model.state_dict()\nfor k, v in state_dict.items():\n    if k in sd.keys():\n"
        "        sd[k] = v\nema = state_dict_to_master_params(sd)\nSAVE")
    assert not _rules(_project(tmp_path / "load", {"train.py": train.replace("SAVE", "")}), "save-without-module")
    saved = train.replace("SAVE", "if rank == 0:\n    torch.save(model.state_dict(), 'ckpt.pt')\n")
    assert _rules(_project(tmp_path / "save", {"train.py": saved}), "save-without-module")


def test_a_resume_load_in_a_helper_module_the_ddp_script_imports(tmp_path):
    """RT-ODLab's utils/solver/optimizer.py: `build_optimizer(cfg, model, resume)` does `checkpoint =
    torch.load(resume)` with no map_location; the module says nothing of ranks, but the DDP script imports it and
    every rank runs it (load-without-map-location). A module no DDP script imports is a tool of its own: quiet."""
    helper = ("import torch\ndef build_optimizer(model, resume):\n"
              "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    if resume:\n"
              "        checkpoint = torch.load(resume)\n        opt.load_state_dict(checkpoint['optimizer'])\n"
              "    return opt\n")
    train = SEED_ONLY + ("from solver import build_optimizer\ndist.init_process_group('gloo')\n"
                         "model = DDP(torch.nn.Linear(2, 2))\nopt = build_optimizer(model, 'last.pth')\n")
    assert _rules(_project(tmp_path / "used", {"train.py": train, "solver.py": helper}), "load-without-map-location")
    tool = "import torch\nfrom solver import build_optimizer\nopt = build_optimizer(torch.nn.Linear(2, 2), 'x.pth')\n"
    alone = _project(tmp_path / "alone", {"tool.py": tool, "solver.py": helper, "train.py": SEED_ONLY + SETUP})
    assert not _rules(alone, "load-without-map-location")


def test_a_backbone_built_by_a_project_builder_and_handed_to_the_model(tmp_path):
    """FastMETRO: `backbone = get_cls_net(hrnet_config, ...)` (HRNet, BatchNorm2d throughout), then
    `_FastMETRO_Network = FastMETRO_Network(args, backbone, ...)` (FastMETRO_Body_Network imported under that name),
    whose __init__ keeps `self.backbone = backbone`, handed to run_train and wrapped in DDP with no SyncBatchNorm
    (batchnorm-without-sync). A builder with no BatchNorm is quiet."""
    hrnet = ("import torch.nn as nn\ndef get_cls_net(cfg):\n    return nn.Sequential(nn.Conv2d(3, 8, 3), NORM)\n")
    net = ("import torch.nn as nn\nclass FastMETRO_Body_Network(nn.Module):\n    def __init__(self, args, backbone):\n"
           "        super().__init__()\n        self.backbone = backbone\n        self.head = nn.Linear(8, 2)\n")
    train = SEED_ONLY + ("from hrnet import get_cls_net\n"
                         "from net import FastMETRO_Body_Network as FastMETRO_Network\n"
                         "def run_train(args, model):\n    model = DDP(model)\n    return model\n"
                         "def main(args):\n    dist.init_process_group('gloo')\n    if args.arch == 'hrnet-w64':\n"
                         "        backbone = get_cls_net({})\n    else:\n"
                         "        backbone = torch.nn.Identity()\n"
                         "    _model = FastMETRO_Network(args, backbone)\n    run_train(args, _model)\nmain(None)\n")
    bn = {"train.py": train, "net.py": net, "hrnet.py": hrnet.replace("NORM", "nn.BatchNorm2d(8)")}
    assert _rules(_project(tmp_path / "bn", bn), "batchnorm-without-sync")
    ln = {**bn, "hrnet.py": hrnet.replace("NORM", "nn.GroupNorm(2, 8)")}
    assert not _rules(_project(tmp_path / "ln", ln), "batchnorm-without-sync")


def test_a_backbone_handed_to_a_model_class_these_files_lack(tmp_path):
    """METRO: `backbone = get_cls_net(...)` (BatchNorm), then `METRO_Network(args, config, backbone, ...)`, a
    class from a module these files do not hold, wrapped in DDP without SyncBatchNorm: the model holds the
    backbone (batchnorm-without-sync). A backbone builder with no BatchNorm is quiet."""
    hrnet = "import torch.nn as nn\ndef get_cls_net(cfg):\n    return nn.Sequential(nn.Conv2d(3, 8, 3), NORM)\n"
    train = SEED_ONLY + ("from hrnet import get_cls_net\nfrom metro.modeling.bert import METRO_Network\n"
                         "def main(args):\n    dist.init_process_group('gloo')\n    backbone = get_cls_net({})\n"
                         "    model = METRO_Network(args, {}, backbone)\n    model = DDP(model)\nmain(None)\n")
    bn = {"train.py": train, "hrnet.py": hrnet.replace("NORM", "nn.BatchNorm2d(8)")}
    assert _rules(_project(tmp_path / "bn", bn), "batchnorm-without-sync")
    gn = {"train.py": train, "hrnet.py": hrnet.replace("NORM", "nn.GroupNorm(2, 8)")}
    assert not _rules(_project(tmp_path / "gn", gn), "batchnorm-without-sync")


def test_a_baselines_logger_configured_without_a_communicator(tmp_path):
    """LN3Diff, consistency models, DiffuSeq (guided-diffusion's logger.py): every rank calls
    `logger.logkv_mean('loss', loss.item())`, and Logger.dumpkvs averages over ranks only `if self.comm is not
    None`; `logger.configure()` hands none, so `logger.dumpkvs()` writes each rank's own means (rank0-local-loss).
    `logger.configure(comm=comm)` is quiet."""
    logger = ("class Logger:\n    def __init__(self, comm=None):\n        self.comm = comm\n"
              "        self.name2val = {}\n    def dumpkvs(self):\n        if self.comm is None:\n"
              "            d = self.name2val\n        else:\n            d = self.comm.reduce(self.name2val)\n"
              "        print(d)\n        return d\nCURRENT = [None]\ndef configure(comm=None):\n"
              "    CURRENT[0] = Logger(comm=comm)\ndef logkv_mean(key, val):\n    CURRENT[0].name2val[key] = val\n"
              "def dumpkvs():\n    return CURRENT[0].dumpkvs()\n")
    train = SEED_ONLY + SETUP + ("import logger\nlogger.configure(CONF)\nfor step in range(3):\n"
                                 "    loss = model(torch.ones(2)).sum()\n    opt.zero_grad()\n    loss.backward()\n"
                                 "    opt.step()\n    logger.logkv_mean('loss', loss.item())\n"
                                 "    if step % 2 == 0:\n        logger.dumpkvs()\n")
    bare = _project(tmp_path / "bare", {"train.py": train.replace("CONF", ""), "logger.py": logger})
    found = _rules(bare, "rank0-local-loss")
    assert found and "dumpkvs" in found[0].message
    comm = _project(tmp_path / "comm", {"train.py": train.replace("CONF", "comm=dist.group.WORLD"),
                                        "logger.py": logger})
    assert not _rules(comm, "rank0-local-loss")
