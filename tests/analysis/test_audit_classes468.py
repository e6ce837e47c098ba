"""Issue 35: classes of round 468-472's first look (docs/measured/cpu2/audit_heldout_round468.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (73dccf3)."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_a_generator_that_reiterates_the_loader_each_pass(tmp_path):
    """StyleMapGAN: `def sample_data(loader): while True: for batch in loader: yield batch`, then
    `train_loader = sample_data(train_loader)` and `set_epoch` at each epoch boundary of the step loop: every pass
    makes a new iterator, which reads the new epoch. With itertools.cycle the first pass is replayed."""
    train = (DDP + "import itertools\nfrom torch.utils.data import DataLoader, DistributedSampler\n"
             "def sample_data(loader):\n    while True:\n        for batch in loader:\n            yield batch\n"
             "def train():\n    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
             "    model = DDP(torch.nn.Linear(2, 2))\n    data = [torch.ones(2)] * 64\n"
             "    sampler = DistributedSampler(data)\n    loader = DataLoader(data, batch_size=4, sampler=sampler)\n"
             "    loader = WRAP(loader)\n    epoch = -1\n    for i in range(1000):\n        if i % 8 == 0:\n"
             "            epoch += 1\n            sampler.set_epoch(epoch)\n        x = next(loader)\n"
             "        model(x).sum().backward()\ntrain()\n")
    fresh = train.replace("WRAP", "sample_data")
    assert not _rules(_project(tmp_path / "fresh", {"train.py": fresh}), "set-epoch-late")
    replayed = train.replace("WRAP", "itertools.cycle")
    assert _rules(_project(tmp_path / "replayed", {"train.py": replayed}), "set-epoch-late")


def test_a_progress_bar_bound_to_a_range_then_to_tqdm(tmp_path):
    """StyleMapGAN: `pbar = range(start, n)`, then `pbar = tqdm(pbar, initial=start)` on every rank and
    `pbar.set_description(f"g: {g_loss_val:.4f}")`: every rank's bar shows its own loss. With `disable=rank != 0`
    on the bar, rank 0's alone shows."""
    train = (DDP + "from tqdm import tqdm\ndist.init_process_group('gloo')\ntorch.manual_seed(0)\n"
             "rank = dist.get_rank()\nmodel = DDP(torch.nn.Linear(2, 2))\npbar = range(0, 100)\n"
             "pbar = tqdm(pbar, initial=0DISABLE)\nfor i in pbar:\n    g_loss = model(torch.ones(2)).sum()\n"
             "    g_loss.backward()\n    g_loss_val = g_loss.item()\n"
             "    pbar.set_description(f'g: {g_loss_val:.4f}')\n")
    every = train.replace("DISABLE", "")
    assert _rules(_project(tmp_path / "every", {"train.py": every}), "every-rank-prints-loss")
    rank0 = train.replace("DISABLE", ", disable=rank != 0")
    assert not _rules(_project(tmp_path / "rank0", {"train.py": rank0}), "every-rank-prints-loss")


def test_a_repository_that_is_its_own_package(tmp_path):
    """MAE-ST: the files sit at the repository's root (mae_st/) and import themselves as `import
    mae_st.util.misc as misc`; `misc.save_model(...)` saves through `save_on_master`, rank 0's: no
    save-on-every-rank. A save_model without the rank-0 guard is the finding."""
    misc = ("import torch, torch.distributed as dist\ndef is_main_process():\n    return dist.get_rank() == 0\n"
            "def save_on_master(state, path):\n    if is_main_process():\n        torch.save(state, path)\n"
            "def save_model(args, epoch, model):\n    SAVE({'model': model.state_dict()}, f'ckpt-{epoch}.pth')\n")
    train = (DDP + "import mae_st.util.misc as misc\nif __name__ == '__main__':\n"
             "    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n    model = DDP(torch.nn.Linear(2, 2))\n"
             "    for epoch in range(3):\n        model(torch.ones(2)).sum().backward()\n"
             "        misc.save_model(args=None, epoch=epoch, model=model.module)\n")
    guarded = {"main_pretrain.py": train, "util/__init__.py": "",
               "util/misc.py": misc.replace("SAVE", "save_on_master")}
    assert not _rules(_project(tmp_path / "mae_st", guarded), "save-on-every-rank")
    every = {"main_pretrain.py": train, "util/__init__.py": "", "util/misc.py": misc.replace("SAVE", "torch.save")}
    assert _rules(_project(tmp_path / "x" / "mae_st", every), "save-on-every-rank")


def test_a_scaling_in_a_main_that_sets_up_the_group_whose_launcher_is_absent(tmp_path):
    """MAE-ST's main_finetune.py: no `__main__` block (run_finetune.py, not copied, starts launch_one_thread),
    and main() sets up the process group, then `args.lr = args.blr * eff_batch_size / 256` with eff_batch_size
    counting the world size: the run's own main, so the lr grows with the GPU count. A scaling helper nothing
    calls and that sets up nothing stays quiet."""
    train = (DDP + "def main(args):\n    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
             "    eff_batch_size = args.batch_size * dist.get_world_size()\n"
             "    args.lr = args.blr * eff_batch_size / 256\n    model = DDP(torch.nn.Linear(2, 2))\n"
             "    opt = torch.optim.SGD(model.parameters(), lr=args.lr)\n"
             "def launch_one_thread(local_rank, args):\n    args.gpu = local_rank\n    main(args)\n")
    assert _rules(_project(tmp_path / "main", {"main_finetune.py": train}), "lr-grows-with-world-size")
    helper = ("import torch.distributed as dist\ndef scale(args):\n    eff = args.batch_size * dist.get_world_size()\n"
              "    args.lr = args.blr * eff / 256\n")
    script = (DDP + "if __name__ == '__main__':\n    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
              "    model = DDP(torch.nn.Linear(2, 2))\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n")
    assert not _rules(_project(tmp_path / "helper", {"train.py": script, "scaling.py": helper}),
                      "lr-grows-with-world-size")
