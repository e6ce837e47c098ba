"""Chapter 14 (FSDP2, torch's `fully_shard`): the port bugs the lab's fsdp2_bug suite measures at run time, where
the code shows them. fully_shard replaces every parameter of the module it shards with a DTensor shard (1/W of it
per rank), reduce-scatters gradients only for the modules it was applied to and only while gradient sync is on, and
a sharded state dict is each rank's own shards. Each rule follows the model through the project's helpers (a
helper that shards its argument, an optimizer factory, a save helper called under a rank-0 guard)."""

from __future__ import annotations

import ast
import re

from ..facts import Facts
from ..project import Module
from ..registry import rule
from ..syntax import callee, dotted, kw, root, walk

CHAPTER = "14_fsdp2"
SHARD = "fully_shard"
SYNC = "set_requires_gradient_sync"
OPTIMIZER = re.compile(r"^(SGD|Adam|AdamW|Adagrad|Adadelta|Adamax|RMSprop|Rprop|NAdam|RAdam|LBFGS|SparseAdam|Lion"
                       r"|Adafactor|Muon|LAMB|Lamb|FusedAdam|ZeroRedundancyOptimizer)$")
OPTIMIZER_FACTORY = re.compile(r"^(build|create|make|get|init|setup|configure)_?optimi[sz]ers?(_v\d)?$")
PARAMS = ("parameters", "named_parameters")
GATHERING_STATE = ("get_model_state_dict", "get_optimizer_state_dict", "get_state_dict")
ITERATORS = ("enumerate", "zip", "list", "reversed", "sorted", "tuple", "iter")


def _scopes(m: Module):
    """Each function of the module, and the module's own top-level code (its statements outside functions)."""
    yield from m.functions.values()
    yield m.tree


def _own_calls(m: Module, scope: ast.AST) -> list[ast.Call]:
    """The calls `scope` makes itself: nested functions are their own scopes."""
    if isinstance(scope, ast.Module):
        nodes = [n for s in scope.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                 for n in ast.walk(s)]
    else:
        nodes = list(walk(scope))
    return [n for n in nodes if isinstance(n, ast.Call) and (m.enclosing(n) or m.tree) is scope]


def _scope_of(m: Module, node: ast.AST) -> ast.AST:
    return m.enclosing(node) or m.tree


def _loop_target_origin(m: Module, name: str, node: ast.AST) -> tuple[str, ast.For] | None:
    """`for block in model.layers:` (or `enumerate(...)`, `.items()`): the module a loop variable walks, and the
    loop."""
    n = m.parent.get(id(node))
    while n is not None and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        if isinstance(n, (ast.For, ast.comprehension)):
            targets = {dotted(t) for t in ast.walk(n.target) if isinstance(t, ast.Name)}
            if name in targets:
                it = n.iter
                while isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id in ITERATORS \
                        and it.args:
                    it = it.args[0]
                if isinstance(it, (ast.Tuple, ast.List)):  # for m in (model.embed, model.head):
                    roots = {root(e) for e in it.elts if not isinstance(e, ast.Name)} - {""}
                    return (roots.pop(), n) if len(roots) == 1 else None
                if isinstance(it, ast.Name):  # `for model in model_parts:` walks whole models, unless the list
                    scope = m.enclosing(n) or m.tree  # is a model's own (`blocks = model.layers`)
                    held = [a.value for a in walk(scope) if isinstance(a, ast.Assign)
                            and any(dotted(t) == it.id for t in a.targets)
                            and isinstance(a.value, (ast.Attribute, ast.Subscript, ast.Call))]
                    origins = {root(v) for v in held if not isinstance(v, ast.Call) or isinstance(
                        v.func, ast.Attribute) and callee(v) in ("children", "modules", "values", "items")} - {""}
                    return (origins.pop(), n) if len(origins) == 1 else None
                return (root(it), n) if root(it) else None
        n = m.parent.get(id(n))
    return None


