"""Issue 38, static half: the FSDP2 port bugs (lab_utils/core/fsdp2.py's fsdp2_bug suite, notebooks/14_fsdp2.ipynb)
found by `ddp-lab audit` where the code shows them. Each rule fires on a small project with the bug and stays quiet
on the same project ported correctly; correct public FSDP2 code (tests/outside/fsdp2/: pytorch/examples' FSDP2
example, torchtitan's FSDP layout, chunked loss and DCP checkpointer) gets none of these rules."""

import textwrap
from pathlib import Path

import pytest

from lab_utils.analysis import audit

REPO = Path(__file__).resolve().parents[2]
FSDP2_OUTSIDE = REPO / "tests" / "outside" / "fsdp2"
FSDP2_RULES = {r for r in audit.REGISTRY if r.startswith("fsdp2-")}

HEAD = """\
import os
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from model import Transformer

dist.init_process_group("nccl")
rank = int(os.environ["RANK"])
torch.manual_seed(0)
"""
MODEL = """\
import torch.nn as nn

class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(100, 16)
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(4))
        self.head = nn.Linear(16, 100)

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)
"""
LOOP = """\
for step in range(10):
    x = torch.randint(0, 100, (8, 32))
    loss = model(x).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
"""
SHARD = "model = Transformer()\nfor layer in model.layers:\n    fully_shard(layer)\nfully_shard(model)\n"

