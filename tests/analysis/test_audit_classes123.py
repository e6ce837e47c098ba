"""Issue 35, held-out batches 123-128 (tests/outside/heldout_labels.json): each class of mistake the first look
showed (docs/measured/cpu2/audit_heldout_round123.txt), fixed as a class, quiet and loud."""

from test_audit import DDP_HEAD, _project

from lab_utils.analysis import audit

SEEDED = DDP_HEAD + "torch.manual_seed(0)\n"


def _rules(found, path_end: str = "") -> list[str]:
    return [f.rule for f in found if f.path.endswith(path_end)]


SPAWNED = ("import os, argparse, torch, torch.multiprocessing as mp\nfrom torch.distributed import init_process_group\n"
           "from torch.nn.parallel import DistributedDataParallel as DDP\n"
           "def ddp_setup(rank, world_size, master_port):\n    os.environ['MASTER_ADDR'] = 'localhost'\n"
           "    os.environ['MASTER_PORT'] = master_port\n"
           "    init_process_group('gloo', rank=rank, world_size=world_size)\n"
           "def main(rank, world_size):\n    p = argparse.ArgumentParser()\n"
           "    p.add_argument('--master_port', type=str{default})\n    args = p.parse_args()\n"
           "    ddp_setup(rank, world_size, args.master_port)\n    torch.manual_seed(0)\n    model = DDP(Net())\n"
           "if __name__ == '__main__':\n    mp.spawn(main, args=(2,), nprocs=2)\n")


def test_a_port_a_setup_helper_is_handed_from_a_fixed_option(tmp_path):
    """ECAPA-TDNN: `ddp_setup(rank, world_size, args.master_port)` sets MASTER_PORT from its parameter, and
    --master_port defaults to '54323' (the launch script passes 54323 again): one finding, at the assignment. A
    launch script that passes a variable leaves the port open; so does an option with no default."""
    loud = _project(tmp_path / "l", {"train.py": SPAWNED.format(default=", default='54323'"),
                                     "run.sh": "python train.py --master_port 54323\n"})
    quiet = _project(tmp_path / "q", {"train.py": SPAWNED.format(default=""),
                                      "run.sh": "python train.py --master_port $PORT\n"})
    found = [f for f in audit.audit_paths([loud]) if f.rule == "hard-coded-master-port"]
    assert [(f.path.rsplit("/", 1)[-1], f.line) for f in found] == [("train.py", 6)], found
    assert "hard-coded-master-port" not in _rules(audit.audit_paths([quiet]))


def test_an_absl_flag_fixes_the_port(tmp_path):
    """conditional-flow-matching: `flags.DEFINE_string("master_port", "12355", ...)` handed to a setup helper that
    sets MASTER_PORT: a fixed port. A flag defaulting to an empty string leaves it to the environment."""
    helper = ("import os, torch.distributed as dist\ndef setup(rank, world, master_port='12355'):\n"
              "    os.environ['MASTER_PORT'] = master_port\n    dist.init_process_group('gloo', rank=rank, "
              "world_size=world)\n")
    train = ("import torch, torch.multiprocessing as mp\nfrom absl import flags\nfrom utils import setup\n"
             "from torch.nn.parallel import DistributedDataParallel as DDP\nFLAGS = flags.FLAGS\n"
             "flags.DEFINE_string('master_port', '{port}', help='port')\ndef train(rank, world):\n"
             "    setup(rank, world, FLAGS.master_port)\n    torch.manual_seed(0)\n    model = DDP(Net())\n"
             "mp.spawn(train, args=(2,), nprocs=2)\n")
    loud = _project(tmp_path / "l", {"utils.py": helper, "train.py": train.format(port="12355")})
    quiet = _project(tmp_path / "q", {"utils.py": helper, "train.py": train.format(port="")})
    assert "hard-coded-master-port" in _rules(audit.audit_paths([loud]), "utils.py")
    assert "hard-coded-master-port" not in _rules(audit.audit_paths([quiet]))