def _shard_target(m: Module, c: ast.Call) -> tuple[str, bool] | None:
    """What a fully_shard call shards: (the model it belongs to, whether it is that model itself). `fully_shard(
    model)` -> ('model', True); `fully_shard(model.layers[i])` or a loop's block -> ('model', False)."""
    arg = c.args[0] if c.args else kw(c, "module")
    if arg is None:
        return None
    name = dotted(arg)
    if isinstance(arg, ast.Name):
        loop = _loop_target_origin(m, name, c)
        if loop is not None:
            origin, for_node = loop
            walks_all = isinstance(for_node.iter, ast.Call) and callee(for_node.iter) in ("modules", "named_modules")
            # model.modules() yields the model itself first: unfiltered, the loop shards the root too
            return origin, walks_all and not any(isinstance(n, ast.If) for n in ast.walk(for_node)
                                                 if n is not for_node)
        return name, True
    base = root(arg)
    if not base:
        return None
    return base, base == name


def _is_shard(c: ast.Call) -> bool:
    return callee(c) == SHARD


def _sharded_params(f: Facts, m: Module, fn: ast.AST, depth: int = 2) -> set[str]:
    """The parameters of a project function that it applies fully_shard to (all or in part), itself or through
    the helpers it hands them to (torchtitan's parallelize -> apply_fsdp, the lab's wrap)."""
    key = ("fsdp2-params", m.rel, id(fn), depth)
    if key in f.cache:
        return f.cache[key]
    f.cache[key] = out = set()
    params = set(_function_params(m, fn))
    for c in _own_calls(m, fn):
        if _is_shard(c):
            t = _shard_target(m, c)
            if t and t[0] in params:
                out.add(t[0])
        elif depth:
            for tm, tf in f.p.resolve(m, c, exact=True):
                inner = _sharded_params(f, tm, tf, depth - 1)
                out |= {dotted(a) for a, p in _bound(tm, tf, c) if p in inner} & params
    return out


def _bound(m: Module, fn: ast.AST, c: ast.Call) -> list[tuple[ast.AST, str]]:
    """(argument, the parameter it binds) for a call of a project function (self/cls left out of a method)."""
    params = _function_params(m, fn)
    if params and params[0] in ("self", "cls") and m.class_of(fn):
        params = params[1:]
    out = [(a, params[i]) for i, a in enumerate(c.args) if i < len(params) and not isinstance(a, ast.Starred)]
    return out + [(k.value, k.arg) for k in c.keywords if k.arg in params]


def _shards(f: Facts, m: Module, c: ast.Call) -> str | None:
    """The model a call shards (all of it or part of it), directly or through a helper given the model."""
    if _is_shard(c):
        t = _shard_target(m, c)
        return t[0] if t else None
    for tm, tf in f.p.resolve(m, c, exact=True):
        inner = _sharded_params(f, tm, tf)
        for a, p in _bound(tm, tf, c):
            if p in inner and isinstance(a, (ast.Name, ast.Attribute)):
                return dotted(a)
    return None


def _argument(m: Module, fn: ast.AST, c: ast.Call, param: str):
    """What a call of `fn` passes for `param` (None when it passes nothing for it)."""
    return next((a for a, p in _bound(m, fn, c) if p == param), None)


def _shards_root(f: Facts, m: Module, scope: ast.AST, name: str, depth: int = 2) -> bool:
    """Whether `scope` applies fully_shard to `name` itself (not only to its blocks), directly or through a
    helper that shards the argument it is given."""
    for c in _own_calls(m, scope):
        if _is_shard(c):
            t = _shard_target(m, c)
            if t == (name, True):
                return True
        elif depth:
            for tm, tf in f.p.resolve(m, c, exact=True):
                if any(dotted(a) == name and _shards_root(f, tm, tf, p, depth - 1) for a, p in _bound(tm, tf, c)):
                    return True
    return False


def _exclusive(m: Module, a: ast.AST, b: ast.AST) -> bool:
    """a and b sit in different arms of one if: no run executes both."""
    def arms(x):
        out, child, n = {}, x, m.parent.get(id(x))
        while n is not None:
            if isinstance(n, ast.If):
                out[id(n)] = "body" if any(child is s for s in n.body) else "else" if any(
                    child is s for s in n.orelse) else "test"
            child, n = n, m.parent.get(id(n))
        return out
    aa, bb = arms(a), arms(b)
    return any(k in bb and bb[k] != v and "test" not in (v, bb[k]) for k, v in aa.items())


def _callers(f: Facts, m: Module, fn: ast.AST) -> list:
    key = ("fsdp2-callers", m.rel, id(fn))
    if key not in f.cache:
        f.cache[key] = f.p.callers(m, fn)
    return f.cache[key]


