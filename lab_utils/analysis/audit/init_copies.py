"""Where a rank's own init is copied before the DDP wrap (an EMA, a deepcopy of the model), for chapter 02's
seed-per-rank rule (rules/seeds.py): DDP broadcasts rank 0's weights to the wrapped model only, so a copy made
before the wrap keeps each rank's own init, unless only rank 0 ever reads it or a later pass overwrites it with
the wrapped (rank 0's) weights."""

from __future__ import annotations

import ast
import re

from .facts import Facts
from .project import Module
from .registry import Hit
from .syntax import callee, const_value, dotted, walk

SETUP_USE = re.compile(r"update|requires_grad|^eval$|^train$|^to$|cuda|half|float|load")


def _read_by_rank0_only(f: Facts, m: Module, fn: ast.AST, copy: ast.Call) -> bool:
    """A per-rank copy no other rank ever reads has no consequence: DiT's `ema = deepcopy(model)` is updated on
    every rank but saved (`ema.state_dict()`) under `if rank == 0` alone. Setting it up or updating it
    (`requires_grad(ema, False)`, `update_ema(ema, model.module)`, `ema.eval()`) reads nothing out."""
    a = m.parent.get(id(copy))
    if not (isinstance(a, ast.Assign) and len(a.targets) == 1 and isinstance(a.targets[0], ast.Name)):
        return False
    name, reads = a.targets[0].id, []
    for n in walk(fn):
        if not (isinstance(n, ast.Name) and n.id == name and n.lineno > a.lineno and isinstance(n.ctx, ast.Load)):
            continue
        inner = m.enclosing(n)
        if inner is not None and inner is not fn and name in {x.arg for x in inner.args.args}:
            continue  # another function's parameter of the same name: judged where it is handed in
        if isinstance(m.parent.get(id(n)), ast.Compare):
            continue  # `if model_ema is not None:` reads nothing out
        user = m.parent.get(id(n))
        call = user if isinstance(user, ast.Call) else m.parent.get(id(user))
        if isinstance(call, ast.Call) and SETUP_USE.search(callee(call)) and (
                n in call.args[:1] or call.func is user):
            continue
        if isinstance(call, ast.Call) and _only_updates(f, m, call, n):
            continue  # handed to the training loop, which only updates it (`model_ema.update(model)`, DeiT/EViT)
        reads.append(n)
    return bool(reads) and all(f.g.effective(m, n) == "rank0" or _into_a_rank0_save(f, m, n) for n in reads)


def _only_updates(f: Facts, m: Module, call: ast.Call, n: ast.AST) -> bool:
    """`call` hands `n` to a project function whose every use of that parameter is a None test or a set-up call
    on it (`if model_ema is not None: model_ema.update(model)`)."""
    i = next((i for i, a in enumerate(call.args) if a is n), None)
    key = next((k.arg for k in call.keywords if k.value is n), None)
    for _, tf in f.p.resolve(m, call, exact=True):
        params = [a.arg for a in getattr(tf, "args", ast.arguments(args=[])).args]
        params = params[1:] if params[:1] in (["self"], ["cls"]) else params
        param = key or (params[i] if i is not None and i < len(params) else None)
        if param is None:
            return False
        uses = [x for x in walk(tf) if isinstance(x, ast.Name) and x.id == param and isinstance(x.ctx, ast.Load)]
        for x in uses:
            up = next((p for p in walk(tf) if any(c is x for c in ast.iter_child_nodes(p))), None)
            ok = isinstance(up, ast.Compare) or isinstance(up, ast.Attribute) and SETUP_USE.search(up.attr)
            if not ok:
                return False
        return bool(uses)
    return False


def _into_a_rank0_save(f: Facts, m: Module, n: ast.AST) -> bool:
    """`n` is read into a checkpoint that a save helper writes on rank 0 alone (DeiT's `utils.save_on_master({...,
    'model_ema': get_state_dict(model_ema)}, path)`): the other ranks' copies go nowhere."""
    up = m.parent.get(id(n))
    while up is not None and not isinstance(up, ast.stmt):
        if isinstance(up, ast.Call) and f.is_save(m, up) and (f.guarded_inside(m, up) or f.g.effective(m, up) ==
                                                               "rank0"):
            return True
        up = m.parent.get(id(up))
    return False


