"""Which seeds the default run skips: a seed under a test the setting's default fails (`if args.seed > 0:` with
--seed -1, `if exp.seed is not None:`), behind an early return the default takes (torchdistill's set_seed, `if not
isinstance(seed, int): return`), or inside a helper every call of which is so gated; and what a rank-holding name is
in the single run (single_run_value). Chapter 02's rules ask it before they count a seed."""

from __future__ import annotations

import ast
import operator
import re

from .facts import Facts
from .options import UNKNOWN
from .project import Module
from .syntax import callee, const_str, const_value, dotted, involves_rank, kw


def gated(f: Facts, m: Module, c: ast.AST, depth: int = 2) -> bool:
    """The default run never reaches `c`: it sits under an option that is off (or a test its default fails), or
    inside a helper every call of which does (MTR's `if args.fix_random_seed: common_utils.set_random_seed(666)`
    gates the torch.manual_seed inside set_random_seed)."""
    if f.off_by_default(m, c) or failed_by_default(f, m, c):
        return True
    fn = m.enclosing(c)
    sites = f.p.callers(m, fn) if depth and fn is not None else []
    return bool(sites) and all(gated(f, cm, s, depth - 1) for cm, s in sites)


def helper_gated(f: Facts, m: Module, c: ast.Call) -> bool:
    """`c` calls project code that seeds torch only through gated calls (`main()` whose seeding sits under `if
    args.fix_random_seed:`): what the call seeds is what those gated calls would."""
    keys = set().union(*(f.p.reach(tm, tf) for tm, tf in f.p.resolve(m, c))) if f.p.resolve(m, c) else set()
    seeds = [(mm, x) for mm, x in f.p.calls_in(keys) if f.seed_kind(mm, x, True) == "torch"
             and not f.p.resolve(mm, x)]  # (a project helper's own seeds are among the calls: judged there)
    return bool(seeds) and all(gated(f, mm, x) for mm, x in seeds)


COMPARES = {ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Is: operator.is_, ast.IsNot: operator.is_not}


def failed_by_default(f: Facts, m: Module, node: ast.AST) -> str | None:
    """The test of an enclosing `if args.seed > 0:` or `if exp.seed is not None:` (a comparison of a setting with
    a constant) that the setting's default fails (`--seed default=-1`; YOLOX's `self.seed = None`, which no Exp
    sets), as written; None when the default run reaches `node`. Settings about ranks (`--local_rank -1`, which
    the launcher replaces) are left out."""
    child, n = node, m.parent.get(id(node))
    while n is not None and not isinstance(n, ast.Module):
        test = n.test if isinstance(n, ast.If) and any(child is b for b in n.body) else None
        # (or one term of an `and`: FunCodec's `if hasattr(options, "num_updates") and
        # options.save_ckpt_every_steps > 0 and ...`)
        for t in test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]:
            failed = _fails(f, m, t)
            if failed:
                return failed
        child, n = n, m.parent.get(id(n))
    return _returned_before(f, m, node) or _drawn_fresh(f, m, node) or _none_arm_by_default(f, m, node)


def _fails(f: Facts, m: Module, t: ast.AST | None) -> str | None:
    """The test `t` as written, when it compares a setting with a constant and the setting's default fails it."""
    if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.left, ast.Subscript) and const_str(
            t.left.slice) and number(t.comparators[0]) is not None and not isinstance(t.ops[0], (ast.In, ast.NotIn)):
        # `if cfg['SEED'] >= 0:` with `SEED: -1` in the project's YAML (VIRT's Base.yaml)
        x = f._yaml_value(const_str(t.left.slice))
        try:
            return ast.unparse(t) if x is not UNKNOWN and x is not None and not COMPARES[type(t.ops[0])](
                x, number(t.comparators[0])) else None
        except (KeyError, TypeError):
            return None
    if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.left, (ast.Attribute, ast.Name)) and (
            isinstance(t.comparators[0], ast.Constant) and not isinstance(t.comparators[0].value, (str, bytes))
            or number(t.comparators[0]) is not None) \
            and not re.search(r"rank|gpu|world|local|dist|device", dotted(t.left).split(".")[-1], re.I) \
            and dotted(t.left).split(".")[-1] not in _launched_with(f):  # (Si-Blurry's scripts pass --rnd_seed)
        # (`if args.seed > 0:`, or a parameter: `if seed is not None:` in `def fit(..., seed=None)` that no
        # call passes, nlp-recipes' Transformer.fit)
        x, op = f.default_value(m, t.left), t.ops[0]
        y = t.comparators[0].value if isinstance(t.comparators[0], ast.Constant) else number(t.comparators[0])
        # (`-1` is a UnaryOp: `if args.seed != -1:`)
        if x is not UNKNOWN and not isinstance(op, (ast.In, ast.NotIn)):
            try:
                holds = COMPARES[type(op)](x, y)
            except TypeError:  # (None > 0)
                holds = True
            if not holds:
                return ast.unparse(t)
    return None


