"""Where a loss is kept after its step (for loss_logs.py and the logging rules): the meters, records and texts
a loss is fed into (loss_carriers), the instance's records other methods fill (instance_carriers), and whether a
record still holds a loss where a log reads it (still_fed)."""

from __future__ import annotations

import ast
import re

from .losses import STATISH, loss_module, text_of
from .project import Module
from .syntax import (
    LOSSISH,
    NOT_A_LOSS,
    a_loss_value,
    const_str,
    dotted,
    root,
    walk,
)


def _rebound_to_constants(binds: dict, name: str, line: int) -> bool:
    """The last assignment of `name` before `line` binds a literal of constants (UniMatch's `metrics = ['abs_rel',
    'sq_rel', ...]` after `metrics` held the step's losses): what is built from it there holds no loss. `binds`:
    name -> the scope's plain assignments to it."""
    before = [a for a in binds.get(name, ()) if a.lineno < line]
    last = max(before, key=lambda a: a.lineno).value if before else None
    return isinstance(last, (ast.List, ast.Tuple, ast.Set)) and all(isinstance(e, ast.Constant) for e in last.elts)


def loss_carriers(scope: ast.AST, seed: frozenset = frozenset()) -> set[str]:
    """Meters and records a loss is fed into, whatever their names: `meter.update(loss.item(), n)`,
    `metric_logger.update(loss=loss_value)`, `history.append(loss.item())`; logging them logs the loss. `seed`:
    the instance's records that other methods feed (`self.stats[k].append(loss.item())`)."""
    out = set(seed)
    binds: dict = {}
    for a in walk(scope):
        if isinstance(a, ast.Assign):
            for t in a.targets:
                if isinstance(t, ast.Name):
                    binds.setdefault(t.id, []).append(a)
    out |= _fed_records(scope, out)
    out |= {a.target.id for a in walk(scope) if isinstance(a, ast.AugAssign) and isinstance(a.target, ast.Name)
            and isinstance(a.op, ast.Add) and a_loss_value(a.value)}
    out |= {dotted(a.target.value) for a in walk(scope) if isinstance(a, ast.AugAssign) and isinstance(
        a.target, ast.Subscript) and isinstance(a.op, ast.Add) and a_loss_value(a.value)} - {""}  # (KAN-TTS's
    # `self.total_train_loss["train/..._loss"] += sc_loss.item()`)
    # ... and a running sum of it, whatever its name (`total += loss.item()`, printed as `total / len(loader)`)
    # a record filled by key: `scalars_to_log['level_0/loss'] = rgb_loss.item()` (NeRF++), logged key by key
    for a in walk(scope):
        if isinstance(a, ast.Assign) and any(isinstance(t, ast.Subscript) for t in a.targets) and any(
                LOSSISH.search(root(n)) and not NOT_A_LOSS.search(root(n)) for n in ast.walk(a.value)
                if isinstance(n, (ast.Name, ast.Attribute))) and not loss_module(a.value):
            out |= {root(t.value) for t in a.targets if isinstance(t, ast.Subscript)
                    and not NOT_A_LOSS.search(root(t.value)) and not OPTIONS.fullmatch(root(t.value))}
            # (not the options namespace a record hangs off: RobustNet's `args.best_record[...]['val_loss'] = ...`
            # makes no loss of `args`, nor of everything built from it)
    out |= _texts_of_losses(scope, out)
    # a holder built from a meter prints what the meter holds: `progress = ProgressMeter(n, [batch_time,
    # losses, top1])` ... `progress.display(i)`; so does a list of the losses (`data = [('G', self.g_loss), ...]`),
    # the statistics returned beside the loss (`loss, stats = self.actor(data)`, OSTrack), and the values a loop
    # takes out of a record (`for name, val in self.stats[split].items():`)
    for _ in range(2):
        for a in walk(scope):
            if isinstance(a, ast.Assign) and isinstance(a.targets[0], ast.Tuple):
                names = [e.id for e in a.targets[0].elts if isinstance(e, ast.Name)]
                if any(LOSSISH.search(n) and not NOT_A_LOSS.search(n) for n in names):
                    out |= {n for n in names if STATISH.search(n)}
            if isinstance(a, (ast.For, ast.comprehension)) and root(a.iter) in out - {""}:
                out |= _values_taken(a)
            if isinstance(a, ast.Assign) and isinstance(a.value, (ast.List, ast.Tuple)) and any(
                    isinstance(n, (ast.Name, ast.Attribute)) and (root(n) in out or LOSSISH.search(root(n)) and
                                                                  not NOT_A_LOSS.search(root(n)))
                    for n in ast.walk(a.value)):
                out |= {dotted(t) for t in a.targets} - {""}
            if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and any(
                    isinstance(n, ast.Name) and n.id in out and not _an_option_read(arg, n)
                    for arg in [*a.value.args, *[k.value for k in a.value.keywords]] for n in ast.walk(arg)):
                out |= {dotted(t) for t in a.targets} - {""}
            # a record built from a carrier (`log_dict = {k: self.metrics[k]["metric"] for k in self.metrics}`), or
            # one a helper files the loss into under its name (`self.metrics = evaluator.update("loss",
            # loss.item(), self.metrics)`, Equiformer/OCP)
            if isinstance(a, ast.Assign) and (isinstance(a.value, (ast.DictComp, ast.ListComp, ast.Dict)) and any(
                    isinstance(n, (ast.Name, ast.Attribute)) and root(n) in out - {""}
                    and not _rebound_to_constants(binds, root(n), a.lineno) for n in ast.walk(a.value))
                    or _filed_under_loss(a.value)):
                out |= {dotted(t) for t in a.targets} - {""}
        out |= _fed_records(scope, out)
    return (out | _texts_of_losses(scope, out)) - {""}


