"""Chapter 08 (checkpoints): who writes a checkpoint. A save every rank runs, with no rank-0 guard or a guard true on
every rank under torchrun, writes one file world_size times at once."""

from __future__ import annotations

import ast
import re

from ..facts import Facts
from ..hierarchy import never_named
from ..project import Module
from ..registry import Hit, rule
from ..seed_gates import failed_by_default
from ..switches import one_process_arm
from ..syntax import callee, dotted, involves_rank, kw, mentions_ddp, walk


def _crash_dump(m: Module, c: ast.Call) -> bool:
    """A save in an exception handler that raises again (VALL-E's `except: display_and_save_batch(batch);
    raise`): the failing rank dumps what it was working on and the run stops; no checkpoint, no shared write."""
    handler = m.enclosing(c, (ast.ExceptHandler, ast.FunctionDef, ast.AsyncFunctionDef))
    if isinstance(handler, ast.ExceptHandler) and any(isinstance(s, ast.Raise) for s in handler.body):
        return True
    # ... or a debugging dump that stops in the debugger (GeoTransformer's `torch.save(...); ipdb.set_trace()`)
    stmt = m.parent.get(id(c))
    block = getattr(m.parent.get(id(stmt)), "body", None)
    if not isinstance(block, list) or not any(s is stmt for s in block):
        return False
    later = block[next(i for i, s in enumerate(block) if s is stmt):]
    return any(isinstance(s, ast.Expr) and isinstance(s.value, ast.Call) and (
        callee(s.value) == "breakpoint" or callee(s.value) == "set_trace" and "pdb" in dotted(s.value.func))
        for s in later)


@rule("save-on-every-rank", "08_checkpoints", "a checkpoint written by every rank (no rank-0 guard, or a guard "
      "true on every rank under torchrun): world_size processes write one file at once, a torn checkpoint")
def save_on_every_rank(f: Facts, m: Module):
    # one defect, one finding: the saves of one function that every rank runs (EarlyStopping.__call__'s two
    # self.save_checkpoint calls) are one finding at the first, naming the others
    per_fn: dict[int, list] = {}
    for hit in _saves_on_every_rank(f, m):
        per_fn.setdefault(id(m.enclosing(hit[0])), []).append(hit)
    for hits in per_fn.values():
        first, rest = hits[0], hits[1:]
        yield Hit(first[0], first[1], related=tuple((m, h[0]) for h in rest) + _writes_of(f, m, first[0]))


def _writes_of(f: Facts, m: Module, c: ast.Call) -> tuple:
    """The torch.save lines a save helper reaches (revisitSR's `self.ckp.save(...)`: save_model's two files and
    the PSNR log), where the files are written: related places of the call's finding."""
    out, todo, seen = [], [(m, c, 2)], set()
    while todo:
        cm, call, depth = todo.pop(0)
        for tm, tf in f.callees(cm, call) if depth else []:
            if (tm.rel, id(tf)) in seen:
                continue
            seen.add((tm.rel, id(tf)))
            for x in (x for x in walk(tf) if isinstance(x, ast.Call)):
                if dotted(x.func) in ("torch.save", "th.save"):
                    out.append((tm, x))
                else:
                    todo.append((tm, x, depth - 1))
    return tuple(out[:4])


def _helper_name(m: Module, fn: ast.AST) -> str:
    """A function's name, or its class's where it is the __call__ of a callable object (`SaveBestModel()(...)`),
    and a closure's with the function around it (UnSAMFlow's `run_one_sample` inside save_checkpoint)."""
    cls = m.class_of(fn) if fn.name == "__call__" else None
    outer = m.enclosing(fn)
    return (cls or fn.name) + (" " + _helper_name(m, outer) if isinstance(outer, ast.FunctionDef) else "")


