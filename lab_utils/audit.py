"""`ddp-lab audit SCRIPT.py`: a static check of a DDP training script against the corrected checklist
(docs/checklist.md; taught in notebooks/10_workflow.ipynb).

It parses the script with `ast` (nothing is imported or run) and reports each finding as
`path:line: RULE message (chapter)`. The rules, and the chapter that measures each:

| rule | finding | chapter |
|---|---|---|
| set-epoch-missing | a DistributedSampler, no `.set_epoch(...)` call: epoch 0's order forever | 03_samplers |
| sampler-with-shuffle | `DataLoader(sampler=<DistributedSampler>, shuffle=True)`: a ValueError | 03_samplers |
| seed-per-rank | a global seed (`torch.manual_seed`, `random.seed`, ...) that depends on the rank | 02_seeds |
| no-seed | a DDP script that never seeds: two runs cannot be compared | 02_seeds |
| peek-iterator | `next(iter(loader))`: an extra iterator draws from the global RNG | 02_seeds |
| sum-loss-unscaled | `reduction="sum"` under DDP, no `* world_size`: gradients x 1/world_size | 05_ddp_flags |
| rank0-local-loss | a loss printed under a rank-0 condition, no all-reduce of the loss | 01_unchanged |
| save-without-module | `.state_dict()` of the DDP-wrapped model: `module.` prefixed keys | 00_preflight |
| collective-under-rank0 | a collective (all_reduce, barrier, ...) under `if rank == 0`: a hang | 00_preflight |
| accumulation-without-no-sync | accumulation under DDP, no `no_sync()` (or its flag) | 06_accumulation |
| batch-and-accum-divided | per-GPU batch and accumulation both divided by world_size (§7.2) | 06_accumulation |
| batchnorm-without-sync | BatchNorm under DDP, no SyncBatchNorm conversion | 07_batchnorm |

What it cannot see: code in other files (a dataset module, a config), values known only at run time, models
built by name (torchvision's resnet has BatchNorm). A rank term inside a conditional expression
(`seed + (rank if per_rank else 0)`) is taken as a deliberate switch, not a finding. It is a checklist, not a
proof: the proof is a comparison of real runs (`ddp-lab compare` / `ddp-lab doctor`).

Exit codes of the CLI verb: 0 no finding, 1 findings, 2 bad input (no such file, not Python).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

CHAPTERS = {
    "set-epoch-missing": "03_samplers", "sampler-with-shuffle": "03_samplers", "seed-per-rank": "02_seeds",
    "no-seed": "02_seeds", "peek-iterator": "02_seeds", "sum-loss-unscaled": "05_ddp_flags",
    "rank0-local-loss": "01_unchanged", "save-without-module": "00_preflight",
    "collective-under-rank0": "00_preflight", "accumulation-without-no-sync": "06_accumulation",
    "batch-and-accum-divided": "06_accumulation", "batchnorm-without-sync": "07_batchnorm",
}
RULES = tuple(CHAPTERS)

RANKISH = re.compile(r"(^|_)rank$|^rank|local_rank|master_process|is_main|is_master|main_process|is_rank_zero")
WORLDISH = re.compile(r"world_size|num_replicas|n_gpus|ngpus|num_gpus|get_world_size|num_processes")
BATCHISH = re.compile(r"batch_size|batch$|^bs$|b_sz")
ACCUMISH = re.compile(r"accum")
LOSSISH = re.compile(r"loss")
COLLECTIVES = {"all_reduce", "all_gather", "all_gather_object", "broadcast", "broadcast_object_list", "barrier",
               "reduce", "gather", "scatter", "reduce_scatter", "all_to_all", "reduce_scatter_tensor",
               "all_gather_into_tensor"}
SEED_CALLS = {"torch.manual_seed", "torch.cuda.manual_seed", "torch.cuda.manual_seed_all", "random.seed",
              "np.random.seed", "numpy.random.seed", "set_seed", "seed_everything", "manual_seed"}


class AuditError(ValueError):
    """The script cannot be audited (missing, not Python); the message names it."""


@dataclass(frozen=True)
class Finding:
    line: int
    rule: str
    message: str

    @property
    def chapter(self) -> str:
        return CHAPTERS[self.rule]

    def format(self, path: str = "") -> str:
        return f"{path}:{self.line}: {self.rule} {self.message} (notebooks/{self.chapter}.ipynb)"


def dotted(node: ast.AST) -> str:
    """`torch.cuda.manual_seed` for an Attribute chain, the name for a Name, '' otherwise."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else node.attr
    if isinstance(node, ast.Call):
        return dotted(node.func) + "()"
    if isinstance(node, ast.Subscript):
        return dotted(node.value) + "[]"
    return ""