def _effective(f: Facts, m: Module, node: ast.AST, depth: int = 3) -> str | None:
    """Guards.effective (a function called only under a rank-0 guard runs on rank 0 only), its callers looked
    up once per function: a checkpointer's three dcp.save calls share them."""
    k = f.g.kind(m, node)
    fn = m.enclosing(node)
    if k or depth == 0 or fn is None:
        return k
    key = ("fsdp2-effective", m.rel, id(fn), depth)
    if key not in f.cache:
        sites = _callers(f, m, fn)
        kinds = {_effective(f, cm, c, depth - 1) for cm, c in sites}
        f.cache[key] = None if not sites else "rank0" if kinds == {"rank0"} else "leaky" if (
            "leaky" in kinds and kinds <= {"rank0", "leaky"}) else None
    return f.cache[key]


# --- the optimizer built before fully_shard
def _optimizer_models(f: Facts, m: Module, c: ast.Call, param_names: dict[str, str]) -> set[str]:
    """The models whose parameters an optimizer construction takes: `AdamW(model.parameters())`, a list of them
    built earlier, param groups, or a project optimizer factory given the model."""
    name = callee(c)
    direct = OPTIMIZER.match(name) or "optim." in dotted(c.func) and name[:1].isupper() and \
        "lr_scheduler" not in dotted(c.func)
    def builds(mm, cc):
        return bool(OPTIMIZER.match(callee(cc))) or "optim." in dotted(cc.func) and callee(cc)[:1].isupper()
    assigned = isinstance(m.parent.get(id(c)), ast.Assign)
    factory = not direct and assigned and (OPTIMIZER_FACTORY.match(name) and not f.p.resolve(m, c) or any(
        f.p.function_does(tm, tf, builds, depth=2) for tm, tf in f.p.resolve(m, c)))
    if not (direct or factory):
        return set()
    out = set()
    for a in [*c.args, *[k.value for k in c.keywords]]:
        for n in ast.walk(a):
            if isinstance(n, ast.Call) and callee(n) in PARAMS and isinstance(n.func, ast.Attribute):
                out.add(root(n.func.value))
            elif isinstance(n, ast.Name) and n.id in param_names:
                out.add(param_names[n.id])
        if factory and isinstance(a, (ast.Name, ast.Attribute)):
            out.add(dotted(a))
    return out - {""}


def _param_lists(m: Module, scope: ast.AST) -> dict[str, str]:
    """`params = [p for p in model.parameters() if p.requires_grad]`: a name holding a model's parameters."""
    out = {}
    nodes = walk(scope) if not isinstance(scope, ast.Module) else (
        n for s in scope.body if not isinstance(s, (ast.FunctionDef, ast.ClassDef)) for n in ast.walk(s))
    for a in nodes:
        if isinstance(a, ast.Assign) and len(a.targets) == 1 and isinstance(a.targets[0], ast.Name):
            owners = {root(n.func.value) for n in ast.walk(a.value) if isinstance(n, ast.Call)
                      and callee(n) in PARAMS and isinstance(n.func, ast.Attribute)} - {""}
            if len(owners) == 1:
                out[a.targets[0].id] = owners.pop()
    return out


@rule("fsdp2-optimizer-before-wrap", CHAPTER, "an optimizer built from the model's parameters before fully_shard "
      "is applied to it: fully_shard replaces those parameters with sharded ones, so the optimizer steps tensors "
      "the model no longer uses and the trained weights never change")
def optimizer_before_wrap(f: Facts, m: Module):
    if not _uses_fully_shard(f):
        return
    for scope in _scopes(m):
        calls = _own_calls(m, scope)
        params = _param_lists(m, scope)
        opts = [(c, _optimizer_models(f, m, c, params)) for c in calls]
        opts = [(c, models) for c, models in opts if models]
        if not opts:
            continue
        shards = [(c, _shards(f, m, c)) for c in calls]
        shards = [(c, t) for c, t in shards if t]
        for oc, models in opts:
            for sc, target in shards:
                if target not in models or sc.lineno <= oc.lineno or _exclusive(m, oc, sc):
                    continue
                rebuilt = any(o.lineno > sc.lineno and target in ms and not _exclusive(m, o, sc) for o, ms in opts)
                if rebuilt:
                    continue
                how = "fully_shard" if _is_shard(sc) else f"{callee(sc)}(), which applies fully_shard,"
                yield oc, (f"{ast.unparse(oc.func)}(...) takes {target}'s parameters before {how} shards {target} "
                           f"(line {sc.lineno}): fully_shard replaces them with DTensor shards, so at 2 ranks the "
                           "optimizer steps the old plain tensors and the sharded weights the model trains with "
                           f"never change — build the optimizer after fully_shard({target})")
                break


