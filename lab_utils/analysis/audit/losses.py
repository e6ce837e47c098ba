"""What a logged name holds: the loss function rather than a loss value, the name a loss was copied from, a value
that is already the global batch's because every caller of the logging function hands it one, or a loss carried
into the log by a record, a meter, a helper's return or an instance attribute. The logging rules ask this before
they call a log rank 0's own loss."""

from __future__ import annotations

import ast
import re

from .facts import Facts
from .gathers import global_model_losses
from .project import Module
from .syntax import (
    LOSSISH,
    NOT_A_LOSS,
    REDUCEISH,
    callee,
    const_str,
    dotted,
    rank_reducing_name,
    root,
    walk,
)
from .whole_sets import whole_set_values


def handed_global(f: Facts, m: Module, scope: ast.AST, name: str, depth: int = 2) -> bool:
    """`name` is a parameter of the logging function (arcface's CallBackLogging.__call__(step, loss, ...)) and
    every project caller hands it a value that is already the global batch's there: reduced over ranks, the loss
    of a model that gathers every rank's features, or a value every rank computed over a whole set (Side-output
    U2's v_loss from evaluate_epoch over an unsharded loader), there or in the callers' own callers."""
    if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    params = [a.arg for a in scope.args.args]
    if name not in params:  # a text built from such parameters (`msg = "Loss %.4f" % loss.avg`), also through a
        # meter this function feeds one (HaGRID's `self.loss_averager.update(loss)`, `log_str += f"{...value}"`)
        built = [a.value for a in walk(scope) if isinstance(a, (ast.Assign, ast.AugAssign)) and name in {
            dotted(t) for t in (a.targets if isinstance(a, ast.Assign) else [a.target])}]
        fed = {dotted(c.func.value): root(c.args[0]) for c in walk(scope) if isinstance(c, ast.Call) and isinstance(
            c.func, ast.Attribute) and c.func.attr in ("update", "append") and c.args}
        reads = {root(n) for v in built for n in ast.walk(v) if isinstance(n, (ast.Name, ast.Attribute))}
        lossy = {r for r in reads | {fed[r] for r in reads if r in fed} if r in params and LOSSISH.search(r)}
        return bool(built) and bool(lossy) and all(handed_global(f, m, scope, r, depth) for r in lossy)
    i = params.index(name) - (1 if params[0] in ("self", "cls") else 0)
    sites = f.p.callers(m, scope)
    defaults, handed = len(scope.args.defaults), 0
    for cm, c in sites:
        given = next((k.value for k in c.keywords if k.arg == name), c.args[i] if 0 <= i < len(c.args) else None)
        if given is None and params.index(name) >= len(params) - defaults:
            continue  # not handed: the default (HaGRID's evaluation calls, `loss: float = None`)
        if isinstance(given, ast.Dict) and not given.keys or isinstance(given, (ast.List, ast.Tuple)) and not \
                given.elts or isinstance(given, ast.Constant) and given.value is None:
            continue  # an empty record or None carries no loss (FSRE-Depth's `self.log("train", inputs, outputs, {})`)
        cs, handed = cm.enclosing(c) or cm.tree, handed + 1
        if given is None or root(given) not in global_model_losses(f, cm, cs) | f.reduced_names(cm, cs) | \
                whole_set_values(f, cm, cs) and not (depth and isinstance(given, ast.Name) and handed_global(
                    f, cm, cs, given.id, depth - 1)):
            return False
    return handed > 0


