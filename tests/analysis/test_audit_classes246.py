"""Issue 35: classes of round 246-251's first look (docs/measured/cpu2/audit_heldout_round246.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (ffdfd65)."""

from test_audit import _project
from test_audit_classes135 import SEEDED
from test_audit_classes189 import _found, _line

HEAD = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
SEED_ONLY = HEAD + "torch.manual_seed(0)\n"
STEP = "    loss = model(torch.ones(2)).sum()\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
SET_UP = ("dist.init_process_group('gloo')\nrank = dist.get_rank()\nmodel = DDP(torch.nn.Linear(2, 2))\n"
          "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n")


def _rules(root, rule):
    return [f for f in _found(root) if f.rule == rule]


def test_a_verbose_flag_zeroed_on_the_other_ranks_is_rank_0s(tmp_path):
    """3D-EMGP: `def train(rank, config, world_size, verbose=1): if rank != 0: verbose = 0`, then `if verbose:
    print(... loss ...)`: rank 0 alone prints its own shard's loss (rank0-local-loss), not every rank.
    Without the zeroing every rank prints."""
    train = HEAD + ("def train(rank, verbose=1):\n    if rank != 0:\n        verbose = 0\n"
                    "    torch.manual_seed(0)\n    dist.init_process_group('gloo')\n"
                    "    model = DDP(torch.nn.Linear(2, 2))\n"
                    "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    for step in range(3):\n"
                    + "".join("    " + s + "\n" for s in STEP.splitlines()) +
                    "        if verbose:\n            print('loss', loss.item())\n"
                    "import torch.multiprocessing as mp\nmp.spawn(train, nprocs=2)\n")
    root = _project(tmp_path / "loud", {"train.py": train})
    assert [f.line for f in _rules(root, "rank0-local-loss")] == [_line(train, "print('loss'")]
    assert not _rules(root, "every-rank-prints-loss")
    every = _project(tmp_path / "every", {"train.py": train.replace("verbose = 0", "pass")})
    assert _rules(every, "every-rank-prints-loss") and not _rules(every, "rank0-local-loss")


def test_a_one_process_script_beside_the_ddp_ones_has_no_rank_findings(tmp_path):
    """3D-EMGP's finetune_qm9.py: a fine-tuning script with no process group, no DDP and no rank, beside the DDP
    pretraining script; its per-step print is one process's, not every rank's. The DDP script's own print is."""
    ddp = SEEDED + SET_UP + "for step in range(3):\n" + STEP + "    print('loss', loss.item())\n"
    alone = ("import torch\ntorch.manual_seed(0)\nmodel = torch.nn.Linear(2, 2)\n"
             "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor step in range(3):\n" + STEP +
             "    print('loss', loss.item())\n")
    hits = _rules(_project(tmp_path / "two", {"pretrain.py": ddp, "finetune.py": alone}), "every-rank-prints-loss")
    assert [h.path.rsplit("/", 1)[-1] for h in hits] == ["pretrain.py"]
    # a module the DDP script imports is part of its run, whatever its own main block does (SFA3D's
    # kitti_dataloader.py, with a demo under `if __name__ == '__main__':`)
    lib = ("import torch\ndef train_epoch(model, opt):\n    for step in range(3):\n" + "".join(
        "    " + x + "\n" for x in STEP.splitlines()) + "        print('loss', loss.item())\n"
        "if __name__ == '__main__':\n    import argparse\n    print(argparse.ArgumentParser().parse_args())\n")
    uses = SEED_ONLY + "from lib import train_epoch\n" + SET_UP + "train_epoch(model, opt)\n"
    hits = _rules(_project(tmp_path / "lib", {"train.py": uses, "lib.py": lib}), "every-rank-prints-loss")
    assert [h.path.rsplit("/", 1)[-1] for h in hits] == ["lib.py"]


