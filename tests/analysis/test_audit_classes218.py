"""Issue 35: classes of round 218-222's first look (docs/measured/cpu2/audit_heldout_round218.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (e9411cd)."""

from test_audit import _project
from test_audit_classes135 import SEEDED
from test_audit_classes189 import _found, _has, _line, _places


def test_a_name_imported_from_a_folder_is_the_module_that_defines_it_and_a_shared_count_holds_everywhere(tmp_path):
    """rtseg: `from utils import get_optimizer` with utils/ holding no __init__.py in the copy but a utils/utils.py
    (which does not define it) beside utils/optimizer.py (which does); parallel.py sets `config.gpu_num =
    dist.get_world_size()` and optimizer.py scales `config.lr = config.base_lr * config.gpu_num`."""
    optimizer = ("import torch\ndef get_optimizer(config, model):\n    config.lr = LR\n"
                 "    return torch.optim.SGD(model.parameters(), lr=config.lr)\n")
    parallel = "import torch.distributed as dist\ndef set_device(config):\n    config.gpu_num = dist.get_world_size()\n"
    train = SEEDED + ("from utils import get_optimizer, set_device\nclass Config:\n    base_lr = 0.1\n"
                      "config = Config()\nset_device(config)\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                      "opt = get_optimizer(config, model)\n")
    for lr, want in (("config.base_lr * config.gpu_num", True), ("config.base_lr", False)):
        root = _project(tmp_path / str(want), {
            "train.py": train, "utils/utils.py": "def helper():\n    return 1\n",
            "utils/optimizer.py": optimizer.replace("LR", lr), "utils/parallel.py": parallel})
        assert _has(root, "lr-grows-with-world-size") is want


def test_a_config_helper_that_seeds_is_a_seed_before_the_spawn(tmp_path):
    """ContrastiveCrop: `cfg = get_cfg(args)` calls set_seed(cfg.seed) (random, numpy, torch) in the parent, then
    mp.spawn(main_worker), which never seeds: the workers' init is unseeded. (A getter's name no longer reads as
    a seed asked for: only `seed = get_seed()`-like names do.)"""
    util = ("import random, torch\ndef set_seed(seed=42):\n    random.seed(seed)\n    torch.manual_seed(seed)\n")
    main = ("import torch, torch.distributed as dist, torch.multiprocessing as mp\n"
            "from torch.nn.parallel import DistributedDataParallel as DDP\nfrom util import set_seed\n"
            "def get_cfg():\n    cfg = {'seed': 42}\n    SEED\n    return cfg\n"
            "def main_worker(rank, world_size, cfg):\n    dist.init_process_group('gloo', rank=rank, world_size=2)\n"
            "    model = DDP(torch.nn.Linear(2, 2))\n"
            "def main():\n    cfg = get_cfg()\n    mp.spawn(main_worker, nprocs=2, args=(2, cfg))\n"
            "if __name__ == '__main__':\n    main()\n")
    for seed, want in (("set_seed(cfg['seed'])", True), ("pass", False)):
        root = _project(tmp_path / str(want), {"main.py": main.replace("SEED", seed), "util.py": util})
        assert _has(root, "seed-before-spawn") is want


def test_a_gather_cut_back_to_the_sets_length_counts_no_padding():
    """ContrastiveCrop's update_box: a padding DistributedSampler over the set, the per-sample boxes all-gathered,
    then `all_boxes[:len_ds]` with len_ds the set's length handed in: the duplicates are cut off. (Asked of the
    evaluation helper directly; a cut to a sequence length is no such cut.)"""
    import ast

    from lab_utils.analysis.audit.evaluation import _drops_the_padding

    text = ("def update_box(loader, model, len_ds, max_len):\n    gather = [b for b in loader]\n"
            "    all_boxes = torch.stack(gather, dim=1).view(-1, 4)\n    all_boxes = all_boxes[:UPPER]\n"
            "    return all_boxes\n")
    for upper, want in (("len_ds", True), ("max_len", False)):
        assert _drops_the_padding(ast.parse(text.replace("UPPER", upper)).body[0]) is want


def test_a_launch_scripts_own_port_option_and_a_fixed_rendezvous_endpoint_are_fixed_ports(tmp_path):
    """Guyu's train.sh passes `--MASTER_PORT 28512` (its script writes it into MASTER_PORT); CosyVoice's run.sh
    runs torchrun with `--rdzv_endpoint="localhost:1234"`. A port the environment sets is no finding. (The script
    reads its --MASTER_PORT: since round 536 an option after the script that the script never reads is no port.)"""
    train = SEEDED + ("import os, sys\nif '--MASTER_PORT' in sys.argv:\n"
                      "    os.environ['MASTER_PORT'] = sys.argv[sys.argv.index('--MASTER_PORT') + 1]\n"
                      "model = DDP(torch.nn.Linear(2, 2))\n")
    for script, want in (("python train.py --MASTER_ADDR localhost --MASTER_PORT 28512\n", True),
                         ('torchrun --rdzv_backend=c10d --rdzv_endpoint="localhost:1234" train.py\n', True),
                         ('torchrun --rdzv_backend=c10d --rdzv_endpoint="localhost:$PORT" train.py\n', False)):
        root = _project(tmp_path / str(len(script)), {"train.py": train, "run.sh": "#!/bin/bash\n" + script})
        assert any(f.rule == "hard-coded-master-port" and f.path.endswith("run.sh") for f in _found(root)) is want


def test_one_loss_printed_per_step_per_epoch_and_by_the_caller_on_every_rank_is_one_finding(tmp_path):
    """SegVol: every rank prints `loss.item()` each step, `loss_step_avg` (a sum of it) and `epoch_loss` (a sum of
    that) in train_epoch, and main_worker prints the epoch_loss train_epoch returns: one defect, found at the
    first print, naming the others. A second loss no sum links to it stays its own finding."""
    train = SEEDED + (
        "def train_epoch(model, opt):\n    epoch_loss = 0.0\n    for step in range(3):\n"
        "        loss_step_avg = 0.0\n        for organ in range(2):\n            loss = model(torch.ones(2)).sum()\n"
        "            loss_step_avg += loss.item()\n            opt.zero_grad()\n            loss.backward()\n"
        "            opt.step()\n            print(f'rank {rank} loss {loss.item()}')\n"
        "        loss_step_avg /= 2\n        print(f'rank {rank} avg loss {loss_step_avg}')\n"
        "        epoch_loss += loss_step_avg\n    print(f'rank {rank} epoch_loss {epoch_loss}')\n"
        "    return epoch_loss\n"
        "model = DDP(torch.nn.Linear(2, 2))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for epoch in range(2):\n    epoch_loss = train_epoch(model, opt)\n"
        "    print(f'Epoch {epoch} Loss {epoch_loss}')\n")
    root = _project(tmp_path, {"train.py": train})
    found = [f for f in _found(root) if f.rule == "every-rank-prints-loss"]
    assert len(found) == 1
    assert {("train.py", _line(train, "avg loss")), ("train.py", _line(train, "epoch_loss {")),
            ("train.py", _line(train, "Epoch {epoch}"))} <= _places(root, "every-rank-prints-loss")


def test_a_text_built_from_a_loss_record_is_a_loss_log(tmp_path):
    """CosyVoice's log_per_step: `for name, value in loss_dict.items(): log_str += '{} {:.6f} '.format(name,
    value)`, then `logging.debug(log_str)` on every rank (basicConfig at DEBUG, no rank guard): each rank's own
    loss. Built from the learning rates alone, the same line logs no loss."""
    train = SEEDED + (
        "import logging\nlogging.basicConfig(level=logging.DEBUG)\n"
        "def log_per_step(info):\n    RECORD = info['RECORD']\n    log_str = 'TRAIN '\n"
        "    for name, value in RECORD.items():\n"
        "        log_str += '{} {:.6f} '.format(name, value)\n    logging.debug(log_str)\n"
        "model = DDP(torch.nn.Linear(2, 2))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for step in range(3):\n    loss = model(torch.ones(2)).sum()\n    opt.zero_grad()\n    loss.backward()\n"
        "    opt.step()\n    log_per_step({'loss_dict': {'loss': loss.item()}, 'lrs': {'lr': 0.1}})\n")
    for record, want in (("loss_dict", True), ("lrs", False)):
        root = _project(tmp_path / str(want), {"train.py": train.replace("RECORD", record)})
        assert _has(root, "every-rank-prints-loss") is want
