"""Gathers over ranks that the rules follow: where an autograd Function (a hand-written all_gather with its own
backward) is applied, and which models compute their loss over every rank's gathered features, so that every rank's
loss is the global batch's; and which gathered tensors can carry a gradient at all (a fresh tensor, a detached
one, a gather under no_grad or only ever handed such), which chapter 05's gather rule asks before it reports."""

from __future__ import annotations

import ast
import re

from .facts import Facts
from .project import Module
from .syntax import LOSSISH, callee, dotted, root, walk

GATHERS = {"all_gather", "all_gather_into_tensor"}


def applications(f: Facts, name: str) -> list[tuple[Module, ast.Call]]:
    """Where the project applies an autograd.Function: `Name.apply(x)`, or through an alias (`allgather =
    AllGather.apply` ... `allgather(x)`, CLIP4Clip)."""
    out = []
    for cm in f.p.modules.values():
        aliases = {dotted(t) for a in cm.nodes if isinstance(a, ast.Assign) and dotted(a.value) == f"{name}.apply"
                   for t in a.targets}
        out += [(cm, c) for c in cm.calls if isinstance(c.func, ast.Attribute) and c.func.attr == "apply"
                and dotted(c.func.value) == name or isinstance(c.func, ast.Name) and c.func.id in aliases]
    return out


