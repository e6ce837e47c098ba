"""Issue 35: classes of round 318-323's first look (docs/measured/cpu2/audit_heldout_round318.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (15f954d)."""

from test_audit import _project
from test_audit_classes189 import _line
from test_audit_classes246 import HEAD, SEED_ONLY, STEP, _rules

LOOP = "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor step in range(3):\n" + STEP


def test_a_save_the_ranks_reaching_it_unguarded_never_reach(tmp_path):
    """RCAN-it: Trainer.test saves `if not self.cfg.SOLVER.TEST_ONLY:`; the script runs `t.test() if
    cfg.SOLVER.TEST_ONLY else t.train()` on every rank; train() calls test() on rank 0 alone, and
    maybe_save_swa_model() calls it on every rank only past `if not hasattr(self, 'swa_model'): return`, an
    attribute set only `if self.cfg.SOLVER.SWA.ENABLED`, a yacs node built `CN({'ENABLED': False})`: in the default
    run no rank but 0 reaches the save, no save-on-every-rank. With SWA on by default every rank saves."""
    defaults = ("from yacs.config import CfgNode as CN\n_C = CN()\n_C.SOLVER = CN()\n_C.SOLVER.TEST_ONLY = False\n"
                "_C.SOLVER.SWA = CN({'ENABLED': VALUE})\n")
    trainer = ("import torch\nclass Trainer:\n    def __init__(self, cfg, rank, model):\n"
               "        self.cfg, self.rank, self.model = cfg, rank, model\n"
               "        if self.cfg.SOLVER.SWA.ENABLED and not self.cfg.SOLVER.TEST_ONLY:\n"
               "            self.swa_model = torch.optim.swa_utils.AveragedModel(model)\n    def train(self):\n"
               "        for i in range(3):\n            if self.rank == 0:\n                self.test(i)\n"
               "        self.maybe_save_swa_model()\n    def maybe_save_swa_model(self):\n"
               "        if not hasattr(self, 'swa_model'):\n            return\n        self.test(-1)\n"
               "    def test(self, i=-1):\n        if not self.cfg.SOLVER.TEST_ONLY:\n"
               "            torch.save(self.model.module.state_dict(), 'latest.pth')\n")
    train = SEED_ONLY + ("from defaults import _C as cfg\nfrom trainer import Trainer\n"
                         "dist.init_process_group('gloo')\n"
                         "model = DDP(torch.nn.Linear(2, 2))\nt = Trainer(cfg, dist.get_rank(), model)\n"
                         "t.test() if cfg.SOLVER.TEST_ONLY else t.train()\n")
    off = {"train.py": train, "trainer.py": trainer, "defaults.py": defaults.replace("VALUE", "False")}
    assert not _rules(_project(tmp_path / "off", off), "save-on-every-rank")
    on = {"train.py": train, "trainer.py": trainer, "defaults.py": defaults.replace("VALUE", "True")}
    assert _rules(_project(tmp_path / "on", on), "save-on-every-rank")


def test_the_gpus_a_process_may_see_are_no_rank(tmp_path):
    """TransBTS's test.py: `os.environ['CUDA_VISIBLE_DEVICES'] = args.gpu` (args.gpu a string of GPU ids) in a
    one-process script beside a DDP train.py: no rank, so no load-without-map-location there. A script that
    reads the rank is judged."""
    test = ("import argparse, os, torch\nparser = argparse.ArgumentParser()\n"
            "parser.add_argument('--gpu', default='0', type=str)\nargs = parser.parse_args()\nRANKED"
            "model = torch.nn.DataParallel(torch.nn.Linear(2, 2))\n"
            "checkpoint = torch.load('model_epoch_last.pth')\nmodel.load_state_dict(checkpoint['state_dict'])\n")
    train = SEED_ONLY + "dist.init_process_group('gloo')\nmodel = DDP(torch.nn.Linear(2, 2))\n" + LOOP
    devices = test.replace("RANKED", "os.environ['CUDA_VISIBLE_DEVICES'] = args.gpu\n")
    assert not _rules(_project(tmp_path / "devices", {"train.py": train, "test.py": devices}),
                      "load-without-map-location")
    ranked = test.replace("RANKED", "rank = int(os.environ['RANK'])\n")
    assert _rules(_project(tmp_path / "ranked", {"train.py": train, "test.py": ranked}), "load-without-map-location")
    # (a rank only read, MedCoSS's `torch.cuda.set_device(args.local_rank)` under a launcher engine these copies
    # lack, makes a distributed script too)
    read = test.replace("RANKED", "os.environ['CUDA_VISIBLE_DEVICES'] = args.gpu\n"
                        "torch.cuda.set_device(args.local_rank)\n")
    assert _rules(_project(tmp_path / "read", {"train.py": train, "test.py": read}), "load-without-map-location")


