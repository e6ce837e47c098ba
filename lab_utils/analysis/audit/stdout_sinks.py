"""Where print goes on the other ranks when a script replaces sys.stdout: a project object whose `write` writes
only under a rank-0 test sends their prints nowhere (facts.py asks this for its print_override fact)."""

from __future__ import annotations

import ast
import re

from .project import Module
from .syntax import callee, dotted, involves


def rank0_writer(p, m: Module, value: ast.AST) -> bool:
    """`sys.stdout = logger` where logger is a project object whose `write` writes only under a rank-0 test
    (OpenUnReID's Logger: `if self.rank == 0 or self.debug: self.console.write(msg)`): the other ranks' prints
    go nowhere."""
    name = dotted(value) if isinstance(value, (ast.Name, ast.Attribute)) else None
    found = p.instance_class(m, name) if name else None
    if found is None and isinstance(value, ast.Call):
        found = next(((tm, tm.classes[tm.class_of(tf)]) for tm, tf in p.resolve(m, value, exact=True)
                      if tm.class_of(tf)), None)
    write = found[0].functions.get(f"{found[1].name}.write") if found else None
    return write is not None and any(
        isinstance(n, ast.If) and any(isinstance(c, ast.Compare) and involves(c, re.compile(r"rank", re.I)) and any(
            isinstance(k, ast.Constant) and k.value == 0 for k in c.comparators) for c in ast.walk(n.test))
        and any(isinstance(x, ast.Call) and callee(x) == "write" for b in n.body for x in ast.walk(b))
        for n in ast.walk(write))