def _none_arm_by_default(f: Facts, m: Module, node: ast.AST) -> str | None:
    """`seed_all_rng(None if cfg.SEED < 0 else cfg.SEED + rank)` (detectron2's default_setup, copied by MonoFlex
    and X-modaler): None seeds from the clock and urandom. The default run takes that arm when the setting's default
    fails the test, or when nothing here sets the setting at all (no assignment, option or YAML key: detectron2's
    own config defaults SEED to -1, "negative to fully randomize")."""
    e = node.args[0] if isinstance(node, ast.Call) and len(node.args) == 1 else None
    if not (isinstance(e, ast.IfExp) and isinstance(e.test, ast.Compare) and len(e.test.ops) == 1 and isinstance(
            e.test.left, (ast.Attribute, ast.Name)) and number(e.test.comparators[0]) is not None):
        return None
    none_if = True if const_value(e.body) is None and isinstance(e.body, ast.Constant) else False if \
        isinstance(e.orelse, ast.Constant) and e.orelse.value is None else None
    if none_if is None:
        return None
    key = dotted(e.test.left).split(".")[-1]
    x = f.default_value(m, e.test.left)
    if x is UNKNOWN:
        if any(isinstance(a, (ast.Assign, ast.AnnAssign)) and any(dotted(t).split(".")[-1] == key for t in (
                a.targets if isinstance(a, ast.Assign) else [a.target])) for mm in f.p.modules.values()
               for a in mm.nodes) or f._yaml_names(key) or key.lower() in _launched_with(f) or any(
                callee(c) == "add_argument" and any((const_str(o) or "").lstrip("-").lower() == key.lower()
                                                    for o in c.args) for mm in f.p.modules.values() for c in mm.calls):
            return None
    else:
        try:
            if COMPARES[type(e.test.ops[0])](x, number(e.test.comparators[0])) != none_if:
                return None
        except (TypeError, KeyError):
            return None
    # (worded as the test that seeds: `cfg.SEED >= 0`; the None arm draws a fresh seed from the clock and urandom)
    op = type(e.test.ops[0])
    flipped = {ast.Lt: ">=", ast.LtE: ">", ast.Gt: "<=", ast.GtE: "<", ast.Eq: "!=", ast.NotEq: "=="}.get(op)
    if none_if and flipped is None:
        return None
    return f"{ast.unparse(e.test.left)} {flipped} {ast.unparse(e.test.comparators[0])}" if none_if else \
        ast.unparse(e.test)


def _launched_with(f: Facts) -> set[str]:
    if "launched_with" not in f.cache:
        f.cache["launched_with"] = f._passed_in_launch_scripts()
    return f.cache["launched_with"]


FRESH_SOURCES = re.compile(r"getpid|urandom|time|now|randint|random|randbits|uuid")


def _drawn_fresh(f: Facts, m: Module, node: ast.AST) -> str | None:
    """`if seed is None: seed = os.getpid() + int(datetime.now()...) + ...` before the seed call, in a helper every
    caller leaves at None (fast-reid's `seed_all_rng()`): the run seeds with a number no other run repeats, which is
    no seed at all for rank 0's init."""
    fn = m.enclosing(node)
    for s in getattr(fn, "body", []):
        if s.lineno >= node.lineno:
            break
        t = s.test if isinstance(s, ast.If) else None
        if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.Is) and isinstance(
                t.left, ast.Name) and isinstance(t.comparators[0], ast.Constant) and t.comparators[0].value is None \
                and _left_at_none(f, m, fn, t.left.id) and any(
                    isinstance(a, ast.Assign) and any(dotted(x) == t.left.id for x in a.targets) and any(
                        isinstance(c, ast.Call) and FRESH_SOURCES.search(callee(c)) for c in ast.walk(a.value))
                    for a in s.body):
            return f"{t.left.id} given (else it is drawn from the clock)"
    return None


def _left_at_none(f: Facts, m: Module, fn: ast.AST, name: str) -> bool:
    """`name` is a parameter of `fn` that defaults to None and that no project call passes (`seed_all_rng()`)."""
    args = fn.args.args
    defaults = dict(zip([a.arg for a in args][len(args) - len(fn.args.defaults):], fn.args.defaults, strict=True))
    if not (isinstance(defaults.get(name), ast.Constant) and defaults[name].value is None):
        return False
    position = [a.arg for a in args if a.arg not in ("self", "cls")].index(name)
    sites = f.p.callers(m, fn)
    return bool(sites) and not any(len(c.args) > position or any(k.arg in (name, None) for k in c.keywords)
                                   for _, c in sites)