OPTIONS = re.compile(r"args|opts?|cfg|config|hparams|params|hp|FLAGS")


def _an_option_read(arg: ast.AST, n: ast.Name) -> bool:
    """`args.max_iter` handed on, where `args` carries a record some helper files a loss into (RobustNet's
    `args.best_record`): the option read is no loss, nor is what the call returns (`i = train(..., args.max_iter)`)."""
    return arg is not n and isinstance(arg, ast.Attribute) and arg.value is n and OPTIONS.fullmatch(
        n.id) is not None and not LOSSISH.search(arg.attr)


def _filed_under_loss(v: ast.AST) -> bool:
    """`evaluator.update("loss", loss.item(), metrics)`: a call handed a loss's name as a string and the loss."""
    if not isinstance(v, ast.Call):
        return False
    args = [*v.args, *[k.value for k in v.keywords]]
    return any(LOSSISH.search(const_str(x) or "") for x in args) and any(
        isinstance(n, (ast.Name, ast.Attribute)) and LOSSISH.search(root(n)) and not NOT_A_LOSS.search(root(n))
        for x in args if const_str(x) is None for n in ast.walk(x))


def _values_taken(loop: ast.AST) -> set[str]:
    """The loop names that hold a record's values: `v` in `for k, v in rec.items()` or `for v in rec.values()`;
    not a key (`for k in rec:`), which names an entry and holds no loss."""
    it = loop.iter
    if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute)):
        return set()
    if it.func.attr == "values":
        return {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    if it.func.attr == "items" and isinstance(loop.target, ast.Tuple) and len(loop.target.elts) == 2:
        return {n.id for n in ast.walk(loop.target.elts[1]) if isinstance(n, ast.Name)}
    return set()


def _fed_records(scope: ast.AST, out: set[str]) -> set[str]:
    """Records fed a loss, or a value taken out of a loss record: `meter.update(loss.item(), n)`,
    `metric_logger.update(loss=loss_value)`, `self.stats[name].update(val)` in `for name, val in
    new_stats.items()`."""
    fed_to = set()
    for c in walk(scope):
        if not (isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and (c.func.attr in (
                "update", "append", "add_", "add", "put", "extend") or re.match(r"(update|record|push)_\w*loss",
                                                                                c.func.attr))):
            continue  # (`recorder.update_loss_stats(loss_stats)`, E2EC: its __str__ prints them)
        fed = [*c.args, *[k.value for k in c.keywords]]
        keys = {k.arg or "" for k in c.keywords}
        if any(LOSSISH.search(k) and not NOT_A_LOSS.search(k) for k in keys) or any(
                LOSSISH.search(root(n)) and not NOT_A_LOSS.search(root(n)) or isinstance(n, ast.Name) and n.id in out
                for v in fed for n in ast.walk(v) if isinstance(n, (ast.Name, ast.Attribute))):
            fed_to.add(root(c.func.value))
    return fed_to


def _texts_of_losses(scope: ast.AST, out: set[str]) -> set[str]:
    """A line of text built from a loss prints it: `log_str += 'loss {:.6f} '.format(loss_dict['loss'])`, or
    from a value a loop took out of a loss record (`print_str += '%s: %.5f' % (name, val.avg)`)."""
    return {dotted(t) for a in walk(scope) if isinstance(a, (ast.Assign, ast.AugAssign)) and text_of(a.value)
            and any(LOSSISH.search(root(n)) and not NOT_A_LOSS.search(root(n)) or root(n) in out
                    for n in ast.walk(a.value) if isinstance(n, (ast.Name, ast.Attribute)))
            for t in (a.targets if isinstance(a, ast.Assign) else [a.target])} - {""}


def instance_carriers(m: Module, scope: ast.AST) -> frozenset:
    """The `self.` records a method's class feeds a loss into anywhere (`self.stats[k].append(loss.item())` in the
    step, printed by print_stats), also through another method it hands a loss record to
    (`self._update_stats(stats, n)`, whose parameter fills `self.stats`)."""
    cls = m.class_of(scope) if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
    if cls is None:
        return frozenset()
    cache = m.__dict__.setdefault("_instance_carriers", {})  # per class: every log in its methods asks again
    if cls not in cache:
        cache[cls] = _instance_carriers(m, cls)
    return cache[cls]


def _instance_carriers(m: Module, cls: str) -> frozenset:
    # (the module's subclasses feed the base's records too: KAN-TTS's GAN_Trainer.train_step fills the
    # `self.total_train_loss` that Trainer.check_log_interval logs)
    subs = [k for k, c in m.classes.items() if any(dotted(b).split(".")[-1] == cls for b in c.bases)]
    methods = {k.split(".", 1)[1]: fn for k, fn in m.functions.items() if k.startswith(cls + ".")}
    methods.update({f"{k}:{name}": fn for name, fn in m.functions.items() for k in subs
                    if name.startswith(k + ".")})
    seeds: dict[str, set[str]] = {name: set() for name in methods}
    found: set[str] = set()
    for _ in range(2):
        for name, fn in methods.items():
            held = loss_carriers(fn, frozenset(seeds[name]) | frozenset(found))
            found |= {n.split("[")[0] for n in held if n.startswith("self.")}  # self.stats[] is self.stats
            for c in walk(fn):  # self.meth(record, ...): the parameter that receives it holds the record
                if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and dotted(c.func.value) == "self" \
                        and c.func.attr in methods:
                    params = [x.arg for x in methods[c.func.attr].args.args][1:]
                    seeds[c.func.attr] |= {params[i] for i, a in enumerate(c.args)
                                           if i < len(params) and root(a) in held}
    return frozenset(found)


def still_fed(scope: ast.AST, c: ast.AST, names: set[str]) -> set[str]:
    """The records in `names` that hold a loss where the log `c` reads them: not one emptied (`disp_text = []`) in
    straight-line code before `c` with nothing loss-like fed into it since (eznlp's disp_running_info logs its
    epoch/step/lr line, then rebinds disp_text and appends the loss), whatever the same name holds later."""
    return {n for n in names if not _emptied_before(scope, c, n) and not _rebound_by_a_loop(scope, c, n)}


def _rebound_by_a_loop(scope: ast.AST, c: ast.AST, name: str) -> bool:
    """A loop around `c` binds `name` from values that name no loss (STARFlow's `for k, v in
    sorted(vars(args).items()): print(f'{k}: {v}')`, though a comprehension elsewhere takes `v` out of loss_dict)."""
    return any(isinstance(f, ast.For) and name in {t.id for t in ast.walk(f.target) if isinstance(t, ast.Name)}
               and any(x is c for x in ast.walk(f)) and any(isinstance(x, ast.Name) and re.fullmatch(
                   r"vars|args|opts?|cfg|config|hparams", x.id) for x in ast.walk(f.iter)) for f in walk(scope))


def _emptied_before(scope: ast.AST, c: ast.AST, name: str) -> bool:
    body = getattr(scope, "body", None)
    if not isinstance(body, list) or not any(s is c or any(x is c for x in ast.walk(s)) for s in body):
        return False
    empty = [s for s in body if isinstance(s, ast.Assign) and s.lineno < c.lineno and any(
        isinstance(t, ast.Name) and t.id == name for t in s.targets) and isinstance(s.value, (
            ast.List, ast.Dict)) and not (s.value.elts if isinstance(s.value, ast.List) else s.value.keys)]
    if not empty:
        return False
    since = empty[-1].lineno
    return not any(isinstance(n, (ast.Name, ast.Attribute)) and root(n) == name and since < n.lineno < c.lineno
                   and isinstance(s, (ast.Expr, ast.AugAssign, ast.Assign)) and any(
                       LOSSISH.search(root(x)) for x in ast.walk(s) if isinstance(x, (ast.Name, ast.Attribute)))
                   for s in walk(scope) if getattr(s, "lineno", 0) and since < s.lineno < c.lineno
                   for n in ast.walk(s))
