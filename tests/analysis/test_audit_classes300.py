"""Issue 35: classes of round 300-305's first look (docs/measured/cpu2/audit_heldout_round300.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (c0a6d1e)."""

from test_audit import _project
from test_audit_classes189 import _line
from test_audit_classes246 import HEAD, SEED_ONLY, STEP, _rules

LOOP = "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor step in range(3):\n" + STEP


def test_an_early_raise_is_no_distributed_switch(tmp_path):
    """LatentSync's init_dist: `if num_gpus == 0: raise RuntimeError(...)`, then init_process_group: every run
    that goes on has the group, so its gather_loss helper's all_reduce is no collective outside a switch. An
    early return there is a switch: the one-process run skips the set-up and then reaches the all_reduce."""
    util = ("import torch, torch.distributed as dist\ndef init_dist():\n    num_gpus = torch.cuda.device_count()\n"
            "    if num_gpus == 0:\n        BODY\n    dist.init_process_group('gloo')\n"
            "def gather_loss(loss):\n    dist.all_reduce(loss)\n    return loss / dist.get_world_size()\n")
    train = SEED_ONLY + ("from util import init_dist, gather_loss\ninit_dist()\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                         + LOOP + "    print(gather_loss(loss.detach()))\n")
    raises = util.replace("BODY", "raise RuntimeError('No GPUs available for training.')")
    assert not _rules(_project(tmp_path / "raise", {"train.py": train, "util.py": raises}),
                      "collective-outside-switch")
    returns = util.replace("BODY", "return")
    hits = _rules(_project(tmp_path / "return", {"train.py": train, "util.py": returns}), "collective-outside-switch")
    assert [h.line for h in hits] == [_line(returns, "dist.all_reduce")]


def test_a_history_restored_from_the_checkpoint_stays_rank_0s_own(tmp_path):
    """LatentSync's SyncNet trainer: `val_loss_list = ckpt["val_loss_list"]` on resume, then rank 0 alone appends
    the loss of its validation over the whole, unsharded set and plots the list: the single run's numbers. Over a
    DistributedSampler's shard the same list holds rank 0's own share (rank0-local-loss)."""
    train = SEED_ONLY + (
        "import sys\nfrom torch.utils.data import DataLoader, DistributedSampler\n"
        "dist.init_process_group('gloo')\nrank = dist.get_rank()\nmodel = DDP(torch.nn.Linear(2, 2))\n"
        "ds = [torch.ones(2)] * 8\nval_loader = DataLoader(ds, batch_size=2SAMPLER)\n"
        "def validation(loader, net):\n    losses = [net(x).sum().item() for x in loader]\n"
        "    return sum(losses) / len(losses)\n"
        "val_loss_list = []\nif len(sys.argv) > 1:\n    ckpt = torch.load(sys.argv[1], map_location='cpu')\n"
        "    val_loss_list = ckpt['val_loss_list']\n" + LOOP +
        "    if rank == 0:\n        val_loss = validation(val_loader, model.module)\n"
        "        val_loss_list.append(val_loss)\n        print(val_loss_list)\n")
    whole = train.replace("SAMPLER", "")
    assert not _rules(_project(tmp_path / "whole", {"train.py": whole}), "rank0-local-loss")
    shard = train.replace("SAMPLER", ", sampler=DistributedSampler(ds)")
    assert _rules(_project(tmp_path / "shard", {"train.py": shard}), "rank0-local-loss")


def test_sync_inside_a_name_is_no_reduction(tmp_path):
    """LatentSync: `vision_embeds, audio_embeds = syncnet(syncnet_input, mel)`, whose audio_embeds also feed the
    DDP model, `loss = recon_loss + sync_loss`, then rank 0's progress bar shows loss.item(): `syncnet` is a model,
    not a reduction over ranks, so the loss is rank 0's own (rank0-local-loss). A helper named for syncing
    (`sync_tensor`) that the loss goes through averages it."""
    train = SEED_ONLY + ("dist.init_process_group('gloo')\nrank = dist.get_rank()\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                         "head = torch.nn.Linear(2, 2)\ndef syncnet(x):\n    return head(x), head(x).detach()\n"
                         "def sync_tensor(t):\n    dist.all_reduce(t)\n    return t / dist.get_world_size()\n"
                         "opt = torch.optim.SGD(model.parameters(), lr=0.1)\naudio_embeds = torch.ones(2)\n"
                         "for step in range(3):\n    pred = model(audio_embeds)\n    recon_loss = pred.sum()\n"
                         "    vision_embeds, audio_embeds = syncnet(pred)\n"
                         "    sync_loss = (vision_embeds * audio_embeds).mean()\n    loss = recon_loss + sync_loss\n"
                         "    opt.zero_grad()\n    loss.backward()\n    opt.step()\nSHOWN"
                         "    if rank == 0:\n        print('step', step_loss)\n")
    own = train.replace("SHOWN", "    step_loss = loss.item()\n")
    hits = _rules(_project(tmp_path / "own", {"train.py": own}), "rank0-local-loss")
    assert [h.line for h in hits] == [_line(own, "print('step'")]
    synced = train.replace("SHOWN", "    step_loss = sync_tensor(loss.detach()).item()\n")
    assert not _rules(_project(tmp_path / "synced", {"train.py": synced}), "rank0-local-loss")


def test_a_key_every_python_config_sets_false_is_off(tmp_path):
    """DINO: config/DINO/DINO_4scale.py says `use_ema = False` (the script merges the config into args), and
    `if args.use_ema: ema_m = ModelEma(model, ...)` before the wrap copies each rank's own init (seeded per
    rank): off in the default run, no seed-per-rank. With `use_ema = True` in the config it is on."""
    train = HEAD + ("import argparse, copy, runpy\nparser = argparse.ArgumentParser()\n"
                    "parser.add_argument('-c', '--config_file', default='config/DINO/DINO_4scale.py')\n"
                    "args = parser.parse_args()\nfor k, v in runpy.run_path(args.config_file).items():\n"
                    "    setattr(args, k, v)\ndist.init_process_group('gloo')\n"
                    "torch.manual_seed(42 + dist.get_rank())\nmodel = torch.nn.Linear(2, 2)\n"
                    "if args.use_ema:\n    ema_m = copy.deepcopy(model)\nmodel = DDP(model)\n" + LOOP)
    off = {"train.py": train, "config/DINO/DINO_4scale.py": "lr = 0.0001\nuse_ema = False\n"}
    assert not _rules(_project(tmp_path / "off", off), "seed-per-rank")
    on = {"train.py": train, "config/DINO/DINO_4scale.py": "lr = 0.0001\nuse_ema = True\n"}
    assert _rules(_project(tmp_path / "on", on), "seed-per-rank")


def test_a_text_formatted_from_rank_0s_whole_set_validation(tmp_path):
    """YOLOP: `..., total_loss, maps, times = validate(...)` under `if rank in [-1, 0]:` over an unsharded loader,
    then `msg = 'Epoch: [{0}] Loss({loss:.3f})'.format(epoch, loss=total_loss)` and logger.info(msg): the single
    run's validation loss, no finding. The same text of the step's own loss is rank 0's share (rank0-local-loss)."""
    train = SEED_ONLY + (
        "import logging\nfrom torch.utils.data import DataLoader\nlogger = logging.getLogger(__name__)\n"
        "dist.init_process_group('gloo')\nrank = dist.get_rank()\nmodel = DDP(torch.nn.Linear(2, 2))\n"
        "valid_loader = DataLoader([torch.ones(2)] * 8, batch_size=2)\n"
        "def validate(epoch, loader, net):\n    losses = [net(x).sum().item() for x in loader]\n"
        "    return [0.5], sum(losses) / len(losses), 0.1\n" + LOOP +
        "    if rank in [-1, 0]:\n        results, total_loss, times = validate(step, valid_loader, model)\n"
        "        msg = 'Epoch: [{0}]    Loss({loss:.3f})  Time({t:.4f})'.format(step, loss=LOGGED, t=times)\n"
        "        logger.info(msg)\n")
    whole = train.replace("LOGGED", "total_loss")
    assert not _rules(_project(tmp_path / "whole", {"train.py": whole}), "rank0-local-loss")
    own = train.replace("LOGGED", "loss.item()")
    assert _rules(_project(tmp_path / "own", {"train.py": own}), "rank0-local-loss")


def test_a_sync_bn_option_parsed_and_never_read(tmp_path):
    """YOLOP: `parser.add_argument('--sync-bn', action='store_true')` and nothing reads args.sync_bn; the model
    comes from a module the copies lack: offering the option says the model has BatchNorm, and no run converts
    it (batchnorm-without-sync at the wrap). Without the option nothing says BatchNorm."""
    train = SEED_ONLY + ("import argparse\nfrom lib.models import get_net\nparser = argparse.ArgumentParser()\n"
                         "OPTIONparser.add_argument('--local_rank', type=int, default=-1)\nargs = parser.parse_args()\n"
                         "dist.init_process_group('gloo')\nmodel = get_net(args)\n"
                         "model = DDP(model, device_ids=[args.local_rank])\n" + LOOP)
    offered = train.replace("OPTION", "parser.add_argument('--sync-bn', action='store_true', help='use SyncBN')\n")
    hits = _rules(_project(tmp_path / "offered", {"tools/train.py": offered}), "batchnorm-without-sync")
    assert [h.line for h in hits] == [_line(offered, "model = DDP(")]
    plain = train.replace("OPTION", "")
    assert not _rules(_project(tmp_path / "plain", {"tools/train.py": plain}), "batchnorm-without-sync")


def test_a_linear_probe_in_eval_mode_keeps_its_running_statistics(tmp_path):
    """PCL's eval_cls_imagenet.py (MoCo's main_lincls): the training function calls `model.eval()` and never
    model.train(): the frozen backbone's BatchNorm uses its running statistics, the same on every rank, so there
    is no batchnorm-without-sync. With model.train() it normalises each rank's half-batch."""
    train = SEED_ONLY + ("dist.init_process_group('gloo')\n"
                         "model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))\n"
                         "model = DDP(model)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                         "def train(loader, net):\n    net.MODE()\n    for x in loader:\n"
                         "        loss = net(x).sum()\n        opt.zero_grad()\n        loss.backward()\n"
                         "        opt.step()\nfor epoch in range(2):\n    train([torch.ones(4, 2)], model)\n")
    probe = train.replace("MODE", "eval")
    assert not _rules(_project(tmp_path / "probe", {"train.py": probe}), "batchnorm-without-sync")
    trains = train.replace("MODE", "train")
    assert _rules(_project(tmp_path / "trains", {"train.py": trains}), "batchnorm-without-sync")


def test_a_run_handed_to_a_project_module_the_copies_lack(tmp_path):
    """V-JEPA's app/main.py: init_distributed(), then `app_main(params['app'], args=params)` from
    `app.scaffold`, which these files lack and which picks app/vjepa/train.py by name; that module wraps in DDP
    and seeds torch: whether the run is seeded is not known here, no no-seed on main.py. When no module of the
    project seeds torch, the launcher's run is unseeded as far as these files show (no-seed)."""
    main = ("import argparse\nimport multiprocessing as mp\nfrom app.scaffold import main as app_main\n"
            "from src.utils.distributed import init_distributed\nparser = argparse.ArgumentParser()\n"
            "parser.add_argument('--fname', default='configs.yaml')\ndef process_main(rank, fname, world_size):\n"
            "    world_size, rank = init_distributed(rank_and_world_size=(rank, world_size))\n"
            "    app_main('vjepa', args={'fname': fname})\nif __name__ == '__main__':\n    args = parser.parse_args()\n"
            "    for rank in range(2):\n        mp.Process(target=process_main, args=(rank, args.fname, 2)).start()\n")
    dist = ("import torch.distributed as dist\ndef init_distributed(rank_and_world_size=(None, None)):\n"
            "    rank, world_size = rank_and_world_size\n"
            "    dist.init_process_group(backend='gloo', world_size=world_size, rank=rank)\n"
            "    return world_size, rank\n")
    train = HEAD + ("def main(args):\nSEED    model = DDP(torch.nn.Linear(2, 2))\n"
                    "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    for step in range(3):\n"
                    "        loss = model(torch.ones(2)).sum()\n        loss.backward()\n        opt.step()\n")
    seeded = {"app/main.py": main, "src/utils/distributed.py": dist, "app/vjepa/__init__.py": "",
              "app/vjepa/train.py": train.replace("SEED", "    torch.manual_seed(0)\n")}
    assert not _rules(_project(tmp_path / "seeded", seeded), "no-seed")
    unseeded = {**seeded, "app/vjepa/train.py": train.replace("SEED", "")}
    assert [h.path.endswith("main.py") for h in _rules(_project(tmp_path / "unseeded", unseeded), "no-seed")] == [True]


def test_a_helper_that_loads_the_checkpoint_back_into_the_wrapper(tmp_path):
    """V-JEPA: the encoder is wrapped in DDP whatever the world size (the single run wraps too), `encoder, opt,
    epoch = load_checkpoint(r_path=..., encoder=encoder, opt=opt)` loads `encoder.load_state_dict(ckpt['encoder'])`
    into the wrapper, and rank 0's save_checkpoint closure saves `encoder.state_dict()`: the same keys go out and
    come back, no save-without-module. When the helper does not load into it, the wrapped keys reach a file no
    plain model loads."""
    train = ("import sys\nimport torch, torch.distributed as dist\n"
             "from torch.nn.parallel import DistributedDataParallel\ntorch.manual_seed(0)\n"
             "def load_checkpoint(r_path, encoder, opt):\n    checkpoint = torch.load(r_path, map_location='cpu')\n"
             "    LOAD\n    return encoder, opt, checkpoint['epoch']\n"
             "def main(args):\n    dist.init_process_group('gloo')\n    rank = dist.get_rank()\n"
             "    encoder = torch.nn.Linear(2, 2)\n    opt = torch.optim.SGD(encoder.parameters(), lr=0.1)\n"
             "    encoder = DistributedDataParallel(encoder, static_graph=True)\n    start_epoch = 0\n    if args:\n"
             "        encoder, opt, start_epoch = load_checkpoint(r_path=args[0], encoder=encoder, opt=opt)\n"
             "    def save_checkpoint(epoch, path):\n        if rank != 0:\n            return\n"
             "        save_dict = {'encoder': encoder.state_dict(), 'epoch': epoch}\n"
             "        torch.save(save_dict, path)\n"
             "    for epoch in range(start_epoch, 3):\n        loss = encoder(torch.ones(2)).sum()\n"
             "        loss.backward()\n        opt.step()\n        save_checkpoint(epoch + 1, 'latest.pth.tar')\n"
             "if __name__ == '__main__':\n    main(sys.argv[1:])\n")
    loads = train.replace("LOAD", "encoder.load_state_dict(checkpoint['encoder'])")
    assert not _rules(_project(tmp_path / "loads", {"train.py": loads}), "save-without-module")
    reads = train.replace("LOAD", "print(sorted(checkpoint['encoder']))")
    hits = _rules(_project(tmp_path / "reads", {"train.py": reads}), "save-without-module")
    assert [h.line for h in hits] == [_line(reads, "encoder.state_dict()")]


def test_a_collective_in_a_distributed_engine_s_arm(tmp_path):
    """Sockeye: `if utils.using_deepspeed(): ... torch.distributed.barrier()` while the process group is set up
    only under `if args.dist:`: DeepSpeed sets up the group itself, so that arm never runs without one; no
    collective-outside-switch. Under a plain option the barrier runs in the one-process run too."""
    train = SEED_ONLY + ("import argparse\nparser = argparse.ArgumentParser()\n"
                         "parser.add_argument('--dist', action='store_true')\nparser.add_argument('--every', type=int, "
                         "default=1)\nargs = parser.parse_args()\nif args.dist:\n    dist.init_process_group('gloo')\n"
                         "def using_deepspeed():\n    return False\nmodel = torch.nn.Linear(2, 2)\n"
                         "if args.dist:\n    model = DDP(model)\n" + LOOP + "    if TEST:\n        dist.barrier()\n")
    engine = train.replace("TEST", "using_deepspeed()")
    assert not _rules(_project(tmp_path / "engine", {"train.py": engine}), "collective-outside-switch")
    option = train.replace("TEST", "step % args.every == 0")
    assert _rules(_project(tmp_path / "option", {"train.py": option}), "collective-outside-switch")


def test_a_save_helper_that_writes_rank_0s_model_and_each_rank_s_shard(tmp_path):
    """nanochat's save_checkpoint(dir, step, model_data, optimizer_data, meta, rank=ddp_rank): `if rank == 0:`
    saves the model, and each rank saves its optimizer shard to `optim_{step}_rank{rank}.pt`: no shared file is
    written twice. Called without the rank, every rank is rank 0 to it: save-on-every-rank."""
    util = ("import torch\ndef save_checkpoint(step, model_data, optimizer_data, rank=0):\n    if rank == 0:\n"
            "        torch.save(model_data, f'model_{step:06d}.pt')\n"
            "    torch.save(optimizer_data, f'optim_{step:06d}_rank{rank:d}.pt')\n")
    train = SEED_ONLY + ("from util import save_checkpoint\ndist.init_process_group('gloo')\n"
                         "ddp_rank = dist.get_rank()\nmodel = DDP(torch.nn.Linear(2, 2))\n" + LOOP +
                         "save_checkpoint(3, model.module.state_dict(), opt.state_dict()RANK)\n")
    handed = train.replace("RANK", ", rank=ddp_rank")
    assert not _rules(_project(tmp_path / "handed", {"train.py": handed, "util.py": util}), "save-on-every-rank")
    left = train.replace("RANK", "")
    assert _rules(_project(tmp_path / "left", {"train.py": left, "util.py": util}), "save-on-every-rank")


def test_what_a_rank_named_file_holds_is_no_rank(tmp_path):
    """nanochat: `model_data, optimizer_data, meta_data = load_checkpoint(dir, step, rank=ddp_rank)` loads
    `optim_{step}_rank{rank}.pt`, and `step = meta_data['step']`: the step is no rank, so `if step % 10 == 0:
    print(loss)` is every rank's print (every-rank-prints-loss), not rank 0's. A helper that returns the rank it
    is handed makes the step a rank: `if step == 0:` is then rank 0's test."""
    util = ("import json, torch\ndef load_checkpoint(step, rank=0):\n"
            "    optimizer_data = torch.load(f'optim_{step:06d}_rank{rank:d}.pt', map_location='cpu')\n"
            "    meta_data = RETURNED\n    return optimizer_data, meta_data\n")
    train = SEED_ONLY + ("from util import load_checkpoint\ndist.init_process_group('gloo')\n"
                         "ddp_rank = dist.get_rank()\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                         "optimizer_data, meta_data = load_checkpoint(0, rank=ddp_rank)\nstep = meta_data['step']\n"
                         "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nwhile step < 3:\n"
                         "    loss = model(torch.ones(2)).sum()\n    loss.backward()\n    opt.step()\n"
                         "    if step % 10 == 0:\n        print('loss', loss.item())\n    step += 1\n")
    data = util.replace("RETURNED", "json.load(open(f'meta_{step:06d}.json'))")
    assert _rules(_project(tmp_path / "data", {"train.py": train, "util.py": data}), "every-rank-prints-loss")
    ranked = util.replace("RETURNED", "{'step': rank}")
    assert not _rules(_project(tmp_path / "ranked", {"train.py": train, "util.py": ranked}), "every-rank-prints-loss")


def test_a_save_that_raises_unless_rank_0(tmp_path):
    """ACE's Trainer.save_checkpoint: `if not Distributed.get_instance().is_root(): raise RuntimeError('Only the
    root process should save checkpoints')`, then torch.save: past the raise only rank 0 goes on, so calling it
    is no save-on-every-rank. A warning in its place lets every rank write."""
    train = SEED_ONLY + ("dist.init_process_group('gloo')\nmodel = DDP(torch.nn.Linear(2, 2))\n"
                         "def save_checkpoint(path):\n    if dist.get_rank() != 0:\n        BODY\n"
                         "    torch.save(model.module.state_dict(), path)\n" + LOOP +
                         "    save_checkpoint('latest.pt')\n")
    raises = train.replace("BODY", "raise RuntimeError('Only the root process should save checkpoints')")
    assert not _rules(_project(tmp_path / "raises", {"train.py": raises}), "save-on-every-rank")
    warns = train.replace("BODY", "print('saving on a rank other than 0')")
    assert _rules(_project(tmp_path / "warns", {"train.py": warns}), "save-on-every-rank")
