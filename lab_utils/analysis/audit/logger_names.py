"""Which logger a name holds, and which loggers every rank gives a console (for consoles.py): `logger =
getLogger("transreid.train")` at the top of a module or a function, a logger a project helper makes and returns
(`logger = get_logger(path)`, whose getLogger(name) with no name is the root), a `logger` parameter every caller
hands such a logger, and the helpers that add a StreamHandler under no rank guard."""

from __future__ import annotations

import ast

from .facts import Facts
from .project import Module
from .syntax import callee, const_str, dotted, kw, walk


def held_logger_name(m: Module, c: ast.Call, name: str, f: Facts | None = None) -> str | None:
    """The logger `name` holds at the log call: `logger = getLogger()` (or getLogger(__name__), whose records
    reach the root's handlers) at the top of the module or in the log's function is the root, "";
    `getLogger("transreid.train")` is that name; with the project, a project helper's logger (baby-llama2's
    `logger = get_logger(path)`, whose `logging.getLogger(name)` gets no name: the root); None when `name` holds
    no logger made there."""
    fn = m.enclosing(c)
    top = [x for s in m.tree.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
           for x in ast.walk(s)]  # (the module's own code, its `__main__` block included)
    for a in [*top, *(walk(fn) if fn is not None else [])]:
        if not (isinstance(a, ast.Assign) and any(dotted(t) == name for t in a.targets) and isinstance(
                a.value, ast.Call)):
            continue
        if callee(a.value) == "getLogger":
            given = const_str(a.value.args[0]) if a.value.args else None
            return given if given else ""
        for _, tf in f.p.resolve(m, a.value) if f is not None else []:
            made = [x.value for x in walk(tf) if isinstance(x, ast.Assign) and isinstance(x.value, ast.Call)
                    and callee(x.value) == "getLogger"]
            if len(made) == 1:
                given = _logger_name_given(tf, made[0], a.value)
                if given is not None:
                    return given
    return None


def _logger_name_given(fn: ast.AST, make: ast.Call, site: ast.Call) -> str | None:
    """The name `getLogger(...)` in the helper `fn` gets at the call `site`: its constant, or the constant the
    site hands the parameter it reads; "" (the root) for no name, or a parameter the site leaves at None."""
    if not make.args:
        return ""
    arg = make.args[0]
    if const_str(arg):
        return const_str(arg)
    params = [x.arg for x in fn.args.args]
    if not (isinstance(arg, ast.Name) and arg.id in params):
        return None
    i = params.index(arg.id)
    given = kw(site, arg.id) or (site.args[i] if i < len(site.args) else None)
    if given is None:
        defaults = dict(zip(params[len(params) - len(fn.args.defaults):], fn.args.defaults, strict=True))
        return "" if arg.id in defaults and isinstance(defaults[arg.id], ast.Constant) and \
            defaults[arg.id].value is None else None
    return const_str(given)


def handed_logger_name(f: Facts, m: Module, c: ast.AST, name: str, depth: int = 2) -> str | None:
    """`logger` a parameter of the logging function (WeSpeaker's run_epoch(..., logger)) that every project caller
    hands a logger a project helper made (`logger = get_logger(exp_dir, 'train.log')`, whose body returns
    `logging.getLogger("Pyobj, f")`), or made with getLogger itself, or was handed one in turn (MetaICL's
    `__main__` block: `logger = logging.getLogger(__name__)`, `main(logger, args)`, whose
    `MetaICLModel(logger, ...)` keeps it): that logger's name; None when a caller hands anything else."""
    fn = m.enclosing(c)
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    params = [a.arg for a in fn.args.args]
    if name not in params:
        return None
    i = params.index(name) - (1 if params[0] in ("self", "cls") else 0)
    names = set()
    for cm, site in f.p.callers(m, fn):
        given = kw(site, name) or (site.args[i] if 0 <= i < len(site.args) else None)
        scope = cm.enclosing(site)
        made = [a.value for a in cm.nodes if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call)
                and cm.enclosing(a) is scope  # the caller's own bindings, not those of the functions it defines
                and isinstance(given, ast.Name) and any(dotted(t) == given.id for t in a.targets)]
        if not made and isinstance(given, ast.Name) and depth:  # handed on from the caller's own parameter
            names.add(handed_logger_name(f, cm, site, given.id, depth - 1))
            continue
        if len(made) != 1:
            return None
        if callee(made[0]) == "getLogger":
            names.add(const_str(made[0].args[0]) if made[0].args and const_str(made[0].args[0]) else "")
            continue  # (`getLogger(__name__)`: its records reach the root's handlers)
        for _tm, tf in f.p.resolve(cm, made[0]):
            rets = {dotted(r.value) for r in walk(tf) if isinstance(r, ast.Return) and r.value is not None}
            names |= {const_str(a.value.args[0]) if a.value.args else "" for a in walk(tf)
                      if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and callee(a.value) ==
                      "getLogger" and {dotted(t) for t in a.targets} & rets}
    return names.pop() if len(names) == 1 and None not in names else None


