"""Issue 35: classes of round 183-188's first look (docs/measured/cpu2/audit_heldout_round183.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (252b819, 599b9ae's audit)."""

from pathlib import Path

from test_audit import DDP_HEAD, _project
from test_audit_classes135 import SEEDED

from lab_utils.analysis import audit


def _found(root: Path) -> list:
    return audit.audit_paths([root])


def _rules(root: Path) -> list[tuple[str, str, int]]:
    return sorted((Path(f.path).name, f.rule, f.line) for f in _found(root))


def _has(root: Path, rule: str) -> bool:
    return any(f.rule == rule for f in _found(root))


def _line(text: str, part: str) -> int:
    return next(i for i, s in enumerate(text.splitlines(), 1) if part in s)


def test_a_rank_parameter_is_followed_to_what_the_callers_hand_it(tmp_path):
    """Efficient Teacher: `init_seeds(1 + RANK)` in Trainer.set_env, whose RANK comes from __init__, which train.py
    hands `RANK = int(os.getenv('RANK', -1))`: the single run seeds 0, rank 0 seeds 1. `seed + RANK` with the
    same -1 default would be rank 0 = seed - 1 too; `seed + max(RANK, 0)` is right."""
    trainer = ("import torch\nclass Trainer:\n    def __init__(self, cfg, RANK):\n        self.set_env(cfg, RANK)\n"
               "    def set_env(self, cfg, RANK):\n        torch.manual_seed(1 + RANK)\n")
    train = DDP_HEAD + ("from trainer import Trainer\nRANK = int(os.getenv('RANK', -1))\n"
                        "t = Trainer(None, RANK)\nmodel = DDP(torch.nn.Linear(2, 2))\n")
    assert _has(_project(tmp_path / "a", {"trainer.py": trainer, "train.py": train}), "seed-per-rank")
    right = trainer.replace("1 + RANK", "1 + max(RANK, 0)")
    assert not _has(_project(tmp_path / "b", {"trainer.py": right, "train.py": train}), "seed-per-rank")


PERSISTENT = ("import torch\nclass InfiniteDataLoader(torch.utils.data.DataLoader):\n"
              "    def __init__(self, *a, **k):\n        super().__init__(*a, **k)\n"
              "        self.iterator = super().__iter__()\n")


def test_set_epoch_in_an_epoch_hook_of_a_persistent_loader_is_late(tmp_path):
    """Efficient Teacher's before_epoch(), called each epoch from train()'s loop, sets the epoch of an
    InfiniteDataLoader, whose iterator (made in __init__) already drew the next epoch's indices. The same hook on
    a plain DataLoader is right."""
    train = SEEDED + ("from loaders import InfiniteDataLoader\nclass T:\n    def __init__(self, ds):\n"
                      "        self.model = DDP(torch.nn.Linear(2, 2))\n"
                      "        self.loader = InfiniteDataLoader(ds, sampler=DistributedSampler(ds))\n"
                      "    def before_epoch(self, e):\n        self.loader.sampler.set_epoch(e)\n"
                      "    def train(self):\n        for e in range(3):\n            self.before_epoch(e)\n"
                      "            for x in self.loader:\n                self.model(x).sum().backward()\n"
                      "T([1, 2]).train()\n")
    root = _project(tmp_path / "a", {"loaders.py": PERSISTENT, "train.py": train})
    assert ("train.py", "set-epoch-late", _line(train, "set_epoch")) in _rules(root)
    plain = train.replace("InfiniteDataLoader(ds", "DataLoader(ds").replace(
        "from loaders import InfiniteDataLoader\n", "")
    assert not _has(_project(tmp_path / "b", {"train.py": plain}), "set-epoch-late")


