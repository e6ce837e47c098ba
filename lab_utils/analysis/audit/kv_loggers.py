"""OpenAI baselines' key-value logger, which guided-diffusion and its descendants copy (consistency models,
DiffuSeq, MDT, LN3Diff): every rank calls `logger.logkv_mean(key, loss)`, and `logger.dumpkvs()` writes the means.
Its Logger.dumpkvs averages over the ranks only when configure() was handed a communicator (`if self.comm is None:
d = self.name2val`), so a project that never hands one (`logger.configure()`, no `comm=`, no set_comm) writes each
rank's own means: rank 0's log holds its own micro-batches' losses, not the global batch's."""

from __future__ import annotations

import ast

from .project import Module
from .registry import Hit
from .syntax import LOSSISH, callee, const_str, dotted, walk


def unreduced_dumps(f, m: Module) -> list[tuple[ast.Call, tuple]]:
    """(the `logger.dumpkvs()` call in `m`, its related places) for each function of `m` that dumps a project
    baselines logger no call ever hands a communicator, when some call logs a loss into it."""
    cache = f.cache.setdefault("kv_dumps", {})
    if m.rel in cache:
        return cache[m.rel]
    cache[m.rel] = out = []
    found = _logger_module(f)
    if found is None or m is found[0]:
        return out
    lm, unreduced = found
    calls = [(mm, c) for mm in f.p.modules.values() if mm is not lm for c in mm.calls]
    mine = [(mm, c) for mm, c in calls if any(tm is lm for tm, _ in f.p.resolve(mm, c))]
    configures = [(mm, c) for mm, c in mine if callee(c) == "configure"]
    if not configures or any(k.arg == "comm" for _, c in configures for k in c.keywords) or any(
            callee(c) == "set_comm" for _, c in mine):
        return out
    if not any(callee(c) in ("logkv_mean", "logkv") and _logs_a_loss(mm, c) for mm, c in mine):
        return out
    # one defect, one finding: the first dump (by file and line), naming the others, the logger's line and the
    # configure() calls that hand no communicator
    dumps = sorted(((mm, c) for mm, c in mine if callee(c) == "dumpkvs"), key=lambda x: (x[0].rel, x[1].lineno))
    if dumps and dumps[0][0] is m:
        out.append((dumps[0][1], ((lm, unreduced), *configures[:2], *dumps[1:3])))
    return out


def _logs_a_loss(m: Module, c: ast.Call) -> bool:
    """`logkv_mean("loss", v)`, `logkv_mean(key, values.mean().item())` over a loss dict, `logkv_mean(f"{key}_q",
    sub_loss)`: a loss by its key or its value; or any value of a loop over a loss dict (CTM's `for key, values in
    losses.items(): logger.logkv_mean(f"{key} mean", values.mean().item())`)."""
    loop = m.enclosing(c, (ast.For,))
    return any(LOSSISH.search(const_str(a) or "") for a in c.args) or any(
        isinstance(n, (ast.Name, ast.Attribute)) and LOSSISH.search(dotted(n).split(".")[-1]) for a in c.args
        for n in ast.walk(a)) or loop is not None and isinstance(loop.iter, ast.Call) and callee(
        loop.iter) == "items" and isinstance(loop.iter.func, ast.Attribute) and LOSSISH.search(
        dotted(loop.iter.func.value).split(".")[-1]) is not None


def _logger_module(f):
    """(the project's baselines logger module, the line of its Logger.dumpkvs that takes the unreduced values)."""
    if "kv_logger" not in f.cache:
        f.cache["kv_logger"] = None
        for mm in f.p.modules.values():
            if not {"logkv_mean", "dumpkvs", "configure"} <= set(mm.functions):
                continue
            for key, fn in mm.functions.items():
                if key.endswith(".dumpkvs"):
                    for n in walk(fn):
                        if isinstance(n, ast.If) and dotted(n.test.left if isinstance(n.test, ast.Compare) else
                                                            n.test) == "self.comm" and n.body:
                            f.cache["kv_logger"] = (mm, n.body[0])
    return f.cache["kv_logger"]


def kv_dump_hits(f, m: Module):
    """rank0-local-loss's findings for the baselines logger, one per function that dumps it."""
    for c, related in unreduced_dumps(f, m):
        yield Hit(c, ("logger.dumpkvs() writes each rank's own logkv_mean values: configure() was handed no "
                      "communicator, so the logger's dumpkvs takes its unreduced name2val, and rank 0 logs its own "
                      "micro-batches' loss, not the global batch's — logger.configure(comm=...) (or all_reduce "
                      "the losses before logkv_mean)"), related=related)