# --- fully_shard on the blocks but never on the root
def _function_params(m: Module, scope: ast.AST) -> list[str]:
    return [a.arg for a in scope.args.args] if not isinstance(scope, ast.Module) else []


@rule("fsdp2-root-not-wrapped", CHAPTER, "fully_shard applied to a model's sub-modules (its blocks) but never to "
      "the model itself: the root's own parameters (embeddings, final norm, head) stay plain tensors whose "
      "gradients no rank reduces, so at 2 ranks each rank trains its own copy of them")
def root_not_wrapped(f: Facts, m: Module):
    if not _uses_fully_shard(f):
        return
    for scope in _scopes(m):
        subs: dict[str, ast.Call] = {}
        for c in _own_calls(m, scope):
            if _is_shard(c):
                t = _shard_target(m, c)
                if t and not t[1] and t[0] not in subs:
                    subs[t[0]] = c
        for model, c in subs.items():
            if _shards_root(f, m, scope, model) or model.startswith("self.") and any(
                    _shards_root(f, m, fn, model) for fn in m.functions.values()
                    if m.class_of(fn) and m.class_of(fn) == m.class_of(scope)):
                continue  # the root sharded here, or (self.model) by another method of the class
            if model in _function_params(m, scope):
                sites = _callers(f, m, scope)
                if not sites:
                    continue  # a library helper nobody in the audited files calls: its callers decide
                if all(isinstance(a := _argument(m, scope, cc, model), (ast.Name, ast.Attribute))
                       and _shards_root(f, cm, _scope_of(cm, cc), dotted(a)) for cm, cc in sites):
                    continue  # every caller shards the root after the helper sharded its blocks
            elif isinstance(scope, ast.Module) and not m.entry:
                continue
            yield c, (f"fully_shard({ast.unparse(c.args[0]) if c.args else '...'}) shards parts of {model}, but "
                      f"fully_shard({model}) is never called: {model}'s own parameters (embeddings, final norm, "
                      "head) stay plain tensors, so at 2 ranks their gradients are never reduced and each rank "
                      f"trains its own copy — call fully_shard({model}) after the blocks")


# --- gradient sync turned off and never back on
def _sync_sites(f: Facts, m: Module, calls) -> tuple[list, list]:
    """(off, on): set_requires_gradient_sync(False) calls, and the ones that can turn it on (True, or a value
    such as `is_last_microbatch`); a project helper given a constant counts as its call."""
    off, on = [], []
    for c in calls:
        if callee(c) == SYNC:
            v = c.args[0] if c.args else kw(c, "requires_gradient_sync")
            (off if isinstance(v, ast.Constant) and v.value is False else on).append(c)
        elif any(f.p.function_does(tm, tf, lambda mm, cc: callee(cc) == SYNC, depth=2)
                 for tm, tf in f.p.resolve(m, c)):
            consts = [a for a in [*c.args, *[k.value for k in c.keywords]] if isinstance(a, ast.Constant)
                      and isinstance(a.value, bool)]
            (off if consts and all(a.value is False for a in consts) else on).append(c)
    return off, on


def _on_reachable(f: Facts, m: Module, scope: ast.AST, depth: int = 2) -> list:
    """The calls that can turn sync on in what `scope` runs (its helpers included), or, if none, in what its
    callers run."""
    pairs = [(m, c) for c in _own_calls(m, scope)] if isinstance(scope, ast.Module) else \
        f.p.calls_in(f.p.reach(m, scope))
    on = [c for mm, c in pairs if _sync_sites(f, mm, [c])[1]]
    if on or not depth or isinstance(scope, ast.Module):
        return on
    for cm, cc in _callers(f, m, scope):
        on += _on_reachable(f, cm, _scope_of(cm, cc), depth - 1)
    return on


def _loop_of(m: Module, node: ast.AST):
    n = m.parent.get(id(node))
    while n is not None and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        if isinstance(n, (ast.For, ast.While)):
            return n
        n = m.parent.get(id(n))
    return None


@rule("fsdp2-sync-left-off", CHAPTER, "set_requires_gradient_sync(False) (gradient accumulation) with no call "
      "that turns it back on before the optimizer step: the gradients are never reduce-scattered, so at 2 ranks "
      "each rank steps with its own shard's local gradient")