def named_consoles_on_every_rank(f: Facts) -> set[str]:
    """Names of loggers a project helper gives a console handler on every rank: `def setup_logger(name, ...):
    logger = logging.getLogger(name); ch = logging.StreamHandler(...); logger.addHandler(ch)`, called as
    setup_logger("transreid", ...) under no rank guard. A logger named below one of them (`transreid.train`)
    sends its records to that console too."""
    cache = f.cache.setdefault("named_consoles", None)
    if cache is not None:
        return cache
    out = set()
    for mm in f.p.modules.values():
        for fn in mm.functions.values():
            made = {dotted(t): a.value.args[0] for a in walk(fn) if isinstance(a, ast.Assign) and isinstance(
                a.value, ast.Call) and callee(a.value) == "getLogger" and a.value.args for t in a.targets}
            consoles = {dotted(t) for a in walk(fn) if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call)
                        and callee(a.value) == "StreamHandler" for t in a.targets}
            for c in walk(fn):
                if not (isinstance(c, ast.Call) and callee(c) == "addHandler" and isinstance(c.func, ast.Attribute)
                        and dotted(c.func.value) in made and c.args and dotted(c.args[0]) in consoles
                        and f.g.effective(mm, c) is None):
                    continue
                arg = made[dotted(c.func.value)]
                if const_str(arg):
                    out.add(const_str(arg))
                elif isinstance(arg, ast.Name) and arg.id in [x.arg for x in fn.args.args]:
                    i = [x.arg for x in fn.args.args].index(arg.id)
                    for cm, site in f.p.callers(mm, fn):
                        given = next((k.value for k in site.keywords if k.arg == arg.id),
                                     site.args[i] if i < len(site.args) else None)
                        if const_str(given) and f.g.effective(cm, site) is None:
                            out.add(const_str(given))
    f.cache["named_consoles"] = out
    return out


def root_console_on_every_rank(f: Facts) -> bool:
    """A project helper gives the root logger a console handler under no rank guard (`console =
    logging.StreamHandler()` ... `logger = logging.getLogger(); logger.addHandler(console)` in a create_logger
    every rank calls): each rank's lines reach the console."""
    for mm in f.p.modules.values():
        for fn in mm.functions.values():
            # (or `getLogger(name)` with a name some caller leaves at its None default: baby-llama2's get_logger)
            roots = {dotted(t) for a in walk(fn) if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call)
                     and callee(a.value) == "getLogger" and (not a.value.args or any(
                         _logger_name_given(fn, a.value, site) == "" for _, site in f.p.callers(mm, fn)))
                     for t in a.targets}
            consoles = {dotted(t) for a in walk(fn) if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call)
                        and callee(a.value) == "StreamHandler" for t in a.targets}
            if any(isinstance(c, ast.Call) and callee(c) == "addHandler" and isinstance(c.func, ast.Attribute) and
                   dotted(c.func.value) in roots and c.args and dotted(c.args[0]) in consoles and
                   f.g.effective(mm, c) is None for c in walk(fn)):
                return True
    return False


def self_logger_name(f: Facts, m: Module, c: ast.Call) -> str | None:
    """The logger a `self.logger.info(...)` call logs through, when the class's __init__ keeps a logger its
    callers hand it (`self.logger = logger`, MetaICLModel): handed_logger_name of that parameter."""
    fn = m.enclosing(c)
    held = dotted(c.func.value) if isinstance(c.func, ast.Attribute) else ""
    cls = m.class_of(fn) if fn is not None else None
    init = m.functions.get(f"{cls}.__init__") if cls and held.startswith("self.") else None
    keep = [a for a in walk(init) if isinstance(a, ast.Assign) and isinstance(a.value, ast.Name) and any(
        dotted(t) == held for t in a.targets)] if init is not None else []
    return handed_logger_name(f, m, keep[0], keep[0].value.id) if len(keep) == 1 else None