def test_a_dataset_class_reading_its_processed_file(tmp_path):
    """HPNN: `class PBCDataset(InMemoryDataset)` whose __init__ does `self.data, self.slices =
    torch.load(self.processed_paths[0])`: data read by the loader, not a checkpoint onto a GPU. The same load in
    a plain helper class is the checkpoint's (load-without-map-location)."""
    data = ("import torch\nfrom torch_geometric.data import InMemoryDataset\n"
            "from torch.utils.data import DistributedSampler\n"
            "import torch.distributed as dist\ndef sampler(ds):\n    rank = dist.get_rank()\n"
            "    return DistributedSampler(ds, rank=rank)\nclass PBCDataset(BASE):\n"
            "    def __init__(self, root):\n        super().__init__()\n"
            "        self.data, self.slices = torch.load(self.processed_paths[0], weights_only=False)\n")
    train = SEED_ONLY + ("from data import PBCDataset\ndist.init_process_group('gloo')\nds = PBCDataset('data')\n"
                         "model = DDP(torch.nn.Linear(2, 2))\n" + LOOP)
    dataset = {"train.py": train, "data.py": data.replace("BASE", "InMemoryDataset")}
    assert not _rules(_project(tmp_path / "dataset", dataset), "load-without-map-location")
    plain = {"train.py": train, "data.py": data.replace("BASE", "object")}
    assert _rules(_project(tmp_path / "plain", plain), "load-without-map-location")


def test_dist_id_names_the_rank(tmp_path):
    """HPNN's logger keeps `self.dist_id = dist_id` and its save helper tests `if log.dist_id == 0:`: rank 0's
    guard, so no save-on-every-rank. A test of another attribute guards nothing."""
    util = ("import torch\nclass Log:\n    def __init__(self, dist_id):\n        self.dist_id = dist_id\n"
            "def save_model(model, log):\n    if log.ATTR == 0:\n"
            "        torch.save(model.module.state_dict(), 'best.pth')\n")
    train = SEED_ONLY + ("from util import Log, save_model\ndist.init_process_group('gloo')\n"
                         "log = Log(dist.get_rank())\nmodel = DDP(torch.nn.Linear(2, 2))\n" + LOOP +
                         "    save_model(model, log)\n")
    guarded = {"train.py": train, "util.py": util.replace("ATTR", "dist_id")}
    assert not _rules(_project(tmp_path / "guarded", guarded), "save-on-every-rank")
    other = {"train.py": train, "util.py": util.replace("ATTR", "level")}
    assert _rules(_project(tmp_path / "other", other), "save-on-every-rank")


def test_a_yaml_config_turns_a_mode_flag_on(tmp_path):
    """SphereFormer: `if args.evaluate and ...: validate(val_loader, ...)`, args loaded from a YAML config with
    `evaluate: True` and no option defining it: the validation runs, and its padding sampler's duplicates are
    all-reduced (eval-padding-duplicates). With `evaluate: False` it never runs."""
    train = SEED_ONLY + ("import yaml\nfrom types import SimpleNamespace\n"
                         "from torch.utils.data import DataLoader, DistributedSampler\n"
                         "args = SimpleNamespace(**yaml.safe_load(open('config/train.yaml')))\n"
                         "dist.init_process_group('gloo')\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                         "val_data = [torch.ones(2)] * 5\nval_sampler = DistributedSampler(val_data, shuffle=False)\n"
                         "val_loader = DataLoader(val_data, batch_size=1, sampler=val_sampler)\n"
                         "def validate(loader, net):\n    total = torch.zeros(1)\n    for x in loader:\n"
                         "        total += net(x).sum().detach()\n    dist.all_reduce(total)\n    return total.item()\n"
                         "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor epoch in range(3):\n" + STEP +
                         "    if args.evaluate:\n        print(validate(val_loader, model))\n")
    on = {"train.py": train, "config/train.yaml": "evaluate: True\nepochs: 3\n"}
    hits = _rules(_project(tmp_path / "on", on), "eval-padding-duplicates")
    assert [h.line for h in hits] == [_line(train, "val_sampler = DistributedSampler(")]
    off = {"train.py": train, "config/train.yaml": "evaluate: False\nepochs: 3\n"}
    assert not _rules(_project(tmp_path / "off", off), "eval-padding-duplicates")