def sync_left_off(f: Facts, m: Module):
    for scope in _scopes(m):
        off, _ = _sync_sites(f, m, _own_calls(m, scope))
        for c in off:
            on = _on_reachable(f, m, scope)
            if not on:
                yield c, (f"{ast.unparse(c)} and nothing turns gradient sync back on: FSDP2 never "
                          "reduce-scatters the gradients, so at 2 ranks each rank steps with its own local "
                          "gradient and the ranks' shards drift apart — call set_requires_gradient_sync(True) "
                          "before the last micro-batch's backward")
                continue
            loop = _loop_of(m, c)
            if loop is None:
                continue
            inside = [o for o in on if any(o is n for n in walk(loop))]
            steps = [n for n in walk(loop) if isinstance(n, ast.Call) and callee(n) == "step"]
            backwards = [n for n in walk(loop) if isinstance(n, ast.Call) and callee(n) == "backward"
                         and n.lineno > c.lineno]
            if inside and steps and backwards and len(inside) == len(on) and \
                    min(o.lineno for o in inside) > max(s.lineno for s in steps):
                yield c, (f"{ast.unparse(c)} runs before every backward of the loop, and sync is turned back on "
                          f"only after the step (line {min(o.lineno for o in inside)}): the next iteration turns "
                          "it off again before any backward, so at 2 ranks the gradients are never "
                          "reduce-scattered — turn it on before the last micro-batch's backward")


# --- a sharded state dict saved by rank 0 alone, and a gathering call rank 0 alone makes
def _uses_fully_shard(f: Facts) -> bool:
    """Some module of the project calls fully_shard: the FSDP2 rules have something to judge."""
    if "fsdp2-used" not in f.cache:
        f.cache["fsdp2-used"] = any(_is_shard(c) for mm in f.p.modules.values() for c in mm.calls)
    return f.cache["fsdp2-used"]


def _base_sharded(f: Facts, m: Module) -> set[str]:
    """Names in the module that hold a fully_shard-ed model (all of it or its blocks: `fully_shard(model)`,
    `model = fully_shard(model)`, a helper given the model, a parameter annotated FSDPModule), and the optimizers
    built over them."""
    key = ("fsdp2-sharded", m.rel)
    if key not in f.cache:
        names = {t for c in m.calls if (t := _shards(f, m, c))}
        for c in m.calls:
            a = m.parent.get(id(c))
            if _is_shard(c) and isinstance(a, ast.Assign):
                names |= {dotted(t) for t in a.targets}
        for fn in m.functions.values():
            names |= {a.arg for a in fn.args.args if a.annotation is not None
                      and "FSDPModule" in ast.unparse(a.annotation)}
        params = _param_lists(m, m.tree)
        for c in m.calls:
            a = m.parent.get(id(c))
            if isinstance(a, ast.Assign) and _optimizer_models(f, m, c, params) & names:
                names |= {dotted(t) for t in a.targets}
        f.cache[key] = names
    return f.cache[key]


def _sharded_names(f: Facts, m: Module, fn: ast.AST | None) -> set[str]:
    """The sharded names `fn` sees: the module's, and its parameters that every caller hands a sharded name (a
    save helper given the model and its optimizer)."""
    names = set(_base_sharded(f, m))
    if fn is None or isinstance(fn, ast.Module):
        return names
    sites = _callers(f, m, fn)
    for p in _function_params(m, fn):
        if sites and all((a := _argument(m, fn, cc, p)) is not None and dotted(a) in _base_sharded(f, cm)
                         for cm, cc in sites):
            names.add(p)
    return names


def _shard_state(m: Module, expr: ast.AST, names: set[str], scope: ast.AST) -> str | None:
    """`X.state_dict()` of a sharded X in the saved value, or a name assigned from one in the same scope (not
    gathered with full_tensor())."""
    def direct(e):
        for n in ast.walk(e):
            if isinstance(n, ast.Call) and callee(n) == "full_tensor":
                return None
        for n in ast.walk(e):
            if isinstance(n, ast.Call) and callee(n) == "state_dict" and isinstance(n.func, ast.Attribute) \
                    and dotted(n.func.value) in names:
                return f"{dotted(n.func.value)}.state_dict()"
        return None
    hit = direct(expr)
    if hit:
        return hit
    read = {dotted(n) for n in ast.walk(expr) if isinstance(n, ast.Name)}
    for a in walk(scope):
        if isinstance(a, ast.Assign) and any(dotted(t) in read for t in a.targets):
            hit = direct(a.value)
            if hit:
                return hit
    return None


