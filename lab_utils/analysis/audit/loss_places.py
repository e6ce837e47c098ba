"""Where a logged loss comes from: the related places of a loss-log finding (rules/logging.py's rank0-local-loss)
that a reader of the log line would point at: the guard that makes it rank 0's, the line that holds the loss in a
log over several lines, the meter updates that feed it, the callers that hand a logging helper its loss."""

from __future__ import annotations

import ast

from .facts import Facts
from .losses import assigned_roots
from .project import Module
from .returned_losses import reads_a_loss
from .syntax import LOSSISH, callee, dotted, root, walk


def rank0_guard(f: Facts, m: Module, c: ast.AST, depth: int = 2) -> tuple:
    """The nearest `if` around the log whose test only rank 0 passes (ParQ's `if is_main_process() and i %
    print_freq == 0:`), in the log's own function."""
    n = m.parent.get(id(c))
    while n is not None and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        if isinstance(n, ast.If) and f.g.classify(m, n.test) == "rank0":
            return ((m, n),)
        n = m.parent.get(id(n))
    # ... or, in a helper only rank 0 calls, the call under its guard (ViPT's `if self.settings.local_rank in [-1,
    # 0]: self._write_tensorboard()`, whose write_epoch logs the stats)
    fn = m.enclosing(c)
    sites = f.p.callers(m, fn) if fn is not None and depth else []
    return tuple(x for cm, call in sites[:1] if f.g.kind(cm, call) == "rank0"
                 for x in ((cm, call), *rank0_guard(f, cm, call, depth - 1)))


