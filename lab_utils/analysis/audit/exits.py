"""A training loop that rank 0 alone leaves: an early stop that only rank 0 decides (the stopping object called
under rank 0's guard, the loop breaking on its flag). The other ranks go on into the next step, whose gradient
all-reduce rank 0 never joins, and wait there forever (a hang the single run cannot have). Chapter 00's
collective-under-rank0 asks it (rules/collectives.py)."""

from __future__ import annotations

import ast
import re

from .facts import Facts
from .project import Module
from .registry import Hit
from .switches import one_process_arm
from .syntax import callee, dotted, involves_rank, walk

EXITS = ("sys.exit", "exit", "quit", "os._exit")


def _steps(mm: Module, c: ast.Call) -> bool:
    return callee(c) == "backward" or callee(c) == "step" and "optim" in dotted(c.func)


def _trains(f: Facts, m: Module, loop: ast.AST) -> bool:
    """The loop runs backward or an optimizer step, itself or through the project functions it calls."""
    calls = [c for c in walk(loop) if isinstance(c, ast.Call)]
    return any(_steps(m, c) for c in calls) or any(
        f.p.function_does(tm, tf, _steps, depth=2) for c in calls for tm, tf in f.p.resolve(m, c))


def _leaves(m: Module, loop: ast.AST, x: ast.AST) -> bool:
    """`x` ends the loop: a `break` of this very loop, a `return` of the function the loop runs in (ToucanTTS's
    `if step_counter > steps: return` inside rank 0's checkpoint block), or an exit of the process."""
    if isinstance(x, ast.Break):
        return m.enclosing(x, (ast.For, ast.While)) is loop
    if isinstance(x, ast.Return):  # (on a count reaching its end, not a NaN abort nor a callback's stop flag:
        test = getattr(m.parent.get(id(x)), "test", None)  # YOLOv5's `if callbacks.stop_training: return`)
        return m.enclosing(x) is m.enclosing(loop) and m.enclosing(loop) is not None and isinstance(
            test, ast.Compare) and any(isinstance(n, (ast.Name, ast.Attribute)) and re.search(
                r"step|iter|epoch|count", dotted(n).split(".")[-1], re.I) for n in ast.walk(test))
    return isinstance(x, ast.Call) and dotted(x.func) in EXITS


def _holder(m: Module, x: ast.AST) -> ast.AST | None:
    """The statement around an exit: a `break`'s own parent, or the `if` around an `exit()` call's statement
    (GraphFormers' `if best_count >= 2: ... exit()` in rank 0's validation block)."""
    up = m.parent.get(id(x))
    return m.parent.get(id(up)) if isinstance(x, ast.Call) and isinstance(up, ast.Expr) else up


def _run_by(f: Facts, m: Module, loop: ast.AST) -> list[tuple[Module, ast.Call]]:
    """The calls the loop makes, itself and in the project functions it calls (two levels down)."""
    out, todo, seen = [], [(m, loop, 0)], set()
    while todo:
        mm, node, depth = todo.pop()
        for c in (x for x in ast.walk(node) if isinstance(x, ast.Call)):
            out.append((mm, c))
            for tm, tf in f.p.resolve(mm, c) if depth < 2 else []:
                if id(tf) not in seen:
                    seen.add(id(tf))
                    todo.append((tm, tf, depth + 1))
    return out


def _decided_on_rank0(f: Facts, m: Module, loop: ast.AST, test: ast.AST) -> tuple | None:
    """(the text, (module, node) where rank 0 decides) of what in `test` only rank 0 sets: an object only rank 0
    calls in the loop (`if self.early_stopping.early_stop:` with `self.early_stopping(score, model)` under `if
    self.local_rank == 0:` in the test() the loop calls), that nothing else sets the flag of."""
    run = _run_by(f, m, loop)
    for n in ast.walk(test):
        if not isinstance(n, (ast.Name, ast.Attribute)):
            continue
        obj = dotted(n.value) if isinstance(n, ast.Attribute) else None
        uses = [(mm, c) for mm, c in run if obj and dotted(c.func) == obj]  # the object called: it decides
        sets = [(mm, a) for mm in {m, *f.p.related(m)} for a in mm.nodes if isinstance(a, ast.Assign)
                and any(dotted(t) == dotted(n) for t in a.targets) and mm.enclosing(a) is not None
                and mm.enclosing(a).name != "__init__"]
        if obj and uses and all(f.g.effective(mm, c) == "rank0" for mm, c in uses) and not sets:
            return f"{dotted(n)} (set by {ast.unparse(uses[0][1].func)}(...), which only rank 0 calls, line " \
                f"{uses[0][1].lineno})", uses[0]
    return None