@rule("fsdp2-rank0-saves-sharded", CHAPTER, "torch.save of a fully_shard-ed model's (or its optimizer's) "
      "state_dict() by rank 0 alone: each value is a DTensor shard, so at 2 ranks the file holds rank 0's half of "
      "every weight and no run can resume from it")
def rank0_saves_sharded(f: Facts, m: Module):
    if not _uses_fully_shard(f):
        return
    for c in m.calls:
        if dotted(c.func) not in ("torch.save", "th.save") or not c.args or _effective(f, m, c) != "rank0" or \
                _not_fsdp_arm(m, c):
            continue
        scope = _scope_of(m, c)
        what = _shard_state(m, c.args[0], _sharded_names(f, m, scope), scope)
        if what:
            yield c, (f"torch.save of {what} by rank 0 alone: under fully_shard its values are DTensor shards, so "
                      "at 2 ranks the file holds rank 0's 1/2 of every weight and nothing loads it as the model "
                      "— save with torch.distributed.checkpoint (dcp.save on every rank), or gather "
                      "get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, "
                      "cpu_offload=True)) on every rank and torch.save it on rank 0")


def _not_fsdp_arm(m: Module, c: ast.AST) -> bool:
    """`c` runs only where the model is not sharded: under `if not args.fsdp:` (or in the else of `if args.fsdp:`),
    STARFlow's DDP checkpoint beside its dcp.save for FSDP."""
    child, n = c, m.parent.get(id(c))
    while n is not None and not isinstance(n, (ast.FunctionDef, ast.Module)):
        if isinstance(n, ast.If) and "fsdp" in ast.unparse(n.test).lower():
            negated = isinstance(n.test, ast.UnaryOp) and isinstance(n.test.op, ast.Not)
            if (any(child is b for b in n.body) and negated) or (any(child is b for b in n.orelse) and not negated):
                return True
        child, n = n, m.parent.get(id(n))
    return False


def _full_options(m: Module, c: ast.Call) -> bool:
    """options=StateDictOptions(full_state_dict=True, ...), given inline or through a name."""
    opt = kw(c, "options")
    if isinstance(opt, ast.Name):
        opt = next((a.value for a in m.nodes if isinstance(a, ast.Assign) and any(
            dotted(t) == opt.id for t in a.targets)), None)
    return isinstance(opt, ast.Call) and callee(opt) == "StateDictOptions" and isinstance(
        kw(opt, "full_state_dict"), ast.Constant) and kw(opt, "full_state_dict").value is True


def _dcp_save(m: Module, c: ast.Call) -> bool:
    if not isinstance(c.func, ast.Attribute) or c.func.attr not in ("save", "async_save", "save_state_dict"):
        return False
    base = root(c.func.value)
    mod, attr, _ = m.imports.get(base, ("", None, 0))
    return f"{mod}.{attr}".startswith("torch.distributed.checkpoint") or mod.startswith(
        "torch.distributed.checkpoint") or dotted(c.func).startswith("torch.distributed.checkpoint.")


@rule("fsdp2-gather-on-rank0-only", CHAPTER, "a call that gathers a sharded state (get_model_state_dict or "
      "get_optimizer_state_dict with full_state_dict=True, DTensor.full_tensor(), dcp.save) made by rank 0 alone: "
      "it is a collective, so at 2 ranks rank 0 waits forever for rank 1 (a hang)")
def gather_on_rank0_only(f: Facts, m: Module):
    for c in m.calls:
        name = callee(c)
        if name in GATHERING_STATE and _full_options(m, c):
            what = f"{name}(..., full_state_dict=True)"
        elif name == "full_tensor" and isinstance(c.func, ast.Attribute):
            what = f"{ast.unparse(c.func)}()"
        elif _dcp_save(m, c):
            what = f"{ast.unparse(c.func)}(...)"
        else:
            continue
        if _effective(f, m, c) != "rank0":
            continue
        yield c, (f"{what} runs on rank 0 only: it gathers every rank's shards (a collective), so at 2 ranks "
                  "rank 0 waits forever for rank 1 (a hang) — call it on every rank, and keep only the torch.save "
                  "(or the print) under the rank-0 guard")