def copy_before_wrap(f: Facts, m: Module, c: ast.Call, fn: ast.AST, after: int):
    """A per-rank init copied (EMA, deepcopy) in `fn` after line `after`, before `fn`'s DDP wrap."""
    wrap = min((a.lineno for a in walk(fn) if isinstance(a, ast.Call) and f.is_ddp_call(m, a)),
               default=None)
    wrapped = {dotted(a.args[0]) for a in walk(fn) if isinstance(a, ast.Call) and f.is_ddp_call(m, a)
               and a.args}
    copies = [a for a in walk(fn) if isinstance(a, ast.Call) and a.lineno > after and
              (wrap is None or a.lineno < wrap) and (callee(a) in ("deepcopy", "ModelEMA", "ModelEmaV2",
                                                                     "ExponentialMovingAverage", "EMA")
                                                     or "ema" in callee(a).lower())
              and not _after_a_wrapped_pass(f, m, a) and not f.off_by_default(m, a)
              and not (a.args and re.search(r"optim", dotted(a.args[0]), re.I))  # (an EMA that wraps the
              # optimizer keeps its averages from the synchronised steps: DDGAN's EMA(optimizerG))
              and not (callee(a) == "deepcopy" and a.args and not (dotted(a.args[0]) in wrapped or re.search(
                  r"model|net|encoder|generator|student|teacher", dotted(a.args[0]), re.I)))]
    # (a deepcopy of what is no model, 4M's `deepcopy(MODALITY_TRANSFORMS_DIVAE)`, copies no init)
    if wrap is not None and copies and not _read_by_rank0_only(f, m, fn, copies[0]) and \
            not _resynced_after(m, fn, copies[0], wrap) and not _pegged_until_a_start(f, m, copies[0]):
        return Hit(copies[0], f"{ast.unparse(copies[0])} copies each rank's own init "
                   f"(seeded per rank at line {c.lineno}) before the DDP wrap (line {wrap}), which broadcasts "
                   "rank 0's weights to the wrapped model only: ranks other than 0 keep another copy — make "
                   "the copy after the wrap, or check that only rank 0's copy is ever used", "check-by-hand")
    return None


def _pegged_until_a_start(f: Facts, m: Module, copy: ast.Call) -> bool:
    """A project EMA class whose update copies the source outright before a start iteration (BigGAN's `ema(G, G_ema,
    decay, start_itr)`: `if itr < self.start_itr: decay = 0.0`), handed a start other than 0 (IC-GAN's ema_start,
    20000 by default): its first updates overwrite each rank's own init with the wrapped model's weights."""
    start = copy.args[3] if len(copy.args) > 3 else next((k.value for k in copy.keywords if k.arg and re.search(
        r"start", k.arg)), None)
    if start is None or const_value(start) == 0:
        return False
    for tm, tf in f.p.resolve(m, copy):
        cls = tm.class_of(tf)
        update = tm.functions.get(f"{cls}.update") if cls else None
        if update is not None and any(isinstance(a, ast.Assign) and const_value(a.value) == 0 and any(
                re.search(r"decay|beta|momentum", dotted(t), re.I) for t in a.targets) for a in walk(update)):
            return True
    return False


def _resynced_after(m: Module, fn: ast.AST, copy: ast.Call, wrap: int) -> bool:
    """After the wrap, the copy is overwritten with the wrapped model's (rank 0's) weights: `update_ema(ema,
    model.module, decay=0)` (Latte, DiT's later versions) or `ema.load_state_dict(model.module.state_dict())`."""
    a = m.parent.get(id(copy))
    while isinstance(a, (ast.Attribute, ast.Call)):  # `deepcopy(model).to(device)`
        a = m.parent.get(id(a))
    name = dotted(a.targets[0]) if isinstance(a, ast.Assign) and len(a.targets) == 1 else None
    return name is not None and any(
        isinstance(c, ast.Call) and c.lineno > wrap and (
            c.args and dotted(c.args[0]) == name and any(k.arg == "decay" and const_value(k.value) == 0
                                                         for k in c.keywords)
            or callee(c) == "load_state_dict" and isinstance(c.func, ast.Attribute) and dotted(c.func.value) == name
            and "module" in ast.unparse(c.args[0] if c.args else c))
        for c in walk(fn))


def _after_a_wrapped_pass(f: Facts, m: Module, copy: ast.Call) -> bool:
    """The copy is made in a loop that wraps the model in DDP later in its body, under a test that is false on
    the loop's first pass (`for task_id, ds in enumerate(tasks): if task_id > 0: teacher = deepcopy(model)`,
    DyTox): it copies weights a DDP pass already made the same on every rank, not the per-rank init."""
    loop, n = None, m.parent.get(id(copy))
    guarded = False
    while n is not None and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        if isinstance(n, ast.If) and not guarded:
            guarded = n
        if isinstance(n, ast.For):
            loop = n
            break
        n = m.parent.get(id(n))
    if loop is None or not guarded or not any(isinstance(a, ast.Call) and f.is_ddp_call(m, a)
                                             and a.lineno > copy.lineno for a in walk(loop)):
        return False
    counters = {x.id for x in ast.walk(loop.target) if isinstance(x, ast.Name)}
    test = guarded.test
    for t in test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]:
        if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.left, ast.Name) and \
                t.left.id in counters and isinstance(t.comparators[0], ast.Constant):
            op, k = t.ops[0], t.comparators[0].value
            if isinstance(op, ast.Gt) and k == 0 or isinstance(op, ast.NotEq) and k == 0 or \
                    isinstance(op, ast.GtE) and k == 1:
                return True
    return False