MODELS = ("import torch, sys\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
          "class PlainModel(torch.nn.Module):\n    def train_network(self, loader):\n        for x in loader:\n"
          "            loss = self.net(x).mean()\n            loss.backward()\n            self.optim.step()\n"
          "            print('Loss: %.5f' % loss.item())\n"
          "class ModelDDP(torch.nn.Module):\n    def __init__(self, gpu_id, **kwargs):\n        super().__init__()\n"
          "        self.gpu_id = gpu_id\n        self.net = DDP(Net())\n    def print_info(self, content):\n"
          "        if self.gpu_id == 0:\n            print(content, flush=True)\n    def train_network(self, loader):\n"
          "        loss = 0\n        for x in loader:\n            nloss = self.net(x).mean()\n"
          "            nloss.backward()\n            self.optim.step()\n            loss += nloss.item()\n"
          "            self.print_info('Loss: %.5f' % loss)\n        return loss\n")


def test_a_class_nothing_builds_and_a_rank_handed_through_vars(tmp_path):
    """ECAPA-TDNN: the module holds the single-GPU class beside the DDP one; the DDP script imports both and builds
    only ModelDDP(**vars(args)) after `args.gpu_id = rank`. The unbuilt class's print is no finding; ModelDDP's
    print_info tests self.gpu_id, the rank: rank 0 logs its own loss. The script's score-file write of what
    train_network returns is the same defect, found once, where the loss is computed. Built, PlainModel prints on
    every rank."""
    train = (DDP_HEAD + "import argparse\nfrom models import PlainModel, ModelDDP\ntorch.manual_seed(0)\n"
             "args = argparse.Namespace()\nargs.gpu_id = rank\ns = ModelDDP(**vars(args))\n{extra}"
             "loss = s.train_network(loader)\nif rank == 0:\n    score_file.write('LOSS %f' % loss)\n")
    quiet = _project(tmp_path / "q", {"models.py": MODELS, "train.py": train.format(extra="")})
    loud = _project(tmp_path / "l", {"models.py": MODELS,
                                     "train.py": train.format(extra="PlainModel().train_network(loader)\n")})
    found = audit.audit_paths([quiet])
    assert [(f.path.rsplit("/", 1)[-1], f.rule) for f in found if "loss" in f.rule] == [
        ("models.py", "rank0-local-loss")], found
    assert "every-rank-prints-loss" in _rules(audit.audit_paths([loud]), "models.py")


def test_a_load_in_the_else_of_a_negated_single_dash_flag(tmp_path):
    """RawNeXt: `if not args.load_model: init ... else: torch.load(args.load_model_path)` with `-load_model`
    (one dash, str2bool, default False): the default run never loads. The same load under `if args.load_model:`
    with default True does."""
    train = (SEEDED + "import argparse\np = argparse.ArgumentParser()\n"
             "p.add_argument('-load_model', type=str2bool, nargs='?', const=True, default={d})\n"
             "p.add_argument('-load_model_path', type=str, default='w.pt')\nargs = p.parse_args()\nmodel = Net()\n"
             "if not args.load_model:\n    model.apply(init_weights)\nelse:\n"
             "    model.load_state_dict(torch.load(args.load_model_path)['model'])\nmodel = DDP(model)\n")
    quiet = _project(tmp_path / "q", {"train.py": train.format(d="False")})
    loud = _project(tmp_path / "l", {"train.py": train.format(d="True")})
    assert "load-without-map-location" not in _rules(audit.audit_paths([quiet]))
    assert "load-without-map-location" in _rules(audit.audit_paths([loud]))


GATHER_LAYER = ("import torch, torch.distributed as dist\nclass GatherLayer(torch.autograd.Function):\n"
                "    @staticmethod\n    def forward(ctx, x):\n"
                "        out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]\n"
                "        dist.all_gather(out, x)\n        return tuple(out)\n    @staticmethod\n"
                "    def backward(ctx, *grads):\n        return grads[dist.get_rank()]\n")


