"""What a script runs, as far as the rules' consequences go: a library's demo under its main guard that the
training run never executes, and a script that only evaluates loaded weights (nothing it runs steps)."""

from __future__ import annotations

import ast
import re

from .facts import Facts
from .project import Module
from .syntax import EVAL_WORD, callee, dotted


def demo_block(f: Facts, m: Module, node: ast.AST) -> bool:
    """`node` lies in the `if __name__ == "__main__":` block of a library module another audited file imports
    (CasMVSNet's models/module.py ends in a plotting demo), and that block sets up no DDP: the training run
    imports the module and never runs the block."""
    guard = next((s for s in m.tree.body if isinstance(s, ast.If) and "__name__" in {
        dotted(x) for x in ast.walk(s.test)} and any(x is node for x in ast.walk(s))), None)
    if guard is None or not any(m.rel in f.p.imports_of(u) for u in f.p.modules.values() if u is not m):
        return False
    keys = set()
    for c in (x for x in ast.walk(guard) if isinstance(x, ast.Call)):
        for tm, tf in f.p.resolve(m, c):
            keys |= f.p.reach(tm, tf)
    calls = [(m, c) for c in ast.walk(guard) if isinstance(c, ast.Call)] + f.p.calls_in(keys)
    return not any(callee(c) in ("init_process_group", "spawn") or f.is_ddp_call(mm, c) for mm, c in calls)

def evaluation_script(f: Facts, m: Module) -> bool:
    """An entry script that only evaluates: nothing it runs calls backward or an optimizer step, and it says it
    evaluates (named test/eval/inference, or it puts a model in eval mode or under no_grad). Its DDP model
    (loaded weights) is never trained, so an unseeded init or per-rank BatchNorm statistics change nothing."""
    cache = f.cache.setdefault("evaluation_script", {})
    if m.rel not in cache:
        top = [s for s in m.tree.body if not isinstance(s, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))]
        calls = [c for s in top for c in ast.walk(s) if isinstance(c, ast.Call)] + [
            c for _, c in f.p.calls_in(f.entry_scope(m))]
        # (`self.var_opt.backward_clip_step(loss=loss)`, VAR's AmpOptimizer from a file these copies lack)
        steps = any("backward" in callee(c) or callee(c) == "step" and re.search(r"opt", dotted(c.func), re.I)
                    or "scaler" in callee(c).lower() for c in calls)
        stem = m.rel.rsplit("/", 1)[-1].removesuffix(".py")
        says = any(EVAL_WORD.fullmatch(w) for w in re.split(r"[_\W]+", stem)) or any(
            callee(c) in ("eval", "no_grad", "inference_mode") and isinstance(c.func, ast.Attribute)
            for c in calls)
        cache[m.rel] = not steps and says
    return cache[m.rel]


def shadowed(m: Module, node: ast.AST) -> bool:
    """`node` lies in a module-level function that the module defines again further down (RepVGG's utils.py has
    two load_checkpoint): the name binds the last one, so the first never runs."""
    top = next((s for s in m.tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
                and s.lineno <= getattr(node, "lineno", 0) <= (s.end_lineno or s.lineno)), None)
    return top is not None and m.functions.get(top.name) is not top