def _returned_before(f: Facts, m: Module, node: ast.AST) -> str | None:
    """An early exit before `node` in its function that the default takes: torchdistill's set_seed, `if not
    isinstance(seed, int): return` (or `if seed is None: return`) with a --seed that has no default."""
    fn = m.enclosing(node)
    for s in getattr(fn, "body", []):
        if s.lineno >= node.lineno:
            break
        if not (isinstance(s, ast.If) and s.body and isinstance(s.body[-1], ast.Return) and not s.orelse):
            continue
        t = s.test
        negated = isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not)
        inner = t.operand if negated else t
        if isinstance(inner, ast.Call) and callee(inner) == "isinstance" and len(inner.args) == 2 and \
                isinstance(inner.args[0], ast.Name):
            value = f.default_value(m, inner.args[0])
            if value is None and negated:  # None is no int: the early return is taken
                return ast.unparse(inner)  # (what the seed needs, as the finding words it)
        elif isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.Is) and \
                isinstance(t.left, ast.Name) and const_value(t.comparators[0]) is None and \
                isinstance(t.comparators[0], ast.Constant) and f.default_value(m, t.left) is None:
            return f"{ast.unparse(t.left)} is not None"
    return None


def number(node: ast.AST | None) -> int | float | None:
    try:
        v = ast.literal_eval(node) if node is not None else None
    except ValueError:
        return None
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def single_run_value(m: Module, name: str, at: ast.AST | None = None, depth: int = 0, p=None) -> float | None:
    """The value a rank-holding name has in the single (non-distributed) run: the constant the script's own
    one-process call hands the function around `at` for it (CLIP-EBC's `run(0, 1, args)` beside
    `mp.spawn(run, ...)`, whose `local_rank` parameter is not the `--local_rank` option), its non-rank assignment,
    the environment default (`os.environ.get("RANK", -1)`), the argparse default, else 0. With the project `p`, a
    parameter is followed to what its callers hand it (Efficient Teacher's `set_env(..., RANK, ...)`, called from
    `Trainer.__init__`, which train.py hands `RANK = int(os.getenv('RANK', -1))`)."""
    fn = m.enclosing(at) if at is not None else None
    params = [a.arg for a in fn.args.args] if isinstance(fn, ast.FunctionDef) else []
    if name in params:
        for c in m.calls:
            i = params.index(name)
            if isinstance(c.func, ast.Name) and c.func.id == fn.name and i < len(c.args) and isinstance(
                    c.args[i], ast.Constant) and isinstance(c.args[i].value, int):
                return c.args[i].value
        handed = _handed_by_callers(m, fn, params, name, depth, p) if p is not None and depth < 4 else None
        if handed is not None:
            return handed
    if depth > 4:
        return 0
    consts, sources = [], []
    for a in m.nodes:
        if not isinstance(a, ast.Assign):
            continue
        # (or one element of a tuple assignment: ScaledYOLOv4's `epochs, ..., rank = opt.epochs, ...,
        # opt.global_rank`, with `opt.global_rank = -1` in the single run)
        pairs = [(t, a.value) for t in a.targets] + [
            (e, v) for t in a.targets if isinstance(t, ast.Tuple) and isinstance(a.value, ast.Tuple)
            and len(t.elts) == len(a.value.elts) for e, v in zip(t.elts, a.value.elts, strict=True)]
        for t, value in pairs:
            if dotted(t) != name:
                continue
            if not involves_rank(value, m.rank_tainted):
                if number(value) is not None:  # (`-1` too)
                    consts.append(number(value))
            else:
                sources.append(value)
    if consts:
        return consts[0]
    for v in sources:
        for n in ast.walk(v):
            if isinstance(n, ast.Call) and callee(n) in ("get", "getenv") and len(n.args) == 2 and \
                    const_str(n.args[0]) in ("RANK", "LOCAL_RANK"):
                d = n.args[1]
                d = d.value if isinstance(d, ast.Constant) else ast.literal_eval(d) if isinstance(
                    d, ast.UnaryOp) else None
                try:
                    return float(d)
                except (TypeError, ValueError):
                    return 0
        if isinstance(v, (ast.Name, ast.Attribute)) and dotted(v) != name:
            return single_run_value(m, dotted(v), None, depth + 1, p)
    leaf = name.split(".")[-1]
    for c in m.calls:
        if callee(c) == "add_argument" and any(const_str(a) in (f"--{leaf}", f"--{leaf.replace('_', '-')}")
                                                for a in c.args):
            d = kw(c, "default")
            if isinstance(d, ast.UnaryOp) and isinstance(d.operand, ast.Constant):
                return -d.operand.value
            if isinstance(d, ast.Constant) and isinstance(d.value, (int, float)):
                return d.value
    return 0


def _handed_by_callers(m: Module, fn: ast.FunctionDef, params: list, name: str, depth: int, p) -> float | None:
    """What the project's calls of `fn` hand its parameter `name` in the single run (the first caller that says)."""
    i = params.index(name) - (1 if params[:1] in (["self"], ["cls"]) else 0)
    for cm, site in p.callers(m, fn):
        given = kw(site, name)
        if given is None and 0 <= i < len(site.args) and not any(isinstance(a, ast.Starred) for a in site.args[:i + 1]):
            given = site.args[i]
        if isinstance(given, ast.Constant) and isinstance(given.value, (int, float)):
            return given.value
        if isinstance(given, (ast.Name, ast.Attribute)):
            return single_run_value(cm, dotted(given), site, depth + 1, p)
    return None
