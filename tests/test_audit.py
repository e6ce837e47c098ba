"""`ddp-lab audit`: each rule fires on the bug it names and not on its fix; real public scripts (tests/outside/)
get the findings a reader of them would agree with; the lab's own train.py gets none."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lab_utils import audit

REPO = Path(__file__).resolve().parents[1]
OUTSIDE = REPO / "tests" / "outside"

DDP_HEAD = """
import os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
dist.init_process_group("gloo")
rank = int(os.environ["RANK"]); world_size = int(os.environ["WORLD_SIZE"])
"""


def rules(body: str, head: str = DDP_HEAD + "torch.manual_seed(0)\n") -> list[str]:
    return [f.rule for f in audit.audit_source(head + textwrap.dedent(body))]


# (rule, a script with the bug, the same script fixed)
CASES = [
    ("set-epoch-missing",
     "s = DistributedSampler(ds)\nfor epoch in range(3):\n    for b in DataLoader(ds, sampler=s): pass\n",
     "s = DistributedSampler(ds)\nfor epoch in range(3):\n    s.set_epoch(epoch)\n"
     "    for b in DataLoader(ds, sampler=s): pass\n"),
    ("sampler-with-shuffle",
     "s = DistributedSampler(ds)\ns.set_epoch(0)\nl = DataLoader(ds, sampler=s, shuffle=True)\n",
     "s = DistributedSampler(ds, shuffle=True)\ns.set_epoch(0)\nl = DataLoader(ds, sampler=s)\n"),
    ("seed-per-rank", "torch.manual_seed(42 + rank)\n", "torch.manual_seed(42)\n"),
    ("seed-per-rank", "offset = rank\nimport random\nrandom.seed(7 + offset)\n", "import random\nrandom.seed(7)\n"),
    ("peek-iterator", "b = next(iter(loader))\n", "b = loader.batch_size\n"),
    ("sum-loss-unscaled", "loss = F.cross_entropy(y, t, reduction='sum')\n",
     "loss = F.cross_entropy(y, t, reduction='sum') * world_size\n"),
    ("rank0-local-loss", "if rank == 0:\n    print(f'loss {loss.item()}')\n",
     "dist.all_reduce(loss)\nloss /= world_size\nif rank == 0:\n    print(f'loss {loss.item()}')\n"),
    ("save-without-module", "model = DDP(model)\nif rank == 0:\n    torch.save(model.state_dict(), 'm.pt')\n",
     "model = DDP(model)\nif rank == 0:\n    torch.save(model.module.state_dict(), 'm.pt')\n"),
    ("collective-under-rank0", "if rank == 0:\n    dist.barrier()\n", "dist.barrier()\n"),
    ("collective-under-rank0", "if dist.get_rank() == 0:\n    dist.all_reduce(t)\n", "dist.all_reduce(t)\n"),
    ("accumulation-without-no-sync",
     "for i, b in enumerate(loader):\n    (model(b) / accum_steps).backward()\n"
     "    if (i + 1) % accum_steps == 0: opt.step()\n",
     "for i, b in enumerate(loader):\n    ctx = model.no_sync() if (i + 1) % accum_steps else nullcontext()\n"
     "    with ctx: (model(b) / accum_steps).backward()\n    if (i + 1) % accum_steps == 0: opt.step()\n"),
    ("batch-and-accum-divided", "batch_size = 32 // world_size\naccum_steps = 8 // world_size\n",
     "batch_size = 32 // world_size\naccum_steps = 8\n"),
    ("batchnorm-without-sync", "net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8))\n",
     "net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8))\n"
     "net = torch.nn.SyncBatchNorm.convert_sync_batchnorm(net)\n"),
]


@pytest.mark.parametrize("rule,bad,good", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_rule_fires_on_the_bug_and_not_on_its_fix(rule, bad, good):
    assert rule in rules(bad), rules(bad)
    assert rule not in rules(good), rules(good)


def test_every_rule_has_a_case_and_a_chapter_notebook():
    assert {c[0] for c in CASES} | {"no-seed"} == set(audit.RULES)  # no-seed: test_no_seed_only_in_a_ddp_script
    for chapter in set(audit.CHAPTERS.values()):
        assert (REPO / "notebooks" / f"{chapter}.ipynb").exists(), chapter


def test_no_seed_only_in_a_ddp_script():
    assert "no-seed" in rules("", head=DDP_HEAD)
    assert "no-seed" not in rules("", head="import torch\nx = torch.rand(3)\n")


def test_a_rank_term_in_a_conditional_is_a_switch_not_a_finding():
    """train.py's `seed + (rank if seed_mode == 'article' else 0)`: the article's bug behind a key."""
    assert "seed-per-rank" not in rules("torch.manual_seed(1 + (rank if per_rank else 0))\n")


def test_a_generator_seeded_per_rank_is_not_a_global_seed():
    """The checklist's own advice: DataLoader(generator=torch.Generator().manual_seed(data_seed + rank))."""
    assert "seed-per-rank" not in rules("g = torch.Generator().manual_seed(1234 + rank)\n")