def returned_reduced(f: Facts, m: Module, scope: ast.AST, name: str, depth: int = 2) -> bool:
    """Every binding of `name` in `scope` holds what a project function returns after reducing it over ranks
    (`val_loss, val_cer, val_wer = test(...)`, whose test() runs `meters.sync()`, an all_reduce, before `return
    meters.avg_loss, ...`: gtn_applications), or is computed from such names and constants (`min_val_loss =
    min(val_loss, min_val_loss)`)."""
    binds = [a for a in walk(scope) if isinstance(a, ast.Assign) and name in assigned_roots(a)]
    if not binds or depth < 0:
        return False
    found = False
    for a in binds:
        targets = (f.p.resolve(m, a.value, exact=True) or f.one_method(a.value)) if isinstance(
            a.value, ast.Call) else []
        # (`num_updates, loss_mean, eta = self.method.train_one_epoch(...)`, OpenSTL: the returned tuple's slot)
        slot = next((i for t in a.targets if isinstance(t, (ast.Tuple, ast.List)) for i, e in enumerate(t.elts)
                     if root(e) == name), None)
        if targets:
            if not all(returns_reduced(f, tm, tf, slot) for tm, tf in targets):
                return False
            found = True
            continue
        reads = {root(n) for n in ast.walk(a.value) if isinstance(n, (ast.Name, ast.Attribute))} - {name, ""}
        lossy = {r for r in reads if LOSSISH.search(r) and not NOT_A_LOSS.search(r)}
        if not all(returned_reduced(f, m, scope, r, depth - 1) for r in lossy):
            return False
        found |= bool(lossy)
    return found


def backwarded(scope: ast.AST) -> set[str]:
    """Names a backward runs from in `scope`, whatever they are called: `errorE.backward()` (SMI-SSED's
    LossE/LossD), `scaler.scale(err).backward()`, `accelerator.backward(err)`: each one is a loss."""
    out = set()
    for c in walk(scope):
        if not (isinstance(c, ast.Call) and callee(c) == "backward" and isinstance(c.func, ast.Attribute)):
            continue
        held = c.func.value
        if isinstance(held, ast.Call) and callee(held) == "scale" and held.args:
            held = held.args[0]
        elif isinstance(held, ast.Name) and c.args and held.id not in ("torch",):
            held = c.args[0]  # accelerator.backward(loss)
        if isinstance(held, ast.Subscript) and LOSSISH.search(const_str(held.slice) or ""):
            held = held.value  # `output['total_loss'].backward()` (slr_handshape): the record that holds the loss
        if isinstance(held, (ast.Name, ast.Attribute)) and not NOT_A_LOSS.search(dotted(held)):
            out.add(root(held))
    return out - {""}


def loss_terms(scope: ast.AST, losses: set[str]) -> set[str]:
    """The terms a backwarded loss is summed from, each computed by a criterion (AdaBins' `l_dense =
    criterion_ueff(...)`, `l_chamfer = criterion_bins(...)`, `loss = l_dense + args.w_chamfer * l_chamfer`): each is
    a loss of the micro-batch, whatever it is called."""
    made = {t.id for a in walk(scope) if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call)
            and re.search(r"crit|loss|objective", dotted(a.value.func), re.I) for t in a.targets
            if isinstance(t, ast.Name)}
    terms = {n.id for a in walk(scope) if isinstance(a, ast.Assign) and isinstance(a.value, ast.BinOp)
             and any(dotted(t) in losses for t in a.targets)
             for n in ast.walk(a.value) if isinstance(n, ast.Name) and n.id in made}
    # ... or added into it by name, however made (HCFlow's `l_g_total += nll`, nll the flow's own output)
    terms |= {a.value.id for a in walk(scope) if isinstance(a, ast.AugAssign) and isinstance(a.op, ast.Add)
              and dotted(a.target) in losses and isinstance(a.value, ast.Name)}
    return terms | _statistics_of_feeders(scope, losses)


def _statistics_of_feeders(scope: ast.AST, losses: set[str]) -> set[str]:
    """Names bound from one loss-named value that the backwarded loss is computed from, and nothing else (MPP's
    `loss = raw_loss.mean() / accum`, then `log_nrmse = raw_loss.sqrt().mean()`, printed): a statistic of the
    micro-batch's own loss, whatever it is called."""
    feeders = {n.id for a in walk(scope) if isinstance(a, ast.Assign) and any(dotted(t) in losses for t in a.targets)
               for n in ast.walk(a.value) if isinstance(n, ast.Name) and LOSSISH.search(n.id)
               and not NOT_A_LOSS.search(n.id)} - set(losses)
    out = set()
    for a in walk(scope) if feeders else []:
        if isinstance(a, ast.Assign) and len(a.targets) == 1 and isinstance(a.targets[0], ast.Name):
            reads = {n.id for n in ast.walk(a.value) if isinstance(n, ast.Name)}
            if len(reads) == 1 and reads <= feeders and all(isinstance(n, (  # (methods and arithmetic alone)
                    ast.Name, ast.Attribute, ast.Call, ast.BinOp, ast.Constant, ast.expr_context, ast.operator))
                    for n in ast.walk(a.value)):
                out.add(a.targets[0].id)
    return out


