"""Issue 35: classes of round 252-257's first look (docs/measured/cpu2/audit_heldout_round252.txt), fixed after
it, each quiet and loud; every test but the last fails at the first look's code (9b345c3)."""

from test_audit import _project
from test_audit_classes135 import SEEDED
from test_audit_classes189 import _line
from test_audit_classes246 import SET_UP, STEP, _rules


def test_a_copy_peeled_by_getattr_over_module_is_unwrapped(tmp_path):
    """ParQ: `model_without_ddp = model`, then `for attr in ("_orig_mod", "module"): if hasattr(model, attr):
    model_without_ddp = getattr(model_without_ddp, attr)`: what is saved is the plain model. A copy kept as it is
    saves the wrapper's keys."""
    train = SEEDED + SET_UP + ("model_without_ddp = model\nfor attr in ('_orig_mod', 'module'):\n"
                               "    if hasattr(model, attr):\n"
                               "        model_without_ddp = getattr(model_without_ddp, attr)\n"
                               "if rank == 0:\n    torch.save(model_without_ddp.state_dict(), 'm.pt')\n")
    assert not _rules(_project(tmp_path / "quiet", {"train.py": train}), "save-without-module")
    kept = train.replace("model_without_ddp = getattr(model_without_ddp, attr)", "pass")
    assert _rules(_project(tmp_path / "loud", {"train.py": kept}), "save-without-module")


def test_a_rank_0_test_compared_with_true(tmp_path):
    """Birder: `if training_utils.is_global_primary(args) is True:` around the checkpoint write is rank 0's guard;
    `is not None` holds on every rank."""
    train = SEEDED + SET_UP + ("def is_global_primary():\n    return dist.get_rank() == 0\n"
                               "if is_global_primary() is True:\n    torch.save(model.module.state_dict(), 'm.pt')\n")
    assert not _rules(_project(tmp_path / "quiet", {"train.py": train}), "save-on-every-rank")
    every = train.replace("if is_global_primary() is True:", "if is_global_primary() is not None:")
    assert _rules(_project(tmp_path / "loud", {"train.py": every}), "save-on-every-rank")


def test_a_value_read_off_a_synced_meter_is_the_global_one(tmp_path):
    """Birder: `running_val_loss.synchronize_between_processes(device)`, `epoch_val_loss =
    running_val_loss.global_avg`, then rank 0 writes epoch_val_loss: the whole set's loss. Read before the sync,
    it is rank 0's own."""
    meter = ("class SmoothedValue:\n    def __init__(self):\n        self.total = 0.0\n"
             "    def update(self, v):\n        self.total += v\n"
             "    def synchronize_between_processes(self, device):\n        pass\n"
             "    @property\n    def global_avg(self):\n        return self.total\n")
    train = SEEDED + "from meter import SmoothedValue\n" + SET_UP + (
        "running_loss = SmoothedValue()\nfor step in range(3):\n" + STEP + "    running_loss.update(loss.item())\n"
        "running_loss.synchronize_between_processes('cpu')\nepoch_loss = running_loss.global_avg\n"
        "if rank == 0:\n    print('loss', epoch_loss)\n")
    assert not _rules(_project(tmp_path / "quiet", {"train.py": train, "meter.py": meter}), "rank0-local-loss")
    early = train.replace("running_loss.synchronize_between_processes('cpu')\nepoch_loss = running_loss.global_avg\n",
                          "epoch_loss = running_loss.global_avg\nrunning_loss.synchronize_between_processes('cpu')\n")
    assert _rules(_project(tmp_path / "loud", {"train.py": early, "meter.py": meter}), "rank0-local-loss")


def test_a_seed_a_python_config_sets_inside_a_dict(tmp_path):
    """vedastr: `self._set_seed(cfg.get('seed', None))`, `if seed is not None: torch.manual_seed(seed)`, and the
    config file says `common = dict(seed=1111, ...)`: the default run is seeded. Without the key, it is not."""
    runner = ("import torch\nclass Runner:\n    def __init__(self, cfg):\n"
              "        self._set_seed(cfg.get('seed', None))\n"
              "    def _set_seed(self, seed):\n        if seed is not None:\n            torch.manual_seed(seed)\n")
    config = "common = dict(seed=1111, workdir='out')\n"
    train = ("import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
             "from runner import Runner\nfrom configs import cstr\ndist.init_process_group('gloo')\n"
             "Runner(cstr.common)\nmodel = DDP(torch.nn.Linear(2, 2))\n")
    files = {"tools/train.py": train, "tools/runner.py": runner, "tools/configs/cstr.py": config}
    assert not _rules(_project(tmp_path / "quiet", files), "no-seed")
    unset = {**files, "tools/configs/cstr.py": "common = dict(workdir='out')\n"}
    assert _rules(_project(tmp_path / "loud", unset), "no-seed")


