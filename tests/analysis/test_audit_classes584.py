"""Issue 35: classes of round 584-589's first look (docs/measured/cpu2/audit_heldout_round584.txt), fixed after
it, quiet and loud; each test fails at the first look's code (808fbad). The round's other false alarms and misses
are left, said in docs/results.md."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"

MOCO = (DDP + "import argparse\nimport torch.multiprocessing as mp\np = argparse.ArgumentParser()\n"
        "p.add_argument('--seed', type=int, default=None)\np.add_argument('--multiprocessing-distributed', "
        "action='store_true')\np.add_argument('--dist-url', default='tcp://localhost:10001')\n"
        "p.add_argument('--local_rank', type=int, default=0)\ndef main():\n    args = p.parse_args()\n"
        "    if args.seed is not None:\n        torch.manual_seed(args.seed)\n"
        "    if args.multiprocessing_distributed:\n        mp.spawn(main_worker, nprocs=2, args=(args,))\n"
        "    else:\n        main_worker(args.local_rank, args)\ndef main_worker(gpu, args):\n"
        "    dist.init_process_group(backend='gloo', init_method=INIT)\n    model = DDP(torch.nn.Linear(2, 2))\n"
        "if __name__ == '__main__':\n    main()\n")


def test_a_spawn_the_launch_scripts_never_ask_for_seeds_nothing_before_it(tmp_path):
    """A MoCo fork: `if args.multiprocessing_distributed: mp.spawn(main_worker, ...)`, but its shell script runs
    `python -m torch.distributed.launch ... main_moco.py` without that option: main_worker runs in the launched
    process, and with --seed left at None nothing seeds torch (no-seed, not seed-before-spawn). A script that
    passes --multiprocessing-distributed spawns."""
    src = MOCO.replace("INIT", "'env://'")
    launch = _project(tmp_path / "launch", {"main_moco.py": src, "run.sh": "python -m torch.distributed.launch "
                                            "--nproc_per_node=2 main_moco.py --lr 0.03\n"})
    assert _rules(launch, "no-seed") and not _rules(launch, "seed-before-spawn")
    spawn = _project(tmp_path / "spawn", {"main_moco.py": src, "run.sh": "python main_moco.py "
                                          "--multiprocessing-distributed --seed 0\n"})
    assert _rules(spawn, "seed-before-spawn")


def test_a_dist_url_to_a_script_that_rendezvouses_on_env_is_never_read(tmp_path):
    """The fork's launch script passes `--dist-url tcp://localhost:10001` to a script whose init_process_group takes
    init_method='env://' (its sibling script reads args.dist_url): no hard-coded-master-port for that command. A
    command to the sibling that reads it keeps the finding."""
    files = {"main_moco.py": MOCO.replace("INIT", "'env://'"),
             "main_lincls.py": MOCO.replace("INIT", "args.dist_url")}
    env = _project(tmp_path / "env", {**files, "run.sh": "python -m torch.distributed.launch --nproc_per_node=2 "
                                      "main_moco.py --dist-url tcp://localhost:10001\n"})
    assert "run.sh" not in [f.path.rsplit("/", 1)[-1] for f in _rules(env, "hard-coded-master-port")]
    read = _project(tmp_path / "read", {**files, "run.sh": "python -m torch.distributed.launch --nproc_per_node=2 "
                                        "main_lincls.py --dist-url tcp://localhost:10001\n"})
    assert "run.sh" in [f.path.rsplit("/", 1)[-1] for f in _rules(read, "hard-coded-master-port")]


def test_a_value_added_into_the_backwarded_loss_is_a_loss(tmp_path):
    """HCFlow (mmsr's layout): `l_g_total = 0; _, nll = self.netG(...); self.log_dict['nll'] = nll.item();
    l_g_total += nll; l_g_total.backward()`, then rank 0 logs `model.get_current_log()`: rank 0's own nll
    (rank0-local-loss). A value never added into the backwarded loss is no loss."""
    model = ("import torch\nclass Model:\n    def __init__(self, net):\n        self.netG, self.log_dict = net, {}\n"
             "        self.opt = torch.optim.SGD(net.parameters(), lr=0.1)\n    def optimize_parameters(self, x):\n"
             "        l_g_total = 0\n        nll = self.netG(x).sum()\n        self.log_dict['nll'] = nll.item()\n"
             "        ADD\n        self.opt.zero_grad()\n        l_g_total.backward()\n        self.opt.step()\n"
             "    def get_current_log(self):\n        return self.log_dict\n")
    train = (DDP + "from model import Model\nif __name__ == '__main__':\n    dist.init_process_group('gloo')\n"
             "    torch.manual_seed(0)\n    rank = dist.get_rank()\n    model = Model(DDP(torch.nn.Linear(2, 2)))\n"
             "    for step in range(4):\n        model.optimize_parameters(torch.ones(2))\n"
             "        logs = model.get_current_log()\n"
             "        message = ''\n        for k, v in logs.items():\n"
             "            message += '{:s}:{:.4e} '.format(k, v)\n"
             "        if rank <= 0:\n            print(message)\n")
    added = _project(tmp_path / "added", {"model.py": model.replace("ADD", "l_g_total += nll"), "train.py": train})
    assert _rules(added, "rank0-local-loss")
    other = _project(tmp_path / "other", {"model.py": model.replace(
        "ADD", "l_g_total = l_g_total + self.netG(x).mean() * 0 + torch.zeros(())"), "train.py": train})
    assert not _rules(other, "rank0-local-loss")