def returns_reduced(f: Facts, m: Module, fn: ast.AST, slot: int | None = None) -> bool:
    """Every return of `fn` (its tuple's `slot` when given) reads only names reduced over ranks before it: a
    collective on them, or a reducing method (`meters.sync()`) called on them."""
    rets = [r.value for r in walk(fn) if isinstance(r, ast.Return) and r.value is not None]
    if slot is not None and rets and all(isinstance(r, ast.Tuple) and len(r.elts) > slot for r in rets):
        rets = [r.elts[slot] for r in rets]
    synced = {root(c.func.value) for c in walk(fn) if isinstance(c, ast.Call) and isinstance(
        c.func, ast.Attribute) and REDUCEISH.search(c.func.attr)} | f.reduced_names(m, fn)
    reads = [{root(n) for n in ast.walk(r) if isinstance(n, (ast.Name, ast.Attribute))} - {""} for r in rets]
    return bool(rets) and all(rd and rd <= synced for rd in reads)


def holds_a_loss_module(m: Module, scope: ast.AST, c: ast.Call, name: str) -> bool:
    """At the log `c`, `name` still holds the loss function its last binding built (`loss =
    LOSS_DICT[name].cuda(gpu)`, then `print("{} Loss Generated".format(loss))`, CurricularFace): no loss value.
    A rebinding inside a loop around the log (`loss = criterion(out, y)`) would reach it."""
    binds = [a for a in walk(scope) if isinstance(a, ast.Assign) and a.lineno < c.lineno
             and any(isinstance(t, ast.Name) and t.id == name for t in a.targets)]
    if not binds:
        return False
    v = max(binds, key=lambda a: a.lineno).value
    while isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr in ("cuda", "to"):
        v = v.func.value
    if isinstance(v, ast.Subscript) and isinstance(v.value, ast.Name):  # LOSS_DICT[cfg['LOSS_NAME']]
        table = v.value.id
        v = next((d.value.values[0] for d in walk(scope) if isinstance(d, ast.Assign) and isinstance(
            d.value, ast.Dict) and d.value.values and any(dotted(t) == table for t in d.targets)), v)
    n = m.parent.get(id(c))
    while n is not None and n is not scope:
        if isinstance(n, (ast.For, ast.While)) and any(isinstance(a, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in a.targets) for a in ast.walk(n)):
            return False
        n = m.parent.get(id(n))
    return loss_module(v)


def origins(scope: ast.AST, lossy) -> set[str]:
    """Each logged name, or the name it was copied from (`epoch_loss = losses.avg`): one loss, one finding."""
    copied = {dotted(a.targets[0]): root(a.value) for a in walk(scope) if isinstance(a, ast.Assign)
              and len(a.targets) == 1 and isinstance(a.targets[0], ast.Name)
              and isinstance(a.value, (ast.Name, ast.Attribute))}
    return {copied.get(n) or n for n in lossy}


def loss_roots(scope: ast.AST, lossy) -> set[str]:
    """origins(), and through sums and averages to the loss a backward ran from: SegVol's `loss_step_avg +=
    loss.item()`, then `epoch_loss += loss_step_avg`, are one loss with `loss` (one defect, one finding)."""
    bw = backwarded(scope)
    steps: dict[str, set[str]] = {}
    for a in walk(scope):
        if isinstance(a, (ast.Assign, ast.AugAssign)) and a.value is not None:
            reads = {root(n) for n in ast.walk(a.value) if isinstance(n, (ast.Name, ast.Attribute))} - {""}
            for t in (a.targets if isinstance(a, ast.Assign) else [a.target]):
                steps.setdefault(root(t), set()).update(reads)
    out = set()
    for n in origins(scope, lossy):
        seen, todo = {n}, [n]
        for _ in range(4):
            todo = [y for x in todo for y in steps.get(x, ()) if y not in seen]
            seen |= set(todo)
        hit = seen & bw
        out |= hit if len(hit) == 1 else {n}
    return out