# (rule, files of the project with the bug, files of the correct port); train.py gets HEAD, model.py is MODEL
CASES = [
    ("fsdp2-optimizer-before-wrap",
     {"train.py": "model = Transformer()\nopt = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
                  "for layer in model.layers:\n    fully_shard(layer)\nfully_shard(model)\n" + LOOP},
     {"train.py": SHARD + "opt = torch.optim.AdamW(model.parameters(), lr=1e-3)\n" + LOOP}),
    # through helpers: an optimizer factory and a helper that shards (torchtitan's apply_fsdp layout)
    ("fsdp2-optimizer-before-wrap",
     {"train.py": "from parallel import shard_model, build_optimizer\n\ndef main():\n    model = Transformer()\n"
                  "    params = [p for p in model.parameters() if p.requires_grad]\n"
                  "    opt = torch.optim.SGD(params, lr=0.1)\n    shard_model(model)\n    return model, opt\n\n"
                  "if __name__ == '__main__':\n    main()\n",
      "parallel.py": "from torch.distributed.fsdp import fully_shard\nimport torch\n\ndef shard_model(model):\n"
                     "    for block in model.layers:\n        fully_shard(block)\n    fully_shard(model)\n\n"
                     "def build_optimizer(model):\n    return torch.optim.AdamW(model.parameters())\n"},
     {"train.py": "from parallel import shard_model, build_optimizer\n\ndef main():\n    model = Transformer()\n"
                  "    shard_model(model)\n    opt = build_optimizer(model)\n    return model, opt\n\n"
                  "if __name__ == '__main__':\n    main()\n",
      "parallel.py": "from torch.distributed.fsdp import fully_shard\nimport torch\n\ndef shard_model(model):\n"
                     "    for block in model.layers:\n        fully_shard(block)\n    fully_shard(model)\n\n"
                     "def build_optimizer(model):\n    return torch.optim.AdamW(model.parameters())\n"}),
    ("fsdp2-root-not-wrapped",
     {"train.py": "model = Transformer()\nfor layer in model.layers:\n    fully_shard(layer)\n"
                  "opt = torch.optim.AdamW(model.parameters())\n" + LOOP},
     {"train.py": SHARD + "opt = torch.optim.AdamW(model.parameters())\n" + LOOP}),
    # the blocks sharded in a helper, the root by the caller (or never)
    ("fsdp2-root-not-wrapped",
     {"train.py": "from parallel import shard_blocks\nmodel = Transformer()\nshard_blocks(model)\n"
                  "opt = torch.optim.AdamW(model.parameters())\n" + LOOP,
      "parallel.py": "from torch.distributed.fsdp import fully_shard\n\ndef shard_blocks(model):\n"
                     "    for i, block in enumerate(model.layers):\n        fully_shard(block)\n"},
     {"train.py": "from parallel import shard_blocks\nmodel = Transformer()\nshard_blocks(model)\n"
                  "fully_shard(model)\nopt = torch.optim.AdamW(model.parameters())\n" + LOOP,
      "parallel.py": "from torch.distributed.fsdp import fully_shard\n\ndef shard_blocks(model):\n"
                     "    for i, block in enumerate(model.layers):\n        fully_shard(block)\n"}),
    ("fsdp2-sync-left-off",
     {"train.py": SHARD + "opt = torch.optim.AdamW(model.parameters())\naccum = 4\n"
                  "model.set_requires_gradient_sync(False)\nfor i in range(40):\n"
                  "    loss = model(torch.randint(0, 100, (8, 32))).sum() / accum\n    loss.backward()\n"
                  "    if (i + 1) % accum == 0:\n        opt.step()\n        opt.zero_grad()\n"},
     {"train.py": SHARD + "opt = torch.optim.AdamW(model.parameters())\naccum = 4\nfor i in range(40):\n"
                  "    model.set_requires_gradient_sync((i + 1) % accum == 0)\n"
                  "    loss = model(torch.randint(0, 100, (8, 32))).sum() / accum\n    loss.backward()\n"
                  "    if (i + 1) % accum == 0:\n        opt.step()\n        opt.zero_grad()\n"}),
    # turned back on, but only after the step: the next iteration turns it off before any backward
    ("fsdp2-sync-left-off",
     {"train.py": SHARD + "opt = torch.optim.AdamW(model.parameters())\naccum = 4\nfor i in range(40):\n"
                  "    model.set_requires_gradient_sync(False)\n"
                  "    loss = model(torch.randint(0, 100, (8, 32))).sum() / accum\n    loss.backward()\n"
                  "    if (i + 1) % accum == 0:\n        opt.step()\n        opt.zero_grad()\n"
                  "        model.set_requires_gradient_sync(True)\n"},
     {"train.py": SHARD + "opt = torch.optim.AdamW(model.parameters())\naccum = 4\nfor i in range(40):\n"
                  "    if (i + 1) % accum != 0:\n        model.set_requires_gradient_sync(False)\n    else:\n"
                  "        model.set_requires_gradient_sync(True)\n"
                  "    loss = model(torch.randint(0, 100, (8, 32))).sum() / accum\n    loss.backward()\n"
                  "    if (i + 1) % accum == 0:\n        opt.step()\n        opt.zero_grad()\n"}),
    ("fsdp2-rank0-saves-sharded",
     {"train.py": SHARD + "opt = torch.optim.AdamW(model.parameters())\n" + LOOP +
                  "if rank == 0:\n    torch.save({'model': model.state_dict(), 'opt': opt.state_dict()}, 'c.pt')\n"},
     {"train.py": "from torch.distributed.checkpoint.state_dict import get_model_state_dict, StateDictOptions\n"
                  + SHARD + "opt = torch.optim.AdamW(model.parameters())\n" + LOOP +
                  "full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, "
                  "cpu_offload=True))\nif rank == 0:\n    torch.save(full, 'c.pt')\n"}),
    # a save helper called under the guard, given the sharded model
    ("fsdp2-rank0-saves-sharded",
     {"train.py": "from ckpt import save_checkpoint\n" + SHARD + "opt = torch.optim.AdamW(model.parameters())\n"
                  + LOOP + "if rank == 0:\n    save_checkpoint(model, opt, 'c.pt')\n",
      "ckpt.py": "import torch\n\ndef save_checkpoint(model, optimizer, path):\n"
                 "    sd = model.state_dict()\n    torch.save({'model': sd}, path)\n"},
     {"train.py": "from ckpt import save_checkpoint\n" + SHARD + "opt = torch.optim.AdamW(model.parameters())\n"
                  + LOOP + "save_checkpoint(model, opt, 'c')\n",
      "ckpt.py": "import torch.distributed.checkpoint as dcp\n\ndef save_checkpoint(model, optimizer, path):\n"
                 "    dcp.save({'model': model.state_dict(), 'opt': optimizer.state_dict()}, checkpoint_id=path)\n"}),
    ("fsdp2-gather-on-rank0-only",
     {"train.py": "from torch.distributed.checkpoint.state_dict import get_model_state_dict, StateDictOptions\n"
                  + SHARD + "opt = torch.optim.AdamW(model.parameters())\n" + LOOP +
                  "if rank == 0:\n    full = get_model_state_dict(model, options=StateDictOptions("
                  "full_state_dict=True, cpu_offload=True))\n    torch.save(full, 'c.pt')\n"},
     {"train.py": "from torch.distributed.checkpoint.state_dict import get_model_state_dict, StateDictOptions\n"
                  + SHARD + "opt = torch.optim.AdamW(model.parameters())\n" + LOOP +
                  "full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, "
                  "cpu_offload=True))\nif rank == 0:\n    torch.save(full, 'c.pt')\n"}),
    ("fsdp2-gather-on-rank0-only",
     {"train.py": "import torch.distributed.checkpoint as dcp\n" + SHARD + "opt = torch.optim.AdamW("
                  "model.parameters())\n" + LOOP + "if rank == 0:\n"
                  "    dcp.save({'model': model.state_dict()}, checkpoint_id='ckpt')\n"
                  "    print({k: v.full_tensor().norm() for k, v in model.state_dict().items()})\n"},
     {"train.py": "import torch.distributed.checkpoint as dcp\n" + SHARD + "opt = torch.optim.AdamW("
                  "model.parameters())\n" + LOOP + "dcp.save({'model': model.state_dict()}, checkpoint_id='ckpt')\n"
                  "norms = {k: v.full_tensor().norm() for k, v in model.state_dict().items()}\nif rank == 0:\n"
                  "    print(norms)\n"}),
]


