"""Issue 35: classes of round 270-275's first look (docs/measured/cpu2/audit_heldout_round270.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (54a814c)."""

from test_audit import _project
from test_audit_classes189 import _line
from test_audit_classes246 import HEAD, SEED_ONLY, _rules

SPAWN_MAIN = ("import torch.multiprocessing as mp\nimport argparse\np = argparse.ArgumentParser()\n"
              "p.add_argument('--seed', default=None, type=int)\n"
              "p.add_argument('--multiprocessing_distributed', type=int, default=1)\nargs = p.parse_args()\n")


def test_a_seed_read_from_a_config_dict_by_key(tmp_path):
    """Faster R-CNN pipeline: `init_seeds(args['seed'] + 1 + RANK)` with RANK = -1 alone: rank 0 of the DDP run
    seeds seed + 1, the single run seed + 0. `args['seed'] + max(RANK, 0)` seeds rank 0 as the single run."""
    train = HEAD + ("import os\nRANK = int(os.getenv('RANK', -1))\nargs = {'seed': 0}\n"
                    "torch.manual_seed(SEED)\ndist.init_process_group('gloo')\nmodel = DDP(torch.nn.Linear(2, 2))\n")
    loud = train.replace("SEED", "args['seed'] + 1 + RANK")
    assert [h.line for h in _rules(_project(tmp_path / "loud", {"train.py": loud}), "seed-per-rank")] == [
        _line(loud, "torch.manual_seed(")]
    quiet = train.replace("SEED", "args['seed'] + max(RANK, 0)")
    assert not _rules(_project(tmp_path / "quiet", {"train.py": quiet}), "seed-per-rank")


def test_a_callable_saver_object_is_judged_where_it_is_called(tmp_path):
    """Faster R-CNN pipeline: `class SaveBestModel: def __call__(self, model, ...): torch.save(...)`, called as
    `save_best_model(model, ...)` by every rank: one finding, at the call, not a second one inside __call__."""
    utils = ("import torch\nclass SaveBestModel:\n    def __call__(self, model, path):\n"
             "        torch.save({'model_state_dict': model.module.state_dict()}, path)\n")
    train = SEED_ONLY + ("from utils import SaveBestModel\ndist.init_process_group('gloo')\n"
                         "model = DDP(torch.nn.Linear(2, 2))\nsave_best_model = SaveBestModel()\n"
                         "for epoch in range(2):\n    GUARDsave_best_model(model, 'best.pth')\n")
    loud = train.replace("GUARD", "")
    hits = _rules(_project(tmp_path / "loud", {"train.py": loud, "utils.py": utils}), "save-on-every-rank")
    assert [(h.path.split("/")[-1], h.line) for h in hits] == [("train.py", _line(loud, "save_best_model(model"))]
    quiet = train.replace("GUARD", "if dist.get_rank() == 0:\n        ")
    assert not _rules(_project(tmp_path / "quiet", {"train.py": quiet, "utils.py": utils}), "save-on-every-rank")


WORKER = HEAD + ("import builtins\nfrom model import MoCo\nimport torchvision.models as models\n"
                 "def main_worker(gpu, ngpus, args):\n    args.distributed = True\n"
                 "    if args.distributed:\n        dist.init_process_group('gloo', init_method='env://')\n"
                 "    model = MoCo(models.__dict__['ARCH'])\n"
                 "    if args.distributed:\n        model = DDP(model)\n"
                 "    else:\n        raise NotImplementedError('Only DistributedDataParallel is supported.')\n"
                 "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                 "    if args.resume:\n        ckpt = torch.load(args.resume, map_location='cpu')\n"
                 "        model.load_state_dict(ckpt['state_dict'])\n"
                 "    for epoch in range(2):\n"
                 "        if not args.multiprocessing_distributed or args.rank % ngpus == 0:\n"
                 "            torch.save({'state_dict': model.state_dict()}, 'ckpt.pth')\n")