def test_sync_bn_from_a_yacs_default_copied_onto_the_trainer_is_off(tmp_path):
    """`self.sync_bn = cfg.sync_bn` in a setup method, `_C.sync_bn = False` in configs/defaults.py, and the
    experiment YAML at hand does not name it: the default DDP run converts nothing. `_C.sync_bn = True` converts;
    with no experiment YAML at hand (HigherHRNet's AUTO_RESUME) one may turn the key on: no finding."""
    defaults = "from yacs.config import CfgNode as CN\n_C = CN()\n_C.sync_bn = False\n"
    train = SEEDED + ("class T:\n    def setup(self, cfg):\n        self.sync_bn = cfg.sync_bn\n"
                      "    def build(self, model):\n        if self.sync_bn:\n"
                      "            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\n"
                      "        return DDP(model)\n")
    exp = {"configs/exp.yaml": "lr: 0.01\nepochs: 300\n"}
    assert _has(_project(tmp_path / "a", {"configs/defaults.py": defaults, "train.py": train, **exp}),
                "batchnorm-without-sync")
    on = defaults.replace("False", "True")
    assert not _has(_project(tmp_path / "b", {"configs/defaults.py": on, "train.py": train, **exp}),
                    "batchnorm-without-sync")
    assert not _has(_project(tmp_path / "c", {"configs/defaults.py": defaults, "train.py": train}),
                    "batchnorm-without-sync")


def test_a_loss_function_handed_on_is_no_logged_loss(tmp_path):
    """Efficient Teacher: rank 0 runs `val.run(..., compute_loss=self.compute_loss)`, the loss function, not a
    loss value. Its meter of `loss_items`, shown on rank 0's progress bar, is the finding."""
    train = SEEDED + ("class T:\n    def __init__(self):\n        self.model = DDP(torch.nn.Linear(2, 2))\n"
                      "        self.compute_loss = lambda p: (p.sum(), p.detach())\n"
                      "        self.writer = SummaryWriter() if rank == 0 else None\n"
                      "    def epoch(self, loader, opt, val):\n        for x in loader:\n"
                      "            loss, loss_items = self.compute_loss(self.model(x))\n"
                      "            loss.backward()\n            opt.step()\n"
                      "        if rank == 0:\n"
                      "            val.run(x, writer=self.writer, compute_loss=self.compute_loss)\n")
    assert not _has(_project(tmp_path / "a", {"train.py": train}), "rank0-local-loss")
    logged = train.replace("val.run(x, writer=self.writer, compute_loss=self.compute_loss)", "print(loss_items)")
    assert _has(_project(tmp_path / "b", {"train.py": logged}), "rank0-local-loss")


def test_a_gather_read_out_on_the_spot_feeds_no_loss(tmp_path):
    """Simple-CCReID's test-time `torch.cat(tensors_gather).cpu()` and Vesper's `self.gather(preds).cpu()`: the
    gathered values go to a metric. A contrastive loss over the gathered features is the finding."""
    loss = SEEDED + ("def gather(x):\n    out = [torch.zeros_like(x) for _ in range(world_size)]\n"
                     "    dist.all_gather(out, x)\n    return torch.cat(out)READ\n"
                     "class ContrastiveLoss(torch.nn.Module):\n    def forward(self, a, b):\n"
                     "        return (a @ gather(b).T).logsumexp(1).mean()\n")
    assert _has(_project(tmp_path / "a", {"train.py": loss.replace("READ", "")}), "gather-without-grad")
    assert not _has(_project(tmp_path / "b", {"train.py": loss.replace("READ", ".cpu()")}), "gather-without-grad")


def test_a_child_of_a_logger_quiet_off_rank0_is_rank0s_line(tmp_path):
    """Simple-CCReID: get_logger sets the 'reid' logger to INFO on local rank 0 and WARN elsewhere, and train()
    logs through logging.getLogger('reid.train'): rank 0's line (rank0-local-loss), not every rank's."""
    utils = ("import logging, sys\ndef get_logger(rank, name=''):\n    logger = logging.getLogger(name)\n"
             "    level = logging.INFO if rank in [-1, 0] else logging.WARN\n    logger.setLevel(level=level)\n"
             "    h = logging.StreamHandler(sys.stdout)\n    h.setLevel(level=level)\n    logger.addHandler(h)\n"
             "    return logger\n")
    train = SEEDED + ("import logging\nfrom utils import get_logger\nget_logger(rank, 'reid')\n"
                      "model = DDP(torch.nn.Linear(2, 2))\ndef train(loader, opt):\n"
                      "    logger = logging.getLogger('reid.train')\n    for x in loader:\n"
                      "        loss = model(x).sum()\n        loss.backward()\n        opt.step()\n"
                      "    logger.info(f'loss {loss.item()}')\n")
    rules = [r for _, r, _ in _rules(_project(tmp_path / "a", {"utils.py": utils, "train.py": train}))]
    assert "rank0-local-loss" in rules and "every-rank-prints-loss" not in rules


