"""Chapters 05-07 and 09: gradients (a sum loss, a gather without autograd, accumulation), BatchNorm, the
rendezvous port."""

from __future__ import annotations

import ast
import re

from ..facts import Facts
from ..project import Module
from ..registry import rule
from ..syntax import ACCUMISH, BATCHISH, WORLDISH, callee, const_str, dotted, involves, involves_rank, kw

TCP_PORT = re.compile(r"tcp://[^:]+:\d+")


def _divided_later(m: Module, c: ast.Call) -> bool:
    """The sum loss is divided afterwards (`loss = crit(...) / n`, `loss /= batch_size`, `loss.div(count)`): a
    mean over the rank's own samples, which DDP's gradient average turns into the global mean."""
    n = m.parent.get(id(c))
    while isinstance(n, (ast.BinOp, ast.Call, ast.Attribute)):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div):
            return True
        n = m.parent.get(id(n))
    if not isinstance(n, (ast.Assign, ast.AnnAssign)):
        return False
    names = {dotted(t) for t in (n.targets if isinstance(n, ast.Assign) else [n.target])}
    scope = m.enclosing(c) or m.tree
    for x in ast.walk(scope):
        if isinstance(x, ast.AugAssign) and isinstance(x.op, ast.Div) and dotted(x.target) in names:
            return True
        if isinstance(x, ast.BinOp) and isinstance(x.op, ast.Div) and any(
                dotted(y) in names for y in ast.walk(x.left) if isinstance(y, (ast.Name, ast.Attribute))):
            return True
        if isinstance(x, ast.Call) and callee(x) in ("div", "div_", "true_divide") and isinstance(
                x.func, ast.Attribute) and dotted(x.func.value) in names:
            return True
    return False


@rule("sum-loss-unscaled", "05_ddp_flags", "reduction='sum' under DDP, never divided and without a x world_size: "
      "DDP averages the gradients over ranks, so each step is 1/world_size of the single run's")
def sum_loss_unscaled(f: Facts, m: Module):
    if any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult) and (involves(n.left, WORLDISH)
                                                                       or involves(n.right, WORLDISH))
           for n in ast.walk(m.tree)):
        return  # the sum is scaled by the world size somewhere
    for c in m.calls:
        if any(k.arg == "reduction" and const_str(k.value) == "sum" for k in c.keywords) and \
                not _divided_later(m, c):
            yield c, ("reduction='sum' under DDP without a x world_size: DDP averages the gradients over ranks, so "
                      "each step is 1/world_size of the single run's (AdamW hides it in the loss; the grad norm "
                      "shows it) — multiply the loss by world_size, or divide the sum by the global count")


@rule("gather-without-grad", "05_ddp_flags", "in-batch negatives through a plain all_gather: the other ranks' "
      "features carry no gradient, so the model gets a fraction of the single run's gradient")
def gather_without_grad(f: Facts, m: Module):
    for c in m.calls:
        if not (dotted(c.func) in ("dist.all_gather", "torch.distributed.all_gather", "all_gather")
                and len(c.args) == 2):
            continue
        fn = m.enclosing(c) or m.tree
        lst, x = dotted(c.args[0]), c.args[1]
        if "detach" in ast.unparse(x) or m.enclosing(c, (ast.With,)) is not None and any(
                "no_grad" in dotted(i.context_expr) for i in m.enclosing(c, (ast.With,)).items):
            continue
        if isinstance(fn, ast.FunctionDef) and any("no_grad" in dotted(d) for d in fn.decorator_list):
            continue
        if not any(isinstance(n, ast.Call) and callee(n) in ("cat", "stack") and n.args and dotted(n.args[0]) == lst
                   for n in ast.walk(fn)):
            continue
        own = any(isinstance(a, ast.Assign) and any(isinstance(t, ast.Subscript) and dotted(t.value) == lst and
                                                    involves_rank(t.slice, m.rank_tainted) for t in a.targets)
                  for a in ast.walk(fn))
        if own:
            yield c, (f"{ast.unparse(c)} then {lst}[rank] = {ast.unparse(x)}: only the rank's own slice keeps its "
                      "gradient; the other ranks' features enter the loss as constants, so the model gets "
                      "1/world_size of the single run's gradient for those terms — "
                      "torch.distributed.nn.functional.all_gather keeps the gradient")
        else:
            yield c, (f"{ast.unparse(c)} returns tensors without a gradient: if the gathered features enter a loss "
                      "(in-batch negatives), that loss's gradient reaches no rank's features but through its own "
                      "rows — torch.distributed.nn.functional.all_gather keeps it", "check-by-hand")


def _fixed_port(v: ast.AST) -> str | None:
    """The text of a rendezvous address whose port is written in the code: 'tcp://localhost:58472',
    f'tcp://{host}:58472'; None otherwise."""
    if const_str(v) is not None:
        return v.value if TCP_PORT.search(v.value) else None
    if isinstance(v, ast.JoinedStr):
        text = "".join(str(p.value) if isinstance(p, ast.Constant) else "{}" for p in v.values)
        return ast.unparse(v) if TCP_PORT.search(text) else None
    return None


