"""What a logged name holds when it is no loss by name: what a project function returns when that is its own running
loss (`train_mae = train(...)`, a getter of the losses its class filled), and texts built from a loss (`log_str +=
'{} {:.6f} '.format(name, value)` over a loss record). For loss_logs.py; losses.py holds the
loss facts of one function."""

from __future__ import annotations

import ast

from .facts import Facts
from .losses import assigned_roots, backwarded, holding_a_loss, loss_terms
from .project import Module
from .syntax import LOSSISH, NOT_A_LOSS, callee, const_str, dotted, rank_reducing_name, root, walk


def returned_losses(f: Facts, m: Module, scope: ast.AST, names: set[str]) -> set[str]:
    """Names holding what a project function returns when that is its own running loss: `train_mae =
    train(model, loader, opt)` whose body ends `return loss_accum / (step + 1)` with `loss_accum += loss.item()`
    and no reduction over ranks; the name says nothing, the function's return does."""
    out = set()
    sources = built_from(scope, names)
    asked = set().union(*sources.values()) if sources else set()
    for a in walk(scope):
        if not (isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and assigned_roots(a) & asked):
            continue
        for tm, tf in f.p.resolve(m, a.value, exact=True) or f.one_method(a.value):
            rets = [r.value for r in walk(tf) if isinstance(r, ast.Return) and r.value is not None]
            # a getter (`def get_current_log(self): return self.log_dict`) returns what its class filled elsewhere;
            # only then is a text built from what it returns (KAIR's message, key by key) followed back to it
            getter = _getter(tf)
            holding = _loss_attributes(tm, tf) if getter else holding_a_loss(tf)
            lossy = [r for r in rets if any(isinstance(n, (ast.Name, ast.Attribute)) and root(n) in holding
                                            for n in ast.walk(r)) and not any(
                isinstance(n, ast.Call) and rank_reducing_name(n) for n in ast.walk(r))]  # reduced on return
            if lossy and len(lossy) == len(rets) and not f.reduced_names(tm, tf) & {
                    root(n) for r in rets for n in ast.walk(r) if isinstance(n, (ast.Name, ast.Attribute))}:
                got = _positions_holding(a, rets, holding)
                # (a text that reads a loss off what it returns counts too: UniPhy's `log_msg = f"Loss:
                # {metrics['loss']}"` after `metrics = train_step(...)`, whose dict holds this rank's loss.item())
                out |= {n for n in names if sources[n] & got} if getter else got & names | _texts_reading_loss_of(
                    scope, names, got)
    return out


def _getter(fn: ast.AST) -> bool:
    """A method whose body only returns an attribute of its object (a docstring aside)."""
    body = [b for b in getattr(fn, "body", []) if not (isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant))]
    return len(body) == 1 and isinstance(body[0], ast.Return) and isinstance(body[0].value, ast.Attribute) and \
        dotted(body[0].value.value) == "self"


def built_from(scope: ast.AST, names: set[str]) -> dict[str, set[str]]:
    """Each name with the names its value is built from in `scope`, two steps back: `message += '{}: {:.4e}
    '.format(k, v)` in `for k, v in logs.items():` (KAIR, IRN: the logged message is built from `logs`)."""
    steps = _steps(scope)
    out = {}
    for n in names:
        seen = {n}
        for _ in range(2):
            seen |= {y for x in seen for y in steps.get(x, ())}
        out[n] = seen
    return out


def _steps(scope: ast.AST) -> dict[str, set[str]]:
    """Each name bound in `scope` with the names its values read; kept on the scope node, since every log of a
    function asks it (KataGo's training function holds dozens)."""
    steps = getattr(scope, "_lab_steps", None)
    if steps is not None:
        return steps
    steps = {}
    for a in walk(scope):
        if isinstance(a, (ast.Assign, ast.AugAssign)) and a.value is not None:
            targets, value = (a.targets if isinstance(a, ast.Assign) else [a.target]), a.value
        elif isinstance(a, (ast.For, ast.comprehension)):
            targets, value = [a.target], a.iter
        elif isinstance(a, ast.Call) and isinstance(a.func, ast.Attribute) and a.func.attr in (
                "append", "extend", "insert") and isinstance(a.func.value, ast.Name):
            targets, value = [a.func.value], ast.Tuple(elts=a.args, ctx=ast.Load())  # (`parts.append(f"{loss}")`)
        else:
            continue
        read = {root(n) for n in ast.walk(value) if isinstance(n, (ast.Name, ast.Attribute))} - {""}
        for t in targets:
            for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]):
                steps.setdefault(root(e), set()).update(read)
    scope._lab_steps = steps
    return steps