def test_the_labs_own_train_script_has_no_finding():
    findings = audit.audit_file(REPO / "scripts" / "train.py")
    assert findings == [], audit.format_findings(findings, "scripts/train.py")


def test_findings_carry_line_rule_message_and_chapter():
    f = audit.audit_source(DDP_HEAD + "torch.manual_seed(42 + rank)\n")[0]
    assert (f.line, f.rule, f.chapter) == (7, "seed-per-rank", "02_seeds")
    assert f.format("x.py").startswith("x.py:7: seed-per-rank ") and "notebooks/02_seeds.ipynb" in f.format("x.py")


def test_nanogpt_train_per_rank_seed_and_rank0_local_loss():
    """karpathy/nanoGPT train.py (MIT): `torch.manual_seed(1337 + seed_offset)` with seed_offset = ddp_rank,
    and rank 0 prints `loss.item()` of its own micro-batch (its own comment: "approximating the true total
    loss"). It uses require_backward_grad_sync instead of no_sync, and divides only the accumulation steps:
    neither is a finding."""
    found = audit.audit_file(OUTSIDE / "nanogpt_train.py")
    by_rule = {f.rule: f.line for f in reversed(found)}
    src = (OUTSIDE / "nanogpt_train.py").read_text().splitlines()
    assert set(by_rule) == {"seed-per-rank", "rank0-local-loss"}, audit.format_findings(found, "nanogpt")
    assert "torch.manual_seed(1337 + seed_offset)" in src[by_rule["seed-per-rank"] - 1]
    assert any("lossf" in src[f.line - 1] for f in found if f.rule == "rank0-local-loss")


def test_pytorch_examples_multigpu_torchrun_no_seed_and_peek():
    """pytorch/examples ddp-tutorial-series/multigpu_torchrun.py (BSD-3): it never seeds, and peeks a batch with
    next(iter(loader)) each epoch; it does call set_epoch and saves model.module (no finding there)."""
    found = audit.audit_file(OUTSIDE / "pytorch_examples_multigpu_torchrun.py")
    assert [f.rule for f in found] == ["no-seed", "peek-iterator"], audit.format_findings(found, "multigpu")
    src = (OUTSIDE / "pytorch_examples_multigpu_torchrun.py").read_text().splitlines()
    assert "next(iter(self.train_data))" in src[found[1].line - 1]


def test_cli_exit_codes():
    run = lambda *a: subprocess.run([sys.executable, "-m", "lab_utils", "audit", *a], capture_output=True,  # noqa: E731
                                    text=True, cwd=REPO)
    bad = run(str(OUTSIDE / "nanogpt_train.py"))
    assert bad.returncode == 1 and "seed-per-rank" in bad.stdout
    assert run("scripts/train.py").returncode == 0
    missing = run("no_such_script.py")
    assert missing.returncode == 2 and "no_such_script.py: no such file" in missing.stderr
    broken = REPO / "runs" / "audit_not_python.py"
    broken.write_text("def f(:\n")
    try:
        r = run(str(broken))
        assert r.returncode == 2 and "not Python" in r.stderr
    finally:
        broken.unlink()
