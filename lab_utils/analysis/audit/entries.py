"""Which modules are scripts. A module a script imports may carry a `__main__` block of its own that only tries
it out (WeKws's model/tcn.py builds the TCN, runs a random tensor through it and prints the shape): such a block
makes no training script, and the rules that judge scripts (seeds, BatchNorm, loads) leave the module to the
scripts that use it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from .syntax import ENTRY_CALLS, callee, dotted

# calls in a `__main__` block that make it a run, not a module's self-test
SELF_TEST_SIGNS = {"parse_args", "step", "fit", "launch", "init_process_group", "Trainer", "main_worker"}


def self_test_only(m) -> bool:
    """The module is a script only through a `__main__` block that trains nothing: no option parsing, no process
    group, wrap, spawn, backward or step, no call of a main/train/run function."""
    mains = [n for n in m.tree.body if isinstance(n, ast.If) and "__name__" in {dotted(x) for x in ast.walk(n.test)}]
    if not mains or any(isinstance(n, (ast.For, ast.While)) for n in m.tree.body):
        return False
    calls = {callee(c) for n in mains for c in ast.walk(n) if isinstance(c, ast.Call) and not (
        isinstance(c.func, ast.Attribute) and c.func.attr in ("train", "eval") and not c.args
        and not re.search(r"train|engine|runner|solver", dotted(c.func.value), re.I))}  # (`m.train()`: a mode)
    return not calls & (ENTRY_CALLS | SELF_TEST_SIGNS) and not any(
        c == "spawn" or "DistributedDataParallel" in (m.imports.get(c, ("", "", 0))[1] or "") for c in calls)


def demote_self_tests(p) -> None:
    """Unmark as scripts the modules the project's other modules import whose `__main__` block is a self-test."""
    imported = {t.rel for m in p.modules.values() for local in m.imports
                for t in [p.module_for(m, local)] if t is not None and t is not m}
    # ... or named by a package import (`from sugar.modules.dynamicarch import DynamicBatchNorm1d`, or
    # `from .dynamicarch import *` in a package __init__ these files may lack)
    named = {part for m in p.modules.values() for mod, name, _ in m.imports.values()
             for part in [*(mod or "").split("."), name or ""] if part}
    imported |= {rel for rel in p.modules if Path(rel).stem in named and Path(rel).stem != "__init__"}
    for m in p.modules.values():
        if m.entry and (m.rel in imported or _tries_its_own_class(m)) and self_test_only(m):
            m.entry = False


def _tries_its_own_class(m) -> bool:
    """The `__main__` block builds a class the module defines (CoCLR's backbone/s3dg.py: `model =
    S3D(num_classes=400)`): a model file trying itself out, whoever imports it."""
    mains = [n for n in m.tree.body if isinstance(n, ast.If) and "__name__" in {dotted(x) for x in ast.walk(n.test)}]
    return any(isinstance(c, ast.Call) and callee(c) in m.classes for n in mains for c in ast.walk(n))