def _saves_on_every_rank(f: Facts, m: Module):
    for c in sorted(m.calls, key=lambda c: c.lineno):
        if not f.is_save(m, c):
            continue
        if _per_rank_target(m, c) or _per_rank_helper(f, m, c):
            continue  # per-rank file names, or an in-memory buffer: no shared file is written
        fn = m.enclosing(c)
        kind = f.g.effective(m, c)
        if kind in ("rank0", "not0") or f.guarded_inside(m, c) or one_process_arm(m, c) or _gated_off_for_others(
                f, m, c) or any(_needs_an_optional_attribute(f, tm, tf) for tm, tf in f.p.resolve(m, c)):
            continue  # rank 0's alone, or the arm that runs only when the run is not distributed
        sites = f.p.callers(m, fn) if fn is not None else []
        if fn is not None and not sites and m.enclosing(fn) is not None:  # a closure (VoCo's `def save_ckp(state,
            # path): torch.save(state, path)` inside main): the outer function calls it by name
            sites = [(m, x) for x in ast.walk(m.enclosing(fn)) if isinstance(x, ast.Call)
                     and isinstance(x.func, ast.Name) and x.func.id == fn.name]
        if fn is not None and sites and re.search(r"save|checkpoint|serialize", _helper_name(m, fn).lower()):
            continue  # inside a save helper (torch.save or a helper of its own): each call is judged where it is made
        if fn is not None and not sites and (not m.entry or never_named(f.p, m, fn)):
            continue  # a library function nobody in the audited files calls: its callers decide (or dead code:
            # Text4Vis's utils.py keeps the epoch_saving its train.py redefines and calls)
        if not any(mentions_ddp(r) for r in f.p.related(m)) or _launches_the_ranks(m):
            continue  # a tool no distributed script runs or imports (a checkpoint converter), or the parent that
            # starts the ranks with a shell command (UniTabE's train_mgpu.py): one process
        if f.off_in_default_run(m, c) or failed_by_default(f, m, c):
            continue  # only under an option that is off unless given (`if args.lora_reinit:`), or whose default
            # fails the test (FunCodec's `options.save_ckpt_every_steps > 0`, -1 by default)
        if _crash_dump(m, c):
            continue
        if kind == "leaky":
            yield c, (f"{ast.unparse(c.func)}(...) under a guard like `not multiprocessing_distributed or rank % "
                      "ngpus == 0`: when torchrun starts the job that flag is off, so the guard is true on every "
                      "rank and every rank writes the same file — guard with `dist.get_rank() == 0`")
        else:
            yield c, (f"{ast.unparse(c.func)}(...) runs on every rank: world_size processes write one file at once "
                      "(a torn or mixed checkpoint) — save on rank 0 only, then barrier outside the if")


def _gated_off_for_others(f: Facts, m: Module, c: ast.Call) -> bool:
    """The save sits under `if not cfg.X:` in a function whose every call that is not rank 0's sits in an arm that
    `cfg.X` is true (RCAN-it's Trainer.test saves `if not self.cfg.SOLVER.TEST_ONLY:`; the script runs `t.test()
    if cfg.SOLVER.TEST_ONLY else t.train()` on every rank, and train() calls test() on rank 0 alone): the ranks
    that reach the function without the rank-0 guard never reach the save."""
    def tail(n):
        return re.sub(r"^self\.", "", dotted(n))
    gates, child, n = set(), c, m.parent.get(id(c))
    while n is not None and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if isinstance(n, ast.If) and any(child is x for x in n.body) and isinstance(n.test, ast.UnaryOp) and \
                isinstance(n.test.op, ast.Not) and isinstance(n.test.operand, ast.Attribute):
            gates.add(tail(n.test.operand))
        child, n = n, m.parent.get(id(n))
    sites = f.p.callers(m, n) if n is not None and gates else []

    def in_gated_arm(cm, cc):
        child, up = cc, cm.parent.get(id(cc))
        while up is not None and not isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if isinstance(up, (ast.If, ast.IfExp)) and tail(up.test) in gates and (
                    child is up.body or isinstance(up.body, list) and any(child is x for x in up.body)):
                return True
            child, up = up, cm.parent.get(id(up))
        return False
    return bool(sites) and all(f.g.effective(cm, cc) == "rank0" or in_gated_arm(cm, cc) or f.off_in_default_run(
        cm, cc) or _needs_an_optional_attribute(f, cm, cm.enclosing(cc)) for cm, cc in sites)


def _needs_an_optional_attribute(f: Facts, m: Module, fn) -> bool:
    """`if not hasattr(self, 'swa_model'): return` first in the function, and the class sets `self.swa_model`
    only under an option off by default (RCAN-it's `if self.cfg.SOLVER.SWA.ENABLED and ...:`): the default run
    leaves the function at once."""
    first = next((s for s in getattr(fn, "body", []) if not (isinstance(s, ast.Expr) and isinstance(
        s.value, ast.Constant))), None)
    if not (isinstance(first, ast.If) and isinstance(first.test, ast.UnaryOp) and isinstance(first.test.op, ast.Not)
            and isinstance(first.test.operand, ast.Call) and callee(first.test.operand) == "hasattr"
            and len(first.test.operand.args) == 2 and first.body and isinstance(first.body[-1], ast.Return)):
        return False
    attr = first.test.operand.args[1].value if isinstance(first.test.operand.args[1], ast.Constant) else None
    sets = [a for a in m.nodes if isinstance(a, ast.Assign) and any(
        isinstance(t, ast.Attribute) and dotted(t) == f"self.{attr}" for x in a.targets for t in ast.walk(x))]
    return bool(attr) and bool(sets) and all(f.off_by_default(m, a) for a in sets)


