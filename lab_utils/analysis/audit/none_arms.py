"""Arms of a None test that no call takes: `def save_model(..., loss_scaler): if loss_scaler is not None: <guarded
save> else: torch.save(...)` (RETFound's util/misc.py, MAE's layout), where every project caller hands
`loss_scaler` an object it built (`loss_scaler = NativeScaler()`): the else arm never runs, so nothing in it is a
finding of the run (registry.run_rules asks it of every finding)."""

from __future__ import annotations

import ast

from .project import Module, Project
from .syntax import callee, kw


def untaken_none_arm(p: Project, m: Module, node: ast.AST) -> bool:
    """`node` sits in the arm of `if P is None:` / `if P is not None:` that runs only when P is None, P a
    parameter of its function that every project caller hands a built object (or a constant other than None); or
    in the arm that runs only when P is set, P a parameter defaulting to None that no caller sets."""
    fn = m.enclosing(node)
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    params = [a.arg for a in fn.args.args]
    child, n = node, m.parent.get(id(node))
    while n is not None and n is not fn:
        if isinstance(n, ast.If) and isinstance(n.test, ast.Compare) and len(n.test.ops) == 1 and isinstance(
                n.test.left, ast.Name) and n.test.left.id in params and isinstance(
                n.test.comparators[0], ast.Constant) and n.test.comparators[0].value is None and isinstance(
                n.test.ops[0], (ast.Is, ast.IsNot)):
            none_arm = n.body if isinstance(n.test.ops[0], ast.Is) else n.orelse
            other = n.orelse if none_arm is n.body else n.body
            if any(child is s for s in none_arm) and _never_none(p, m, fn, n.test.left.id):
                return True
            if any(child is s for s in other) and _always_none(p, m, fn, n.test.left.id):
                return True  # (SEDD's cycle_loader(loader, sampler=None): `if sampler is not None: set_epoch`)
        child, n = n, m.parent.get(id(n))
    return False


def _never_none(p: Project, m: Module, fn: ast.AST, name: str) -> bool:
    """Every project call of `fn` hands `name` a constructor's result (`NativeScaler()`, or a name its function
    binds to one and nothing else) or a constant other than None; not rebound in `fn` itself."""
    if any(isinstance(a, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in a.targets)
           for a in ast.walk(fn)):
        return False
    params = [a.arg for a in fn.args.args]
    i = params.index(name) - (1 if params[:1] in (["self"], ["cls"]) else 0)
    sites = p.callers(m, fn)
    for cm, site in sites:
        given = kw(site, name) or (site.args[i] if 0 <= i < len(site.args) else None)
        if given is None or any(isinstance(a, ast.Starred) for a in site.args):
            return False
        if isinstance(given, ast.Name):
            scope = cm.enclosing(site) or cm.tree
            values = [a.value for a in ast.walk(scope) if isinstance(a, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == given.id for t in a.targets)]
            if not values or not all(_built(v) for v in values):
                return False
        elif not _built(given):
            return False
    return bool(sites)


def _always_none(p: Project, m: Module, fn: ast.AST, name: str) -> bool:
    """`name` defaults to None, no project call of `fn` hands it anything else, and `fn` does not rebind it."""
    args = fn.args.args
    defaults = dict(zip([a.arg for a in args[len(args) - len(fn.args.defaults):]], fn.args.defaults, strict=True))
    if not (isinstance(defaults.get(name), ast.Constant) and defaults[name].value is None) or any(
            isinstance(a, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in a.targets)
            for a in ast.walk(fn)):
        return False
    params = [a.arg for a in args]
    i = params.index(name) - (1 if params[:1] in (["self"], ["cls"]) else 0)
    sites = p.callers(m, fn)
    for _cm, site in sites:
        given = kw(site, name) or (site.args[i] if 0 <= i < len(site.args) else None)
        if any(isinstance(a, ast.Starred) for a in site.args) or any(k.arg is None for k in site.keywords) or (
                given is not None and not (isinstance(given, ast.Constant) and given.value is None)):
            return False
    return bool(sites)


def _built(v: ast.AST) -> bool:
    """A class's constructor (`NativeScaler()`, `torch.cuda.amp.GradScaler()`) or a constant other than None."""
    return isinstance(v, ast.Call) and callee(v)[:1].isupper() or isinstance(v, ast.Constant) and v.value is not None
