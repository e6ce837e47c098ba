"""Flags and objects a script switches off on every rank but 0, for ranks.py's Guards: `self.verbose = True`, then
`if gpu != 0: self.verbose = False`; `if rank not in [0, -1]: self.use_wandb = False; conf.ckpt_dir = None`. A test
of such a name (`if self.use_wandb:`, `if conf.ckpt_dir is not None:`) is true on rank 0 alone."""

from __future__ import annotations

import ast

from .project import Module
from .syntax import callee, dotted


def switched_off_elsewhere(g, m: Module, kinds: dict[str, str]) -> dict[str, str]:
    """`self.verbose = True`, then `if self.args.gpu != 0: self.verbose = False` (VL-T5): a flag true on rank
    0 alone."""
    consts: dict[str, list[tuple[bool, str | None]]] = {}
    for a in m.nodes:
        if isinstance(a, ast.Assign) and len(a.targets) == 1 and dotted(a.targets[0]):
            name = dotted(a.targets[0])
            if isinstance(a.value, ast.Constant) and a.value.value is None:
                continue  # (`self.save_models = None` in __init__, set for real later: IDDM)
            if isinstance(a.value, ast.Constant) and isinstance(a.value.value, bool):
                consts.setdefault(name, []).append((a.value.value, g.arm(m, a)))
            else:
                consts.setdefault(name, []).append((None, "other"))
    # `if rank % ngpus == 0: opt.log = True` / `else: opt.log = False` (HybrIK) says the same
    # ... and so does `self.print = False`, then `if rank == 0 ...: self.print = True` (ClearerVoice's Solver),
    # unless rank 0 then hands it to the others (HaGRID's broadcast `self.stop`)
    shared = _shared(m)
    return {name: "rank0" for name, sets in consts.items() if name not in kinds
            and ((True, None) in sets or (True, "rank0") in sets) and (False, "not0") in sets
            and all(s in ((True, None), (True, "rank0"), (False, "not0")) for s in sets)
            or name not in kinds and (False, None) in sets and (True, "rank0") in sets
            and all(s in ((False, None), (True, "rank0")) for s in sets) and name not in shared}


def cleared_off_rank0(g, m: Module, const: bool | None) -> set[str]:
    """Names set to `const` (False, or None) in an arm only the other ranks run, after whatever the script set
    them to (FrameDiff's `self._use_wandb = self._exp_conf.use_wandb`, then `if rank not in [0, -1]:
    self._use_wandb = False; self._exp_conf.ckpt_dir = None`): every other binding comes earlier in the same
    function, or only keeps the value where it is already set (`if conf.ckpt_dir is not None: conf.ckpt_dir =
    os.path.join(conf.ckpt_dir, ...)`). A False flag is rank 0's flag; a None is an object only rank 0 holds."""
    binds: dict[str, list[ast.Assign]] = {}
    for a in m.nodes:
        if isinstance(a, ast.Assign) and len(a.targets) == 1 and dotted(a.targets[0]):
            binds.setdefault(dotted(a.targets[0]), []).append(a)
    shared, out = _shared(m), set()
    for name, sets in binds.items():
        off = [a for a in sets if isinstance(a.value, ast.Constant) and (a.value.value is const or const is False and (
            type(a.value.value) is int and a.value.value == 0)) and g.arm(m, a) == "not0"]  # (`verbose = 0`: 3D-EMGP)
        if off and name not in shared and all(b in off or any(
                m.enclosing(b) is m.enclosing(a) and b.lineno < a.lineno for a in off) or _kept_where_set(m, b, name)
                for b in sets):
            out.add(name)
    return out


def _kept_where_set(m: Module, b: ast.AST, name: str) -> bool:
    """b sits under a test of `name` itself: it rebinds the value only where the value is already set."""
    n = m.parent.get(id(b))
    while n is not None and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        if isinstance(n, ast.If) and name in {dotted(x) for x in ast.walk(n.test)}:
            return True
        n = m.parent.get(id(n))
    return False


def _shared(m: Module) -> set[str]:
    """Names rank 0 hands to the others (HaGRID's `broadcast(self.stop)`): no longer rank 0's alone."""
    return {dotted(a) for c in m.calls if callee(c) in ("broadcast", "all_reduce") for a in c.args}


def none_or_bare_iterable(v: ast.IfExp) -> bool:
    """`SummaryWriter(...) if rank == 0 else None`, or `tqdm(loader) if is_main else loader` (dyMEAN): the other
    ranks hold None or the bare iterable the bar wraps, so a call on the object's own methods (`t_iter.set_postfix(
    loss=...)`, behind `hasattr(t_iter, 'set_postfix')`) is rank 0's."""
    return isinstance(v.body, ast.Call) and (isinstance(v.orelse, ast.Constant) and v.orelse.value is None or callee(
        v.body) == "tqdm" and bool(v.body.args) and ast.dump(v.body.args[0]) == ast.dump(v.orelse))


def idle_object(p, m: Module, c: ast.Call) -> bool:
    """`model_saver = NoOp()` on the ranks but 0 (VLN-HAMT, UNITER's utils): a project class every method of which
    does nothing (`pass`, a bare return, `return self.noop` from `__getattr__`): calls on it are no-ops there."""
    def idle(fn) -> bool:
        body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        return all(isinstance(s, ast.Pass) or isinstance(s, ast.Return) and (
            s.value is None or isinstance(s.value, ast.Constant) and s.value.value is None or
            isinstance(s.value, ast.Attribute) and dotted(s.value.value) == "self") for s in body)
    for tm, tf in p.resolve(m, c):
        cls = tm.classes.get(tm.class_of(tf) or "") if isinstance(tf, (ast.FunctionDef, ast.AsyncFunctionDef)) \
            else tf if isinstance(tf, ast.ClassDef) else None
        methods = [d for d in getattr(cls, "body", []) if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))]
        if methods and all(idle(d) for d in methods) and all(dotted(b) == "object" for b in cls.bases):
            return True
    return False
