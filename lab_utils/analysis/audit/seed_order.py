"""When the run seeds torch against when it builds the model (for rules/seeds.py's no-seed): where the model DDP
wraps is built (built_at), and a seed that only comes after that build (seeded_after_the_build), which leaves rank
0's init, the one DDP broadcasts, unseeded."""

from __future__ import annotations

import ast
import re

from .facts import Facts
from .files import script_flags
from .project import Module
from .seed_gates import gated
from .syntax import callee, dotted, walk


def seeded_after_the_build(f: Facts, calls: list):
    """((module, seed call), (module, the model's build)) when every torch seed the run makes comes after the line
    that builds the model DDP wraps, in the same function (GPST's `model = create_model(...)`, then
    `set_seed(args.seed)` forty lines on), and no unconditional load replaces the init in between."""
    wraps = [(mm, c) for mm, c in calls if f.is_ddp_call(mm, c)]
    built = built_at(f, wraps[:1])
    seeds = [(mm, c) for mm, c in calls if f.seed_kind(mm, c) == "torch" and not gated(f, mm, c)]
    if not built or not seeds:
        return None
    bm, assign = built[0]
    fn = bm.enclosing(assign)
    def after(mm: Module, c: ast.AST, depth: int = 2) -> bool:  # (or in a helper only called after it: set_seed)
        if mm is bm and mm.enclosing(c) is fn:
            return c.lineno > assign.lineno
        sites = f.p.callers(mm, mm.enclosing(c)) if depth and mm.enclosing(c) is not None else []
        return bool(sites) and all(after(sm, sc, depth - 1) for sm, sc in sites)
    if not all(after(mm, c) for mm, c in seeds):
        return None
    seeds = [(mm, c) for mm, c in seeds if mm is bm and mm.enclosing(c) is fn]

    def ifs(n):  # the `if`s around a node, in its function (a script's `if __name__ == '__main__':` too)
        out, up = set(), bm.parent.get(id(n))
        while up is not None and up is not fn:
            out |= {id(up)} if isinstance(up, ast.If) else set()
            up = bm.parent.get(id(up))
        return out
    model = {dotted(t) for t in assign.targets}
    # (an `if args.pretrain_dir is not None:` load is taken where the project's launch script passes the option)
    flags = script_flags(f.p.root, bm.rel)
    given = {id(n) for n in (walk(fn) if fn is not None else bm.nodes) if isinstance(n, ast.If) and any(
        isinstance(x, ast.Attribute) and x.attr in flags for x in ast.walk(n.test))}

    def on_the_model(c):  # (`model.from_pretrain(...)`, `model = load_checkpoint(model, ...)`; not a tokenizer's)
        up = bm.parent.get(id(c))
        return isinstance(c.func, ast.Attribute) and dotted(c.func.value) in model or isinstance(
            up, ast.Assign) and {dotted(t) for t in up.targets} & model or any(dotted(a) in model for a in c.args)
    if re.search(r"pretrain|load", callee(assign.value), re.I) or any(
            isinstance(c, ast.Call) and re.search(r"load_state_dict|from_pretrain|load_checkpoint|load_pretrain",
                                                  callee(c)) and c.lineno > assign.lineno and on_the_model(c)
            and bm.enclosing(c) is fn and not (ifs(c) - ifs(assign)) - given
            for c in (walk(fn) if fn is not None else bm.nodes)):
        return None  # (the weights come from a file: the init is never used)
    return min(seeds, key=lambda x: x[1].lineno), built[0]


def built_at(f: Facts, wraps: list) -> list:
    """Where the model the first wrap gets is built (StableTTS's `model = StableTTS(...).to(rank)` before `model =
    DDP(model, ...)`; through the caller when the wrap's function is handed it, Re-IQA's `model, model_ema =
    build_model(args)` then `trainer.wrap_up(model, ...)`): the unseeded init happens there, the seed goes before."""
    if not wraps or not wraps[0][1].args or not (isinstance(wraps[0][1].args[0], ast.Name) or dotted(
            wraps[0][1].args[0]).startswith("self.")):  # (or an attribute: MPP's `self.model = build_avit(params)`)
        return []
    (mm, c), name = wraps[0], dotted(wraps[0][1].args[0])
    for _ in range(2):
        scope = mm.enclosing(c) or mm.tree
        built = [a for a in walk(scope) if isinstance(a, ast.Assign) and a.lineno < c.lineno and isinstance(
            a.value, ast.Call) and name in {dotted(t) for x in a.targets for t in ast.walk(x)}
            and name not in {dotted(x) for x in a.value.args}]  # (not `model = amp.initialize(model, ...)`)
        params = [a.arg for a in scope.args.args] if isinstance(scope, ast.FunctionDef) else []
        if built or name not in params or not f.p.callers(mm, scope):
            return [(mm, max(built, key=lambda a: a.lineno))] if built else []
        (mm, c), i = f.p.callers(mm, scope)[0], params.index(name) - (params[0] in ("self", "cls"))
        if not (0 <= i < len(c.args) and isinstance(c.args[i], ast.Name)):
            return []
        name = c.args[i].id
    return []