def loss_module(v: ast.AST) -> bool:
    """A loss function being built (`criterion["stft"] = MultiResolutionSTFTLoss(...)`): no loss value."""
    return isinstance(v, ast.Call) and callee(v)[:1].isupper() and LOSSISH.search(callee(v)) is not None


def loaded_from_a_checkpoint(f: Facts, m: Module, scope: ast.AST, c: ast.Call, name: str) -> bool:
    """Before the log `c`, `name` is only assigned what a project function that torch.loads a checkpoint returns
    (`ep_start, performance_desc = misc.load_checkpoint(...)`, SparK's "PT already done" print): a value this run
    read back, not a loss it computed."""
    binds = [a for a in walk(scope) if isinstance(a, ast.Assign) and a.lineno < c.lineno and name in {
        dotted(x) for t in a.targets for x in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])}]
    loaded = {dotted(t) for a in walk(scope) if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call)
              and callee(a.value) == "load" and "torch" in dotted(a.value.func) for t in a.targets}
    # (or read off what torch.load returned: SimpleAICV's `best_metric, test_loss, lr = checkpoint['best_metric'],
    # checkpoint['test_loss'], checkpoint['lr']` for its resume message)
    def read_off(a: ast.Assign) -> bool:  # (its starting `test_loss = 0` aside)
        return loaded and any(isinstance(v, ast.Subscript) and dotted(v.value) in loaded for v in _values(a)) and all(
            isinstance(v, ast.Constant) or isinstance(v, ast.Subscript) and dotted(v.value) in loaded
            for v in _values(a))
    return bool(binds) and all(isinstance(a.value, ast.Call) and any(
        f.p.function_does(tm, tf, lambda mm, cc: callee(cc) == "load" and "torch" in dotted(cc.func), 1)
        for tm, tf in f.p.resolve(m, a.value)) or read_off(a) or isinstance(a.value, (ast.Constant, ast.Tuple))
        and all(isinstance(v, ast.Constant) for v in _values(a)) for a in binds) and any(
        isinstance(a.value, ast.Call) or read_off(a) for a in binds)


def _values(a: ast.Assign) -> list:
    return a.value.elts if isinstance(a.value, ast.Tuple) else [a.value]


LABELISH = ("target", "label", "labels", "targets", "y", "gt")


def over_gathered_labels(m: Module, scope: ast.AST) -> set[str]:
    """Losses computed over every rank's labels: `target = ts.distributed.gather(target, dim=0)` then `loss_id,
    loss_g, one_hot = criterion(output, target, x_norm)` (MagFace's model-parallel classifier): the loss covers the
    global batch on every rank, so rank 0's value is the run's. Names assigned from a call handed the gathered
    labels, and sums of them (`loss = loss_id + lam * loss_g`)."""
    gathered = {dotted(t) for a in walk(scope) if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call)
                and "gather" in callee(a.value) and "dist" in dotted(a.value.func) and a.value.args
                and dotted(a.value.args[0]).split(".")[-1] in LABELISH for t in a.targets}
    if not gathered:
        return set()
    out: set[str] = set()
    for _ in range(2):
        for a in walk(scope):
            if not isinstance(a, ast.Assign):
                continue
            reads = {dotted(n) for n in ast.walk(a.value) if isinstance(n, (ast.Name, ast.Attribute))}
            handed = isinstance(a.value, ast.Call) and reads & gathered
            summed = isinstance(a.value, ast.BinOp) and any(LOSSISH.search(r) for r in reads) and all(
                r in out for r in reads if LOSSISH.search(r))
            if handed or summed:
                out |= {dotted(x) for t in a.targets for x in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])}
    return out