def global_model_losses(f: Facts, m: Module, scope: ast.AST) -> set[str]:
    """Names that hold what a loss-returning model that gathers every rank's features returns, and what is computed
    from them (CLIP4Clip's loss over the all-gathered similarity matrix; arcface's PartialFC_V2, whose loss is
    all-reduced across the class shards): every rank's loss is the global batch's, the number the single run logs.
    The model is an instance of such a class (`module_partial_fc(emb, labels)`), or a callable no project def
    names (the DDP-wrapped `model(...)`) in a project that has one."""
    gathering = gathering_loss_models(f)
    if not gathering:
        return set()

    def targets(a):
        return a.targets if isinstance(a, ast.Assign) else [a.target]
    out: set[str] = set()
    for a in walk(scope):
        v = a.value if isinstance(a, (ast.Assign, ast.AnnAssign)) else None
        if not (isinstance(v, ast.Call) and isinstance(v.func, (ast.Name, ast.Attribute))):
            continue
        holder = f.any_class(m, dotted(v.func))
        if holder is not None and holder[1].name in gathering or holder is None and re.search(
                r"model|net", dotted(v.func).split(".")[-1], re.I) and not f.p.resolve(m, v):
            out |= {root(t) for t in targets(a) if isinstance(t, (ast.Name, ast.Attribute))}
    for _ in range(3):  # loss = loss.mean(); total_loss += float(loss); loss_am.update(loss.item())
        for a in walk(scope):
            if isinstance(a, ast.Call) and isinstance(a.func, ast.Attribute) and a.func.attr == "update" and a.args:
                a = ast.Assign(targets=[a.func.value], value=a.args[0])
            if isinstance(a, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and a.value is not None:
                reads = {root(n) for n in ast.walk(a.value) if isinstance(n, (ast.Name, ast.Attribute))}
                lossy = {r for r in reads if r and LOSSISH.search(r)}
                if lossy and lossy <= out | {root(t) for t in targets(a)}:
                    out |= {root(t) for t in targets(a)}
    return out


def gathering_loss_models(f: Facts) -> list[str]:
    """Project classes whose forward returns a loss and reaches an all_gather (directly, through a helper, or
    through an autograd Function applied by alias: `allgather = AllGather.apply`)."""
    if "gathering_models" not in f.cache:
        gathering_fns = {cls.name for mm in f.p.modules.values() for cls in mm.classes.values()
                         if any(isinstance(n, ast.Call) and callee(n) in GATHERS for n in ast.walk(cls))}
        out = []
        for mm in f.p.modules.values():
            for cls in mm.classes.values():
                fwd = mm.functions.get(f"{cls.name}.forward")
                if fwd is None or not any(isinstance(r, ast.Return) and r.value is not None and any(
                        isinstance(n, ast.Name) and LOSSISH.search(n.id) for n in ast.walk(r.value))
                        for r in ast.walk(fwd)):
                    continue
                for rm, c in _calls_feeding(f, mm, fwd):
                    applied = dotted(c.func).removesuffix(".apply") if dotted(c.func).endswith(".apply") else next(
                        (dotted(a.value).removesuffix(".apply") for a in rm.nodes if isinstance(a, ast.Assign)
                         and dotted(a.value).endswith(".apply") and isinstance(c.func, ast.Name)
                         and c.func.id in {dotted(t) for t in a.targets}), None)
                    if callee(c) in GATHERS or applied in gathering_fns:
                        out.append(cls.name)
                        break
        f.cache["gathering_models"] = out
    return f.cache["gathering_models"]


def _calls_feeding(f: Facts, m: Module, fwd: ast.AST) -> list[tuple[Module, ast.Call]]:
    """The calls a forward makes, and those of the project functions it calls for their results: a helper called
    as a statement (MoBY's `self._dequeue_and_enqueue(keys1, keys2)`, which gathers the keys into the negatives'
    queue under no_grad) returns nothing the forward's loss is computed from."""
    seen, todo, out = {id(fwd)}, [(m, fwd)], []
    while todo:
        mm, fn = todo.pop()
        calls = [c for c in walk(fn) if isinstance(c, ast.Call)]
        out += [(mm, c) for c in calls]
        for c in calls:
            if isinstance(mm.parent.get(id(c)), ast.Expr):
                continue
            for tm, tf in f.p.resolve(mm, c):
                if id(tf) not in seen:
                    seen.add(id(tf))
                    todo.append((tm, tf))
    return out


FRESH = {"tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "zeros_like", "ones_like",
         "empty_like", "full_like", "from_numpy", "ByteTensor", "LongTensor", "IntTensor", "FloatTensor", "Tensor"}


# methods that move or reshape a tensor and keep whether it carries a gradient
RESHAPES = {"to", "cuda", "unsqueeze", "view", "reshape", "float", "long", "double", "int", "contiguous", "flatten"}


def grad_free(scope: ast.AST, x: ast.AST, seen: frozenset = frozenset()) -> bool:
    """The gathered tensor cannot carry a gradient: built by a tensor constructor (`torch.tensor([t.numel()])`,
    the sizes gathered before an all_gather of pickled objects), directly or through every assignment of its
    name in the scope."""
    if isinstance(x, ast.Call) and isinstance(x.func, ast.Attribute) and x.func.attr in RESHAPES:
        return grad_free(scope, x.func.value, seen)  # `torch.tensor(metric).unsqueeze(0).to(device)` (VAN)
    if isinstance(x, ast.Call) and callee(x) in ("stack", "cat") and x.args:
        return grad_free(scope, x.args[0], seen)  # a stack of fresh tensors (ContrastiveCrop's boxes)
    if isinstance(x, ast.Call) and isinstance(x.func, ast.Attribute) and isinstance(x.func.value, ast.Attribute) \
            and x.func.value.attr == "grad":
        return True  # `p.grad.norm()`: a parameter's gradient, which no graph records (MeanFlow's sanity check)
    if isinstance(x, ast.Call):
        return callee(x) in FRESH and not any(k.arg == "requires_grad" for k in x.keywords)
    if isinstance(x, (ast.List, ast.Tuple)):
        return all(grad_free(scope, e, seen) for e in x.elts)
    if not isinstance(x, ast.Name) or x.id in seen:  # (`x = x.to(device)` names itself: not known free)
        return False
    values = [a.value for a in walk(scope) if isinstance(a, ast.Assign)
              and any(isinstance(t, ast.Name) and t.id == x.id for t in a.targets)]
    # ... and what is appended to it (`boxes = []`, `boxes.append(torch.tensor([h0, w0, h1, w1]))`)
    values += [c.args[0] for c in walk(scope) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
               and c.func.attr == "append" and dotted(c.func.value) == x.id and c.args]
    # (a rebinding from itself, `boxes = torch.stack(boxes).cuda()`, is as free as its other bindings)
    values = [v for v in values if not _restacks(v, x.id)]
    return bool(values) and all(grad_free(scope, v, seen | {x.id}) for v in values)


def _restacks(v: ast.AST, name: str) -> bool:
    while isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr in RESHAPES:
        v = v.func.value
    return isinstance(v, ast.Call) and callee(v) in ("stack", "cat") and bool(v.args) and dotted(v.args[0]) == name


def assigned_without_grad(m: Module, scope: ast.AST, x: ast.AST) -> bool:
    """Every assignment of the gathered name is made under no_grad or from a fresh tensor (GALIP's CLIP score:
    `clip_cos = torch.FloatTensor([0.0])`, then `clip_cos = clip_cos + clip_sim` in a `with torch.no_grad():`)."""
    assigns = [a for a in walk(scope) if isinstance(a, ast.Assign) and isinstance(x, ast.Name)
               and any(isinstance(t, ast.Name) and t.id == x.id for t in a.targets)]
    return bool(assigns) and all(no_grad_at(m, a) or grad_free(scope, a.value) for a in assigns)


def features_without_grad(m: Module, scope: ast.AST, x: ast.AST) -> bool:
    """The gathered value's own name (`proj_ecg_emb` of `proj_ecg_emb[0]`, a tuple's element too) is bound only
    under no_grad (MERL's val: the model's outputs in a `with torch.no_grad():`): nothing there carries a gradient,
    whatever slice the gather puts back."""
    name = root(x)
    assigns = [a for a in walk(scope) if isinstance(a, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == name for tg in a.targets for t in ast.walk(tg))]
    return bool(name) and bool(assigns) and all(no_grad_at(m, a) for a in assigns)


def no_grad_at(m: Module, node: ast.AST) -> bool:
    """`node` sits in a `with torch.no_grad():` block or a function decorated with no_grad."""
    n = m.parent.get(id(node))
    while n is not None:
        if isinstance(n, ast.With) and any("no_grad" in dotted(i.context_expr) for i in n.items) or isinstance(
                n, (ast.FunctionDef, ast.AsyncFunctionDef)) and any("no_grad" in dotted(d) for d in n.decorator_list):
            return True
        n = m.parent.get(id(n))
    return False


def called_only_without_grad(f: Facts, m: Module, fn: ast.AST, depth: int = 2) -> bool:
    """Every project call of `fn` sits under no_grad, or hands its result only to code under no_grad (AVID's
    memory bank: `video_emb_gathered = _gather_from_all(video_emb)`, read only in `with torch.no_grad():`), or in
    a helper that is itself called only so (CLD's dist_collect in DistributedShufle's shuffles, which the step
    runs under no_grad for the key encoder): what it gathers carries no gradient by design."""
    def result_without_grad(cm: Module, c: ast.AST) -> bool:
        bound = cm.parent.get(id(c))
        if not (isinstance(bound, ast.Assign) and len(bound.targets) == 1 and isinstance(bound.targets[0], ast.Name)):
            return False
        name, scope = bound.targets[0].id, cm.enclosing(c) or cm.tree
        reads = [n for n in walk(scope) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)]
        return bool(reads) and all(no_grad_at(cm, r) for r in reads)
    def handed_without_grad(cm: Module, c: ast.Call) -> bool:
        # (`dist.gather_concat(z.detach()...)`, `gather_concat(torch.tensor(v))`: TarFlow's metrics and prior)
        x = c.args[0] if c.args else None
        return x is not None and ("detach" in ast.unparse(x) or grad_free(cm.enclosing(c) or cm.tree, x))
    sites = f.p.callers(m, fn)
    return bool(sites) and all(no_grad_at(cm, c) or result_without_grad(cm, c) or handed_without_grad(cm, c)
                               or f.off_by_default(cm, c) or depth > 1 and cm.enclosing(c) is not None
                               and called_only_without_grad(f, cm, cm.enclosing(c), depth - 1) for cm, c in sites)