def test_a_gather_layer_applied_only_under_an_option_a_commented_command_passes(tmp_path):
    """RawNeXt: GatherLayer.apply only under `if args.use_metric_l:` (default False); the launch script passes
    the flag only in a commented-out command. The live command passing it turns the gather on."""
    train = (SEEDED + "import argparse\nfrom layers import GatherLayer\np = argparse.ArgumentParser()\n"
             "p.add_argument('-use_metric_l', type=str2bool, nargs='?', const=True, default=False)\n"
             "args = p.parse_args()\nmodel = DDP(Net())\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
             "for x in loader:\n    code = model(x)\n    loss = code.mean()\n    if args.use_metric_l:\n"
             "        emb = torch.cat(GatherLayer.apply(code), dim=0)\n        loss = loss + metric(emb)\n"
             "    loss.backward()\n    opt.step()\n")
    quiet = _project(tmp_path / "q", {"layers.py": GATHER_LAYER, "train.py": train,
                                      "run.sh": "python train.py -bs 40\n# python train.py -use_metric_l T\n"})
    loud = _project(tmp_path / "l", {"layers.py": GATHER_LAYER, "train.py": train,
                                     "run.sh": "python train.py -bs 40 -use_metric_l T\n"})
    assert "gather-without-grad" not in _rules(audit.audit_paths([quiet]))
    assert "gather-without-grad" in _rules(audit.audit_paths([loud]))


def test_a_progress_bar_opened_in_a_with(tmp_path):
    """RawNeXt: `with tqdm(total=len(loader)) as pbar:` with no rank guard, then `pbar.set_description(
    description)` where description holds the loss: every rank draws its bar. `disable=rank != 0` keeps one."""
    train = (SEEDED + "from tqdm import tqdm\nmodel = DDP(Net())\nwith tqdm(total=len(loader){d}) as pbar:\n"
             "    for x in loader:\n        loss = model(x).mean()\n        loss.backward()\n"
             "        description = 'TOT: %.4f' % loss\n        pbar.set_description(description)\n")
    loud = _project(tmp_path / "l", {"train.py": train.format(d="")})
    quiet = _project(tmp_path / "q", {"train.py": train.format(d=", disable=rank != 0")})
    assert "every-rank-prints-loss" in _rules(audit.audit_paths([loud]))
    assert "every-rank-prints-loss" not in _rules(audit.audit_paths([quiet]))


def test_an_accumulation_count_a_yaml_key_sets_to_one(tmp_path):
    """s3prl: `steps = self.config['runner'].get('gradient_accumulate_steps')`, `loss / steps`, with
    `gradient_accumulate_steps: 1` in the config YAML: every micro-batch steps. 4 accumulates without no_sync."""
    train = (SEEDED + "import yaml\nconfig = yaml.safe_load(open('config.yaml'))\nmodel = DDP(Net())\n"
             "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor i, x in enumerate(loader):\n"
             "    steps = config['runner'].get('gradient_accumulate_steps')\n    loss = model(x).mean() / steps\n"
             "    loss.backward()\n    if (i + 1) % steps == 0:\n        opt.step()\n        opt.zero_grad()\n")
    quiet = _project(tmp_path / "q", {"train.py": train, "config.yaml": "runner:\n  gradient_accumulate_steps: 1\n"})
    loud = _project(tmp_path / "l", {"train.py": train, "config.yaml": "runner:\n  gradient_accumulate_steps: 4\n"})
    assert "accumulation-without-no-sync" not in _rules(audit.audit_paths([quiet]))
    assert "accumulation-without-no-sync" in _rules(audit.audit_paths([loud]))