def test_a_rank_handed_to_a_logger_does_not_make_every_parameter_a_rank(tmp_path):
    """LSGM: `logging = utils.common_init(args.global_rank)` returns a logger, no rank; `args =
    utils.prepare(args, logging)` hands args back; the training loop gets args and runs `utils.average_tensor(meter,
    args.distributed)`, whose `if is_distributed: dist.all_reduce(...)` is the distributed switch, true on every
    rank: no collective-under-rank0. A helper whose all_reduce sits under `if rank != 0:` still hangs."""
    utils = ("import torch.distributed as dist\nclass Logger:\n"
             "    def __init__(self, rank):\n        self.rank = rank\n"
             "    def info(self, *a):\n        if self.rank == 0:\n            print(*a)\n"
             "def common_init(rank):\n    logging = Logger(rank)\n    return logging\n"
             "def prepare(args, logging):\n    logging.info('ready')\n    return args\n"
             "def average_tensor(t, is_distributed):\n    if is_distributed:\n        dist.all_reduce(t)\n")
    loop = ("import torch\nimport utils\ndef train(model, opt, args):\n    for step in range(3):\n"
            "        loss = model(torch.ones(2)).sum()\n        opt.zero_grad()\n        loss.backward()\n"
            "        opt.step()\n        utils.average_tensor(loss, args.distributed)\n")
    train = SEEDED + ("import utils, loop, argparse\nargs = argparse.Namespace(distributed=True)\n"
                      "args.global_rank = dist.get_rank()\nlogging = utils.common_init(args.global_rank)\n"
                      "args = utils.prepare(args, logging)\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                      "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nloop.train(model, opt, args)\n")
    files = {"train.py": train, "utils.py": utils, "loop.py": loop}
    assert not _rules(_project(tmp_path / "quiet", files), "collective-under-rank0")
    hang = {**files, "utils.py": utils + "def sync(t, rank):\n    if rank != 0:\n        dist.all_reduce(t)\n",
            "loop.py": loop + "        utils.sync(loss, args.global_rank)\n"}
    assert _rules(_project(tmp_path / "loud", hang), "collective-under-rank0")


def test_a_writer_returned_by_a_set_up_helper_keeps_its_class(tmp_path):
    """LSGM: `logging, writer = utils.common_init(rank, seed, save)`, which builds `writer = Writer(rank, save)`
    whose add_scalar writes on rank 0 alone; the loop it is handed to writes its own micro-batch's loss there.
    A Writer that writes on every rank is no rank-0 log."""
    utils = ("import torch\nclass Writer:\n    def __init__(self, rank):\n        self.rank = rank\n"
             "    def add_scalar(self, *a):\n        if self.rank == 0:\n            print(*a)\n"
             "def common_init(rank):\n    torch.manual_seed(0)\n    logging = print\n    writer = Writer(rank)\n"
             "    return logging, writer\n")
    loop = ("import torch\ndef train(model, opt, writer):\n    for step in range(3):\n"
            "        loss = model(torch.ones(2)).sum()\n        opt.zero_grad()\n        loss.backward()\n"
            "        opt.step()\n        writer.add_scalar('train/loss', loss, step)\n")
    train = SEEDED + ("import utils, loop\ndist.init_process_group('gloo')\nrank = dist.get_rank()\n"
                      "logging, writer = utils.common_init(rank)\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                      "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nloop.train(model, opt, writer)\n")
    files = {"train.py": train, "utils.py": utils, "loop.py": loop}
    hits = _rules(_project(tmp_path / "loud", files), "rank0-local-loss")
    assert [(h.path.rsplit("/", 1)[-1], h.line) for h in hits] == [("loop.py", _line(loop, "add_scalar"))]
    every = {**files, "utils.py": utils.replace("if self.rank == 0:", "if True:")}
    assert not _rules(_project(tmp_path / "quiet", every), "rank0-local-loss")


def test_a_sync_bn_setting_left_false_in_the_script(tmp_path):
    """bubbliiiing's YOLOX: the settings block of train.py says `sync_bn = False`, and the conversion runs only
    `if sync_bn and distributed:`: the default DDP run normalises with per-rank statistics. With `sync_bn = True`
    it converts."""
    train = SEEDED + ("if __name__ == '__main__':\n    distributed = True\n    sync_bn = False\n"
                      "    dist.init_process_group('gloo')\n"
                      "    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))\n"
                      "    if sync_bn and distributed:\n"
                      "        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\n"
                      "    model = DDP(model)\n")
    assert [f.line for f in _rules(_project(tmp_path / "loud", {"train.py": train}), "batchnorm-without-sync")] \
        == [_line(train, "if sync_bn and")]
    on = train.replace("sync_bn = False", "sync_bn = True")
    assert not _rules(_project(tmp_path / "quiet", {"train.py": on}), "batchnorm-without-sync")


def test_a_record_emptied_before_the_log_holds_no_loss_yet(tmp_path):
    """eznlp's disp_running_info(loss=...): `disp_text = []`, the epoch/step/lr parts, `logger.info(disp_text)`;
    then `disp_text = []` again with the loss appended and logged. The defect is the second log (its loss handed in
    by the training loop, named as a related place), not the first. A first log of a record that already has the
    loss is the finding."""
    show = ("import logging\nlogger = logging.getLogger(__name__)\n"
            "def show(step, loss):\n    parts = []\n    parts.append(f'Step: {step}')\n    logger.info(parts)\n"
            "    parts = []\n    parts.append(f'Loss: {loss:.3f}')\n    logger.info(parts)\n")
    train = SEEDED + ("import logging\nfrom show import show\n" + SET_UP +
                      "if rank == 0:\n    logging.basicConfig(level=logging.INFO)\nfor step in range(3):\n" + STEP +
                      "    show(step, loss.item())\n")
    hits = _rules(_project(tmp_path / "loud", {"train.py": train, "show.py": show}), "rank0-local-loss")
    assert [h.line for h in hits] == [_line(show, "parts.append(f'Loss") + 1]
    assert ("train.py", _line(train, "show(step")) in {(p.rsplit("/", 1)[-1], n) for p, n in hits[0].related}


def test_no_seed_names_the_seeds_that_leave_the_cpu_rng_alone(tmp_path):
    """GNS's train_multinode.py: only `torch.cuda.manual_seed(0)`, while the model is built on the CPU: no-seed,
    naming the cuda seed (where a reader looks, and where torch.manual_seed goes)."""
    train = HEAD + ("dist.init_process_group('gloo')\ntorch.cuda.manual_seed(0)\nmodel = DDP(torch.nn.Linear(2, 2))\n")
    hits = _rules(_project(tmp_path, {"train.py": train}), "no-seed")
    assert len(hits) == 1 and _line(train, "cuda.manual_seed") in {n for _, n in hits[0].related}
