"""The seed a seeding call's argument gives, for chapter 02's seed-per-rank rule (rules/seeds.py): at rank 0 of the
DDP run and in the single run, with the rank and world-size names set, and the names that only carry a rank
inlined, so `seed + 1 + RANK` (RANK = -1 alone) reads as the two different seeds it is; and the assignment the
single run keeps where a distributed switch replaces the seed with a rank."""

from __future__ import annotations

import ast
import copy
import warnings

from .project import Module
from .switches import distributed_switch
from .syntax import RANKISH, WORLDISH, const_str, dotted, involves_rank, is_rankish_node


def seed_value(m: Module, expr: ast.AST, rank_value, world: int = 2) -> float | None:
    """The seed an expression gives with every rank-holding name set by rank_value(name), the world size set to
    `world` (2 for the DDP run, 1 for the single run: `global_seed * world_size + rank` moves rank 0's seed too),
    other names 1000."""
    def value(n, name):
        if is_rankish_node(n, m.rank_tainted):
            return rank_value(name)
        return world if WORLDISH.search(dotted(n.func if isinstance(n, ast.Call) else n)) else 1000

    class Sub(ast.NodeTransformer):
        def visit_Name(s, n):
            return ast.Constant(value(n, n.id))

        def visit_Attribute(s, n):
            return ast.Constant(value(n, dotted(n)))

        def visit_Call(s, n):
            return ast.Constant(value(n, "get_rank"))

        def visit_Subscript(s, n):  # `args['seed'] + 1 + RANK` (a config dict read by key: the key is the name)
            key = const_str(n.slice)
            return ast.Constant(value(ast.Name(key), key)) if key and key.isidentifier() else n
    try:
        warnings.simplefilter("ignore", SyntaxWarning)
        body = Sub().visit(ast.parse(ast.unparse(expr), mode="eval").body)
        tree = ast.fix_missing_locations(ast.Expression(body))
        return eval(compile(tree, "<seed>", "eval"), {"__builtins__": {}}, {})  # noqa: S307 (constants only)
    except Exception:  # noqa: BLE001 - an expression we cannot evaluate is no finding
        return None


def inline_rank_name(m: Module, expr: ast.AST, depth: int = 3) -> ast.AST:
    """`seed = args.seed + utils.get_rank(); torch.manual_seed(seed)`: a name that only carries a rank (it is
    no rank itself, and has one assignment) is replaced by its expression, so the rank term is judged as
    written, not the intermediate name taken for the rank."""
    if depth == 0 or not isinstance(expr, (ast.Name, ast.Attribute)) or RANKISH.search(
            dotted(expr).split(".")[-1]) or dotted(expr) not in m.rank_tainted:
        return expr
    defs = [a.value for a in m.nodes if isinstance(a, ast.Assign) and len(a.targets) == 1
            and dotted(a.targets[0]) == dotted(expr)]
    if len(defs) > 1:  # (`seed = args.seed`, then `seed = args.seed + idr_torch.rank` on GPUs: the one with the rank)
        defs = [d for d in defs if involves_rank(d, m.rank_tainted)]
    return inline_rank_name(m, defs[0], depth - 1) if len(defs) == 1 else expr


def rank_seed_under_switch(m: Module, arg: ast.AST):
    """(the rank-bearing assignment, the earlier one the single run keeps, the switch) for `seed = config.seed`
    then `if engine.distributed: seed = engine.local_rank` (TorchSeg): under DDP the seed is replaced, and rank 0's
    value need not be the single run's."""
    if not isinstance(arg, ast.Name):
        return None
    binds = sorted((a for a in m.nodes if isinstance(a, ast.Assign) and len(a.targets) == 1
                    and dotted(a.targets[0]) == arg.id), key=lambda a: a.lineno)
    ranked = [a for a in binds if involves_rank(a.value, m.rank_tainted) and distributed_switch(m, a) is not None]
    bases = [a for a in binds if not involves_rank(a.value, m.rank_tainted) and distributed_switch(m, a) is None]
    if len(ranked) != 1 or not bases or bases[0].lineno > ranked[0].lineno:
        return None
    return ranked[0], bases[0], distributed_switch(m, ranked[0])


def with_name(expr: ast.AST, name: str, value: ast.AST) -> ast.AST:
    """`expr` with the name `name` replaced by `value` (`seed + local_rank` after `seed = 12345`)."""
    class Put(ast.NodeTransformer):
        def visit_Name(self, n):
            return value if n.id == name else n
    return Put().visit(copy.deepcopy(expr))