def fills_state_only(fn: ast.AST | None, out: str) -> bool:
    """What a method gathers into `out` ends only in in-place writes to state and never leaves it: a memory bank's
    slots (TOIST's `self.feature_bank[i][-n:] = feature_to_update`) or an optimizer's moments (modded-nanogpt's
    `embed_state[key].copy_(full_lm.T[...])`). No value is returned, stored on an attribute or backpropagated, so
    nothing a loss differentiates this step reads the gathered copy."""
    if not isinstance(fn, ast.FunctionDef) or fn.name == "forward" or not out or any(
            isinstance(r, (ast.Return, ast.Yield)) and r.value is not None for r in walk(fn)):
        return False
    tainted, stores = {out}, False

    def reads(x: ast.AST | None) -> bool:
        return x is not None and any(dotted(n) in tainted or root(n) in tainted for n in ast.walk(x)
                                     if isinstance(n, (ast.Name, ast.Attribute)))
    for _ in range(3):  # (names bound from names bound from the gather: a fixed point in a few passes)
        for n in walk(fn):
            if isinstance(n, ast.Assign) and reads(n.value):
                tainted |= {t.id for t in n.targets if isinstance(t, ast.Name)}
            elif isinstance(n, ast.For) and reads(n.iter):
                tainted |= {t.id for t in ast.walk(n.target) if isinstance(t, ast.Name)}
            elif isinstance(n, ast.Call) and callee(n) == "append" and isinstance(n.func, ast.Attribute) and any(
                    reads(a) for a in n.args):
                tainted.add(root(n.func.value))
    for n in walk(fn):
        if isinstance(n, ast.Assign) and reads(n.value) and any(isinstance(t, ast.Attribute) for t in n.targets):
            return False  # `self.features = torch.cat(gathered)`: another method may take a loss over it
        if isinstance(n, ast.Assign) and reads(n.value) and any(isinstance(t, ast.Subscript) for t in n.targets) \
                or isinstance(n, ast.Call) and callee(n) == "copy_" and any(reads(a) for a in n.args):
            stores = True
        if isinstance(n, ast.Call) and callee(n) == "backward" and isinstance(n.func, ast.Attribute) and reads(
                n.func.value):
            return False
    return stores
