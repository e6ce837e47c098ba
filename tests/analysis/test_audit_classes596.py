"""Issue 35: classes of round 596-601's first look (docs/measured/cpu2/audit_heldout_round596.txt), fixed after
it, quiet and loud; each test fails at the first look's code (4d67339). The round's other false alarms and misses
are left, said in docs/results.md."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_the_total_batch_times_nothing_is_no_growing_lr(tmp_path):
    """SlotCon: `args.batch_size = int(args.batch_size / args.world_size)` (the per-GPU share of the total the user
    gave), then `lr=args.batch_size * args.world_size / 256 * args.base_lr`: the total batch again, the same lr at
    any GPU count (no lr-grows-with-world-size). Without the division the lr grows."""
    src = (DDP + "import argparse\np = argparse.ArgumentParser()\np.add_argument('--batch-size', type=int, "
           "default=512)\np.add_argument('--base-lr', type=float, default=1.0)\nargs = p.parse_args()\n"
           "dist.init_process_group('gloo')\ntorch.manual_seed(0)\nargs.world_size = dist.get_world_size()\n"
           "SHARE\nmodel = DDP(torch.nn.Linear(2, 2))\n"
           "opt = torch.optim.SGD(model.parameters(), lr=args.batch_size * args.world_size / 256 * args.base_lr)\n")
    share = src.replace("SHARE", "args.batch_size = int(args.batch_size / args.world_size)")
    assert not _rules(_project(tmp_path / "share", {"train.py": share}), "lr-grows-with-world-size")
    grows = src.replace("SHARE", "pass")
    assert _rules(_project(tmp_path / "grows", {"train.py": grows}), "lr-grows-with-world-size")


def test_a_spawn_switched_on_by_the_config_file_still_spawns(tmp_path):
    """OpenScene: `if args.multiprocessing_distributed: mp.spawn(main_worker, ...)`, the option a key of its YAML
    config (`multiprocessing_distributed: True`), not a command-line flag, and the launch script passes only
    `--config`: the spawn runs, so the parent's `torch.manual_seed` reaches no worker (seed-before-spawn). Round
    584's reading of the launch scripts (a CLI flag they leave out) must not silence it."""
    src = (DDP + "import argparse, yaml\nimport torch.multiprocessing as mp\ndef get_args():\n"
           "    p = argparse.ArgumentParser()\n    p.add_argument('--config', default='cfg.yaml')\n"
           "    cfg = yaml.safe_load(open(p.parse_args().config))\n    return argparse.Namespace(**cfg)\n"
           "def main():\n    args = get_args()\n    torch.manual_seed(args.manual_seed)\n"
           "    if args.multiprocessing_distributed:\n        mp.spawn(main_worker, nprocs=2, args=(args,))\n"
           "    else:\n        main_worker(0, args)\ndef main_worker(gpu, args):\n"
           "    dist.init_process_group('gloo', init_method='env://')\n    model = DDP(torch.nn.Linear(2, 2))\n"
           "if __name__ == '__main__':\n    main()\n")
    root = _project(tmp_path, {"run/train.py": src, "run/train.sh": "python run/train.py --config cfg.yaml\n",
                               "cfg.yaml": "manual_seed: 1463\nmultiprocessing_distributed: True\n"})
    assert _rules(root, "seed-before-spawn")


def test_a_sibling_scripts_division_leaves_this_scripts_lr_growing(tmp_path):
    """CLD: its ImageNet main sets `args.batch_size = int(args.batch_size / ngpus_per_node)`, its CIFAR script
    does not and sets `lr=args.batch_size * dist.get_world_size() / 128 * args.base_learning_rate`: the CIFAR lr
    grows (lr-grows-with-world-size). The full regression at c063547 lost this label; fixed the next commit."""
    cifar = (DDP + "import argparse\np = argparse.ArgumentParser()\np.add_argument('--batch-size', type=int, "
             "default=128)\np.add_argument('--base-learning-rate', type=float, default=0.03)\nargs = p.parse_args()\n"
             "dist.init_process_group('gloo')\ntorch.manual_seed(0)\nmodel = DDP(torch.nn.Linear(2, 2))\n"
             "opt = torch.optim.SGD(model.parameters(), lr=args.batch_size * dist.get_world_size() / 128 * "
             "args.base_learning_rate)\n")
    imagenet = (DDP + "import argparse\np = argparse.ArgumentParser()\np.add_argument('--batch-size', type=int, "
                "default=256)\nargs = p.parse_args()\nngpus_per_node = 2\n"
                "args.batch_size = int(args.batch_size / ngpus_per_node)\ndist.init_process_group('gloo')\n"
                "torch.manual_seed(0)\nmodel = DDP(torch.nn.Linear(2, 2))\n")
    root = _project(tmp_path, {"train_cifar.py": cifar, "main_imagenet.py": imagenet})
    assert [f.path.rsplit("/", 1)[-1] for f in _rules(root, "lr-grows-with-world-size")] == ["train_cifar.py"]
