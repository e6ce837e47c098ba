"""Which values rank 0 computes by itself, not as a share of a global batch: what a project function called under
the rank-0 guard returns over a whole, unsharded set (`val_loss = evaluate(model, val_loader)`), and copies of it.
Rank 0's number there is the single run's, so chapter 01's loss rules (rules/logging.py) take it out of the logged
losses they judge; so too a regulariser of the weights DDP keeps equal (of_the_weights_alone)."""

from __future__ import annotations

import ast
import re

from .facts import Facts
from .losses import assigned_roots
from .project import Module
from .syntax import LOSSISH, branches, callee, dotted, kw, root

CONSTISH = {"np", "numpy", "math", "float", "inf", "torch"}


def _sharded(f: Facts, m: Module, call: ast.Call) -> bool:
    """Whether a call is handed this rank's shard: a batch of an enclosing loop, or a loader built with a
    DistributedSampler (`DataLoader(ds, sampler=sampler)` with `sampler = DistributedSampler(ds)`)."""
    names = {root(n) for a in [*call.args, *[k.value for k in call.keywords]] for n in ast.walk(a)
             if isinstance(n, (ast.Name, ast.Attribute))}
    n = m.parent.get(id(call))
    while n is not None:
        if isinstance(n, ast.For) and names & {x.id for x in ast.walk(n.target) if isinstance(x, ast.Name)} and \
                not (isinstance(n.iter, ast.Call) and callee(n.iter) == "range"):  # (a step count is no batch)
            return True
        n = m.parent.get(id(n))
    classes = f.sampler_classes()
    samplers = {dotted(t) for a in m.nodes if isinstance(a, ast.Assign) for t in a.targets
                if any(isinstance(v, ast.Call) and callee(v) in classes for v in branches(a.value))}
    for a in m.nodes:
        if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and assigned_roots(a) & names:
            s = kw(a.value, "sampler") or kw(a.value, "batch_sampler")
            if s is not None and any(isinstance(v, ast.Call) and callee(v) in classes or dotted(v) in samplers
                                     for v in branches(s)):
                return True
    return False


def rank0_own(f: Facts, m: Module, scope: ast.AST) -> set[str]:
    """Values rank 0 computes by itself, not a share of a global batch: what a project function called under the
    rank-0 guard returns (`val_loss = evaluate(model, val_loader)`, rank 0 alone over a whole, unsharded set) and
    copies of it (`min_loss = val_loss`). Rank 0's number there is the single run's; a call handed this rank's
    batch or a DistributedSampler's loader stays local."""
    cache = f.cache.setdefault("rank0_own", {})
    if (m.rel, id(scope)) in cache:
        return cache[(m.rel, id(scope))]

    def source(v, own):
        return isinstance(v, ast.Call) and f.g.kind(m, v) == "rank0" and bool(f.p.resolve(m, v)) and \
            not _sharded(f, m, v) or isinstance(v, (ast.Name, ast.Attribute)) and dotted(v) in own or \
            _made_only_from(v, own)
    assigns = [a for a in own_walk(scope) if isinstance(a, (ast.Assign, ast.AugAssign))]
    # `losses.append(step(valid_dataset, model.module, ...))` under rank 0's guard (DOT's validation)
    appends = [a for a in own_walk(scope) if isinstance(a, ast.Call) and callee(a) == "append" and a.args
               and isinstance(a.func, ast.Attribute)]
    own: set[str] = set()
    for _ in range(3):
        own |= {t for a in assigns if isinstance(a, ast.Assign) and source(a.value, own) for t in assigned_roots(a)}
        own |= {dotted(a.func.value) for a in appends if source(a.args[0], own)}
    # a history restored from the resumed checkpoint (`val_loss_list = ckpt["val_loss_list"]` after `ckpt =
    # torch.load(...)`, LatentSync's SyncNet trainer) holds what rank 0 saved of its own values: no other feed
    loaded = {t for a in assigns if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call)
              and callee(a.value) == "load" for t in assigned_roots(a)}
    for a in assigns:  # a name also fed from elsewhere (not a starting constant like np.inf) is not rank 0's own
        if isinstance(a, ast.AugAssign) or not source(a.value, own) and any(
                isinstance(n, ast.Name) and n.id not in CONSTISH | loaded for n in ast.walk(a.value)):
            own -= assigned_roots(a) if isinstance(a, ast.Assign) else {root(a.target)}
    cache[(m.rel, id(scope))] = own
    return own


def _made_only_from(v: ast.AST, own: set[str]) -> bool:
    """A library call over rank 0's own values alone (`torch.stack(losses).mean()`)."""
    if not isinstance(v, ast.Call):
        return False
    reads = {n.id for n in ast.walk(v) if isinstance(n, ast.Name)} - CONSTISH
    if bool(reads) and reads <= own:
        return True
    # a text formatted from rank 0's own losses and other values that are no loss (YOLOP's `msg = '... Loss(
    # {loss:.3f}) ...'.format(epoch, loss=total_loss, ...)` after `..., total_loss, ... = validate(...)`)
    text = isinstance(v.func, ast.Attribute) and v.func.attr == "format" and isinstance(v.func.value, ast.Constant)
    return text and bool(reads & own) and not any(LOSSISH.search(r) for r in reads - own)


def own_walk(scope: ast.AST) -> list[ast.AST]:
    """The nodes of a scope without the bodies of the functions and classes defined in it: a helper's local
    `losses = torch.zeros(n)` is another variable than the script's `losses = estimate_loss()`. Listed once and kept
    on the scope, as syntax.walk does."""
    got = scope.__dict__.get("_own_walked")
    if got is None:
        got, todo = [], [scope]
        while todo:
            n = todo.pop()
            got.append(n)
            todo += [c for c in ast.iter_child_nodes(n)
                     if not isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda))]
        scope._own_walked = got
    return got


def of_the_weights_alone(f: Facts, m: Module, c: ast.Call, name: str) -> bool:
    """Every binding of `name` in the function is a regulariser's call handed only the model, its weights and
    options (AtomNAS's `loss_l2 = optim.cal_l2_loss(model, FLAGS.weight_decay, ...)`): a function of the weights
    DDP keeps equal, the same number on every rank, so rank 0's is the global one."""
    binds = [a.value for a in ast.walk(m.enclosing(c) or m.tree) if isinstance(a, ast.Assign) and any(
        dotted(t) == name for t in a.targets)]
    model = set(f.ddp_wrapped.get(m.rel, {})) | {"model", "self.model", "net", "self.net"}

    def of_model(x):
        return dotted(x) in model or isinstance(x, ast.Call) and x.args and all(dotted(y) in model for y in x.args)
    return bool(binds) and all(isinstance(v, ast.Call) and REGULARISER.search(callee(v)) and any(
        of_model(x) for x in v.args) and all(
        isinstance(x, ast.Constant) or of_model(x) or isinstance(x, ast.Attribute) and root(x) in OPTION_ROOTS
        or isinstance(x, ast.Name) and not BATCHISH.search(x.id)  # (a schedule's scalar: AtomNAS's `rho`)
        for x in [*v.args, *(k.value for k in v.keywords)]) for v in binds)


OPTION_ROOTS = {"FLAGS", "args", "cfg", "config", "opt", "opts", "hparams"}
# what a function of the weights alone is called (not `train_one_epoch(model)`, which returns a batch loss)
REGULARISER = re.compile(r"l1|l2|regulari|decay|penalt|sparsit|orthogonal", re.I)
BATCHISH = re.compile(r"input|target|image|img|label|batch|data|output|logit|pred|feat|emb|loss|^[xyzqk]\d*$", re.I)