def _loss_attributes(tm: Module, tf: ast.AST) -> set[str]:
    """The attributes of a method's class that some method fills with a loss, unless a reduction fills them
    (`self.log_dict['l_pix'] = l_pix.item()` in optimize_parameters, returned by `get_current_log`; not BasicSR's
    `self.log_dict = self.reduce_loss_dict(loss_dict)`): what a getter returns of them is this rank's own."""
    cls = tm.class_of(tf)
    if cls is None:
        return set()
    held, reduced = set(), set()
    for k, fn in tm.functions.items():
        if not k.startswith(cls + "."):
            continue
        backward = backwarded(fn)
        terms = backward | loss_terms(fn, backward)  # (IRN's l_forw_fit, a term of the loss it backwards)
        for a in walk(fn):
            if not isinstance(a, ast.Assign):
                continue
            names = {root(t) for t in a.targets if root(t).startswith("self.")}
            if any(isinstance(n, ast.Call) and rank_reducing_name(n) for n in ast.walk(a.value)):
                reduced |= names
            elif any(isinstance(n, (ast.Name, ast.Attribute)) and (LOSSISH.search(root(n)) and not NOT_A_LOSS.search(
                    root(n)) or root(n) in terms) for n in ast.walk(a.value)):
                held |= names
    return held - reduced


def _positions_holding(a: ast.Assign, rets: list, holding: set[str]) -> set[str]:
    """The names `a` binds to the returned positions that hold a loss: `model, criterion = get_model(args)` whose
    `return model, criterion` holds a loss only in criterion (Group-Free-3D); every name when the shapes differ."""
    target = a.targets[0] if len(a.targets) == 1 else None
    if isinstance(target, ast.Tuple) and all(isinstance(r, ast.Tuple) and len(r.elts) == len(target.elts)
                                             for r in rets):
        return {root(t) for i, t in enumerate(target.elts) if any(
            isinstance(n, (ast.Name, ast.Attribute)) and root(n) in holding for r in rets
            for n in ast.walk(r.elts[i]))} - {""}
    return assigned_roots(a)


def _texts_reading_loss_of(scope: ast.AST, names: set[str], records: set[str]) -> set[str]:
    """Names bound from a value that reads a loss key or attribute off one of `records` (`metrics['loss']`)."""
    return {root(t) for a in walk(scope) if isinstance(a, (ast.Assign, ast.AugAssign)) and any(
        isinstance(x, (ast.Subscript, ast.Attribute)) and root(x.value) in records and (
            LOSSISH.search(const_str(x.slice) or "") if isinstance(x, ast.Subscript) else LOSSISH.search(x.attr))
        for x in ast.walk(a.value)) for t in (a.targets if isinstance(a, ast.Assign) else [a.target])} & names


def reads_a_loss(v: ast.AST) -> bool:
    """v reads a value named as a loss: `loss_meter.val`, `train_loss`, or a loss key (UniPhy's
    `f"Loss: {metrics['loss']:.4f}"`)."""
    return any(isinstance(x, (ast.Name, ast.Attribute)) and LOSSISH.search(dotted(x).split(".")[-1] or "") or
               isinstance(x, ast.Subscript) and LOSSISH.search(const_str(x.slice) or "") for x in ast.walk(v))