def test_an_lr_scaling_helper_nothing_calls_scales_nothing(tmp_path):
    """Vesper's utils/distributed.py defines scale_learning_rate(lr, world_size, ...) and no file calls it."""
    helper = ("import torch.distributed as dist\ndef find_free_port():\n    return 29500\n"
              "def scale_learning_rate(lr, world_size, batch_size, base=64):\n"
              "    new_lr = lr * world_size * batch_size / base\n    return new_lr\n")
    train = SEEDED + "import utils.distributed\nport = utils.distributed.find_free_port()\n" \
                     "model = DDP(torch.nn.Linear(2, 2))\nLR\n" \
                     "opt = torch.optim.SGD(model.parameters(), lr=lr)\n"
    unused = train.replace("LR", "lr = 0.1")
    files = {"utils/distributed.py": helper, "train.py": unused}
    assert not _has(_project(tmp_path / "a", files), "lr-grows-with-world-size")
    used = train.replace("LR", "lr = utils.distributed.scale_learning_rate(0.1, world_size, 32)")
    assert _has(_project(tmp_path / "b", {**files, "train.py": used}), "lr-grows-with-world-size")


def test_a_factory_of_a_saver_object_saves_nothing(tmp_path):
    """T4C TLab: `saver = get_saver(cfg, rank)` on every rank builds a ModelSaver whose save() is rank 0's; the
    factory's name says save, but it writes no file. The saver's unguarded save_model, called on every rank, is
    the finding."""
    saver = ("import torch\nclass ModelSaver:\n    def __init__(self, rank):\n        self.rank = rank\n"
             "    def save(self, model):\n        if self.rank == 0:\n"
             "            torch.save(model.module.state_dict(), 'best.pt')\n"
             "    def save_model(self, model):\n        torch.save(model.module.state_dict(), 'last.pt')\n"
             "def get_saver(rank):\n    return ModelSaver(rank)\n")
    train = SEEDED + ("from saver import get_saver\nmodel = DDP(torch.nn.Linear(2, 2))\nsaver = get_saver(rank)\n"
                      "for epoch in range(3):\n    saver.save(model)\n")
    assert not _has(_project(tmp_path / "a", {"saver.py": saver, "train.py": train}), "save-on-every-rank")
    leaky = train.replace("saver.save(model)", "saver.save_model(model)").replace(
        "get_saver(rank)", "ModelSaver(rank)").replace("import get_saver", "import ModelSaver")
    assert _has(_project(tmp_path / "b", {"saver.py": saver, "train.py": leaky}), "save-on-every-rank")


def test_a_flag_written_as_true_if_rank0_else_false_guards(tmp_path):
    """ADAPT: `main_device = True if rank == 0 else False`, then `if main_device: save_model(...)`."""
    train = SEEDED + ("model = DDP(torch.nn.Linear(2, 2))\nmain_device = FLAG\n"
                      "for epoch in range(3):\n    if main_device:\n"
                      "        torch.save(model.module.state_dict(), 'ckpt.pt')\n")
    guarded = train.replace("FLAG", "True if rank == 0 else False")
    assert not _has(_project(tmp_path / "a", {"train.py": guarded}), "save-on-every-rank")
    assert _has(_project(tmp_path / "b", {"train.py": train.replace("FLAG", "True")}), "save-on-every-rank")


