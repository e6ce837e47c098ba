"""Which modules are scripts. A module a script imports may carry a `__main__` block of its own that only tries
it out (WeKws's model/tcn.py builds the TCN, runs a random tensor through it and prints the shape): such a block
makes no training script, and the rules that judge scripts (seeds, BatchNorm, loads) leave the module to the
scripts that use it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from .syntax import ENTRY_CALLS, callee, dotted, walk

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
        c == "spawn" or "DistributedDataParallel" in (m.imports.get(c, ("", "", 0))[1] or "") or RUN_SIGN.search(c)
        for c in calls)


# a call of the run's own main or training function (X-ray denoising's `train_model_ddp(model, ...)` after
# `model = UNetplusplus(...)`, a class the module defines: a script, not a model file trying itself out)
RUN_SIGN = re.compile(r"^(main|run|fit)$|^train(_|$)|_train$|^(setup|init)_(ddp|dist)")


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


# `python tools/train.py`, `torchrun ... $method.py`, `-m torch.distributed.launch ... ${ROOT}/main.py`
SCRIPT_ARGUMENT = re.compile(r"(?<![\w$/.-])((?:[\w$.{}/-]*/)?[\w${}-]+\.py)\b")
SHELL_VARIABLE = re.compile(r"^\s*(?:export\s+)?(\w+)=['\"]?([\w./-]*)['\"]?\s*(?:#.*)?$")


def launched_scripts(root: Path, scripts: list[Path]) -> set[str] | None:
    """The Python files the project's shell scripts run (their names, a script's own variables filled in:
    UniMatch V2's `method='unimatch_v2'`, then `$method.py`); None when no script runs any. A comment that lists
    the other choices (`# method: ['unimatch_v2', 'fixmatch', 'supervised']`) runs nothing."""
    found: set[str] = set()
    for path in scripts:
        text = path.read_text(encoding="utf-8", errors="replace")
        lines = [re.sub(r"(^|\s)#.*$", "", line) for line in text.replace("\\\n", " ").splitlines()]  # (not `${#a[@]}`)
        variables = {m.group(1): m.group(2) for m in map(SHELL_VARIABLE.match, text.splitlines()) if m}
        for line in lines:
            for name in SCRIPT_ARGUMENT.findall(line):
                name = re.sub(r"\$\{?(\w+)\}?", lambda v, known=variables: known.get(v.group(1), "\0"), name)
                if "\0" not in name:
                    found.add(Path(name).name)
    return found or None


def unlaunched_lines(p, scripts: list[Path]) -> dict[str, list[range]]:
    """Per script the project's launch scripts never run, when they run another of them and import from this one (a
    second entry point, UniMatch V2's supervised.py beside the unimatch_v2.py that train.sh runs): the lines only
    its own run reaches, i.e. all but the functions and classes another module imports from it (unimatch_v2.py's
    `from supervised import evaluate`). What is wrong only there is not in the run the project documents. {path:
    line ranges}."""
    launched = launched_scripts(p.root, scripts) if p.on_disk else None
    entries = [m for m in p.modules.values() if m.entry]
    if not launched or not any(Path(m.rel).name in launched for m in entries):
        return {}
    out = {}
    for e in entries:
        if Path(e.rel).name in launched:
            continue
        used = {name for m in p.modules.values() if m is not e for local, (_, name, _) in m.imports.items()
                if p.module_for(m, local) is e}
        if not used:
            continue  # an entry point of its own, which nothing imports (GNS's train.py beside the train_multinode.py
            # its SLURM script runs; ROSITA's run_rec.py): a run its README documents too, judged as one
        kept = [range(n.lineno, n.end_lineno + 1) for n in e.tree.body if getattr(n, "name", None) in used]
        out[str(e.path)] = [range(a.stop, b.start) for a, b in zip(
            [range(0, 1), *sorted(kept, key=lambda r: r.start)],
            [*sorted(kept, key=lambda r: r.start), range(10**9, 10**9)], strict=True)]
    return out


def chosen_by_name(p, m, c: ast.Call, name: str) -> list:
    """The functions a name may hold when the script picks one of its own by a configured name (OVSR's main.py:
    `function = getattr(sys.modules[__name__], config.function)`, then `ddp_func(function, config)`; or
    `globals()[args.mode]`): each function the module defines or imports, (module, function) pairs."""
    chosen = m.__dict__.get("_chosen_by_name")
    if chosen is None:  # (the names any statement of the module binds so: asked for every handed name)
        chosen = m.__dict__["_chosen_by_name"] = {dotted(t) for a in m.nodes if isinstance(a, ast.Assign)
                                                  and _from_own_globals(a.value) for t in a.targets}
    if name not in chosen:
        return []
    scope = m.enclosing(c) or m.tree
    if not any(isinstance(a, ast.Assign) and any(dotted(t) == name for t in a.targets) and _from_own_globals(a.value)
               for a in walk(scope)):
        return []
    own = [(m, fn) for k, fn in m.functions.items() if "." not in k]
    return own + [t for local, (_, attr, _) in m.imports.items() if attr
                  for t in p.resolve(m, ast.Call(func=ast.Name(id=local), args=[], keywords=[]))]


def _from_own_globals(v: ast.AST) -> bool:
    """`getattr(sys.modules[__name__], ...)` or `globals()[...]`."""
    if isinstance(v, ast.Call) and callee(v) == "getattr" and v.args and isinstance(v.args[0], ast.Subscript):
        return dotted(v.args[0].value) == "sys.modules" and dotted(v.args[0].slice) == "__name__"
    return isinstance(v, ast.Subscript) and isinstance(v.value, ast.Call) and callee(v.value) == "globals"