def texts_of_losses(scope: ast.AST, names: set[str], carriers: set[str] = frozenset()) -> set[str]:
    """Texts built from a loss within two steps: CosyVoice's `for name, value in loss_dict.items(): log_str +=
    '{} {:.6f} '.format(name, value)`, then `logging.debug(log_str)`. Only names some statement builds from a
    string (a literal, an f-string, a format). A text built from a local meter fed the loss stands for the meter
    (UnSAMFlow's `istr = ... + " Info {}".format(key_meters)`): the meter's name is returned, to be judged (an
    object's meter, `self.avg` fed a parameter, is judged through the callers that hand the loss)."""
    texts, records, handed = _text_facts(scope)
    sources = built_from(scope, names & texts)
    # (formatted whole, `.format(key_meters)` or f"{key_meters}": its own text; not a field read off it,
    # Contriever's `run_stats.average_stats`, which its property reduces)
    whole, bound = _formatted_and_bound(scope)
    # (a text bound once: SimpleAICV's `log_info`, rebound for the config, the losses and the metrics, is judged
    # line by line elsewhere)
    return {n for n, src in sources.items() if src & records} | (names & texts & handed) | {
        x for n, src in sources.items() if bound.get(n) == 1 for x in src & set(carriers) & whole}


def _formatted_and_bound(scope: ast.AST) -> tuple[set[str], dict[str, int]]:
    """(names formatted whole into a text, how many times each name is bound) in the scope, kept on its node: a
    function with many logs asks once (YANMTT's training loop)."""
    kept = getattr(scope, "_lab_formatted", None)
    if kept is None:
        whole, bound = set(), {}
        for n in walk(scope):
            for a in (n.args if isinstance(n, ast.Call) and callee(n) == "format" else [n.value] if isinstance(
                    n, ast.FormattedValue) else []):
                if isinstance(a, ast.Name):
                    whole.add(a.id)
            if isinstance(n, (ast.Assign, ast.AugAssign)):
                for t in {root(t) for t in (n.targets if isinstance(n, ast.Assign) else [n.target])}:
                    bound[t] = bound.get(t, 0) + 1
        kept = scope._lab_formatted = (whole, bound)
    return kept


def _text_facts(scope: ast.AST) -> tuple[set[str], set[str], set[str]]:
    """texts_of_losses' questions that do not depend on the log: asked once per function, kept on its node."""
    kept = getattr(scope, "_lab_texts", None)
    if kept is not None:
        return kept

    def texty(v):  # a literal, an f-string, a format or join, or a sum or % of them (not a key's string)
        return isinstance(v, ast.JoinedStr) or isinstance(v, ast.Constant) and isinstance(v.value, str) or \
            isinstance(v, ast.Call) and callee(v) in ("format", "join") or \
            isinstance(v, ast.BinOp) and isinstance(v.op, (ast.Add, ast.Mod)) and (texty(v.left) or texty(v.right))
    texts = {root(t) for a in walk(scope) if isinstance(a, (ast.Assign, ast.AugAssign)) and texty(a.value)
             for t in (a.targets if isinstance(a, ast.Assign) else [a.target])}
    # ... from the entries of a loss record walked in a loop (`for k, v in loss_dict.items()`), not from any name
    # two steps back (a text beside a loss is no loss: AdaptiveSpan's span stats, SVoice's replayed history)
    records = {root(n.iter.func.value) for n in walk(scope) if isinstance(n, (ast.For, ast.comprehension))
               and isinstance(n.iter, ast.Call) and isinstance(n.iter.func, ast.Attribute) and n.iter.func.attr in (
                   "items", "values") and LOSSISH.search(root(n.iter.func.value))
               and not NOT_A_LOSS.search(root(n.iter.func.value))}
    # ... or from a call handed a loss record in the text's own statement (Panoptic-DeepLab's `msg +=
    # get_loss_info_str(model.loss_meter_dict)`)
    handed = {root(t) for a in walk(scope) if isinstance(a, (ast.Assign, ast.AugAssign)) and any(
        isinstance(c, ast.Call) and any(isinstance(x, (ast.Name, ast.Attribute)) and LOSSISH.search(
            dotted(x).split(".")[-1]) and not NOT_A_LOSS.search(dotted(x).split(".")[-1]) for x in c.args)
        for c in ast.walk(a.value)) for t in (a.targets if isinstance(a, ast.Assign) else [a.target])}
    scope._lab_texts = (texts, records, handed)
    return scope._lab_texts