def _names(node: ast.AST) -> list[str]:
    """Every name and attribute name in an expression, and string constants used as subscripts/env keys."""
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.append(n.id)
        elif isinstance(n, ast.Attribute):
            out.append(n.attr)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in ("RANK", "LOCAL_RANK"):
            out.append("rank")
    return out


def _callee(call: ast.Call) -> str:
    return dotted(call.func).split(".")[-1]


class _Script:
    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
        self.callees = {_callee(c) for c in self.calls}
        self.text_names = set(_names(tree))
        self.rank_tainted = self._taint(RANKISH)

    def _taint(self, pattern: re.Pattern) -> set[str]:
        """Names assigned (anywhere) from an expression that involves a rank: flow-insensitive, to a fixpoint."""
        tainted: set[str] = set()
        assigns = [n for n in ast.walk(self.tree) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign))]
        changed = True
        while changed:
            changed = False
            for a in assigns:
                if a.value is None or not self.involves_rank(a.value, tainted, pattern):
                    continue
                targets = a.targets if isinstance(a, ast.Assign) else [a.target]
                for t in targets:
                    name = dotted(t)
                    if name and name not in tainted:
                        tainted.add(name)
                        changed = True
        return tainted

    @staticmethod
    def involves_rank(node: ast.AST, tainted: set[str], pattern: re.Pattern = RANKISH,
                      skip_conditional: bool = False) -> bool:
        for n in ast.walk(node):
            if skip_conditional and isinstance(n, ast.IfExp):
                continue
            if isinstance(n, (ast.Name, ast.Attribute)) and (pattern.search(dotted(n).split(".")[-1] or "")
                                                              or dotted(n) in tainted):
                if skip_conditional and _inside_ifexp(node, n):
                    continue
                return True
            if isinstance(n, ast.Call) and _callee(n) == "get_rank":
                return True
            if isinstance(n, ast.Constant) and n.value in ("RANK", "LOCAL_RANK"):
                return True
        return False

    def is_ddp(self) -> bool:
        return bool({"DistributedDataParallel", "DDP", "init_process_group"} & (self.callees | self.text_names))


def _inside_ifexp(root: ast.AST, target: ast.AST) -> bool:
    """Whether `target` sits in a conditional expression under `root` (a deliberate switch, condition included)."""
    for n in ast.walk(root):
        if isinstance(n, ast.IfExp) and any(target is m for m in ast.walk(n)):
            return True
    return False


def _rank_zero_test(test: ast.AST, s: _Script) -> bool:
    """`if rank == 0`, `if master_process`, `if dist.get_rank() == 0`, `if is_main and ...`: a rank-0 branch."""
    for n in ast.walk(test):
        if isinstance(n, ast.Compare) and s.involves_rank(n, s.rank_tainted) and any(
                isinstance(c, ast.Constant) and c.value == 0 for c in [n.left, *n.comparators]):
            return True
        if isinstance(n, (ast.Name, ast.Attribute)) and re.search(
                r"master|is_main|main_process|rank_zero|is_rank0", dotted(n).split(".")[-1]):
            return True
        if isinstance(n, (ast.Name, ast.Attribute)) and dotted(n) in s.rank_tainted and \
                re.search(r"master|main|writer|zero", dotted(n)):
            return True
    return False