def test_a_fold_with_functools_reduce_is_no_reduction_over_ranks(tmp_path):
    """GLNet: the trainer's train() sums features with `reduce(lambda x, y: x + y, features)` and returns its
    own micro-batch's loss; the meter rank 0 prints holds that loss, not an average over ranks."""
    train = SEEDED + ("from functools import reduce\nclass Trainer:\n    def train(self, model, x, opt):\n"
                      "        f = reduce(lambda a, b: a + b, [x, x])\n        loss = model(f).sum()\n"
                      "        loss.backward()\n        opt.step()\n        return loss.item()\n"
                      "model = DDP(torch.nn.Linear(2, 2))\ntrainer = Trainer()\n"
                      "def epoch(loader, opt):\n    for x in loader:\n        loss = trainer.train(model, x, opt)\n"
                      "        if rank == 0:\n            print(loss)\n")
    assert _has(_project(tmp_path / "a", {"train.py": train}), "rank0-local-loss")
    reduced = train.replace("reduce(lambda a, b: a + b, [x, x])", "x").replace(
        "        return loss.item()\n", "        dist.all_reduce(loss)\n        return loss.item()\n")
    assert not _has(_project(tmp_path / "b", {"train.py": reduced}), "rank0-local-loss")


def test_fixed_rendezvous_addresses_in_a_script_and_an_f_string(tmp_path):
    """GLNet's launch script passes `--dist-url "tcp://127.0.0.1:1235"`; Color2Embed writes
    `init_method=f'tcp://{master_ip}:23461'`. A port the launcher or the environment sets is no finding."""
    sh = 'python -m torch.distributed.launch --nproc_per_node=4 train.py \\\n--dist-url "tcp://127.0.0.1:1235"\n'
    train = SEEDED.replace('dist.init_process_group("gloo")', "") + "model = DDP(torch.nn.Linear(2, 2))\n"
    assert _has(_project(tmp_path / "a", {"train.py": train, "run.sh": sh}), "hard-coded-master-port")
    free = sh.replace('--dist-url "tcp://127.0.0.1:1235"', "--dist-url env://")
    assert not _has(_project(tmp_path / "b", {"train.py": train, "run.sh": free}), "hard-coded-master-port")
    fstring = train + ("master_ip = os.environ['MASTER_ADDR']\n"
                       "dist.init_process_group('nccl', init_method=f'tcp://{master_ip}:23461')\n")
    assert _has(_project(tmp_path / "c", {"train.py": fstring}), "hard-coded-master-port")
    env = fstring.replace(":23461'", ":{os.environ[\"MASTER_PORT\"]}'")
    assert not _has(_project(tmp_path / "d", {"train.py": env}), "hard-coded-master-port")


def test_a_world_size_default_the_launch_overrides_is_no_one_process_arm(tmp_path):
    """ClearerVoice's __main__: `args.world_size = 1`, then `if 'WORLD_SIZE' in os.environ: args.world_size =
    int(os.environ['WORLD_SIZE'])`; main() saves on every rank under torchrun."""
    train = DDP_HEAD.replace('dist.init_process_group("gloo")\n', "") + (
        "torch.manual_seed(0)\nclass A:\n    pass\n"
        "def main(args):\n    dist.init_process_group('gloo')\n    model = DDP(torch.nn.Linear(2, 2))\n"
        "    for epoch in range(3):\n        torch.save(model.module.state_dict(), 'ckpt.pt')\n"
        "if __name__ == '__main__':\n    args = A()\n    args.world_size = 1\n"
        "    if 'WORLD_SIZE' in os.environ:\n        args.world_size = int(os.environ['WORLD_SIZE'])\n"
        "    main(args)\n")
    assert _has(_project(tmp_path / "a", {"train.py": train}), "save-on-every-rank")


def test_a_flag_false_by_default_and_true_on_rank0_is_rank0s(tmp_path):
    """ClearerVoice's Solver: `self.print = False`, then `if (distributed and local_rank == 0) or not
    distributed: self.print = True`; `if self.print: print(loss)` is rank 0's log, not an option off by default."""
    train = SEEDED + ("distributed = int(os.environ['WORLD_SIZE']) > 1\n"
                      "class Solver:\n    def __init__(self):\n        self.print = False\n"
                      "        if (distributed and rank == 0) or not distributed:\n            self.print = True\n"
                      "        self.model = DDP(torch.nn.Linear(2, 2))\n"
                      "    def epoch(self, loader, opt):\n        for x in loader:\n"
                      "            loss = self.model(x).sum()\n            loss.backward()\n            opt.step()\n"
                      "            if self.print:\n                print(loss.item())\n")
    assert _has(_project(tmp_path / "a", {"train.py": train}), "rank0-local-loss")