def every_loss_over_gathered_labels(m: Module, scope: ast.AST) -> bool:
    """Every loss the function computes (a loss-named result of a call, or a sum of such) is over every rank's
    labels (over_gathered_labels): so is each meter or record fed from them."""
    over = over_gathered_labels(m, scope)
    computed = {dotted(x) for a in walk(scope) if isinstance(a, ast.Assign) and isinstance(
        a.value, (ast.Call, ast.BinOp)) for t in a.targets
        for x in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])
        if LOSSISH.search(dotted(x)) and not (isinstance(a.value, ast.Call) and (
            callee(a.value) in ("item", "float") or callee(a.value)[:1].isupper()))}  # (a meter: AverageMeter(...))
    return bool(over) and bool(computed) and computed <= over


# which names in a logging scope carry a loss value: packed into records, returned by helpers, fed to meters


def text_of(v: ast.AST) -> bool:
    """A string built from values: an f-string, `'...'.format(...)`, `'...' % (...)`; or a list of them (EDM's
    status line, `fields += [f"loss {loss.mean().item():<9.3f}"]`, printed as `' '.join(fields)`)."""
    if isinstance(v, (ast.List, ast.Tuple)) and v.elts:
        return all(map(text_of, v.elts))
    return isinstance(v, ast.JoinedStr) or isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and \
        v.func.attr in ("format", "join") and isinstance(v.func.value, ast.Constant) or isinstance(v, ast.BinOp) and \
        isinstance(v.op, ast.Mod) and isinstance(v.left, ast.Constant) and isinstance(v.left.value, str)


def assigned_roots(a: ast.Assign) -> set[str]:
    """The names an assignment binds, tuple targets unpacked."""
    return {root(e) for t in a.targets for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])} - {""}


def packed_losses(scope: ast.AST, names: set[str]) -> set[str]:
    """Losses packed into a record that is then logged: `stats = dict(epoch=epoch, loss=loss.item())` ...
    `print(json.dumps(stats))`; the loss values' own names."""
    out = set()
    for a in walk(scope):
        if not (isinstance(a, ast.Assign) and any(dotted(t) in names for t in a.targets)
                and isinstance(a.value, (ast.Call, ast.Dict))):
            continue
        v = a.value
        if isinstance(v, ast.Dict):  # {"loss": loss.item(), ...}; a **spread has no key
            pairs = [(const_str(k), val) for k, val in zip(v.keys, v.values, strict=True)]
        else:  # dict(loss=loss.item(), ...)
            pairs = [(k.arg, k.value) for k in v.keywords] if callee(v) == "dict" else []
        for key, val in pairs:
            if key and LOSSISH.search(key) and not NOT_A_LOSS.search(key):
                out |= {root(n) for n in ast.walk(val) if isinstance(n, (ast.Name, ast.Attribute))
                        and LOSSISH.search(root(n)) and not NOT_A_LOSS.search(root(n))}  # (not VoiceprintRecognition's
                # `"loss": use_loss`, the loss's name from the config)
    return out


def holding_a_loss(fn: ast.AST) -> set[str]:
    """Names in fn that hold a loss: named so, or fed from one (`acc += loss.item()`), to a fixpoint. A parameter
    whose default is True or False is a switch named for a loss (RF-DETR's populate_args(aux_loss=True,
    use_varifocal_loss=False, ...)), not one."""
    args = getattr(fn, "args", None)
    switches = {a.arg for a, d in zip(args.args[len(args.args) - len(args.defaults):], args.defaults, strict=True)
                if isinstance(d, ast.Constant) and isinstance(d.value, bool)} if args is not None else set()
    held = {root(n) for n in walk(fn) if isinstance(n, (ast.Name, ast.Attribute))
            and LOSSISH.search(root(n)) and not NOT_A_LOSS.search(root(n)) and root(n) not in switches}
    assigns = [a for a in walk(fn) if isinstance(a, (ast.Assign, ast.AugAssign)) and a.value is not None]
    for _ in range(3):
        for a in assigns:
            if any(isinstance(n, (ast.Name, ast.Attribute)) and root(n) in held for n in ast.walk(a.value)):
                held |= {root(t) for t in (a.targets if isinstance(a, ast.Assign) else [a.target])} - {""}
    return held


