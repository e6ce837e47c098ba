"""Issue 35, held-out batches 81-86 (tests/outside/heldout_labels.json): each class of mistake the first look
showed (docs/measured/cpu2/audit_heldout_batch81..86.txt), fixed as a class, quiet and loud."""

from test_audit import DDP_HEAD, _project, rules

from lab_utils.analysis import audit

PARSER = "import argparse\np = argparse.ArgumentParser()\n"
SPAWN_HEAD = ("import argparse, torch, torch.distributed as dist, torch.multiprocessing as mp\n"
              "from torch.nn.parallel import DistributedDataParallel as DDP\n")


def found(root) -> list:
    return [f.rule for f in audit.audit_paths([root])]


def test_a_computed_host_before_an_option_port_and_a_positional_fallback(tmp_path):
    """E2FGVI / ProPainter: `config['init_method'] = f"tcp://{get_master_ip()}:{args.port}"` with --port
    defaulting to '23455' is a fixed port whatever host the helper names; an option the caller must set is not.
    STEERER's train.sh: `PORT=${3:-29000}` falls back for the script's third argument, not for the environment."""
    src = (SPAWN_HEAD + PARSER[16:] + "p.add_argument('--port', {port})\nargs = p.parse_args()\n"
           "def get_master_ip():\n    return '127.0.0.1'\ndef worker(rank, config):\n"
           "    dist.init_process_group('nccl', init_method=config['init_method'], world_size=2, rank=rank)\n"
           "    torch.manual_seed(0)\n    model = DDP(Net())\nconfig = {{}}\n"
           "config['init_method'] = f'tcp://{{get_master_ip()}}:{{args.port}}'\n"
           "mp.spawn(worker, nprocs=2, args=(config,))\n")
    assert "hard-coded-master-port" in [f.rule for f in audit.audit_source(src.format(port="default='23455'"))]
    assert "hard-coded-master-port" not in [f.rule for f in audit.audit_source(src.format(port="required=True"))]
    script = "import torch.distributed as dist\ndist.init_process_group('nccl')\ntorch.manual_seed(0)\n"
    shell = "PORT={value}\npython -m torch.distributed.launch --nproc_per_node=2 --master_port=$PORT train.py\n"
    loud = _project(tmp_path / "loud", {"train.py": DDP_HEAD + script, "train.sh": shell.format(value="${3:-29000}")})
    quiet = _project(tmp_path / "quiet", {"train.py": DDP_HEAD + script,
                                          "train.sh": shell.format(value="${PORT:-29000}")})
    assert "hard-coded-master-port" in found(loud)
    assert "hard-coded-master-port" not in found(quiet)


def test_a_fixed_port_in_the_arm_that_declares_one_process():
    """DINO's template (FewTURE): `elif torch.cuda.is_available(): args.rank, args.gpu, args.world_size = 0, 0, 1;
    os.environ['MASTER_PORT'] = '29500'` runs only where no launcher set RANK: the 2-rank run takes the first arm.
    The same port in the launched arm is the launched run's port."""
    src = ("import os, torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
           "def init_distributed_mode(args):\n    if 'RANK' in os.environ and 'WORLD_SIZE' in os.environ:\n"
           "        args.rank = int(os.environ['RANK'])\n        args.world_size = int(os.environ['WORLD_SIZE'])\n"
           "{launched}    elif torch.cuda.is_available():\n        args.rank, args.gpu, args.world_size = 0, 0, 1\n"
           "{single}    dist.init_process_group('nccl', world_size=args.world_size, rank=args.rank)\n"
           "init_distributed_mode(args)\ntorch.manual_seed(0)\nmodel = DDP(Net())\n")
    port = "        os.environ['MASTER_PORT'] = '29500'\n"
    assert "hard-coded-master-port" not in [f.rule for f in audit.audit_source(src.format(launched="", single=port))]
    assert "hard-coded-master-port" in [f.rule for f in audit.audit_source(src.format(launched=port, single=""))]