def _under_rank0_guard(f: Facts, m: Module, loop: ast.AST, x: ast.AST) -> tuple | None:
    """The exit sits in rank 0's own block inside the loop (DUSTGaussian's `if args.local_rank == 0: ...
    global_step += 1; if global_step > ...: break`; Joey NMT's `if (is_min_lr or is_max_update) and self.rank ==
    0: break`): rank 0 alone can take it, whatever its test reads."""
    n = m.parent.get(id(x))
    while n is not None and n is not loop:
        if isinstance(n, ast.If) and f.g.classify(m, n.test) == "rank0" and involves_rank(n.test) and not (
                f.off_by_default(m, x) or f.off_by_default(m, _holder(m, x)) or one_process_arm(m, x) or any(
                    isinstance(c, ast.Compare) and involves_rank(c.left) and isinstance(c.ops[0], ast.Eq) and
                    ast.unparse(c.comparators[0]) == "-1" for c in ast.walk(_holder(m, x).test))):
            # (nor an option's early stop, nor KAPAO's `if RANK == -1 and stopper(...): break`, one process's)
            # (a test that names the rank: not a flag only rank 0 computes, YOLOv5's `if stop: break`, which a
            # broadcast hands every rank first)
            return f"it sits under rank 0's own test `{ast.unparse(n.test)[:60]}` (line {n.lineno})", (m, n)
        n = m.parent.get(id(n))
    return None


def rank0_loop_exits(f: Facts, m: Module):
    """(node, message) for each training loop that only rank 0 leaves; the exits of nested loops in one function
    under rank 0's own tests (Joey NMT's batch loop and epoch loop) are one finding, at the first test."""
    first: dict = {}
    for hit in sorted(_rank0_loop_exits(f, m), key=lambda h: h.node.lineno):
        key = id(m.enclosing(hit.node)) if isinstance(hit.node, ast.If) else id(hit)
        first[key] = first[key]._replace(related=(*first[key].related, (m, hit.node))) if key in first else hit
    yield from first.values()


def _rank0_loop_exits(f: Facts, m: Module):
    for loop in (n for n in m.nodes if isinstance(n, (ast.For, ast.While))):
        # (cheap first: a break or an exit of this loop directly under an `if` on an attribute of an object)
        exits = [x for x in walk(loop) if _leaves(m, loop, x) and isinstance(_holder(m, x), ast.If)
                 and (any(isinstance(n, ast.Attribute) for n in ast.walk(_holder(m, x).test))
                      or f.g.kind(m, x) == "rank0")]  # (or under rank 0's own test: the guard case below)
        if not exits or f.g.effective(m, loop) == "rank0" or not _trains(f, m, loop):
            continue
        for x in exits:
            what = "exits the process" if isinstance(x, ast.Call) else "leaves the training loop"
            word = "exit" if isinstance(x, ast.Call) else "return" if isinstance(x, ast.Return) else "break"
            decided = _decided_on_rank0(f, m, loop, _holder(m, x).test)
            guard = _under_rank0_guard(f, m, loop, x) if decided is None else None
            if decided is not None or guard is not None:
                why, where = decided or guard
                at = _holder(m, x) if guard else x
                yield Hit(at, (f"this {word} {what} on a test only rank 0 "
                               f"can pass: {why}; the other ranks go on into the next step, whose gradient all-reduce "
                               "rank 0 never joins, and wait forever (a hang the single run cannot have) — "
                               "broadcast the decision from rank 0 (dist.broadcast of a stop flag) so every rank "
                               "leaves together"),
                          related=(where,) if where[1] is not at else ())
                break