def _launches_the_ranks(m: Module) -> bool:
    """The module starts the ranks itself through a shell command (`subprocess.Popen("... python -m
    torch.distributed.launch --nproc_per_node=2 trainer.py")`, `os.system("torchrun ...")`): it is the launcher's
    parent, one process, not a rank."""
    return any(callee(c) in ("Popen", "run", "call", "check_call", "system") for c in m.calls) and any(
        re.search(r"torch\.distributed\.(launch|run)|\btorchrun\b", n.value) for n in m.nodes
        if isinstance(n, ast.Constant) and isinstance(n.value, str))


def _per_rank_target(m: Module, c: ast.Call) -> bool:
    target = c.args[1] if dotted(c.func).endswith("save") and len(c.args) > 1 else kw(c, "f")
    if target is None and not dotted(c.func).endswith("save"):
        # a save helper handed a file name built with the rank (music-translation's
        # `self.save_model(f'bestmodel_{self.args.rank}.pth')`): each rank its own file
        target = next((a for a in [*c.args, *(k.value for k in c.keywords)] if isinstance(a, ast.JoinedStr) or (
            isinstance(a, ast.BinOp) and any(isinstance(x, ast.Constant) and isinstance(x.value, str)
                                             for x in ast.walk(a)))), None)
    return target is not None and (involves_rank(target, m.rank_tainted) or "buf" in dotted(target).lower()
                                   or isinstance(target, ast.Call) and callee(target) == "BytesIO")


def _per_rank_helper(f: Facts, m: Module, c: ast.Call) -> bool:
    """A save helper every torch.save of which writes a per-rank file (llm-baselines' save_worker_state:
    `torch.save(worker_state, ckpt_dir / f"worker_{rank}.pt")`): each rank writes its own."""
    saves = [(tf, x) for _, tf in f.callees(m, c) for x in walk(tf) if isinstance(x, ast.Call)
             and dotted(x.func) in ("torch.save", "th.save")]
    # (the helper's own rank, not the module's flow-insensitive taint: Timer's EarlyStopping.save_checkpoint
    # writes path + '/checkpoint.pth', a `path` that some other function of utils/tools.py derives from a rank)
    # (or sits under the helper's own `if rank == 0:` on a rank parameter the call hands it: nanochat's
    # save_checkpoint(..., rank=ddp_rank) writes the model on rank 0 and each rank's optimizer shard to its own file)
    return bool(saves) and all(_names_its_rank(tf, x) or _rank0_of_handed(m, c, tf, x) for tf, x in saves)


def _rank0_of_handed(m: Module, c: ast.Call, fn: ast.AST, x: ast.Call) -> bool:
    """`x` sits under `if rank == 0:` in `fn`, on a rank-named parameter that the call `c` passes."""
    params = [a.arg for a in getattr(fn, "args", ast.arguments(args=[])).args]
    params = params[1:] if params[:1] in (["self"], ["cls"]) else params
    given = {params[i] for i in range(min(len(c.args), len(params)))} | {k.arg for k in c.keywords if k.arg}
    ranked = {p for p in given if re.search(r"rank", p, re.I)}
    return bool(ranked) and any(
        isinstance(n, ast.If) and isinstance(n.test, ast.Compare) and isinstance(n.test.left, ast.Name)
        and n.test.left.id in ranked and isinstance(n.test.ops[0], ast.Eq)
        and isinstance(n.test.comparators[0], ast.Constant) and n.test.comparators[0].value == 0
        and any(y is x for s in n.body for y in ast.walk(s)) for n in walk(fn))


def _names_its_rank(fn: ast.AST, c: ast.Call) -> bool:
    target = c.args[1] if len(c.args) > 1 else kw(c, "f")
    ranked = {dotted(t) for a in walk(fn) if isinstance(a, ast.Assign) and any(
        isinstance(x, (ast.Name, ast.Attribute, ast.Call)) and re.search(r"rank", dotted(
            x.func if isinstance(x, ast.Call) else x), re.I) for x in ast.walk(a.value)) for t in a.targets}
    return target is not None and any(isinstance(x, (ast.Name, ast.Attribute)) and (
        re.search(r"rank", dotted(x), re.I) or dotted(x) in ranked) for x in ast.walk(target))
