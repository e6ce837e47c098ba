"""Objects told at construction that they run on rank 0 alone: a project class handed a rank-0 flag (`Logger(...,
enable=is_main)`, `Progbar(..., verbose=1 if rank == 0 else 0)`) that its __init__ keeps and whose printing code
tests. Every rank holds the object; only rank 0's prints anything, so what it shows is rank 0's console line."""

from __future__ import annotations

import ast
import re

from .project import Module
from .syntax import callee, const_value, dotted, walk


def enabled_on_rank0(g, m: Module, c: ast.Call) -> bool:
    """`c` builds a project object handed a rank-0 flag by keyword that its __init__ keeps (`self.enable =
    enable`) and a method tests before it prints (`def print(self, info): if self.enable:`, SIMPL; Keras-style
    `def update(...): if self.verbose == 1: sys.stdout.write(...)`, ZITS's Progbar). `g`: the rank Guards."""
    given = [k.arg for k in c.keywords if k.arg and rank0_flag(g, m, k.value)]
    for tm, tf in g.p.resolve(m, c) if given else []:
        cls = tm.classes.get(tm.class_of(tf) or "")
        init = tm.functions.get(f"{cls.name}.__init__") if cls is not None else None
        if init is None or not re.search(r"log|print|bar|progress|writer|monitor|meter|board|console", cls.name, re.I):
            continue  # (a printer: a trainer handed `verbose=... and is_logger` still trains on every rank, neuralop)
        kept = {dotted(t) for a in walk(init) if isinstance(a, ast.Assign) and isinstance(a.value, ast.Name)
                and a.value.id in given for t in a.targets}
        if any(isinstance(n, ast.If) and _tests_kept(n.test, kept) and (
                re.search(r"print|log|info", d.name) or _writes_stdout(n))
               for d in cls.body if isinstance(d, ast.FunctionDef) for n in ast.walk(d)):
            return True
    return False


def rank0_flag(g, m: Module, v: ast.expr) -> bool:
    """A value true on rank 0 alone: a rank-0 test, or a constant picked by one (`1 if rank == 0 else 0`)."""
    if isinstance(v, ast.IfExp) and isinstance(v.body, ast.Constant) and isinstance(v.orelse, ast.Constant):
        side = g.classify(m, v.test)
        if side not in ("rank0", "not0"):
            return False
        on, off = (v.body.value, v.orelse.value) if side == "rank0" else (v.orelse.value, v.body.value)
        return bool(on) and not off
    return g.classify(m, v) == "rank0"


def _tests_kept(t: ast.expr, kept: set) -> bool:
    """`if self.enable:`, or `if self.verbose == 1:` / `> 0`: a test true only when the kept flag is."""
    if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], (ast.Eq, ast.Gt, ast.GtE)):
        k = t.comparators[0]
        return dotted(t.left) in kept and isinstance(k, ast.Constant) and type(k.value) is int and (
            k.value > 0 or isinstance(t.ops[0], ast.Gt))
    return dotted(t) in kept


def _writes_stdout(n: ast.If) -> bool:
    return any(isinstance(c, ast.Call) and (callee(c) == "print" or dotted(c.func) == "sys.stdout.write")
               for c in ast.walk(n))


def tuple_flags(g, m: Module) -> dict[str, str]:
    """`default_gpu, n_gpu, device = set_cuda(opts)` where every return of the project's set_cuda puts a rank-0
    test (or a name bound only to rank-0 tests and True, the single process's answer) in that slot: the name
    unpacked from it is a rank-0 flag (VLN-HAMT, UNITER's utils)."""
    out = {}
    for a in m.nodes:
        if not (isinstance(a, ast.Assign) and len(a.targets) == 1 and isinstance(a.targets[0], ast.Tuple)
                and isinstance(a.value, ast.Call)):
            continue
        names = [dotted(t) for t in a.targets[0].elts]
        for tm, tf in g.p.resolve(m, a.value):
            rets = [r.value for r in walk(tf) if isinstance(r, ast.Return) and r.value is not None]
            if not rets or not all(isinstance(r, ast.Tuple) and len(r.elts) == len(names) for r in rets):
                continue
            for i, name in enumerate(names):
                kinds = [_slot_kind(g, tm, tf, r.elts[i]) for r in rets]
                if name and all(kinds) and "test" in kinds:
                    out[name] = "rank0"
    return out