def test_a_method_called_only_on_the_one_process_path(tmp_path):
    """MatterSim: `if is_distributed: self.save_model_ddp(...) else: self.save_model(...)`, and the DDP script
    hands is_distributed=True: save_model's torch.load never runs at two ranks. Called on both paths, it does."""
    pot = ("import torch, torch.distributed as dist\nclass Potential:\n"
           "    def train_model(self, loader, is_distributed=False):\n        self.rank = dist.get_rank()\n"
           "        for x in loader:\n            pass\n        {call}\n    def save_model_ddp(self):\n"
           "        torch.save(self.model.module.state_dict(), 'best.pth')\n    def save_model(self):\n"
           "        best = torch.load('best.pth')\n        self.model.load_state_dict(best)\n")
    train = (SEEDED + "from potential import Potential\npotential = Potential()\npotential.model = DDP(Net())\n"
             "potential.train_model(loader, is_distributed=True)\n")
    quiet = _project(tmp_path / "q", {"potential.py": pot.format(
        call="if is_distributed:\n            self.save_model_ddp()\n        else:\n            self.save_model()"),
        "train.py": train})
    loud = _project(tmp_path / "l", {"potential.py": pot.format(call="self.save_model()"), "train.py": train})
    assert "load-without-map-location" not in _rules(audit.audit_paths([quiet]))
    assert "load-without-map-location" in _rules(audit.audit_paths([loud]))


def test_a_sampler_built_each_epoch_with_the_epoch_in_its_seed(tmp_path):
    """MatterSim: `DistributedSampler(data, seed=seed + idx * 131 + epoch)` built inside the epoch loop: its order
    moves on without set_epoch. Seeded with a constant, it repeats epoch 0's order."""
    train = (SEEDED + "model = DDP(Net())\nfor epoch in range(10):\n"
             "    sampler = DistributedSampler(data, seed={seed})\n"
             "    loader = DataLoader(data, batch_size=8, sampler=sampler)\n    for x in loader:\n"
             "        model(x).mean().backward()\n")
    quiet = _project(tmp_path / "q", {"train.py": train.format(seed="42 + epoch")})
    loud = _project(tmp_path / "l", {"train.py": train.format(seed="42")})
    assert "set-epoch-missing" not in _rules(audit.audit_paths([quiet]))
    assert "set-epoch-missing" in _rules(audit.audit_paths([loud]))


UTILS = ("import torch\nclass Distributed:\n    def gather_concat(self, x):\n"
         "        xs = [torch.empty_like(x) for _ in range(2)]\n        torch.distributed.all_gather(xs, x)\n"
         "        return torch.cat(xs)\nclass Metrics:\n    def __init__(self):\n        self.metrics = {}\n"
         "    def update(self, d):\n        for k, v in d.items():\n"
         "            self.metrics.setdefault(k, []).append(v)\n"
         "    def compute(self, dist):\n        out = {}\n        for k, v in self.metrics.items():\n"
         "            v = sum(v) / len(v)\n            out[k] = dist.gather_concat(torch.tensor(v).view(1)).mean()\n"
         "        return out\n")


def test_a_gather_method_handed_detached_tensors_and_a_meter_that_gathers(tmp_path):
    """TarFlow: Distributed.gather_concat is handed `z.detach()...` and `torch.tensor(v)`: nothing it gathers
    carries a gradient. Metrics.compute averages the gathered per-rank means, so `{'lr': lr,
    **metrics.compute(dist)}` printed on rank 0 is the global loss. Handed z itself inside the loss, it drops the
    other ranks' gradient."""
    train = (SEEDED + "import utils\ndist2 = utils.Distributed()\nmodel = DDP(Net())\nmetrics = utils.Metrics()\n"
             "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor x in loader:\n    z = model(x)\n"
             "    prior = dist2.gather_concat({arg})\n    loss = (z * prior.mean()).mean()\n    loss.backward()\n"
             "    opt.step()\n    metrics.update({{'loss': loss}})\n"
             "metrics_dict = {{'lr': 0.1, **metrics.compute(dist2)}}\n"
             "if rank == 0:\n    print(metrics_dict)\n")
    quiet = _project(tmp_path / "q", {"utils.py": UTILS, "train.py": train.format(arg="z.detach().square()")})
    loud = _project(tmp_path / "l", {"utils.py": UTILS, "train.py": train.format(arg="z")})
    assert _rules(audit.audit_paths([quiet])) == []
    assert "gather-without-grad" in _rules(audit.audit_paths([loud]))