def _env_fallback(m: Module, node: ast.Assign) -> bool:
    """The fixed value is only a fallback: under `if "MASTER_PORT" not in os.environ:` (a test of the very
    variable or environment key it sets), so a launcher's port wins."""
    keys = {"MASTER_PORT", "MASTER_ADDR"} | {dotted(t) for t in node.targets}
    n = m.parent.get(id(node))
    while n is not None and not isinstance(n, ast.Module):
        if isinstance(n, ast.If) and any(const_str(x) in keys or dotted(x) in keys for x in ast.walk(n.test)):
            return True
        n = m.parent.get(id(n))
    return False


@rule("hard-coded-master-port", "09_launching", "a fixed rendezvous port (MASTER_PORT or a tcp:// init_method) with "
      "no environment fallback: a second job on the host collides on it")
def hard_coded_master_port(f: Facts, m: Module):
    advice = "a second job on this host (or a stale one) collides on the port — torchrun --standalone, or env://"
    urls = {dotted(kw(c, "init_method")) for mm in f.p.modules.values() for c in mm.calls
            if callee(c) == "init_process_group" and isinstance(kw(c, "init_method"), (ast.Name, ast.Attribute))}
    reported: set[str] = set()
    for a in sorted((a for a in ast.walk(m.tree) if isinstance(a, ast.Assign)), key=lambda a: a.lineno):
        if _env_fallback(m, a):
            continue
        if any(isinstance(t, ast.Subscript) and const_str(t.slice) == "MASTER_PORT" for t in a.targets) and \
                const_str(a.value) is not None:
            yield a, f"MASTER_PORT fixed to {a.value.value!r}: {advice}", "check-by-hand"
        elif any(dotted(t) in urls - reported for t in a.targets) and _fixed_port(a.value):
            # args.dist_url = 'tcp://localhost:58472' ... init_method=args.dist_url; one finding per variable,
            # however many branches fix it
            reported |= {dotted(t) for t in a.targets}
            yield a, f"{ast.unparse(a.value)} (passed as init_method) fixes the rendezvous port: {advice}", \
                "check-by-hand"
    for c in m.calls:
        url = kw(c, "init_method") if callee(c) == "init_process_group" else None
        if url is not None and const_str(url) and _fixed_port(url):
            yield url, f"init_method={url.value!r} fixes the rendezvous port: {advice}", "check-by-hand"


@rule("accumulation-without-no-sync", "06_accumulation", "gradient accumulation under DDP without no_sync: every "
      "micro-batch all-reduces, N-1 extra all-reduces a step", scope="entry")
def accumulation_without_no_sync(f: Facts, m: Module):
    accum = any(isinstance(n, ast.Name) and ACCUMISH.search(n.id) or isinstance(n, ast.Attribute)
                and ACCUMISH.search(n.attr) for n in ast.walk(m.tree))
    used = [n for n in ast.walk(m.tree) if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Mod, ast.Div))
            and involves(n.right, ACCUMISH)]
    if accum and used and not ({"no_sync", "require_backward_grad_sync"} & f.all_names()):
        yield used[0], ("gradient accumulation under DDP without model.no_sync(): every micro-batch all-reduces "
                        "(same result, N-1 extra all-reduces per step); run all but the last micro-batch inside "
                        "`with model.no_sync():`")


@rule("batch-and-accum-divided", "06_accumulation", "per-GPU batch and accumulation steps both divided by "
      "world_size: the global batch shrinks by world_size")
def batch_and_accum_divided(f: Facts, m: Module):
    divided = {"batch": None, "accum": None}
    for n in ast.walk(m.tree):
        target, value = None, None
        if isinstance(n, ast.AugAssign) and isinstance(n.op, (ast.Div, ast.FloorDiv)):
            target, value = dotted(n.target), n.value
        elif isinstance(n, ast.Assign) and isinstance(n.value, ast.BinOp) and isinstance(
                n.value.op, (ast.Div, ast.FloorDiv)):
            target, value = dotted(n.targets[0]), n.value.right
        if target and value is not None and involves(value, WORLDISH):
            leaf = target.split(".")[-1]
            if ACCUMISH.search(leaf):
                divided["accum"] = n
            elif BATCHISH.search(leaf):
                divided["batch"] = n
    if divided["batch"] is not None and divided["accum"] is not None:
        yield divided["accum"], (f"both the per-GPU batch (line {divided['batch'].lineno}) and the accumulation "
                                 "steps are divided by world_size: the global batch shrinks by world_size (article "
                                 "§7.2's table) — divide one of them, and check global = micro x accum x world_size")


@rule("batchnorm-without-sync", "07_batchnorm", "BatchNorm under DDP without SyncBatchNorm: each rank normalises "
      "with its own micro-batch's statistics", scope="entry")
def batchnorm_without_sync(f: Facts, m: Module):
    bns = [c for c in m.calls if re.fullmatch(r"BatchNorm[123]d", callee(c))]
    if bns and not ({"SyncBatchNorm", "convert_sync_batchnorm"} & f.all_names()):
        yield bns[0], ("BatchNorm under DDP without SyncBatchNorm: each rank normalises with its own micro-batch's "
                       "statistics — nn.SyncBatchNorm.convert_sync_batchnorm(model) before DDP")