def test_a_dedup_that_this_loader_s_evaluation_never_runs(tmp_path):
    """ReferFormer: a COCO-style merge keeps one result per image id (`np.unique(..., return_index=True)` after an
    all_gather), but the A2D validation loader goes to evaluate_a2d, which all-gathers its padded predictions as
    they are: the duplicates count (eval-padding-duplicates). When evaluate_a2d merges through the dedup, none."""
    engine = ("import numpy as np, torch, torch.distributed as dist\ndef merge(img_ids, preds):\n"
              "    ids = torch.tensor(img_ids)\n"
              "    out = [torch.zeros_like(ids) for _ in range(dist.get_world_size())]\n"
              "    dist.all_gather(out, ids)\n    merged, idx = np.unique(torch.cat(out).numpy(), return_index=True)\n"
              "    return merged, idx\ndef evaluate_a2d(model, data_loader):\n    preds = []\n"
              "    for x in data_loader:\n        preds.append(model(x).sum().item())\nMERGE    return preds\n")
    train = SEED_ONLY + ("from torch.utils.data import DataLoader, DistributedSampler\n"
                         "from engine import evaluate_a2d\n"
                         "dist.init_process_group('gloo')\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                         "dataset_val = [torch.ones(2)] * 5\n"
                         "sampler_val = DistributedSampler(dataset_val, shuffle=False)\n"
                         "data_loader_val = DataLoader(dataset_val, batch_size=1, sampler=sampler_val)\n" + LOOP +
                         "    stats = evaluate_a2d(model, data_loader_val)\n")
    plain = engine.replace("MERGE", "    t = torch.tensor(preds)\n    out = [torch.zeros_like(t) for _ in range(2)]\n"
                           "    dist.all_gather(out, t)\n    preds = torch.cat(out).tolist()\n")
    hits = _rules(_project(tmp_path / "plain", {"train.py": train, "engine.py": plain}), "eval-padding-duplicates")
    assert [h.line for h in hits] == [_line(train, "sampler_val = DistributedSampler(")]
    merged = engine.replace("MERGE", "    preds, _ = merge(list(range(len(preds))), preds)\n")
    assert not _rules(_project(tmp_path / "merged", {"train.py": train, "engine.py": merged}),
                      "eval-padding-duplicates")


def test_a_script_s_top_level_validation_reduced_after_its_loop(tmp_path):
    """HPNN's run_ddp.py: in the `__main__` block's epoch loop, `for idx, data in enumerate(valid_loader): ...`,
    then `loss = gather_ddp_loss(loss)` (an all_reduce) after it: the padded duplicates of the validation
    sampler count (eval-padding-duplicates). Without the reduction each rank keeps its own shard's number."""
    train = HEAD + ("from torch.utils.data import DataLoader, DistributedSampler\n"
                    "def gather_loss(v):\n    t = torch.tensor(v)\n    dist.all_reduce(t)\n"
                    "    return t.item() / dist.get_world_size()\nif __name__ == '__main__':\n"
                    "    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
                    "    model = DDP(torch.nn.Linear(2, 2))\n"
                    "    valid_dataset = [torch.ones(2)] * 5\n"
                    "    valid_loader = DataLoader(valid_dataset, sampler=DistributedSampler(valid_dataset))\n"
                    "    for epoch in range(3):\n        total = 0.0\n"
                    "        for idx, data in enumerate(valid_loader):\n            total += model(data).sum().item()\n"
                    "        loss = GATHER\n        if dist.get_rank() == 0:\n            print('valid', loss)\n")
    gathered = train.replace("GATHER", "gather_loss(total)")
    hits = _rules(_project(tmp_path / "gathered", {"run_ddp.py": gathered}), "eval-padding-duplicates")
    assert [h.line for h in hits] == [_line(gathered, "valid_loader = DataLoader(")]
    own = train.replace("GATHER", "total")
    assert not _rules(_project(tmp_path / "own", {"run_ddp.py": own}), "eval-padding-duplicates")


def test_a_url_variable_with_a_fixed_port_in_a_launch_script(tmp_path):
    """SSL4EO-S12's srun script: `dist_url="tcp://"`, `dist_url+=$master_node`, `dist_url+=:40000`, then
    `--dist-url $dist_url`: a fixed rendezvous port (hard-coded-master-port). A URL without a port hands the
    choice on."""
    train = SEED_ONLY + ("import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('--dist-url')\n"
                         "args = parser.parse_args()\ndist.init_process_group('gloo', init_method=args.dist_url)\n"
                         "model = DDP(torch.nn.Linear(2, 2))\n" + LOOP)
    script = ('#!/bin/bash\nmaster_node=${SLURM_NODELIST:0:9}\ndist_url="tcp://"\ndist_url+=$master_node\nPORT'
              'srun python -u train.py \\\n--dist-url $dist_url \\\n--seed 42\n')
    fixed = script.replace("PORT", "dist_url+=:40000\n")
    hits = _rules(_project(tmp_path / "fixed", {"train.py": train, "run.sh": fixed}), "hard-coded-master-port")
    assert [(h.path.rsplit("/", 1)[-1], h.line) for h in hits] == [("run.sh", _line(fixed, "--dist-url $dist_url"))]
    open_ = script.replace("PORT", "")
    assert not _rules(_project(tmp_path / "open", {"train.py": train, "run.sh": open_}), "hard-coded-master-port")