def test_a_save_helper_handed_the_wrapper(tmp_path):
    """AdaBins: `model_io.save_checkpoint(model, ...)` after `model = DDP(model)`, and the helper saves
    `model.state_dict()`; the DataParallel of the `elif` beside the DDP arm is not what the DDP run saves. Handed
    `model.module`, the keys are plain."""
    helper = ("import torch\ndef save_checkpoint(model, optimizer, epoch, filename):\n"
              "    torch.save({'model': model.state_dict(), 'epoch': epoch}, filename)\n")
    train = (SEEDED + "import model_io\nmodel = Net()\nif args.distributed:\n    model = DDP(model)\n"
             "elif args.gpu is None:\n    model = torch.nn.DataParallel(model)\nfor epoch in range(3):\n"
             "    for x in loader:\n        model(x).mean().backward()\n    if rank == 0:\n"
             "        model_io.save_checkpoint({arg}, None, epoch, 'latest.pt')\n")
    loud = _project(tmp_path / "l", {"model_io.py": helper, "train.py": train.format(arg="model")})
    quiet = _project(tmp_path / "q", {"model_io.py": helper, "train.py": train.format(arg="model.module")})
    assert "save-without-module" in _rules(audit.audit_paths([loud]), "train.py")
    assert "save-without-module" not in _rules(audit.audit_paths([quiet]))


def test_a_seed_helper_that_draws_from_the_clock_for_none(tmp_path):
    """fast-reid: `seed_all_rng()` with no seed, and seed_all_rng draws `os.getpid() + datetime.now()...` for
    None: no reproducible seed (a sampler's `comm.shared_random_seed()` asks for a seed, it sets none). Called
    with a seed, torch is seeded."""
    env = ("import os, random, torch\nfrom datetime import datetime\ndef seed_all_rng(seed=None):\n"
           "    if seed is None:\n        seed = os.getpid() + int(datetime.now().strftime('%S%f'))\n"
           "    torch.manual_seed(seed)\n    random.seed(seed)\n")
    train = (DDP_HEAD + "from env import seed_all_rng\nimport comm\nseed_all_rng({arg})\n"
             "sampler_seed = comm.shared_random_seed()\nmodel = DDP(Net())\nfor x in loader:\n"
             "    model(x).mean().backward()\n")
    loud = _project(tmp_path / "l", {"env.py": env, "train.py": train.format(arg="")})
    quiet = _project(tmp_path / "q", {"env.py": env, "train.py": train.format(arg="0")})
    assert "no-seed" in _rules(audit.audit_paths([loud]))
    assert "no-seed" not in _rules(audit.audit_paths([quiet]))


def test_a_star_import_of_a_package_these_copies_hold_without_its_init(tmp_path):
    """MVSTER: `from models import *` with models/__init__.py not in the copies: MVS4net comes from
    models/net.py, whose blocks hold BatchNorm2d. With a SyncBatchNorm conversion, nothing to report."""
    net = ("import torch.nn as nn\nclass MVS4net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
           "        self.bn = nn.BatchNorm2d(8)\n")
    train = (SEEDED + "from models import *\nmodel = MVS4net()\n{convert}"
             "model = torch.nn.parallel.DistributedDataParallel(model)\n"
             "loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data))\n")
    loud = _project(tmp_path / "l", {"models/net.py": net, "train.py": train.format(convert="")})
    quiet = _project(tmp_path / "q", {"models/net.py": net, "train.py": train.format(
        convert="model = nn.SyncBatchNorm.convert_sync_batchnorm(model)\n")})
    assert "batchnorm-without-sync" in _rules(audit.audit_paths([loud]))
    assert "batchnorm-without-sync" not in _rules(audit.audit_paths([quiet]))


