"""guided-diffusion's parser built from dicts of defaults (`defaults = dict(...)`, `defaults.update(
cm_train_defaults())`, `add_dict_to_argparser(parser, defaults)`): its options, for options.py, which reads argparse's
own add_argument calls."""

from __future__ import annotations

import ast
import re

from .syntax import callee, dotted, walk


def dict_parser_flags(project) -> dict[str, str]:
    """Each key a dict of defaults sets to False: an option off unless given (CTM's `large_log=False`,
    `sanity_check=False`), as store_true_flags names them (attribute -> option)."""
    if not any(callee(c) == "add_dict_to_argparser" for mm in project.modules.values() for c in mm.calls):
        return {}
    out = {}
    for mm in project.modules.values():
        for fn in mm.functions.values():
            if not re.search(r"defaults?$", fn.name.split(".")[-1]) and not any(
                    isinstance(a, ast.Assign) and any(dotted(t) == "defaults" for t in a.targets) for a in walk(fn)):
                continue
            for c in walk(fn):
                if isinstance(c, ast.Call) and callee(c) == "dict":
                    out.update({k.arg: k.arg for k in c.keywords if k.arg and isinstance(k.value, ast.Constant)
                                and k.value.value is False})
    return out