def test_the_global_batch_grows_only_in_the_arm_the_default_skips():
    """L2P: `if args.unscale_lr: global_batch_size = args.batch_size else: ... * args.world_size`, then
    `args.lr = args.lr * global_batch_size / 256` with --unscale_lr type=bool default True: the lr is fixed."""
    src = (DDP_HEAD + "torch.manual_seed(0)\n" + PARSER + "p.add_argument('--lr', type=float, default=1e-3)\n"
           "p.add_argument('--batch_size', type=int, default=16)\n"
           "p.add_argument('--unscale_lr', type=bool, default={default})\nargs = p.parse_args()\n"
           "args.world_size = world_size\nmodel = DDP(Net())\nif args.unscale_lr:\n"
           "    global_batch_size = args.batch_size\nelse:\n"
           "    global_batch_size = args.batch_size * args.world_size\n"
           "args.lr = args.lr * global_batch_size / 256.0\nopt = torch.optim.SGD(model.parameters(), lr=args.lr)\n")
    assert "lr-grows-with-world-size" not in [f.rule for f in audit.audit_source(src.format(default="True"))]
    assert "lr-grows-with-world-size" in [f.rule for f in audit.audit_source(src.format(default="False"))]


def test_seeds_through_torch_random_and_a_json_config(tmp_path):
    """EvoDiff: `torch.random.manual_seed(args.random_seed)` seeds torch. gtn_applications: `seed =
    config.get("seed", None); if seed is not None: torch.manual_seed(seed)` with `"seed": 0` in the JSON config it
    loads: seeded; a config that leaves the seed out seeds nothing."""
    assert "no-seed" not in rules("model = DDP(Net())\n", head=DDP_HEAD + "torch.random.manual_seed(0)\n")
    assert "no-seed" in rules("model = DDP(Net())\n", head=DDP_HEAD + "random.seed(0)\n")
    script = (DDP_HEAD + "import json\nconfig = json.load(open('configs/run.json'))\n"
              "seed = config.get('seed', None)\nif seed is not None:\n    torch.manual_seed(seed)\n"
              "model = DDP(Net())\n")
    seeded = _project(tmp_path / "seeded", {"train.py": script, "configs/run.json": '{"seed": 0, "lr": 0.1}\n'})
    unseeded = _project(tmp_path / "unseeded", {"train.py": script, "configs/run.json": '{"lr": 0.1}\n'})
    assert "no-seed" not in found(seeded)
    assert "no-seed" in found(unseeded)


def test_a_seed_per_rank_only_where_the_default_seeds_nothing():
    """genforce: `if config.seed is not None: torch.manual_seed(config.seed * world_size + rank)` with the seed
    None by default: no seed at all in the default run (no-seed's finding), not a per-rank one."""
    src = (DDP_HEAD + PARSER + "p.add_argument('--seed', type=int, default={seed})\nargs = p.parse_args()\n"
           "if args.seed is not None:\n    torch.manual_seed(args.seed * world_size + rank)\nmodel = DDP(Net())\n")
    quiet = [f.rule for f in audit.audit_source(src.format(seed="None"))]
    assert "seed-per-rank" not in quiet and "no-seed" in quiet, quiet
    assert "seed-per-rank" in [f.rule for f in audit.audit_source(src.format(seed="1"))]


def test_a_logging_level_chosen_by_rank_through_a_name_and_a_value_reduced_in_a_helper():
    """gtn_applications: `level = logging.INFO; if world_rank != 0: level = logging.CRITICAL;
    logging.getLogger().setLevel(level)`: only rank 0's INFO lines show. Its epoch loss is `meters.avg_loss`
    after `meters.sync()` (an all_reduce), and its validation loss comes back from test(), which syncs too."""
    src = ("import logging\nclass Meters:\n    loss = 0.0\n    n = 1\n    def sync(self):\n"
           "        t = torch.tensor([self.loss, self.n])\n        dist.all_reduce(t)\n"
           "        self.loss, self.n = t.tolist()\n    @property\n    def avg_loss(self):\n"
           "        return self.loss / self.n\n"
           "def test(model):\n    meters = Meters()\n    for x in loader:\n        meters.loss += model(x).item()\n"
           "{sync}    return meters.avg_loss\n"
           "level = logging.INFO\nif rank != 0:\n    level = logging.CRITICAL\nlogging.getLogger().setLevel(level)\n"
           "model = DDP(Net())\nfor epoch in range(3):\n    meters = Meters()\n    for x in loader:\n"
           "        loss = model(x)\n        loss.backward()\n        meters.loss += loss.item()\n"
           "{sync2}    logging.info('loss %f', meters.avg_loss)\n    val_loss = test(model)\n"
           "    logging.info('val %f', val_loss)\n")
    quiet = rules(src.format(sync="    meters.sync()\n", sync2="    meters.sync()\n"))
    assert "rank0-local-loss" not in quiet and "every-rank-prints-loss" not in quiet, quiet
    loud = rules(src.format(sync="", sync2=""))
    assert "rank0-local-loss" in loud and "every-rank-prints-loss" not in loud, loud