def test_a_single_run_wrapped_in_data_parallel_by_the_same_helper(tmp_path):
    """NVIDIA semantic-segmentation: `net = network.wrap_network_in_dataparallel(net, args.apex)`, a helper that
    wraps in DDP when distributed and in DataParallel otherwise: the single run's checkpoints carry `module.` too,
    so saving the wrapper's state_dict() changes nothing between the runs. A helper with no DataParallel arm
    leaves the single run's keys plain."""
    helper = ("import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
              "def wrap(net, distributed):\n    if distributed:\n        net = DDP(net)\n    else:\n"
              "        net = torch.nn.DataParallel(net)\n    return net\n")
    train = SEEDED + ("import network\nnet = network.wrap(torch.nn.Linear(2, 2), True)\n"
                      "if rank == 0:\n    torch.save(net.state_dict(), 'm.pt')\n")
    files = {"train.py": train, "network.py": helper}
    assert not _rules(_project(tmp_path / "quiet", files), "save-without-module")
    plain = {**files, "network.py": helper.replace("torch.nn.DataParallel(net)", "net")}
    assert _rules(_project(tmp_path / "loud", plain), "save-without-module")


def test_values_walked_out_of_a_synced_record(tmp_path):
    """UniDepth: `track_losses = aggregate_sync_losses(track_losses)`, then rank 0 logs `{**{f"Train/{k}": v for
    k, v in track_losses.items()}, ...}`: every value is the synced one. Unsynced, they are rank 0's own."""
    utils = ("import torch.distributed as dist\ndef aggregate_sync_losses(d):\n    for v in d.values():\n"
             "        dist.all_reduce(v)\n    return d\n")
    train = SEEDED + "import wandb\nfrom utils import aggregate_sync_losses\n" + SET_UP + (
        "track_losses = {}\nfor step in range(3):\n" + STEP + "    track_losses['loss'] = loss.detach()\n"
        "    if step % 50 == 0:\n        track_losses = aggregate_sync_losses(track_losses)\n        if rank == 0:\n"
        "            wandb.log({**{f'Train/{k}': v for k, v in track_losses.items()}, **{'Train/lr': 0.1}})\n")
    assert not _rules(_project(tmp_path / "quiet", {"train.py": train, "utils.py": utils}), "rank0-local-loss")
    raw = train.replace("        track_losses = aggregate_sync_losses(track_losses)\n", "")
    assert _rules(_project(tmp_path / "loud", {"train.py": raw, "utils.py": utils}), "rank0-local-loss")


def test_the_rank_0_guard_is_a_place_of_the_loss_finding(tmp_path):
    """ParQ: `if is_main_process() and i % print_freq == 0:` then a print over many lines whose loss sits on an
    inner line: the guard is where a reader points too, named as a related place."""
    train = SEEDED + SET_UP + ("def is_main_process():\n    return dist.get_rank() == 0\n"
                               "for i in range(3):\n" + STEP.replace("    ", "    ") +
                               "    if is_main_process() and i % 10 == 0:\n        print(\n            'step',\n"
                               "            i,\n            loss.item())\n")
    hits = _rules(_project(tmp_path, {"train.py": train}), "rank0-local-loss")
    assert len(hits) == 1 and _line(train, "if is_main_process() and") in {n for _, n in hits[0].related}


def test_a_call_of_torch_that_reduces_is_no_synced_record(tmp_path):
    """A slip of this round's own fix, caught by the full run (YOLOv5/v7/v9, KAPAO, DirectMHP): `torch.distributed.
    barrier()` early in train() is a reduction-named call on the `torch` module, not a record synced; a name later
    read off `torch.*` (`mem = torch.cuda.memory_reserved()`) or beside it (`mloss`) stays rank 0's own. (This test
    passes at 9b345c3 too: it guards the fix above.)"""
    train = SEEDED + SET_UP + ("torch.distributed.barrier()\nmloss = torch.zeros(1)\n"
                               "for i in range(3):\n" + STEP + "    if rank == 0:\n"
                               "        mloss = (mloss * i + loss.detach()) / (i + 1)\n"
                               "        mem = torch.cuda.memory_reserved()\n        print(mem, *mloss)\n")
    assert _rules(_project(tmp_path, {"train.py": train}), "rank0-local-loss")