def keys_or_tags(values: list, log: ast.Call | None = None) -> set[str]:
    """Names the logged values read only as a key or a text: `losses_meter[key]`, `key + '_loss_train'` (ESTRNN's
    `for key in losses_name:` loop over the losses' names), a writer's tag (`writer.add_scalar(k, avg_loss,
    step)`, DiffMoE): a string in the log, never a loss's value."""
    parents = {id(k): n for v in values for n in ast.walk(v) for k in ast.iter_child_nodes(n)}
    tag = log.args[0] if log is not None and callee(log) in ("add_scalar", "add_scalars") and log.args else None

    def key_or_tag(x: ast.Name) -> bool:
        if x is tag:
            return True
        up = parents.get(id(x))
        texts = isinstance(up, ast.BinOp) and isinstance(up.op, ast.Add) and (up.left, up.right)
        return isinstance(up, ast.Subscript) and up.slice is x or bool(texts) and any(
            isinstance(o, ast.Constant) and isinstance(o.value, str) for o in texts)
    reads = [n for v in values for n in ast.walk(v) if isinstance(n, ast.Name)]
    return {n.id for n in reads} - {n.id for n in reads if not key_or_tag(n)}


def looped_losses(m: Module, c: ast.Call, names: set[str]) -> set[str]:
    """Losses logged one by one from their container: `for k, v in loss_meter.items(): writer.add_scalar(k,
    v.latest)`; the container's name stands for the logged values (so a reduced container still counts as
    reduced). Only a loop around the log or a comprehension inside it: elsewhere the same name (`name`) is
    another variable."""
    out = set()
    loops, n = [x for x in ast.walk(c) if isinstance(x, ast.comprehension)], m.parent.get(id(c))
    while n is not None and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        loops += [n] if isinstance(n, ast.For) else []
        n = m.parent.get(id(n))
    for loop in loops:
        if not (isinstance(loop, (ast.For, ast.comprehension))
                and {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)} & names):
            continue
        out |= {root(n) for n in ast.walk(loop.iter) if isinstance(n, (ast.Name, ast.Attribute))
                and LOSSISH.search(root(n)) and not NOT_A_LOSS.search(root(n))}
    return out


STATISH = re.compile(r"stat|log|info|metric|summar", re.I)


def instance_losses(f: Facts, m: Module, scope: ast.AST) -> set[str]:
    """`self.` attributes the method's class sets from its own unreduced loss in some method (`self.d_loss =
    float(total_disc_loss.item() / n)` in the step, printed by print_log): the step's loss, held on the
    instance."""
    cls = m.class_of(scope) if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
    kept = f.cache.setdefault("instance_losses", {})  # (per class: each of its methods' logs asks)
    if (m.rel, cls) in kept:
        return set(kept[(m.rel, cls)])
    out: set[str] = set()
    kept[(m.rel, cls)] = out
    for fn in (m.functions[k] for k in m.functions if cls and k.startswith(cls + ".")):
        held, red = holding_a_loss(fn), f.reduced_names(m, fn)
        for a in walk(fn):
            if isinstance(a, ast.Assign) and any(dotted(t).startswith("self.") for t in a.targets) and any(
                    isinstance(n, (ast.Name, ast.Attribute)) and root(n) in held and root(n) not in red
                    for n in ast.walk(a.value)) and not any(
                    isinstance(n, ast.Call) and rank_reducing_name(n) for n in ast.walk(a.value)):
                out |= {dotted(t) for t in a.targets if dotted(t).startswith("self.")}
    return set(out)


def walked_from(scope: ast.AST, records: set[str]) -> set[str]:
    """The names a loop or comprehension takes out of one of `records` (`for k, v in track_losses.items()`):
    what they hold came from the record (UniDepth logs `{f"Train/{k}": v ...}` after aggregate_sync_losses)."""
    out = set()
    for n in walk(scope):
        if isinstance(n, (ast.For, ast.comprehension)) and isinstance(n.iter, ast.Call) and isinstance(
                n.iter.func, ast.Attribute) and n.iter.func.attr in ("items", "values") and dotted(
                    n.iter.func.value) in records:
            out |= {x.id for x in ast.walk(n.target) if isinstance(x, ast.Name)}
    return out
