"""Issue 35: classes of round 336-341's first look (docs/measured/cpu2/audit_heldout_round336.txt), fixed after
it, each quiet and loud; every test fails at the first look's code (50fd675)."""

from test_audit import _project
from test_audit_classes189 import _line
from test_audit_classes246 import SEED_ONLY, _found, _rules


def test_a_wrap_under_a_model_option_and_a_keyword_loader(tmp_path):
    """UniMiSS (DINO's layout): `if utils.has_batchnorms(student): teacher = DDP(teacher)` (a test of the model, which
    the single run takes as the 2-rank run does), a helper handed the teacher that saves its state_dict(), and
    `restart_from_checkpoint(path, teacher=teacher)`, which loads each keyword it is handed: the single run saves
    and resumes the same `module.` keys, so no save-without-module. Without the resume nothing loads the wrapper's
    file back, and no plain model can load it: found."""
    utils = ("import torch\ndef has_batchnorms(model):\n"
             "    return any(isinstance(m, torch.nn.BatchNorm1d) for m in model.modules())\n"
             "def restart_from_checkpoint(path, **kwargs):\n    checkpoint = torch.load(path, map_location='cpu')\n"
             "    for key, value in kwargs.items():\n        value.load_state_dict(checkpoint[key])\n")
    train = SEED_ONLY + ("import utils\ndef train_epochs(student, teacher, opt):\n    for epoch in range(2):\n"
                         "        loss = student(torch.ones(2)).sum()\n        opt.zero_grad()\n"
                         "        loss.backward()\n"
                         "        opt.step()\n        if dist.get_rank() == 0:\n"
                         "            torch.save({'teacher': teacher.state_dict()}, 'checkpoint.pth')\n"
                         "dist.init_process_group('gloo')\nstudent = torch.nn.Linear(2, 2)\n"
                         "teacher = torch.nn.Linear(2, 2)\nif utils.has_batchnorms(student):\n"
                         "    teacher = DDP(teacher)\nelse:\n    teacher_plain = teacher\nstudent = DDP(student)\n"
                         "opt = torch.optim.SGD(student.parameters(), lr=0.1)\nRESUME"
                         "train_epochs(student, teacher, opt)\n")
    resumed = train.replace("RESUME", "utils.restart_from_checkpoint('checkpoint.pth', teacher=teacher)\n")
    assert not _rules(_project(tmp_path / "resumed", {"train.py": resumed, "utils.py": utils}), "save-without-module")
    fresh = train.replace("RESUME", "")
    hits = _rules(_project(tmp_path / "fresh", {"train.py": fresh, "utils.py": utils}), "save-without-module")
    assert [h.line for h in hits] == [len(fresh.splitlines())]  # (the call, the last line)


def test_a_per_rank_log_file_chooses_no_level(tmp_path):
    """CvT: `logging.basicConfig(filename='train_rank{}.txt'.format(rank))` names a file per rank, and a console
    handler goes on every rank's root logger: `logging.info(msg)` of the running loss prints on every rank
    (every-rank-prints-loss), not rank 0's console alone. A level chosen by rank (`level=INFO if rank == 0 else
    WARN`) does make the console rank 0's (rank0-local-loss)."""
    train = SEED_ONLY + ("import logging\ndist.init_process_group('gloo')\nrank = dist.get_rank()\n"
                         "logging.basicConfig(CONFIG)\nlogging.getLogger('').addHandler(logging.StreamHandler())\n"
                         "model = DDP(torch.nn.Linear(2, 2))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                         "for step in range(3):\n    loss = model(torch.ones(2)).sum()\n    opt.zero_grad()\n"
                         "    loss.backward()\n    opt.step()\n    msg = 'loss {:.3f}'.format(loss.item())\n"
                         "    logging.info(msg)\n")
    per_file = train.replace("CONFIG", "filename='train_rank{}.txt'.format(rank)")
    found = _found(_project(tmp_path / "per_file", {"train.py": per_file}))
    assert [(f.rule, f.line) for f in found if "loss" in f.rule] == [
        ("every-rank-prints-loss", _line(per_file, "logging.info(msg)"))]
    leveled = train.replace("CONFIG", "level=logging.INFO if rank == 0 else logging.WARN")
    found = _found(_project(tmp_path / "leveled", {"train.py": leveled}))
    assert [(f.rule, f.line) for f in found if "loss" in f.rule] == [
        ("rank0-local-loss", _line(leveled, "logging.info(msg)"))]


def test_timms_multi_epochs_loader_is_a_persistent_iterator(tmp_path):
    """CvT: `create_loader(dataset, ..., distributed=True, use_multi_epochs_loader=True)` from timm.data builds a
    MultiEpochsDataLoader, whose iterator its __init__ makes once: `train_loader.sampler.set_epoch(epoch)` each
    epoch comes after its workers drew the next pass's order (set-epoch-late, at the option; CvT also builds the
    DistributedSampler beside it). timm's plain loader (the option left off) re-makes its iterator each epoch."""
    build = ("import torch\nfrom timm.data import create_loader\ndef build_loader(dataset):\n"
             "    sampler = torch.utils.data.distributed.DistributedSampler(dataset, shuffle=True)\n"
             "    return create_loader(dataset, input_size=224, batch_size=8, is_training=True,\n"
             "                         distributed=True, use_multi_epochs_loader=MULTI)\n")
    train = SEED_ONLY + ("from build import build_loader\ndist.init_process_group('gloo')\n"
                         "model = DDP(torch.nn.Linear(2, 2))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                         "train_loader = build_loader(list(range(64)))\nfor epoch in range(3):\n"
                         "    train_loader.sampler.set_epoch(epoch)\n    for x in train_loader:\n"
                         "        loss = model(x).sum()\n        opt.zero_grad()\n        loss.backward()\n"
                         "        opt.step()\n")
    multi = build.replace("MULTI", "True")
    hits = _rules(_project(tmp_path / "multi", {"train.py": train, "build.py": multi}), "set-epoch-late")
    assert [(h.path.rsplit("/", 1)[-1], h.line) for h in hits] == [("build.py", _line(multi, "use_multi_epochs"))]
    plain = build.replace("MULTI", "False")
    assert not _rules(_project(tmp_path / "plain", {"train.py": train, "build.py": plain}), "set-epoch-late")
