"""Values that grow with the GPU count (`eff_batch = batch_size * accum * world_size`, a copy of
`get_world_size()`, a ratio over them) and learning rates written where nothing reads them: what chapter 01's lr
rule asks before it says the lr moves with the world size."""

from __future__ import annotations

import ast
import re

from .facts import Facts
from .project import Module
from .scripts import off_the_default_path
from .syntax import WORLDISH, callee, const_str, dotted, involves, root, walk


def never_read(f: Facts, m: Module, a: ast.Assign) -> bool:
    """An lr written to an attribute of the object that nothing reads (UniTabE's `self.lr = config.lr *
    num_gpus`, while the optimizer gets config.lr): the run never steps with it. Only `self.` attributes: an
    options namespace (`args.lr`) or a name is read by helpers and callers these files may not show."""
    names = [dotted(t) for t in a.targets]
    if not all(n.startswith("self.") and n.count(".") == 1 for n in names):
        return False
    attrs = {n.split(".")[1] for n in names}
    return not any(isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load) and n.attr in attrs
                   and not re.fullmatch(r"(config|cfg|args|opt|opts|hparams|params)", root(n))
                   for mm in f.p.modules.values() for n in mm.nodes)


def world_holding(f: Facts, m: Module) -> set[str]:
    """Names that grow with the GPU count: `eff_batch = batch_size * accum * world_size` (to a fixpoint), and
    names that hold the count itself, whatever they are called (`num_tasks = utils.get_world_size()`). A product
    whose other factor was divided by the count (`glb = (bs // world_size) * world_size`, SparK) stays fixed, and
    so does one written only in an arm the default run skips (L2P's `if args.unscale_lr: global_batch_size =
    args.batch_size else: ... * args.world_size`, --unscale_lr on by default)."""
    shrunk = {dotted(t) for a in m.nodes if isinstance(a, ast.Assign) and isinstance(a.value, ast.BinOp)
              and isinstance(a.value.op, (ast.Div, ast.FloorDiv)) and involves(a.value.right, WORLDISH)
              for t in a.targets}
    out: set[str] = set(_shared_counts(f)) | {dotted(c.func) for c in m.calls if callee(c) in _count_helpers(f)}
    for _ in range(3):
        for a in m.nodes:
            count = isinstance(a, ast.Assign) and a_count(a.value, out)
            cancels = isinstance(a, ast.Assign) and any(dotted(n) in shrunk for n in ast.walk(a.value)
                                                        if isinstance(n, (ast.Name, ast.Attribute)))
            if isinstance(a, ast.Assign) and (count or grows(a.value, out) and not cancels) and not (
                    grows(a.value, out) and off_the_default_path(f, m, a)):
                out |= {dotted(t) for t in a.targets} - {""}
    return out


def _count_helpers(f: Facts) -> set[str]:
    """Project functions that return the GPU count, whatever they are called (EfficientViT's `def get_dist_size():
    return int(os.environ["WORLD_SIZE"])`): a call of one is the count."""
    if "count_helpers" not in f.cache:
        f.cache["count_helpers"] = {fn.name for mm in f.p.modules.values() for fn in mm.functions.values()
                                    if isinstance(fn, ast.FunctionDef) and (rets := [
                                        r.value for r in walk(fn) if isinstance(r, ast.Return)]) and all(
                                        r is not None and a_count(r, set()) for r in rets)}
    return f.cache["count_helpers"]


def _shared_counts(f: Facts) -> set[str]:
    """Attributes of a shared object that some module sets to the GPU count (rtseg's parallel.py:
    `config.gpu_num = dist.get_world_size()`, then `config.lr = config.base_lr * config.gpu_num` in
    optimizer.py): the same object, so the same count, in every module."""
    if "shared_counts" not in f.cache:
        f.cache["shared_counts"] = {dotted(t) for mm in f.p.modules.values() for a in mm.nodes
                                    if isinstance(a, ast.Assign) and a_count(a.value, set())
                                    for t in a.targets if isinstance(t, ast.Attribute) and not dotted(t).startswith(
                                        "self.")} - {""}
    return f.cache["shared_counts"]


def a_count(v: ast.AST, holding: set[str]) -> bool:
    """The GPU count itself: `get_world_size()` (torch's or a helper's), `args.world_size`, a copy of a name
    that holds it, `int(os.environ["WORLD_SIZE"])`; not an expression that merely uses it (`batch_size //
    world_size` shrinks)."""
    if isinstance(v, ast.Call) and callee(v) in ("int", "len") and len(v.args) == 1:
        v = v.args[0]
    if isinstance(v, ast.Subscript):
        return const_str(v.slice) == "WORLD_SIZE"
    if isinstance(v, ast.Call):
        return bool(WORLDISH.search(callee(v))) or callee(v) == "get" and bool(v.args) and \
            const_str(v.args[0]) == "WORLD_SIZE"
    return isinstance(v, (ast.Name, ast.Attribute)) and (bool(WORLDISH.search(dotted(v).split(".")[-1]))
                                                         or dotted(v) in holding)


def grows(v: ast.AST, holding: set[str]) -> bool:
    """A product with a world-size factor (`x * world_size`, `x * get_world_size()`, `x * eff_batch`), or a value
    that carries one on: a ratio over it (`batch_ratio = global_batch / 256`), a root of it (`batch_ratio ** 0.5`),
    a copy of it. A world size in a divisor shrinks the value instead."""
    def held(side):
        return involves(side, WORLDISH) or any(dotted(n) in holding for n in ast.walk(side)
                                               if isinstance(n, (ast.Name, ast.Attribute)))
    if isinstance(v, (ast.Name, ast.Attribute)) and dotted(v) in holding:
        return True
    return any(isinstance(b, ast.BinOp) and (isinstance(b.op, ast.Mult) and any(held(s) for s in (b.left, b.right))
                                             or isinstance(b.op, (ast.Div, ast.Pow)) and carries(b.left, holding))
               for b in ast.walk(v))


def carries(v: ast.AST, holding: set[str]) -> bool:
    """The numerator or base of a ratio or a power is a name that grows with the GPU count."""
    return isinstance(v, (ast.Name, ast.Attribute)) and dotted(v) in holding or isinstance(v, ast.BinOp) and \
        grows(v, holding)