def test_another_objects_method_run_by_rank0_forwards_the_wrapper(tmp_path):
    """ECAPA-TDNN: `if rank == 0: s.eval_network(...)` in the script, and eval_network (a method of the object's
    class, in another module) calls the DDP-wrapped `self.speaker_encoder`, which has BatchNorm buffers. Run by
    every rank, no rank waits alone."""
    model = ("import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\nclass Trainer:\n"
             "    def __init__(self):\n        self.speaker_encoder = DDP(torch.nn.BatchNorm1d(4))\n"
             "    def eval_network(self, data):\n        with torch.no_grad():\n"
             "            return self.speaker_encoder(data)\n")
    train = (SEEDED + "from trainer import Trainer\ns = Trainer()\n{guard}s.eval_network(x)\n")
    loud = _project(tmp_path / "l", {"trainer.py": model, "train.py": train.format(guard="if rank == 0:\n    ")})
    quiet = _project(tmp_path / "q", {"trainer.py": model, "train.py": train.format(guard="")})
    assert "ddp-forward-under-rank0" in _rules(audit.audit_paths([loud]), "train.py")
    assert "ddp-forward-under-rank0" not in _rules(audit.audit_paths([quiet]))


def test_the_terms_of_a_backwarded_loss_logged_on_rank0(tmp_path):
    """AdaBins: `l_dense = criterion_ueff(...)`, `loss = l_dense + w * l_chamfer`, `loss.backward()`, then rank 0
    logs `l_dense.item()` to wandb: a term of rank 0's micro-batch loss, never reduced. A metric that no criterion
    computes is no loss."""
    train = (SEEDED + "import wandb\nmodel = DDP(Net())\nfor x in loader:\n    pred = model(x)\n"
             "    l_dense = {made}(pred, x)\n    loss = l_dense + 0.1 * pred.mean()\n    loss.backward()\n"
             "    if rank == 0:\n        wandb.log({{'Train/dense': l_dense.item()}})\n")
    loud = _project(tmp_path / "l", {"train.py": train.format(made="criterion_ueff")})
    quiet = _project(tmp_path / "q", {"train.py": train.format(made="silog_metric")})
    assert "rank0-local-loss" in _rules(audit.audit_paths([loud]))
    assert "rank0-local-loss" not in _rules(audit.audit_paths([quiet]))


def test_a_record_reduced_only_in_the_arm_the_default_run_skips(tmp_path):
    """MACE: `if isinstance(optimizer, LBFGS): _, opt_metrics = take_step_lbfgs(...)` (which all-reduces) `else:
    _, opt_metrics = take_step(...)` (which does not); rank 0 logs opt_metrics after each: the else's log is rank
    0's own loss. With take_step reducing too, both are global."""
    train = (SEEDED + "def take_step_lbfgs(model, batch):\n    loss = model(batch).mean()\n    loss.backward()\n"
             "    dist.all_reduce(loss)\n    return loss, {{'loss': loss.item()}}\n"
             "def take_step(model, batch):\n    loss = model(batch).mean()\n    loss.backward()\n"
             "    opt.step()\n{reduce}    return loss, {{'loss': loss.item()}}\n"
             "def train_one_epoch(model, loader, optimizer, logger):\n    if isinstance(optimizer, LBFGS):\n"
             "        _, opt_metrics = take_step_lbfgs(model, loader)\n        if rank == 0:\n"
             "            logger.log(opt_metrics)\n    else:\n        for batch in loader:\n"
             "            _, opt_metrics = take_step(model, batch)\n            if rank == 0:\n"
             "                logger.log(opt_metrics)\nmodel = DDP(Net())\n"
             "opt = torch.optim.Adam(model.parameters())\ntrain_one_epoch(model, loader, opt, logger)\n")
    loud = _project(tmp_path / "l", {"train.py": train.format(reduce="")})
    quiet = _project(tmp_path / "q", {"train.py": train.format(reduce="    dist.all_reduce(loss)\n")})
    assert "rank0-local-loss" in _rules(audit.audit_paths([loud]))
    assert "rank0-local-loss" not in _rules(audit.audit_paths([quiet]))