def _slot_kind(g, m: Module, fn: ast.AST, v: ast.expr) -> str | None:
    """'test' for a rank-0 test (or a name every binding of which in `fn` is one, or True), 'true' for True."""
    if isinstance(v, ast.Constant) and v.value is True:
        return "true"
    if g.classify(m, v, shallow=True) == "rank0":
        return "test"
    binds = [a.value for a in walk(fn) if isinstance(a, ast.Assign) and isinstance(v, ast.Name)
             and any(isinstance(t, ast.Name) and t.id == v.id for t in a.targets)]
    kinds = [_slot_kind(g, m, fn, b) if not isinstance(b, ast.Name) else None for b in binds]
    return "test" if kinds and all(kinds) and "test" in kinds else None


def one_process_test(p, v: ast.AST) -> bool:
    """`args.local_rank == -1` where the project sets up the group only when that value is not -1 (BERT-style
    scripts: `if args.local_rank == -1: ... DataParallel ... else: init_process_group(...)`): true only in a run
    without DDP, so `args.local_rank == -1 or get_rank() == 0` is rank 0's in every DDP run."""
    def minus_one(x):
        return isinstance(x, ast.UnaryOp) and isinstance(x.op, ast.USub) and const_value(x.operand) == 1
    if not (isinstance(v, ast.Compare) and len(v.ops) == 1 and isinstance(v.ops[0], ast.Eq) and minus_one(
            v.comparators[0]) and dotted(v.left)):
        return False
    def tests_it(t, op, joint):  # (alone, or in an `or` for ==, an `and` for !=: `if args.local_rank == -1 or
        if isinstance(t, ast.BoolOp) and isinstance(t.op, joint):  # args.no_cuda:`)
            return any(tests_it(x, op, joint) for x in t.values)
        return isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], op) and dotted(
            t.left) == dotted(v.left) and minus_one(t.comparators[0])
    def inits(block):
        return any(isinstance(c, ast.Call) and callee(c) == "init_process_group" for s in block for c in ast.walk(s))
    return any(isinstance(n, ast.If) and (tests_it(n.test, ast.Eq, ast.Or) and inits(n.orelse) or tests_it(
        n.test, ast.NotEq, ast.And) and inits(n.body)) for m in p.modules.values() for n in m.nodes)


SETUP_METHODS = {"create", "init", "initialize", "setup", "set_up", "configure", "open", "start"}


def created_on_rank0(g, m: Module) -> set[str]:
    """Imported objects this module sets up on rank 0 alone (UNITER-style `TB_LOGGER.create(log_dir)` under `if
    default_gpu:`, VLN-HAMT, PolarNet): a writer that writes nothing until it is created, so its later calls
    (`TB_LOGGER.add_scalar(...)`) log on rank 0 alone."""
    sets = {}
    for c in m.calls:
        if isinstance(c.func, ast.Attribute) and c.func.attr in SETUP_METHODS and isinstance(c.func.value, ast.Name) \
                and c.func.value.id in m.imports:
            sets.setdefault(c.func.value.id, []).append(g.kind(m, c) == "rank0")
    return {name for name, ranks in sets.items() if all(ranks)}


def raised_on_rank0(g, m: Module) -> set[str]:
    """Flags set False first and True only on rank 0 or in the one-process arm (ViLBERT's `default_gpu = False`;
    `if dist.is_available() and args.local_rank != -1: if rank == 0: default_gpu = True` `else: default_gpu =
    True`): true on rank 0 alone in the DDP run, so `if default_gpu:` is rank 0's."""
    binds: dict[str, list[ast.Assign]] = {}
    for a in m.nodes:
        if isinstance(a, ast.Assign) and len(a.targets) == 1 and isinstance(a.targets[0], ast.Name):
            binds.setdefault(a.targets[0].id, []).append(a)
    out = set()
    for name, sets in binds.items():
        if len(sets) < 2 or not all(isinstance(a.value, ast.Constant) and a.value.value in (True, False)
                                    for a in sets) or m.enclosing(sets[0]) is not m.enclosing(sets[-1]):
            continue
        raised = [a for a in sets if a.value.value is True]
        if raised and any(g.kind(m, a) == "rank0" for a in raised) and all(
                g.kind(m, a) == "rank0" or _one_process_else(g, m, a) for a in raised) and any(
                a.value.value is False and a.lineno < min(r.lineno for r in raised) for a in sets):
            out.add(name)
    return out


def _one_process_else(g, m: Module, a: ast.AST) -> bool:
    """`a` sits in the else of an `if` whose body holds a rank-0 test (the distributed arm that asks the rank)."""
    child, n = a, m.parent.get(id(a))
    while n is not None and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        if isinstance(n, ast.If) and any(child is s for s in n.orelse) and any(
                isinstance(x, ast.If) and g.classify(m, x.test) == "rank0" for s in n.body for x in ast.walk(s)):
            return True
        child, n = n, m.parent.get(id(n))
    return False
