"""Options unset unless given: a command-line option whose default is the empty string or a resume path left
None, and a config key no YAML file names; tested so, false in the default run (DLRM's `if args.load_model:`,
APTM's `if 'attr' in config.keys():`). Mixed into Facts through options.DefaultOptions."""

from __future__ import annotations

import ast
import re

from .python_configs import CONFIGISH, PythonConfigs
from .syntax import callee, const_str, const_value, dotted, kw


def configish(x: ast.AST) -> bool:
    """A config object however it is reached: `cfg`, `self.cfg['Global']`, `config['solver']`, `op_cfg`."""
    while isinstance(x, (ast.Subscript, ast.Attribute)):
        if isinstance(x, ast.Attribute) and CONFIGISH.search(x.attr):
            return True
        x = x.value
    return isinstance(x, ast.Name) and bool(re.search(r"(^|_)(cfg|config|conf|opt|hparams)$", x.id, re.I))



class EmptyOptions(PythonConfigs):
    """Mixed into Facts: needs `self.p` (the Project) and `self.cache`."""

    def _key_never_in_config(self, t: ast.AST) -> str | None:
        """`'attr' in config.keys()` (APTM's `if ('attr' in config.keys()) and config['attr']:`) where no YAML file
        of the project names the key and no code sets it: false in the default run."""
        if not (isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.In) and self.p.on_disk):
            return None
        key, where = const_str(t.left), t.comparators[0]
        where = where.func.value if isinstance(where, ast.Call) and callee(where) == "keys" and isinstance(
            where.func, ast.Attribute) else where if isinstance(where, ast.Name) else None  # (not a substring test:
        # ALIGNN's `'alignn_' in config.model.name`)
        if where is None:
            return None
        sets = (x for mm in self.p.modules.values() for a in mm.nodes if isinstance(a, ast.Assign) for x in a.targets)
        if not key or not configish(where) or self._yaml_names(key) or any(
                isinstance(x, ast.Subscript) and const_str(x.slice) == key for x in sets):
            return None
        return f"'{key}' in {dotted(where)} (no config sets it)"

    def empty_options(self) -> dict[str, str]:
        """Command-line options whose default is the empty string (`--load-model`, default=""): a path or name
        that is unset unless given, by argparse attribute -> the option as written."""
        if "empty" not in self.cache:
            out = {}
            for mm in self.p.modules.values():
                for a in mm.calls:
                    # (`-load_model`: a long option written with one dash, RawNeXt's parser)
                    opt = next((const_str(x) for x in a.args if const_str(x) and re.match(
                        r"--|-[A-Za-z][\w-]+$", const_str(x))), None)
                    default = kw(a, "default")
                    if callee(a) == "add_argument" and opt and isinstance(default, ast.Constant) and \
                            default.value == "":
                        out[(const_str(kw(a, "dest")) or opt.lstrip("-")).replace("-", "_")] = opt.lstrip("-")
                    # ... or a resume path left None, written or not (`--resume default=None`, VoCo), that no
                    # launch script, config or assignment sets: a first training run starts fresh (a pretrained
                    # weights path, by contrast, is what the README's command usually passes)
                    elif callee(a) == "add_argument" and opt and (default is None or isinstance(
                            default, ast.Constant) and default.value is None) and kw(a, "action") is None and \
                            const_value(kw(a, "required")) in (None, False) and kw(a, "nargs") is None and \
                            re.search(r"resume|restart|reload", opt, re.I):
                        out[(const_str(kw(a, "dest")) or opt.lstrip("-")).replace("-", "_")] = opt.lstrip("-")
            passed = self._passed_in_launch_scripts()
            assigned = {t.attr for mm in self.p.modules.values() for n in mm.nodes if isinstance(n, ast.Assign)
                        for t in n.targets if isinstance(t, ast.Attribute)}
            self.cache["empty"] = {k: v for k, v in out.items() if k not in passed and k not in assigned
                                   and not self.config_defaults(k) and not self._yaml_names(k)}
        return self.cache["empty"]

    def _empty_option_tested(self, t: ast.AST) -> str | None:
        """`if args.load_model:`, `if args.load_model != "":` or `if not (args.load_model == ""):` on an option whose
        default is "" (DLRM): false in the default run. The option's name, or None."""
        empty = self.empty_options()
        if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not) and isinstance(t.operand, ast.Compare):
            c = t.operand
            negated = len(c.ops) == 1 and isinstance(c.ops[0], ast.Eq)
        elif isinstance(t, ast.Compare):
            c, negated = t, len(t.ops) == 1 and isinstance(t.ops[0], ast.NotEq)
        else:
            return empty.get(t.attr) if isinstance(t, ast.Attribute) else None
        if negated and isinstance(c.left, ast.Attribute) and isinstance(c.comparators[0], ast.Constant) \
                and c.comparators[0].value == "":
            return empty.get(c.left.attr)
        if len(c.ops) == 1 and isinstance(c.ops[0], (ast.IsNot, ast.NotEq)) and isinstance(c.left, ast.Attribute) \
                and isinstance(c.comparators[0], ast.Constant) and c.comparators[0].value is None:
            return empty.get(c.left.attr)  # `if args.resume is not None:` (or `!= None`, MeshGraphormer)
        return None