def handed_from(f: Facts, m: Module, c: ast.Call, lossy: set[str]) -> tuple:
    """When the logged loss is a parameter of the logging helper (PixelRec's `_add_train_loss_to_tensorboard(self,
    epoch_idx, losses)`), the callers' calls and the lines that bind what they hand in (`train_loss =
    self._train_epoch(...)`): where the unreduced loss comes from, as related places."""
    fn = m.enclosing(c)
    params = [a.arg for a in fn.args.args if a.arg not in ("self", "cls")] if isinstance(
        fn, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
    if not lossy & set(params):
        return ()
    out = []
    for cm, call in f.p.callers(m, fn)[:2]:
        out.append((cm, call))
        given = {root(a) for a in call.args} | {root(k.value) for k in call.keywords}
        scope = cm.enclosing(call) or cm.tree
        out += [(cm, a) for a in walk(scope) if isinstance(a, ast.Assign) and a.lineno < call.lineno
                and assigned_roots(a) & given][:1]
    return tuple(out)


def meter_feeds(f: Facts, c: ast.Call, m: Module | None = None) -> tuple:
    """`self.train_progress.display(i)`: the `self.train_progress.update(meters)` calls that feed the meter its
    loss, in any project class (OpenUnReID's SpCL runner overrides train_step, where it feeds the loss), as
    related places: where the unreduced loss goes in."""
    if m is not None and isinstance(c.func, ast.Attribute) and isinstance(c.func.value, ast.Name):
        return _handed_meter_feeds(f, m, c, c.func.value.id)
    if not (isinstance(c.func, ast.Attribute) and isinstance(c.func.value, ast.Attribute)):
        return ()
    held = dotted(c.func.value)
    feeds = [(mm, u) for mm in f.p.modules.values() for u in mm.calls if isinstance(u.func, ast.Attribute)
             and u.func.attr == "update" and dotted(u.func.value) == held and u.args
             and isinstance(u.args[0], ast.Name)]
    return tuple(sorted(feeds, key=lambda x: not x[0].entry)[:3])  # the script's own subclass first


def _handed_meter_feeds(f: Facts, m: Module, c: ast.Call, meter: str) -> tuple:
    """A local meter the logging function hands to a step method (OBoW's `self.train_step(mini_batch,
    metric_logger)`, which the run's subclass overrides): the step's `metric_logger["loss_crop"].update(losses[0],
    ...)` lines that feed it a loss, as related places."""
    scope = m.enclosing(c)
    out = []
    for call in (x for x in walk(scope) if isinstance(x, ast.Call) and x is not c) if scope is not None else ():
        slots = [i for i, a in enumerate(call.args) if isinstance(a, ast.Name) and a.id == meter]
        slots += [k.arg for k in call.keywords if isinstance(k.value, ast.Name) and k.value.id == meter]
        for tm, tf in f.p.resolve(m, call) if slots else []:
            params = [a.arg for a in tf.args.args]
            params = params[1:] if params and params[0] in ("self", "cls") else params
            names = {params[s] if isinstance(s, int) and s < len(params) else s for s in slots} - {None}
            out += [(tm, u) for u in walk(tf) if isinstance(u, ast.Call) and isinstance(u.func, ast.Attribute)
                    and u.func.attr == "update" and root(u.func.value) in names and any(
                        LOSSISH.search(dotted(x) or "") or isinstance(x, ast.Constant) and isinstance(
                            x.value, str) and LOSSISH.search(x.value) for a in [*u.args, u.func.value]
                        for x in ast.walk(a))]
    return tuple(sorted(out, key=lambda x: (not x[0].entry, x[1].lineno))[:3])


def updates_of(m: Module, c: ast.Call, lossy) -> tuple:
    """`loss_meter.update(update_loss.item(), bsz)` earlier in the function that prints `loss_meter` (Re-IQA's
    contrast trainer): where this rank's own loss goes into the meter, as a related place."""
    ups = [u for u in ast.walk(m.enclosing(c) or m.tree) if isinstance(u, ast.Call) and isinstance(
        u.func, ast.Attribute) and u.func.attr == "update" and dotted(u.func.value) in lossy and u.lineno < c.lineno]
    return ((m, min(ups, key=lambda u: u.lineno)),) if ups else ()


def value_lines(m: Module, c: ast.Call, lossy) -> tuple:
    """A log call over several lines (`print(f"Epoch {epoch}, "\n f"Train MAE: {train_mae:.4f}")`): the line
    that holds the loss value, as the finding's related place."""
    names = {n.lineno: n for n in ast.walk(c) if isinstance(n, (ast.Name, ast.Attribute))
             and (dotted(n) in lossy or dotted(n).split(".")[-1] in lossy) and n.lineno != c.lineno}
    scope = m.enclosing(c) or m.tree
    # ... and where the logged value was taken from the loss (llama2.c: `lossf = loss.item() *
    # gradient_accumulation_steps` before the print): the line that makes it this rank's own
    took = [a for a in walk(scope) if isinstance(a, ast.Assign) and a.lineno < c.lineno and a.lineno not in names
            and any(isinstance(t, ast.Name) and t.id in lossy for t in a.targets)
            and any(isinstance(x, ast.Call) and callee(x) == "item" or isinstance(x, ast.Attribute) and x.attr in (
                "avg", "val", "value", "global_avg", "median") for x in ast.walk(a.value))]  # (or a meter, MonoFlex)
    taken = ((m, max(took, key=lambda a: a.lineno)),) if took else ()
    if names:
        return tuple((m, names[line]) for line in sorted(names)[:1]) + taken
    if taken:
        return taken
    # a text that carries the loss (`desc_str += f' | Loss {loss_meter.val:4f}'`, then pbar.set_description(
    # desc_str), VL-T5): the line that put the loss into it
    scope = m.enclosing(c) or m.tree
    built = [a for a in walk(scope) if isinstance(a, (ast.Assign, ast.AugAssign)) and a.lineno < c.lineno
             and any(dotted(t) in lossy for t in (a.targets if isinstance(a, ast.Assign) else [a.target]))
             and (isinstance(a, ast.AugAssign) or reads_a_loss(a.value))]  # (+=: AOT-GAN adds each loss)
    if built:
        reads_loss = [a for a in built if reads_a_loss(a.value)]  # (not the `+= f" [lr] ..."` after it)
        text = max(reads_loss or built, key=lambda a: a.lineno)
        # ... and the line that took the loss it reads off the tensor (landmark-attention's `train_loss =
        # loss.detach().cpu().item()`, then `print_string = f"... loss={train_loss:.3f} ..."`)
        read = {x.id for x in ast.walk(text.value) if isinstance(x, ast.Name) and LOSSISH.search(x.id)}
        took = [a for a in walk(scope) if isinstance(a, ast.Assign) and a.lineno < text.lineno and any(
            isinstance(t, ast.Name) and t.id in read for t in a.targets) and any(
            isinstance(x, ast.Call) and callee(x) == "item" for x in ast.walk(a.value))]
        # (the text's own line that reads the loss, when it runs over several: RangeViT's `log_str += 'LR {} Loss
        # {:0.4f}'.format(\n lr, loss.item(), ...)`)
        at = next((x for x in ast.walk(text.value) if isinstance(x, (ast.Name, ast.Attribute)) and x.lineno !=
                   text.lineno and LOSSISH.search(dotted(x).split(".")[0])), None)
        return ((m, text),) + (((m, at),) if at is not None else ()) + (
            ((m, max(took, key=lambda a: a.lineno)),) if took else ())
    # ... or a record filled key by key (NVIDIA's TinyBERT: `result['loss'] = mean_loss`, then each key logged):
    # the first key that takes a loss
    filled = [a for a in walk(scope) if isinstance(a, ast.Assign) and a.lineno < c.lineno and any(
        isinstance(t, ast.Subscript) and root(t) in lossy for t in a.targets) and any(
        isinstance(x, (ast.Name, ast.Attribute)) and LOSSISH.search(dotted(x).split(".")[-1] or "")
        for x in ast.walk(a.value))]
    return ((m, min(filled, key=lambda a: a.lineno)),) if filled else ()


def rebound(scope: ast.AST, name: str, after: int, before: int) -> bool:
    """`name` is bound anew between the two lines (ST-Adapter's evaluation syncs its metric_logger, then the epoch
    loop makes a fresh `metric_logger = MetricLogger()` it never syncs)."""
    return any(isinstance(a, ast.Assign) and after < a.lineno < before and any(dotted(t) == name for t in a.targets)
               for a in walk(scope))