# One-script cases read by meaning: (rule, where it must stay quiet, where it must fire), each under SCRIPT_HEAD
SCRIPT_HEAD = ("import os, torch\nfrom torch.distributed.fsdp import fully_shard\nimport torch.distributed as dist\n"
               "dist.init_process_group('nccl')\nrank = int(os.environ['RANK'])\ntorch.manual_seed(0)\n")
TRAINER = ("class Trainer:\n    def __init__(self, model):\n        self.model = model\n        self.shard()\n{root}"
           "        self.opt = torch.optim.AdamW(self.model.parameters())\n    def shard(self):\n"
           "        for b in self.model.layers:\n            fully_shard(b)\n"
           "if __name__ == '__main__':\n    Trainer(Net())\n")
SCRIPT_CASES = [
    # a loop over a list of whole models (pipeline stages) shards roots; a loop over a model's blocks does not
    ("fsdp2-root-not-wrapped",
     "def main(model_parts):\n    for model in model_parts:\n        for b in model.layers:\n"
     "            fully_shard(b)\n        fully_shard(model)\nif __name__ == '__main__':\n    main(build())\n",
     "def main(model_parts):\n    for model in model_parts:\n        for b in model.layers:\n"
     "            fully_shard(b)\nif __name__ == '__main__':\n    main(build())\n"),
    ("fsdp2-root-not-wrapped",
     "model = Net()\nblocks = model.layers\nfor b in blocks:\n    fully_shard(b)\nfully_shard(model)\n",
     "model = Net()\nblocks = model.layers\nfor b in blocks:\n    fully_shard(b)\n"),
    # a model held by a class: its blocks sharded in one method, the root in another
    ("fsdp2-root-not-wrapped", TRAINER.format(root="        fully_shard(self.model)\n"), TRAINER.format(root="")),
    # model.modules() yields the model itself first; a filtered loop does not shard it
    ("fsdp2-root-not-wrapped",
     "model = Net()\nfor m in model.modules():\n    fully_shard(m)\n",
     "model = Net()\nfor m in model.modules():\n    if isinstance(m, Block):\n        fully_shard(m)\n"),
    # two exclusive arms: the optimizer of the plain run is not the sharded run's
    ("fsdp2-optimizer-before-wrap",
     "model = Net()\nif args.fsdp:\n    fully_shard(model)\n    opt = torch.optim.SGD(model.parameters())\nelse:\n"
     "    opt = torch.optim.SGD(model.parameters())\nsched = torch.optim.lr_scheduler.StepLR(opt, 1)\n",
     "model = Net()\nopt = torch.optim.SGD(model.parameters())\nif args.fsdp:\n    fully_shard(model)\n"),
    # StateDictOptions through a name, the gather in a helper only rank 0 calls
    ("fsdp2-gather-on-rank0-only",
     "from torch.distributed.checkpoint.state_dict import get_model_state_dict, StateDictOptions\nmodel = Net()\n"
     "fully_shard(model)\nopts = StateDictOptions(full_state_dict=True)\ndef full():\n"
     "    return get_model_state_dict(model, options=opts)\nsd = full()\nif rank == 0:\n    torch.save(sd, 'x')\n",
     "from torch.distributed.checkpoint.state_dict import get_model_state_dict, StateDictOptions\nmodel = Net()\n"
     "fully_shard(model)\nopts = StateDictOptions(full_state_dict=True)\ndef save():\n"
     "    sd = get_model_state_dict(model, options=opts)\n    torch.save(sd, 'x')\nif rank == 0:\n    save()\n"),
]


@pytest.mark.parametrize("rule,quiet,loud", SCRIPT_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(SCRIPT_CASES)])
def test_fsdp2_rules_read_what_a_loop_a_class_or_a_branch_means(rule, quiet, loud):
    said = lambda src: {f.rule for f in audit.audit_source(SCRIPT_HEAD + src)}  # noqa: E731
    assert rule not in said(quiet), said(quiet)
    assert rule in said(loud), said(loud)

