"""Issue 35: a class of round 668-673's first look (docs/measured/cpu2/audit_heldout_round668.txt), fixed after it,
quiet and loud; the test fails at the first look's code (9c1e43e8). The round's other false alarms and misses are
left, said in docs/results.md."""

from test_audit import _project
from test_audit_classes246 import _rules

DDP = "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"


def test_a_flag_handed_on_from_the_callers_own_default(tmp_path):
    """DNABERT's run_finetune.py: rank 0 alone runs `evaluate(args, model, tokenizer)`, whose `def evaluate(...,
    evaluate=True)` hands `evaluate=evaluate` to load_and_cache_examples, which barriers only `if
    args.local_rank not in [-1, 0] and not evaluate:`: never reached from there (no collective-under-rank0). With
    the default False it is."""
    src = (DDP + "def load_and_cache_examples(args, evaluate=False):\n    if args.local_rank not in [-1, 0] and "
           "not evaluate:\n        dist.barrier()\n    data = [torch.ones(2)]\n"
           "    if args.local_rank == 0 and not evaluate:\n        dist.barrier()\n    return data\n"
           "def evaluate(args, model, prefix='', evaluate=DEFAULT):\n"
           "    data = load_and_cache_examples(args, evaluate=evaluate)\n    return [model(x) for x in data]\n"
           "def main(args):\n    dist.init_process_group('gloo')\n    torch.manual_seed(0)\n"
           "    model = DDP(torch.nn.Linear(2, 2))\n    model(torch.ones(2)).sum().backward()\n"
           "    if args.local_rank in [-1, 0]:\n        evaluate(args, model.module)\n")
    assert not _rules(_project(tmp_path / "true", {"t.py": src.replace("DEFAULT", "True")}), "collective-under-rank0")
    assert _rules(_project(tmp_path / "false", {"t.py": src.replace("DEFAULT", "False")}), "collective-under-rank0")