MOCO = ("import torch\nclass MoCo(torch.nn.Module):\n    def __init__(self, base_encoder):\n"
        "        super().__init__()\n"
        "        self.encoder_q = base_encoder(num_classes=128)\n"
        "    def forward(self, x):\n        idx = torch.randperm(x.shape[0])\n"
        "        torch.distributed.broadcast(idx, src=0)\n        return self.encoder_q(x[idx])\n")


def test_moco_style_workers_that_refuse_one_process(tmp_path):
    """AdCo (MoCo's layout): the worker raises NotImplementedError where the run is not distributed, the model's
    shuffle broadcasts outside any switch, the spawning flag defaults to 1, the wrapper's checkpoint is loaded back
    into the wrapper, and --seed (None by default) seeds the parent in a helper before mp.spawn. Every run is a
    spawned DDP run, so: no collective-outside-switch, no save-without-module, no leaky save guard, one seed
    finding (seed-before-spawn, not also no-seed). The query encoder torchvision builds by --arch has BatchNorm."""
    main = SPAWN_MAIN + ("import random\nfrom worker import main_worker\n"
                         "def config(args):\n    if args.seed is not None:\n        random.seed(args.seed)\n"
                         "        torch.manual_seed(args.seed)\n    return 1\n"
                         "if __name__ == '__main__':\n    n = config(args)\n"
                         "    if args.multiprocessing_distributed == 1:\n"
                         "        mp.spawn(main_worker, nprocs=n, args=(n, args))\n    else:\n"
                         "        main_worker(0, n, args)\n")
    main = HEAD + main
    root = _project(tmp_path / "p", {"main.py": main, "worker.py": WORKER.replace("ARCH", "resnet50"),
                                     "model.py": MOCO})
    for rule in ("collective-outside-switch", "save-without-module", "save-on-every-rank", "no-seed"):
        assert not _rules(root, rule), rule
    assert len(_rules(root, "seed-before-spawn")) == 1
    assert [h.line for h in _rules(root, "batchnorm-without-sync")] == [_line(WORKER, "model = DDP(model)")]
    vit = _project(tmp_path / "vit", {"main.py": main, "worker.py": WORKER.replace("ARCH", "vit_b_16"),
                                      "model.py": MOCO})
    assert not _rules(vit, "batchnorm-without-sync")
    # without the raising arm the one-process run exists: its broadcast has no group, its checkpoint no wrapper
    plain = WORKER.replace("raise NotImplementedError('Only DistributedDataParallel is supported.')", "pass")
    one = _project(tmp_path / "one", {"main.py": main, "worker.py": plain, "model.py": MOCO})
    assert _rules(one, "collective-outside-switch") and _rules(one, "save-without-module")


def test_a_model_package_the_copies_lack_indexed_by_a_batchnorm_family(tmp_path):
    """CLD: `import models` (a package these files lack), `model = models.__dict__['ResNet18'](low_dim=128)`
    in a build_model() helper, then DDP(model): a ResNet has BatchNorm. A 'ViT' from the same package is not
    judged."""
    train = SEED_ONLY + ("import models\ndef build_model():\n    model = models.__dict__['ARCH'](low_dim=128)\n"
                         "    return model\ndist.init_process_group('gloo')\nmodel = build_model()\n"
                         "model = DDP(model)\n")
    loud = train.replace("ARCH", "ResNet18")
    assert [h.line for h in _rules(_project(tmp_path / "loud", {"train.py": loud}), "batchnorm-without-sync")] == [
        _line(loud, "model = DDP(")]
    quiet = train.replace("ARCH", "ViT_small")
    assert not _rules(_project(tmp_path / "quiet", {"train.py": quiet}), "batchnorm-without-sync")