def test_a_range_check_that_stops_in_the_debugger_and_a_loss_named_by_its_backward():
    """EvoDiff: `if loss <= 0 or loss >= 1000000: print(loss, ...); pdb.set_trace()` reports why the run stops,
    not the curve. SMI-SSED: `errorE.backward()` makes errorE a loss whatever its name, so rank 0's
    `print(f'LossE: {errorE.item()}')` logs its own micro-batch's."""
    abort = ("model = DDP(Net())\nfor x in loader:\n    loss = model(x)\n    loss.backward()\n"
             "    if {test}:\n        print(loss)\n{stop}")
    stop = "        import pdb; pdb.set_trace()\n"
    assert "every-rank-prints-loss" not in rules(abort.format(test="loss <= 0 or loss >= 1000000", stop=""))
    assert "every-rank-prints-loss" not in rules(abort.format(test="step % 10 == 0", stop=stop))
    assert "every-rank-prints-loss" in rules(abort.format(test="step % 10 == 0", stop=""))
    named = ("model = DDP(Net())\nfor x in loader:\n    errorE = model(x)\n    errorE.backward()\n"
             "    if rank == 0:\n        print(f'E: {{{value}.item()}}')\n")
    assert "rank0-local-loss" in rules(named.format(value="errorE"))
    assert "rank0-local-loss" not in rules(named.format(value="x.sum()"))


def test_a_project_sampler_with_no_epoch_and_an_evaluation_helper_arm_without_the_sampler():
    """genforce's DistributedSampler(Sampler) has no set_epoch and reseeds from its own iteration count: nothing
    to miss. Demucs denoiser's `def loader(dataset, *args, shuffle=False, ...)` builds a DistributedSampler only
    `if shuffle:`; its evaluation call leaves shuffle False and gets an unpadded strided Subset."""
    sampler = ("from torch.utils.data import Sampler\nclass DistributedSampler(Sampler):\n"
               "    def __init__(self, ds):\n        self.ds = ds\n        self.it = 0\n"
               "    def __iter__(self):\n        g = torch.Generator()\n        g.manual_seed(self.it)\n"
               "        return iter(torch.randperm(len(self.ds), generator=g).tolist())\n{extra}")
    loop = ("model = DDP(Net())\ns = DistributedSampler(ds)\nfor epoch in range(3):\n"
            "    for x in DataLoader(ds, sampler=s):\n        model(x).sum().backward()\n")
    assert "set-epoch-missing" not in rules(sampler.format(extra="") + loop)
    epoch = "    def set_epoch(self, e):\n        self.epoch = e\n"
    assert "set-epoch-missing" in rules(sampler.format(extra=epoch) + loop)
    helper = ("from torch.utils.data import Subset\ndef loader(dataset, *args, shuffle=False, **kwargs):\n"
              "    if shuffle:\n"
              "        return DataLoader(dataset, *args, sampler=DistributedSampler(dataset), **kwargs)\n"
              "    return DataLoader(Subset(dataset, list(range(rank, len(dataset), world_size))), *args)\n"
              "model = DDP(Net())\ntrain_loader = loader(train_set, batch_size=4, shuffle=True)\n"
              "for epoch in range(3):\n    train_loader.sampler.set_epoch(epoch)\n    for x in train_loader:\n"
              "        model(x).sum().backward()\n    evaluate(model)\n")
    helper = ("def evaluate(model):\n    val_loader = loader(val_set, batch_size=1{flag})\n"
              "    total = torch.zeros(1)\n    with torch.no_grad():\n        for x in val_loader:\n"
              "            total += model(x)\n    dist.all_reduce(total)\n    return total\n") + helper
    assert "eval-padding-duplicates" not in rules(helper.format(flag=""))
    assert "eval-padding-duplicates" in rules(helper.format(flag=", shuffle=True"))