def audit_source(source: str, filename: str = "<script>") -> list[Finding]:
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as e:
        raise AuditError(f"{filename}:{e.lineno}: not Python ({e.msg})") from None
    s = _Script(tree)
    found: list[Finding] = []
    add = lambda node, rule, msg: found.append(Finding(getattr(node, "lineno", 0), rule, msg))  # noqa: E731
    ddp = s.is_ddp()

    # --- samplers (ch03)
    dist_samplers = [c for c in s.calls if _callee(c) == "DistributedSampler"]
    sampler_names = {dotted(a.targets[0]) for a in ast.walk(tree) if isinstance(a, ast.Assign)
                     and isinstance(a.value, ast.Call) and _callee(a.value) == "DistributedSampler"}
    if dist_samplers and "set_epoch" not in s.callees:
        add(dist_samplers[0], "set-epoch-missing", "DistributedSampler without any sampler.set_epoch(epoch) call: "
            "every epoch repeats epoch 0's order, and the run leaves the single run at the first epoch boundary")
    for c in s.calls:
        if _callee(c) != "DataLoader":
            continue
        kw = {k.arg: k.value for k in c.keywords if k.arg}
        sampler = kw.get("sampler")
        is_dist = sampler is not None and ((isinstance(sampler, ast.Call) and _callee(sampler) == "DistributedSampler")
                                           or dotted(sampler) in sampler_names)
        shuffle = kw.get("shuffle")
        if is_dist and isinstance(shuffle, ast.Constant) and shuffle.value is True:
            add(c, "sampler-with-shuffle", "DataLoader(sampler=DistributedSampler(...), shuffle=True): torch raises "
                "'sampler option is mutually exclusive with shuffle'; shuffle in the sampler (shuffle=True, seed=)")

    # --- seeds (ch02)
    seeds = [c for c in s.calls if dotted(c.func) in SEED_CALLS or (
        _callee(c) in ("set_seed", "seed_everything") and "Generator" not in dotted(c.func))]
    seeds = [c for c in seeds if not (isinstance(c.func, ast.Attribute) and _callee(c) == "manual_seed"
                                      and isinstance(c.func.value, ast.Call))]  # Generator().manual_seed(...)
    for c in seeds:
        if any(s.involves_rank(a, s.rank_tainted, skip_conditional=True) for a in c.args):
            add(c, "seed-per-rank", f"{dotted(c.func)}(...) depends on the rank: every rank draws other dropout "
                "masks and augmentations than the single run (one seed on every rank; key per-sample randomness "
                "by (seed, sample), chapter 04)")
    if ddp and not seeds:
        line = next((c for c in s.calls if _callee(c) in ("init_process_group", "DDP", "DistributedDataParallel")),
                    tree)
        add(line, "no-seed", "the script never seeds torch's RNG: two runs (single and DDP) start from other weights "
            "and data, so comparing them proves nothing — torch.manual_seed(seed) on every rank, before the model")
    for c in s.calls:
        if _callee(c) == "next" and c.args and isinstance(c.args[0], ast.Call) and _callee(c.args[0]) == "iter":
            add(c, "peek-iterator", "next(iter(loader)) creates an extra iterator, which draws a seed from the "
                "global RNG (even with num_workers=0) and shifts every later draw; give the DataLoader "
                "generator=torch.Generator().manual_seed(...), or read the batch size from the loader's batch_size")

    # --- loss reduction and logging (ch05, ch01)
    world_mults = [n for n in ast.walk(tree) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult)
                   and (s.involves_rank(n.left, set(), WORLDISH) or s.involves_rank(n.right, set(), WORLDISH))]
    if ddp and not world_mults:
        for c in s.calls:
            for k in c.keywords:
                if k.arg == "reduction" and isinstance(k.value, ast.Constant) and k.value.value == "sum":
                    add(c, "sum-loss-unscaled", "reduction='sum' under DDP without a x world_size: DDP averages "
                        "the gradients over ranks, so each step is 1/world_size of the single run's (AdamW hides "
                        "it in the loss; the grad norm shows it)")
    reduces_loss = any(_callee(c) in ("all_reduce", "all_reduce_mean", "reduce", "all_gather") or "reduce" in
                       _callee(c) for c in s.calls if any(LOSSISH.search(x) for a in c.args for x in _names(a)))
    for node in ast.walk(tree):
        if not (isinstance(node, ast.If) and _rank_zero_test(node.test, s)):
            continue
        for inner in [m for stmt in node.body for m in ast.walk(stmt) if isinstance(m, ast.Call)]:
            name = _callee(inner)
            if name in COLLECTIVES:
                add(inner, "collective-under-rank0", f"{dotted(inner.func)}(...) under a rank-0 branch (line "
                    f"{node.lineno}): the other ranks never enter it, so rank 0 waits forever (a hang)")
            elif ddp and not reduces_loss and name in ("print", "log", "info", "write", "add_scalar") and any(
                    LOSSISH.search(x) for a in [*inner.args, *[k.value for k in inner.keywords]] for x in _names(a)):
                add(inner, "rank0-local-loss", "rank 0 logs a loss no all_reduce has averaged: its own micro-batch's "
                    "loss, not the global batch's — all_reduce(loss, SUM) / world_size before logging")

    # --- checkpoint (ch00, article §5.2)
    wrapped = {}
    for a in ast.walk(tree):
        if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and _callee(a.value) in (
                "DDP", "DistributedDataParallel"):
            for t in a.targets:
                wrapped[dotted(t)] = a.lineno
    for c in s.calls:
        if _callee(c) == "state_dict" and isinstance(c.func, ast.Attribute):
            owner = dotted(c.func.value)
            if owner in wrapped and c.lineno > wrapped[owner]:
                add(c, "save-without-module", f"{owner}.state_dict() after {owner} = DDP(...) (line "
                    f"{wrapped[owner]}): every key gets a 'module.' prefix and the checkpoint does not load into "
                    f"the plain model — save {owner}.module.state_dict() on rank 0")

    # --- accumulation (ch06)
    accum_names = {n for n in s.text_names if ACCUMISH.search(n)}
    if ddp and accum_names and not ({"no_sync"} & s.callees) and "require_backward_grad_sync" not in s.text_names:
        node = next((n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in accum_names), tree)
        add(node, "accumulation-without-no-sync", "gradient accumulation under DDP without model.no_sync(): every "
            "micro-batch all-reduces (same result, N-1 extra all-reduces per step); run all but the last "
            "micro-batch inside `with model.no_sync():`")
    divided = {"batch": None, "accum": None}
    for n in ast.walk(tree):
        target, value = None, None
        if isinstance(n, ast.AugAssign) and isinstance(n.op, (ast.Div, ast.FloorDiv)):
            target, value = dotted(n.target), n.value
        elif isinstance(n, ast.Assign) and isinstance(n.value, ast.BinOp) and isinstance(
                n.value.op, (ast.Div, ast.FloorDiv)):
            target, value = dotted(n.targets[0]), n.value.right
        if target and value is not None and s.involves_rank(value, set(), WORLDISH):
            leaf = target.split(".")[-1]
            if ACCUMISH.search(leaf):
                divided["accum"] = n
            elif BATCHISH.search(leaf):
                divided["batch"] = n
    if divided["batch"] is not None and divided["accum"] is not None:
        add(divided["accum"], "batch-and-accum-divided", f"both the per-GPU batch (line {divided['batch'].lineno}) "
            f"and the accumulation steps are divided by world_size: the global batch shrinks by world_size "
            f"(article §7.2's table) — divide one of them, and check global = micro x accum x world_size")

    # --- BatchNorm (ch07)
    bns = [c for c in s.calls if re.fullmatch(r"BatchNorm[123]d", _callee(c))]
    if ddp and bns and not ({"SyncBatchNorm", "convert_sync_batchnorm"} & (s.callees | s.text_names)):
        add(bns[0], "batchnorm-without-sync", "BatchNorm under DDP without SyncBatchNorm: each rank normalises "
            "with its own micro-batch's statistics — nn.SyncBatchNorm.convert_sync_batchnorm(model) before DDP")
    return sorted(set(found), key=lambda f: (f.line, f.rule))


def audit_file(path: str | Path) -> list[Finding]:
    p = Path(path)
    if not p.exists():
        raise AuditError(f"{path}: no such file")
    if not p.is_file():
        raise AuditError(f"{path}: not a file")
    try:
        text = p.read_text()
    except UnicodeDecodeError:
        raise AuditError(f"{path}: not a text file") from None
    return audit_source(text, str(path))


def format_findings(findings: list[Finding], path: str) -> str:
    if not findings:
        return f"{path}: no findings ({len(RULES)} rules; a static check — prove the port with ddp-lab compare)"
    return "\n".join(f.format(path) for f in findings) + f"\n{len(findings)} finding(s) in {path}"
