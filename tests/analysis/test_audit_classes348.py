"""Issue 35: classes of round 348-353's first look (docs/measured/cpu2/audit_heldout_round348.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (ba44bd4)."""

from test_audit import _project
from test_audit_classes189 import _line
from test_audit_classes246 import SEED_ONLY, _rules


def test_the_none_arm_of_a_parameter_every_caller_fills(tmp_path):
    """RETFound (MAE's util/misc.py): `def save_model(..., loss_scaler): if loss_scaler is not None:
    save_on_master(...) else: torch.save(...)`, called with `loss_scaler = NativeScaler()`: the unguarded else arm
    never runs, so the call is no save-on-every-rank. Called with `loss_scaler=None`, every rank writes: found."""
    misc = ("import torch, torch.distributed as dist\ndef save_on_master(obj, path):\n"
            "    if dist.get_rank() == 0:\n        torch.save(obj, path)\n"
            "def save_model(model, loss_scaler):\n    if loss_scaler is not None:\n"
            "        save_on_master(model.state_dict(), 'ckpt.pth')\n    else:\n"
            "        torch.save(model.state_dict(), 'ckpt.pth')\n")
    train = SEED_ONLY + ("import misc\nclass NativeScaler:\n    pass\ndist.init_process_group('gloo')\n"
                         "model = DDP(torch.nn.Linear(2, 2))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                         "loss_scaler = SCALER\nfor epoch in range(2):\n    loss = model(torch.ones(2)).sum()\n"
                         "    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
                         "    misc.save_model(model.module, loss_scaler=loss_scaler)\n")
    built = train.replace("SCALER", "NativeScaler()")
    assert not _rules(_project(tmp_path / "built", {"train.py": built, "misc.py": misc}), "save-on-every-rank")
    none = train.replace("SCALER", "None")
    hits = _rules(_project(tmp_path / "none", {"train.py": none, "misc.py": misc}), "save-on-every-rank")
    assert [h.line for h in hits] == [_line(none, "misc.save_model(")]


def test_a_tuple_assignment_taints_only_the_rank(tmp_path):
    """YOLOR (YOLOv5's layout): `save_dir, epochs, rank = Path(opt.save_dir), opt.epochs, opt.global_rank` binds the
    run's folder beside the rank: `torch.save(model, save_dir / 'init.pt')` with no guard is one file every rank
    writes (save-on-every-rank), not a file per rank. A folder built from the rank is one per rank: quiet."""
    train = SEED_ONLY + ("from pathlib import Path\nimport argparse\nparser = argparse.ArgumentParser()\n"
                         "parser.add_argument('--save_dir', default='runs')\nopt = parser.parse_args()\n"
                         "dist.init_process_group('gloo')\nopt.global_rank = dist.get_rank()\n"
                         "save_dir, epochs, rank = FOLDER, 2, opt.global_rank\n"
                         "model = DDP(torch.nn.Linear(2, 2))\nopt_sgd = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                         "torch.save(model.module, save_dir / 'init.pt')\nfor epoch in range(epochs):\n"
                         "    loss = model(torch.ones(2)).sum()\n    opt_sgd.zero_grad()\n    loss.backward()\n"
                         "    opt_sgd.step()\n")
    shared = train.replace("FOLDER", "Path(opt.save_dir)")
    hits = _rules(_project(tmp_path / "shared", {"train.py": shared}), "save-on-every-rank")
    assert [h.line for h in hits] == [_line(shared, "torch.save(model.module")]
    per_rank = train.replace("FOLDER", "Path(opt.save_dir) / str(opt.global_rank)")
    assert not _rules(_project(tmp_path / "per_rank", {"train.py": per_rank}), "save-on-every-rank")


def test_a_model_built_anew_after_the_wrap_is_no_wrapper(tmp_path):
    """SpikingResformer (found by the full regression after round 330's change to what a class call runs): `del
    model`, then `model = create_model(...)` and `if is_main_process(): test(model, ...)`: rank 0 alone runs the
    plain model built anew, no DDP forward (no ddp-forward-under-rank0). Handing it the wrapper is one."""
    train = SEED_ONLY + ("def create_model():\n    return torch.nn.BatchNorm1d(2)\n"
                         "def test(net):\n    with torch.no_grad():\n        return net(torch.ones(4, 2))\n"
                         "dist.init_process_group('gloo')\nmodel = DDP(create_model())\n"
                         "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor step in range(3):\n"
                         "    loss = model(torch.ones(4, 2)).sum()\n    opt.zero_grad()\n    loss.backward()\n"
                         "    opt.step()\nREBUILD"
                         "if dist.get_rank() == 0:\n    test(model)\n")
    rebuilt = train.replace("REBUILD", "del model\nmodel = create_model()\n")
    assert not _rules(_project(tmp_path / "rebuilt", {"train.py": rebuilt}), "ddp-forward-under-rank0")
    kept = train.replace("REBUILD", "")
    hits = _rules(_project(tmp_path / "kept", {"train.py": kept}), "ddp-forward-under-rank0")
    assert [h.line for h in hits] == [_line(kept, "    test(model)")]
