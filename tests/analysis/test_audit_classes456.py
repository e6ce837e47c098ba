"""Issue 35: classes of round 456-461's first look (docs/measured/cpu2/audit_heldout_round456.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (4cafbd7)."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_a_function_handed_inside_a_tuple_of_arguments_runs(tmp_path):
    """CLD-SGM: `mp.Process(target=setup, args=(config, main))`, and setup's `fn(config)` runs main, whose
    helper seeds torch before it builds the model setup wraps: no no-seed. With nothing seeding, the finding
    stays."""
    train = (DDP + "import torch.multiprocessing as mp\n"
             "def setup(config, fn):\n    dist.init_process_group('gloo', rank=config, world_size=2)\n"
             "    model = DDP(fn(config))\n    model(torch.ones(2)).sum().backward()\n"
             "def main(config):\n    import run_lib\n    return run_lib.build_model(config)\n"
             "def run_main(n):\n    ps = [mp.Process(target=setup, args=(r, main)) for r in range(n)]\n"
             "    [p.start() for p in ps]\nif __name__ == '__main__':\n    run_main(2)\n")
    helpers = "import torch\ndef build_model(rank):\n    SEED\n    return torch.nn.Linear(2, 2)\n"
    seeded = {"main.py": train, "run_lib.py": helpers.replace("SEED", "torch.manual_seed(0)")}
    assert not _rules(_project(tmp_path / "seeded", seeded), "no-seed")
    unseeded = {"main.py": train, "run_lib.py": helpers.replace("SEED", "pass")}
    assert _rules(_project(tmp_path / "unseeded", unseeded), "no-seed")


def test_a_configargparse_file_turns_a_store_true_flag_on(tmp_path):
    """CLD-SGM: `p.add('-cc', is_config_file=True)`, `p.add('--is_image', action='store_true')`, and
    configs/default_cifar10.txt's `is_image = true` (the README passes `-cc` that file): the seed under `if
    config.is_image:` runs. Without the line in the file the flag is off and torch is seeded only under it."""
    train = (DDP + "import configargparse\np = configargparse.ArgParser()\np.add('-cc', is_config_file=True)\n"
             "p.add('--is_image', action='store_true')\nconfig = p.parse_args()\n"
             "dist.init_process_group('gloo')\nif config.is_image:\n    torch.manual_seed(0)\n"
             "model = DDP(torch.nn.Linear(2, 2))\nmodel(torch.ones(2)).sum().backward()\n")
    on = {"main.py": train, "configs/default.txt": "# Data\ndataset = cifar10\nis_image            = true\n"}
    assert not _rules(_project(tmp_path / "on", on), "no-seed")
    off = {"main.py": train, "configs/default.txt": "# Data\ndataset = cifar10\n"}
    assert _rules(_project(tmp_path / "off", off), "no-seed")


def test_set_epoch_missing_names_the_loop_under_a_while_loop(tmp_path):
    """CLD-SGM: `train_queue, valid_queue = datasets.get_loaders(config)`, then `while step < n_iters: for x in
    train_queue:`: the finding names the loop over the loader (where the fix goes) among its places."""
    data = ("import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\ndef get_loaders(n):\n"
            "    train_data = [torch.ones(2)] * n\n    sampler = DistributedSampler(train_data)\n"
            "    train_queue = DataLoader(train_data, batch_size=4, sampler=sampler)\n    return train_queue, None\n")
    train = (DDP + "import datasets\ndef train():\n    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
             "    model = DDP(torch.nn.Linear(2, 2))\n    train_queue, valid_queue = datasets.get_loaders(64)\n"
             "    step = 0\n    while step < 1000:\n        for x in train_queue:\n"
             "            model(x).sum().backward()\n            step += 1\ntrain()\n")
    hits = _rules(_project(tmp_path / "p", {"train.py": train, "datasets.py": data}), "set-epoch-missing")
    assert any(path.endswith("train.py") and line == 11 for h in hits for path, line in h.related), [
        (h.path, h.line, h.related) for h in hits]


def test_a_port_option_formatted_into_master_port(tmp_path):
    """CLD-SGM: `os.environ['MASTER_PORT'] = '%d' % config.master_port` with `--master_port` defaulting to 6020:
    a fixed port. With the option defaulting to the environment's, it is not."""
    train = (DDP + "import argparse, os\nparser = argparse.ArgumentParser()\n"
             "parser.add_argument('--master_port', type=int, default=DEFAULT)\nconfig = parser.parse_args()\n"
             "os.environ['MASTER_PORT'] = '%d' % config.master_port\ndist.init_process_group('gloo')\n"
             "torch.manual_seed(0)\nmodel = DDP(torch.nn.Linear(2, 2))\n")
    fixed = train.replace("DEFAULT", "6020")
    assert _rules(_project(tmp_path / "fixed", {"main.py": fixed}), "hard-coded-master-port")
    env = train.replace("DEFAULT", "int(os.environ.get('MASTER_PORT', 0))")
    assert not _rules(_project(tmp_path / "env", {"main.py": env}), "hard-coded-master-port")


def test_a_learning_rate_scaled_by_the_global_size(tmp_path):
    """DINOv2: `cfg.optim.lr *= math.sqrt(cfg.train.batch_size_per_gpu * distributed.get_global_size() /
    1024.0)`: the lr grows with the number of processes. Scaled by the per-GPU batch alone, it does not."""
    train = (DDP + "import math\nfrom types import SimpleNamespace as NS\nimport distributed\n"
             "cfg = NS(optim=NS(base_lr=1e-3, lr=0.0), train=NS(batch_size_per_gpu=64))\n"
             "dist.init_process_group('gloo')\ntorch.manual_seed(0)\ncfg.optim.lr = cfg.optim.base_lr\n"
             "cfg.optim.lr *= math.sqrt(cfg.train.batch_size_per_gpu SCALE / 1024.0)\n"
             "model = DDP(torch.nn.Linear(2, 2))\nopt = torch.optim.SGD(model.parameters(), lr=cfg.optim.lr)\n")
    helper = ("_GLOBAL_SIZE = -1\ndef get_global_size() -> int:\n    return _GLOBAL_SIZE\n"
              "def enable(size):\n    global _GLOBAL_SIZE\n    _GLOBAL_SIZE = size\n")
    grows = {"train.py": train.replace("SCALE", "* distributed.get_global_size()"), "distributed.py": helper}
    assert _rules(_project(tmp_path / "grows", grows), "lr-grows-with-world-size")
    fixed = {"train.py": train.replace("SCALE", ""), "distributed.py": helper}
    assert not _rules(_project(tmp_path / "fixed", fixed), "lr-grows-with-world-size")