def test_accumulation_in_one_arm_with_a_plain_step_in_the_other(tmp_path):
    """ClearerVoice: `if args.accu_grad: ... if self.accu_count == effec/batch: opt.step()` else a step each
    batch: the accumulating arm all-reduces on every micro-batch. With no_sync around the early backwards it is
    quiet."""
    train = SEEDED + ("model = DDP(torch.nn.Linear(2, 2))\ndef epoch(loader, opt, args):\n    accu_count = 0\n"
                      "    for x in loader:\n        loss = model(x).sum()\n        if args.accu_grad:\n"
                      "            accu_count += 1\n            loss.backward()\n"
                      "            if accu_count == args.effec_batch_size / args.batch_size:\n"
                      "                opt.step()\n                accu_count = 0\n        else:\n"
                      "            loss.backward()\n            opt.step()\n")
    assert _has(_project(tmp_path / "a", {"train.py": train}), "accumulation-without-no-sync")


def test_a_training_loop_rank0_alone_leaves_hangs_the_others(tmp_path):
    """Vesper: `self.early_stopping(score, model)` only under `if self.local_rank == 0:` in test(), and run()'s
    loop breaks on `self.early_stopping.early_stop`. A stop every rank decides is quiet. (A `break` under a rank
    guard alone was tried too: over the held-out projects it took in breaks that run on every rank, YOLOv5's
    broadcast `stop`, a debug flag, and was backed out.)"""
    train = SEEDED + ("class Stop:\n    early_stop = False\n    def __call__(self, s):\n"
                      "        self.early_stop = s > 3\n"
                      "class T:\n    def __init__(self):\n        self.model = DDP(torch.nn.Linear(2, 2))\n"
                      "        self.stopper = Stop()\n"
                      "    def test(self, e):\n        if rank == 0:\n            self.stopper(e)\n"
                      "    def run(self, loader, opt):\n        for e in range(10):\n            for x in loader:\n"
                      "                self.model(x).sum().backward()\n                opt.step()\n"
                      "            self.test(e)\n            if self.stopper.early_stop:\n                break\n")
    assert ("train.py", "collective-under-rank0", _line(train, "                break")) in _rules(
        _project(tmp_path / "a", {"train.py": train}))
    everyone = train.replace("        if rank == 0:\n            self.stopper(e)\n", "        self.stopper(e)\n")
    assert not _has(_project(tmp_path / "b", {"train.py": everyone}), "collective-under-rank0")


def test_a_rank0_logging_helper_names_the_scripts_call(tmp_path):
    """BigColor: `if ... is_main_dev: make_log_scalar(writer, step, loss_dic)` in train.py, the helper in
    utils/logger.py writing `loss_dic['loss_g'].item()`: one finding, whose places include the script's call."""
    helper = ("def make_log_scalar(writer, step, loss_dic):\n    loss_g = loss_dic['loss_g']\n"
              "    writer.add_scalar('G', loss_g.item(), step)\n")
    train = SEEDED + ("from logger import make_log_scalar\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                      "def epoch(loader, opt, writer):\n    for step, x in enumerate(loader):\n"
                      "        loss_g = model(x).sum()\n        loss_g.backward()\n        opt.step()\n"
                      "        if rank == 0:\n            make_log_scalar(writer, step, {'loss_g': loss_g})\n")
    found = [f for f in _found(_project(tmp_path / "a", {"logger.py": helper, "train.py": train}))
             if f.rule == "rank0-local-loss"]
    assert found and any(Path(p).name == "train.py" and line == _line(train, "make_log_scalar(writer")
                         for f in found for p, line in ((f.path, f.line), *f.related))