def test_a_logger_that_prints_on_rank_text_0_and_files_every_rank(tmp_path):
    """YouReID: `Logger(path, rank=os.environ['RANK'] ...)`, whose write prints to the console when `self.rank ==
    '0'` (the variable's text) and into each rank's own log_<rank>.txt: the console line is rank 0's own loss, the
    file no console. Printing whatever the rank, every rank prints."""
    logger = ("import sys\nclass Logger:\n    def __init__(self, rank='0'):\n        self.rank = rank\n"
              "        self.file = open('log_%s.txt' % rank, 'a+')\n    def write(self, msg):\n"
              "        if {test}:\n            print(msg)\n        print(msg, file=self.file)\n")
    train = (SEEDED + "from logger import Logger\nlog = Logger(rank=os.environ['RANK'])\nmodel = DDP(Net())\n"
             "for x in loader:\n    loss = model(x).mean()\n    loss.backward()\n"
             "    log.write('loss: %f' % loss.item())\n")
    quiet = _project(tmp_path / "q", {"logger.py": logger.format(test="self.rank == '0'"), "train.py": train})
    loud = _project(tmp_path / "l", {"logger.py": logger.format(test="True"), "train.py": train})
    assert _rules(audit.audit_paths([quiet]), "train.py") == ["rank0-local-loss"]
    assert "every-rank-prints-loss" in _rules(audit.audit_paths([loud]), "train.py")


def test_a_progress_bar_on_ranks_whose_stderr_goes_to_a_file(tmp_path):
    """The Music Translation Network: `if rank != 0: sys.stdout = open(...); sys.stderr = open(...)`, so the other
    ranks' progress bars (stderr) go to their own files. With stdout alone redirected, the bars interleave."""
    train = (SEEDED + "import sys\nfrom tqdm import tqdm\nif rank != 0:\n    sys.stdout = open('o.log', 'w')\n"
             "{err}model = DDP(Net())\nwith tqdm(total=10) as bar:\n    for x in loader:\n"
             "        batch_loss = model(x).mean()\n        batch_loss.backward()\n"
             "        bar.set_description(f'Train (loss: {{batch_loss:.2f}})')\n")
    quiet = _project(tmp_path / "q", {"train.py": train.format(err="    sys.stderr = open('e.log', 'w')\n")})
    loud = _project(tmp_path / "l", {"train.py": train.format(err="")})
    assert "every-rank-prints-loss" not in _rules(audit.audit_paths([quiet]))
    assert "every-rank-prints-loss" in _rules(audit.audit_paths([loud]))


def test_a_class_imported_under_an_alias_is_built(tmp_path):
    """UniTS: `from exp.exp_sup import Exp_All_Task as Exp_All_Task_SUP`, then `Exp = Exp_All_Task_SUP; exp =
    Exp(args)`: the class is built under its alias, so its lr scaling is the run's. (A guard of this round's rule
    for classes nothing builds, which first missed the alias; fd200c8 had no such rule, so it passes there.)"""
    exp = ("import torch\nclass Exp_All_Task:\n    def __init__(self, args):\n        self.args = args\n"
           "    def train(self, model):\n        lr = self.args.learning_rate * {factor}\n"
           "        return torch.optim.SGD(model.parameters(), lr=lr)\n")
    train = (SEEDED + "from exp.exp_sup import Exp_All_Task as Exp_All_Task_SUP\nExp = Exp_All_Task_SUP\n"
             "exp = Exp(args)\nmodel = DDP(Net())\nexp.train(model)\n")
    loud = _project(tmp_path / "l", {"exp/exp_sup.py": exp.format(factor="dist.get_world_size()"),
                                     "train.py": train})
    quiet = _project(tmp_path / "q", {"exp/exp_sup.py": exp.format(factor="1"), "train.py": train})
    assert "lr-grows-with-world-size" in _rules(audit.audit_paths([loud]))
    assert "lr-grows-with-world-size" not in _rules(audit.audit_paths([quiet]))