def _project(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "model.py").write_text(MODEL)
    for name, text in files.items():
        (root / name).write_text((HEAD if name == "train.py" else "") + textwrap.dedent(text))
    return root


def _found(root: Path) -> list[audit.Finding]:
    return audit.audit_paths([root])


@pytest.mark.parametrize("rule,bad,good", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_fsdp2_rule_fires_on_the_bug_and_not_on_the_correct_port(tmp_path, rule, bad, good):
    loud, quiet = _found(_project(tmp_path / "bad", bad)), _found(_project(tmp_path / "good", good))
    assert rule in {f.rule for f in loud}, audit.format_findings(loud)
    assert not {f.rule for f in quiet} & FSDP2_RULES, audit.format_findings(quiet)
    for f in loud:
        if f.rule == rule:
            assert f.chapter == "14_fsdp2" and "2 ranks" in f.message and " — " in f.message, f


def test_every_fsdp2_rule_has_a_case_and_the_chapter_14_notebook():
    assert {c[0] for c in CASES} == FSDP2_RULES
    for r in FSDP2_RULES:
        assert (REPO / "notebooks" / f"{audit.REGISTRY[r].chapter}.ipynb").exists(), r


def test_the_findings_name_the_line_of_the_bug(tmp_path):
    root = _project(tmp_path, CASES[0][1])
    src = (root / "train.py").read_text().splitlines()
    (f,) = [f for f in _found(root) if f.rule == "fsdp2-optimizer-before-wrap"]
    assert "torch.optim.AdamW(model.parameters()" in src[f.line - 1], f
    assert "fully_shard(model)" in f.message and f"line {src.index('    fully_shard(layer)') + 1}" in f.message


def test_a_fully_shard_project_counts_as_distributed():
    """needs_ddp rules speak on an FSDP2 script that never names DDP or init_process_group."""
    src = ("import os, torch\nfrom torch.distributed.fsdp import fully_shard\nrank = int(os.environ['RANK'])\n"
           "model = Net()\nfully_shard(model)\nif rank == 0:\n    torch.distributed.barrier()\n")
    assert "collective-under-rank0" in {f.rule for f in audit.audit_source(src)}


def test_the_ddp_port_gets_no_fsdp2_finding(tmp_path):
    """A DDP script that builds its optimizer before the wrap (correct under DDP) and saves on rank 0 is no FSDP2
    project: none of these rules speak."""
    src = ("from torch.nn.parallel import DistributedDataParallel as DDP\nmodel = Transformer()\n"
           "opt = torch.optim.AdamW(model.parameters())\nmodel = DDP(model)\n" + LOOP +
           "if rank == 0:\n    torch.save(model.module.state_dict(), 'c.pt')\n")
    assert not {f.rule for f in _found(_project(tmp_path, {"train.py": src}))} & FSDP2_RULES


PUBLIC = {"pytorch_examples_fsdp2": "example.py", "torchtitan": "torchtitan"}


@pytest.mark.parametrize("folder", sorted(PUBLIC))
def test_correct_public_fsdp2_code_gets_no_fsdp2_finding(folder):
    """pytorch/examples distributed/FSDP2 (blocks then root sharded, optimizer after, full state dicts gathered on
    every rank and saved on rank 0) and torchtitan's apply_fsdp_to_decoder / llama3 parallelize / chunked loss
    (sync off for chunks 0..N-2, back on for the last) / DCP checkpointer: correct FSDP2 code, no fsdp2-* finding.
    The other rules' findings on them are listed in tests/outside/fsdp2/README.md."""
    found = audit.audit_paths([FSDP2_OUTSIDE / folder])
    assert not {f.rule for f in found} & FSDP2_RULES, audit.format_findings(found)
    assert {(Path(f.path).name, f.rule) for f in found} <= PUBLIC_OTHER_FINDINGS[folder], audit.format_findings(found)


# What the other rules say on them: nothing. torchtitan's loss.py sums its cross-entropy and MSE
# (reduction="sum"), then BaseLoss divides by global_valid_tokens, the token count over every rank, and fsdp.py
# turns off FSDP's own gradient division (set_gradient_divide_factor(1.0)): the sum over ranks is the global mean.
# sum-loss-unscaled flagged loss.py:57 and :221 until it learned that a divide factor set on FSDP removes its
# consequence (rules/gradients.DIVIDE_FACTOR_CALLS).
PUBLIC_OTHER_FINDINGS: dict[str, set[tuple[str, str]]] = {"pytorch_examples_fsdp2": set(), "torchtitan": set()}