def test_each_accumulating_loop_is_one_finding(tmp_path):
    """FreeYOLO: a warm-up loop and an epoch loop, copies of each other, both accumulate 4 micro-batches without
    no_sync: each needs its own fix (two findings, one per function)."""
    loop = ("def NAME(model, opt, loader):\n    for i, x in enumerate(loader):\n"
            "        loss = model(x).sum()\n        loss.backward()\n        if (i + 1) % 4 == 0:\n"
            "            opt.step()\n            opt.zero_grad()\n")
    train = SEED_ONLY + loop.replace("NAME", "warmup") + loop.replace("NAME", "train_one_epoch") + (
        "dist.init_process_group('gloo')\nmodel = DDP(torch.nn.Linear(2, 2))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nwarmup(model, opt, [])\ntrain_one_epoch(model, opt, [])\n")
    hits = _rules(_project(tmp_path / "loud", {"train.py": train}), "accumulation-without-no-sync")
    assert len(hits) == 2 and len({h.line for h in hits}) == 2


def test_the_keys_of_a_reduced_record_are_no_reduced_values(tmp_path):
    """FreeYOLO: `loss_dict_reduced = reduce_dict(loss_dict)`, then `for k in loss_dict_reduced.keys(): log +=
    '...'.format(k, loss_dict[k])` printed by rank 0: the values read are the unreduced ones. Reading
    `loss_dict_reduced[k]` logs the reduced loss."""
    utils = ("import torch.distributed as dist\ndef reduce_dict(d):\n    out = {}\n    for k, v in d.items():\n"
             "        v = v.clone()\n        dist.all_reduce(v)\n        out[k] = v / dist.get_world_size()\n"
             "    return out\n")
    engine = ("import torch, torch.distributed as dist\nimport distributed_utils\n"
              "def train_one_epoch(model, criterion, opt, loader):\n    for x in loader:\n"
              "        loss_dict = criterion(model(x))\n        losses = loss_dict['losses']\n"
              "        loss_dict_reduced = distributed_utils.reduce_dict(loss_dict)\n        opt.zero_grad()\n"
              "        losses.backward()\n        opt.step()\n        if dist.get_rank() == 0:\n"
              "            log = ''\n            for k in loss_dict_reduced.keys():\n"
              "                log += '[{}: {:.2f}]'.format(k, READ[k])\n            print(log)\n")
    train = SEED_ONLY + ("from engine import train_one_epoch\ndist.init_process_group('gloo')\n"
                         "model = DDP(torch.nn.Linear(2, 2))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                         "train_one_epoch(model, lambda out: {'losses': out.sum()}, opt, [])\n")
    files = {"train.py": train, "distributed_utils.py": utils}
    loud = engine.replace("READ", "loss_dict")
    hits = _rules(_project(tmp_path / "loud", dict(files, **{"engine.py": loud})), "rank0-local-loss")
    assert [h.line for h in hits] == [_line(loud, "print(log)")]
    quiet = engine.replace("READ", "loss_dict_reduced")
    assert not _rules(_project(tmp_path / "quiet", dict(files, **{"engine.py": quiet})), "rank0-local-loss")


def test_a_meter_a_helper_feeds_is_a_loss_meter(tmp_path):
    """AdCo: train() builds `losses = AverageMeter()` and `progress = ProgressMeter([losses])`, hands `losses`
    to update_network(), whose `losses.update(loss.item())` fills it, then `progress.display(i)` prints it on
    rank 0 alone (builtins.print replaced): rank 0's own loss. A helper that all-reduces the loss first is fine."""
    train = SEED_ONLY + (
        "import builtins\nclass AverageMeter:\n    def update(self, v):\n        self.v = v\n"
        "    def __str__(self):\n        return str(self.v)\n"
        "class ProgressMeter:\n    def __init__(self, meters):\n        self.meters = meters\n"
        "    def display(self, i):\n        print(' '.join(str(m) for m in self.meters))\n"
        "def update_network(model, x, losses, opt):\n    loss = model(x).sum()\nREDUCE"
        "    losses.update(loss.item())\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
        "def train(loader, model, opt):\n    losses = AverageMeter()\n    progress = ProgressMeter([losses])\n"
        "    for i, x in enumerate(loader):\n        update_network(model, x, losses, opt)\n"
        "        progress.display(i)\n"
        "dist.init_process_group('gloo')\nif dist.get_rank() != 0:\n    def print_pass(*a):\n        pass\n"
        "    builtins.print = print_pass\nmodel = DDP(torch.nn.Linear(2, 2))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\ntrain([], model, opt)\n")
    loud = train.replace("REDUCE", "")
    assert [h.line for h in _rules(_project(tmp_path / "loud", {"train.py": loud}), "rank0-local-loss")] == [
        _line(loud, "progress.display(i)")]
    quiet = train.replace("REDUCE", "    dist.all_reduce(loss)\n")
    assert not _rules(_project(tmp_path / "quiet", {"train.py": quiet}), "rank0-local-loss")


def test_a_logger_whose_level_the_rank_picks_kept_by_a_trainer(tmp_path):
    """OpenStereo: `create_logger(log_file, rank=local_rank)` sets `logger.setLevel(level if rank == 0 else
    'ERROR')` (and its console's), and the script hands the logger to a trainer built by a registry these files
    lack, whose base class keeps `self.logger = logger` and logs `loss.item()` with it: rank 0's own loss."""
    utils = ("import logging\ndef create_logger(rank=0, log_level=logging.INFO):\n"
             "    logger = logging.getLogger(__name__)\n    logger.setLevel(log_level if rank == 0 else 'ERROR')\n"
             "    console = logging.StreamHandler()\n    console.setLevel(log_level if rank == 0 else 'ERROR')\n"
             "    logger.addHandler(console)\n    return logger\n")
    trainer = HEAD + ("class TrainerTemplate:\n    def __init__(self, model, logger):\n        self.logger = logger\n"
                      "        self.model = DDP(model)\n"
                      "        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)\n"
                      "    def train_one_epoch(self, loader):\n        for x in loader:\n"
                      "            loss = self.model(x).sum()\n            self.opt.zero_grad()\n"
                      "            loss.backward()\n            self.opt.step()\n"
                      "            self.logger.info('Loss:{:.4f}'.format(loss.item()))\n")
    train = SEED_ONLY + ("import os\nfrom utils import create_logger\nfrom registry import build_trainer\n"
                         "local_rank = int(os.environ['LOCAL_RANK'])\ndist.init_process_group('gloo')\n"
                         "logger = create_logger(rank=RANK)\ntrainer = build_trainer(torch.nn.Linear(2, 2), logger)\n"
                         "trainer.train_one_epoch([])\n")
    loud = {"train.py": train.replace("RANK", "local_rank"), "utils.py": utils, "trainer_template.py": trainer}
    hits = _rules(_project(tmp_path / "loud", loud), "rank0-local-loss")
    assert [h.line for h in hits] == [_line(trainer, "self.logger.info(")]
    every = dict(loud, **{"utils.py": utils.replace("log_level if rank == 0 else 'ERROR'", "log_level")})
    assert not _rules(_project(tmp_path / "every", every), "rank0-local-loss")


def test_gathered_values_merged_by_their_gathered_index(tmp_path):
    """OpenStereo: the evaluation all_gathers each metric's sample indexes and values, then `for key, value in
    zip(gathered indexes, gathered values): if key not in unique: unique[key] = value`: the padding sampler's
    duplicates are dropped, so the mean counts each sample once. Averaging the gathered values as they are
    counts them."""
    train = SEED_ONLY + (
        "from torch.utils.data import DataLoader, DistributedSampler\ndist.init_process_group('gloo')\n"
        "model = DDP(torch.nn.Linear(2, 2))\nval_set = list(range(5))\n"
        "val_loader = DataLoader(val_set, sampler=DistributedSampler(val_set, shuffle=False))\n"
        "@torch.no_grad()\ndef evaluate(model, loader):\n    idx, vals = [], []\n    for i, x in loader:\n"
        "        idx.append(i)\n        vals.append(model(x).sum().item())\n"
        "    indexes, values = torch.tensor(idx), torch.tensor(vals)\n"
        "    gi = [torch.zeros_like(indexes) for _ in range(2)]\n"
        "    gv = [torch.zeros_like(values) for _ in range(2)]\n"
        "    dist.all_gather(gi, indexes)\n    dist.all_gather(gv, values)\nMERGE"
        "for epoch in range(2):\n    evaluate(model, val_loader)\n")
    quiet = train.replace("MERGE", "    unique = {}\n    for key, value in zip(torch.cat(gi).tolist(), "
                                   "torch.cat(gv).tolist()):\n        if key not in unique:\n"
                                   "            unique[key] = value\n    return sum(unique.values()) / len(unique)\n")
    assert not _rules(_project(tmp_path / "quiet", {"train.py": quiet}), "eval-padding-duplicates")
    loud = train.replace("MERGE", "    return torch.cat(gv).mean()\n")
    assert _rules(_project(tmp_path / "loud", {"train.py": loud}), "eval-padding-duplicates")


def test_a_gather_in_a_helper_of_helpers_run_under_no_grad(tmp_path):
    """CLD: `dist_collect(x)` (a plain all_gather) is called only by DistributedShufle's forward_shuffle and
    backward_shuffle, which the step runs under `with torch.no_grad():` for the key encoder: nothing it gathers
    carries a gradient by design. Called with grad, it is a finding."""
    utils = ("import torch, torch.distributed as dist\ndef dist_collect(x):\n"
             "    out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]\n    dist.all_gather(out, x)\n"
             "    return torch.cat(out)\nclass Shuffle:\n    @staticmethod\n    def forward_shuffle(x):\n"
             "        x_all = dist_collect(x)\n        return x_all\n")
    train = SEED_ONLY + ("from utils import Shuffle\ndist.init_process_group('gloo')\n"
                         "model = DDP(torch.nn.Linear(2, 2))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                         "for x in []:\n    q = model(x)\nWITH    k = Shuffle.forward_shuffle(q)\n"
                         "    loss = (q @ k.T).sum()\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n")
    quiet = train.replace("WITH    k = ", "    with torch.no_grad():\n        k = ")
    assert not _rules(_project(tmp_path / "quiet", {"train.py": quiet, "utils.py": utils}), "gather-without-grad")
    loud = train.replace("WITH", "")
    assert _rules(_project(tmp_path / "loud", {"train.py": loud, "utils.py": utils}), "gather-without-grad")


def test_a_wrap_under_an_option_that_is_no_distributed_switch(tmp_path):
    """YANMTT: every run is spawned (one GPU or more), and the teacher is wrapped under `if args.distillation:`
    then `if args.use_fsdp: FSDP(...) else: DDP(...)`; its checkpoint is loaded back into the wrapper. The single
    run takes the same arms, so its keys carry `module.` too: no save-without-module. Under `if
    args.distributed:` with a plain model otherwise, the finding stays."""
    train = SEED_ONLY + (
        "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\nimport argparse\n"
        "p = argparse.ArgumentParser()\np.add_argument('--distillation', action='store_true')\n"
        "p.add_argument('--use_fsdp', action='store_true')\np.add_argument('--distributed', action='store_true')\n"
        "args = p.parse_args()\ndef worker(gpu):\n    dist.init_process_group('gloo')\n"
        "    model = torch.nn.Linear(2, 2)\n    if TEST:\n        if args.use_fsdp:\n"
        "            model = FSDP(model)\n        else:\n            model = DDP(model)\n"
        "    model.load_state_dict(torch.load('ckpt.pth', map_location='cpu'))\n"
        "    if dist.get_rank() == 0:\n        torch.save(model.state_dict(), 'ckpt.pth')\n"
        "import torch.multiprocessing as mp\nmp.spawn(worker, nprocs=2)\n")
    quiet = train.replace("TEST", "args.distillation")
    assert not _rules(_project(tmp_path / "quiet", {"train.py": quiet}), "save-without-module")
    loud = train.replace("TEST", "args.distributed")
    assert _rules(_project(tmp_path / "loud", {"train.py": loud}), "save-without-module")