def test_a_save_helper_handed_a_per_rank_name():
    """music-translation: `self.save_model(f'bestmodel_{self.args.rank}.pth')` on every rank: each rank writes
    its own file."""
    src = ("def save_model(model, filename):\n    torch.save(model.module.state_dict(), filename)\n"
           "model = DDP(Net())\nfor x in loader:\n    model(x).sum().backward()\nsave_model(model, {name})\n")
    assert "save-on-every-rank" not in rules(src.format(name="f'best_{rank}.pth'"))
    assert "save-on-every-rank" in rules(src.format(name="'best.pth'"))


def test_a_meter_fed_an_accuracy_from_gathered_labels_and_a_wrap_chosen_by_an_ifexp():
    """FewTURE: `metric_logger.update(loss=loss.item())` beside `metric_logger.update(acc=acc)` with acc from
    concat_all_gather: the gathered accuracy does not make the meter's loss global. Its student is wrapped as
    `DDP(s, broadcast_buffers=False) if 'swin' in arch else DDP(s)`: a wrapper either way."""
    src = ("builtins_print = print\nif rank != 0:\n    import builtins\n    builtins.print = lambda *a, **k: None\n"
           "model = DDP(Net())\nfor x, y in loader:\n    loss = model(x)\n    loss.backward()\n"
           "    pred = concat_all_gather(y)\n    acc = (pred == pred).float().mean()\n"
           "    metric_logger.update({what})\n    metric_logger.update(acc=acc)\n"
           "    if rank == 0:\n        print(metric_logger)\n")
    assert "rank0-local-loss" in rules(src.format(what="loss=loss.item()"))
    assert "rank0-local-loss" not in rules(src.format(what="lr=0.1"))
    wrap = ("student = DDP(Net(), broadcast_buffers=False) if arch == 'swin' else {other}\n"
            "for x in loader:\n    student(x).sum().backward()\nif rank == 0:\n"
            "    torch.save({{'student': student.state_dict()}}, 'c.pth')\n")
    assert "save-without-module" in rules(wrap.format(other="DDP(Net())"))
    assert "save-without-module" not in rules(wrap.format(other="Net()"))


def test_a_print_method_of_the_trainer_itself_and_one_finding_for_the_epoch_it_returns():
    """PICK: `self.logger_info(msg)`, whose body is `self.logger.info(msg) if self.local_master else None`, logs
    rank 0's own avg_loss; train() logs what _train_epoch returns first in the file, and that is the same defect,
    one finding at the step log. Its gl_loss_lambda is a weight, not a loss."""
    src = ("class Trainer:\n    def __init__(self):\n        self.model = DDP(Net())\n"
           "        if config['distributed']:\n            self.local_master = (config['local_rank'] == 0)\n"
           "        else:\n            self.local_master = True\n        self.gl_loss_lambda = 0.01\n"
           "    def train(self):\n        for epoch in range(3):\n            result = self._train_epoch(epoch)\n"
           "            self.logger_info('epoch loss {{}}'.format(result['loss']))\n"
           "    def _train_epoch(self, epoch):\n        total = 0.0\n        for x in loader:\n"
           "            loss = self.model(x)\n            loss.backward()\n            avg_loss = {value}\n"
           "            total += avg_loss.item()\n"
           "            self.logger_info('Loss {{:.6f}} {{}}'.format(avg_loss.item(), self.gl_loss_lambda))\n"
           "        return {{'loss': total}}\n"
           "    def logger_info(self, msg):\n        self.logger.info(msg) if self.local_master else None\n"
           "Trainer().train()\n")
    loud = [f for f in audit.audit_source(DDP_HEAD + "torch.manual_seed(0)\n" + src.format(value="loss.detach()"))
            if f.rule == "rank0-local-loss"]
    assert len(loud) == 1 and "gl_loss_lambda" not in loud[0].message, [(f.line, f.message) for f in loud]
    assert "rank0-local-loss" not in rules(src.format(value="reduce_mean(loss)"))
