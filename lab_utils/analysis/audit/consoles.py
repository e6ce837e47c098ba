"""Which ranks' log lines reach a console: loggers only rank 0 gives a handler, a root logger writing to a stdout
the other ranks silenced, and loggers (root or named) that every rank gives a console; and which project objects
print when called (a meter's log_every, a progress bar's __call__). The logging rules ask this to tell rank 0's own
loss from every rank's."""

from __future__ import annotations

import ast
import re

from .facts import Facts
from .logger_names import (
    handed_logger_name,
    held_logger_name,
    named_consoles_on_every_rank,
    root_console_on_every_rank,
    self_logger_name,
)
from .project import Module
from .syntax import LOG_CALLS, callee, const_str, dotted, involves_rank, kw, walk


def rank0_loggers(f: Facts, m: Module) -> set[str]:
    """Loggers whose console output only rank 0 has, whatever their names: `logger = create_logger(out,
    dist_rank=dist.get_rank())` where the project helper adds its StreamHandler (or basicConfig) under a rank-0
    guard. Every rank calls logger.info(...), but what the user reads is rank 0's. Also a class's `self.logger`
    kept from its constructor's `logger` parameter where every logger the project makes is such a one (OpenStereo's
    TrainerTemplate, built by a registry these files lack from the script's create_logger(..., rank=local_rank))."""
    cache = f.cache.setdefault("kept_rank0_loggers", {})
    if m.rel not in cache:
        cache[m.rel] = _made_rank0_loggers(f, m) | _kept_rank0_loggers(f, m)
    return cache[m.rel]


LOGGER_MAKER = re.compile(r"^(get|create|setup|set_up|build|init|make)_?logger$|^getLogger$", re.I)


def _kept_rank0_loggers(f: Facts, m: Module) -> set[str]:
    kept = {f"self.{t.attr}" for fn in m.functions.values() if fn.name == "__init__" for a in walk(fn)
            if isinstance(a, ast.Assign) and isinstance(a.value, ast.Name) and re.search(r"logger", a.value.id)
            and a.value.id in [x.arg for x in fn.args.args] for t in a.targets
            if isinstance(t, ast.Attribute) and dotted(t.value) == "self"}
    if not kept:
        return set()
    made = [(mm, a) for mm in f.p.modules.values() for a in mm.nodes if isinstance(a, ast.Assign) and isinstance(
        a.value, ast.Call) and LOGGER_MAKER.search(callee(a.value)) and not _returned_there(mm, a)]
    return kept if made and all({dotted(t) for t in a.targets} & _made_rank0_loggers(f, mm) for mm, a in made) \
        else set()


def _returned_there(m: Module, a: ast.Assign) -> bool:
    """The assignment is a logger helper's own (`logger = logging.getLogger(__name__) ... return logger`)."""
    fn = m.enclosing(a)
    return fn is not None and any(isinstance(r, ast.Return) and r.value is not None and dotted(r.value) in {
        dotted(t) for t in a.targets} for r in walk(fn))


def _made_rank0_loggers(f: Facts, m: Module) -> set[str]:
    cache = f.cache.setdefault("rank0_loggers", {})
    if m.rel not in cache:
        out = set()
        for a in m.nodes:
            if not (isinstance(a, ast.Assign) and isinstance(a.value, ast.Call)):
                continue
            # `logger = setup_logger(out, distributed_rank=rank)`, the helper seen or not
            if _consoles_on_rank0(f, m, a.value) or _unseen_setup_handed_the_rank(f, m, a.value):
                out |= {dotted(t) for t in a.targets} - {""}
            if callee(a.value) == "getLogger" and _named_by_a_rank0_setup(f, m, a.value):
                out |= {dotted(t) for t in a.targets} - {""}
        out |= {dotted(c.func.value) for c in m.calls if callee(c) == "setLevel" and isinstance(c.func, ast.Attribute)
                and c.args and _quiet(c.args[0]) and f.g.effective(m, c) == "not0"} - {""}
        # (`if rank not in [0, -1]: self._log.setLevel("ERROR")`, FrameDiff: its info lines show on rank 0 alone)
        # loguru's one global logger, its sinks set by a helper these files lack that is handed the rank (YOLOX's
        # `setup_logger(file_name, distributed_rank=self.rank)`, which adds the console sink on rank 0 alone)
        out |= {local for local, (mod, _, _) in m.imports.items() if mod.split(".")[0] == "loguru"
                and (_unseen_setup_given_the_rank(f) or _loguru_stdout_on_rank0(f))}
        out |= {local for local, (mod, attr, _) in m.imports.items() if mod == "wandb" and not attr
                and _wandb_on_rank0_only(f)}
        cache[m.rel] = out
    return cache[m.rel]


def _loguru_stdout_on_rank0(f: Facts) -> bool:
    """loguru's default sink removed (`logger.remove(0)`) and a stdout or stderr sink added on rank 0 alone
    (VirTex's common_setup: `if dist.is_master_process(): logger.add(sys.stdout, ...)`): only rank 0's lines show."""
    calls = [(mm, c) for mm in f.p.modules.values() for c in mm.calls if isinstance(c.func, ast.Attribute)
             and dotted(c.func.value) == "logger" and c.func.attr in ("remove", "add")]
    consoles = [(mm, c) for mm, c in calls if c.func.attr == "add" and c.args and dotted(c.args[0]) in (
        "sys.stdout", "sys.stderr")]
    return any(c.func.attr == "remove" for _, c in calls) and bool(consoles) and all(
        f.g.effective(mm, c) == "rank0" for mm, c in consoles)


def _quiet(level: ast.AST) -> bool:
    """A logging level above INFO: "ERROR", logging.WARNING, 40."""
    name = const_str(level) or dotted(level).split(".")[-1]
    return name in ("WARN", "WARNING", "ERROR", "CRITICAL", "FATAL") or isinstance(
        level, ast.Constant) and isinstance(level.value, int) and level.value > 20


def _named_by_a_rank0_setup(f: Facts, m: Module, c: ast.Call) -> bool:
    """`logging.getLogger("mmn.trainer")` (or `getLogger(__name__)` in the package) where the script set up the
    logger "mmn" with a helper these files lack, handed the rank (MMN's `setup_logger("mmn", output_dir,
    get_rank())`, maskrcnn-benchmark's, which adds no handler off rank 0), or with a project helper that adds its
    console handlers on rank 0 alone (IRRA's): the child logs through rank 0's console."""
    arg = c.args[0] if c.args else None
    name = const_str(arg) if arg is not None else None
    if isinstance(arg, ast.Name) and arg.id == "__name__":
        name = m.rel.removesuffix(".py").replace("/", ".")
    if not name:
        return False
    setups = [const_str(s.args[0]) or const_str(kw(s, "name")) for mm in f.p.modules.values() for s in mm.calls
              if s.args and (_unseen_setup_handed_the_rank(f, mm, s) or _consoles_on_rank0(f, mm, s))]
    return any(n and (name == n or name.startswith(n + ".")) for n in setups)


def _consoles_on_rank0(f: Facts, m: Module, c: ast.Call) -> bool:
    """A project set-up whose console handlers only rank 0 adds (IRRA's setup_logger: `if distributed_rank > 0:
    return logger` before its StreamHandler)."""
    for tm, tf in f.p.resolve(m, c):
        consoles = [x for x in walk(tf) if isinstance(x, ast.Call)
                    and callee(x) in ("StreamHandler", "basicConfig") and not _to_a_file(x)]
        if consoles and all(f.g.effective(tm, x) == "rank0" for x in consoles):
            return True
        # ... or a level picked by rank (OpenStereo's create_logger: `logger.setLevel(log_level if rank == 0 else
        # 'ERROR')`, the console's too): the INFO lines show on rank 0 alone
        if consoles and any(callee(x) == "setLevel" and x.args and isinstance(e := x.args[0], ast.IfExp) and (
                f.g.classify(tm, e.test) == "rank0" and _quiet(e.orelse) or
                f.g.classify(tm, e.test) == "not0" and _quiet(e.body))
                            for x in walk(tf) if isinstance(x, ast.Call)):
            return True
    return False


def _wandb_on_rank0_only(f: Facts) -> bool:
    """Every `wandb.init(...)` of the project switches the run off but on rank 0 (RoMa's `wandb_mode = "online" if
    wandb_log and rank == 0 else "disabled"`, then `wandb.init(..., mode=wandb_mode)`): every rank calls wandb.log,
    and what reaches the dashboard is rank 0's. (An init under a rank-0 guard says nothing of the logs: the other
    ranks must skip wandb.log by a guard of their own, which the logging rules read where it stands.)"""
    if "wandb_rank0" not in f.cache:
        inits = [(mm, c) for mm in f.p.modules.values() for c in mm.calls if dotted(c.func) == "wandb.init"]
        f.cache["wandb_rank0"] = bool(inits) and all(_mode_off_rank0(f, mm, c) for mm, c in inits)
    return f.cache["wandb_rank0"]


def _mode_off_rank0(f: Facts, m: Module, c: ast.Call) -> bool:
    mode = kw(c, "mode")
    if isinstance(mode, ast.Name):  # the mode chosen a line before
        mode = next((a.value for a in ast.walk(m.enclosing(c) or m.tree) if isinstance(a, ast.Assign)
                     and any(dotted(t) == mode.id for t in a.targets)), None)
    return isinstance(mode, ast.IfExp) and const_str(mode.orelse) in ("disabled", "offline") and any(
        f.g.classify(m, t) == "rank0" for t in ([mode.test, *mode.test.values] if isinstance(mode.test, ast.BoolOp)
                                               else [mode.test]))


def _unseen_setup_handed_the_rank(f: Facts, m: Module, c: ast.Call) -> bool:
    """A logger set-up from outside the audited files (`setup_logger`, `get_root_logger`) handed the rank: such
    helpers keep the console on rank 0 (detectron2's, YOLOX's, mmcv's: the other ranks log to files or at ERROR)."""
    return re.search(r"logg", callee(c), re.I) is not None and not f.p.resolve(m, c) and any(
        involves_rank(a, m.rank_tainted) for a in [*c.args, *(k.value for k in c.keywords)])


def _to_a_file(c: ast.Call) -> bool:
    """`logging.StreamHandler(_cached_log_stream(filename))` (detectron2's setup_logger, every rank's own file):
    a handler on an opened file, not on the console."""
    stream = c.args[0] if c.args else kw(c, "stream")
    return callee(c) == "StreamHandler" and stream is not None and dotted(stream) not in ("sys.stdout", "sys.stderr")


def root_console_on_stdout(f: Facts, m: Module, c: ast.Call) -> bool:
    """`logging.info(...)` through a root logger whose every basicConfig writes to sys.stdout, which the other
    ranks sent to /dev/null (ParallelWaveGAN): the console shows rank 0's lines alone."""
    configs = [b for mm in f.p.modules.values() for b in mm.calls if callee(b) == "basicConfig"]
    if dotted(c.func.value) == "logging" and _root_console_added_on_rank0(f):
        return True
    return f.stdout_silenced and dotted(c.func.value) == "logging" and bool(configs) and all(
        dotted(kw(b, "stream")) == "sys.stdout" for b in configs)


def _root_console_added_on_rank0(f: Facts) -> bool:
    """A project set-up takes the root logger (`logging.getLogger()`) and adds its console handler only under a
    rank-0 test (the Swin-style create_logger of the FAS challenge code: `if dist_rank == 0:
    logger.addHandler(console_handler)`, file handlers on every rank): `logging.info(...)` reaches the console on
    rank 0 alone."""
    if "root_rank0" not in f.cache:
        found = False
        for mm in f.p.modules.values():
            for fn in mm.functions.values():
                calls = [c for c in walk(fn) if isinstance(c, ast.Call)]
                roots = any(callee(c) == "getLogger" and not c.args for c in calls)
                consoles = [c for c in calls if callee(c) == "StreamHandler" and not _to_a_file(c)]
                if roots and consoles and all(f.g.kind(mm, c) == "rank0" for c in consoles) and f.p.callers(mm, fn):
                    found = True
        f.cache["root_rank0"] = found
    return f.cache["root_rank0"]


def root_logger_on_every_rank(f: Facts, m: Module, c: ast.Call) -> bool:
    """`logging.info(...)` through the root logger, which every process sets up alike (its basicConfig is under
    no rank guard): each rank's line reaches the console, as print's would."""
    if not (isinstance(c.func, ast.Attribute) and c.func.attr in ("info", "warning", "debug", "log", "error",
                                                                   "critical")):
        # a meter whose display logs through the root logger (HAWQ's ProgressMeter: `logging.info('\t'.join(
        # entries))`, its StreamHandler added at import in every spawned worker)
        return meter_prints(f, m, c) == "info" and any(
            root_logger_on_every_rank(f, mm, x) for mm, x in meter_print_calls(f, m, c) if x is not c)
    if root_console_on_stdout(f, m, c):
        return False
    if dotted(c.func.value) != "logging":
        held = self_logger_name(f, m, c) if dotted(c.func.value).startswith("self.") else _module_logger_name(f, m, c)
        if held is None and (not isinstance(c.func.value, ast.Name) or c.func.value.id in rank0_loggers(f, m)):
            return False
        if held is None and _logger_class_on_every_rank(f, m, c):
            return True
        if held is None:
            held = held_logger_name(m, c, c.func.value.id, f)
        if held is None:
            held = handed_logger_name(f, m, c, c.func.value.id)
        # a named logger propagates its records to the root's handlers, and to those of the loggers above it
        return held is not None and (root_console_on_every_rank(f) or _basic_config_on_every_rank(f) or bool(
            held) and any(held == n or held.startswith(n + ".") for n in named_consoles_on_every_rank(f)))
    if _unseen_setup_given_the_rank(f) or info_on_rank0_only(f, m, c):
        return False
    return not any(callee(b) == "basicConfig" and f.g.effective(mm, b) in ("rank0", "not0")
                   for mm in f.p.modules.values() for b in mm.calls)


def _module_logger_name(f: Facts, m: Module, c: ast.Call) -> str | None:
    """`logger.log.info(...)` where `logger` is a project module whose global `log = logging.getLogger()` (PccAI's
    pccai.utils.logger, set in its create_logger): the name of the logger it holds ('' for the root)."""
    v = c.func.value
    mod = f.p.module_for(m, v.value.id) if isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) else None
    gets = [a.value for a in (mod.nodes if mod is not None else []) if isinstance(a, ast.Assign) and isinstance(
        a.value, ast.Call) and dotted(a.value.func) == "logging.getLogger" and any(
        dotted(t) == v.attr for t in a.targets)]
    return (const_str(gets[0].args[0]) or "" if gets[0].args else "") if gets else None


def _unseen_setup_given_the_rank(f: Facts) -> bool:
    """`setup_logger_dist(cfg.log_path, cfg.rank, name=...)` from a module these files lack (PointNeXt): a logger
    set-up handed the rank decides per rank, so which consoles show the root's lines is not known here."""
    return any(_unseen_setup_handed_the_rank(f, mm, c) for mm in f.p.modules.values() for c in mm.calls)


INFO_CALLS = ("info", "debug")


def _console_handler(m: Module, c: ast.Call) -> bool:
    """`console_handler.setLevel(...)` on a StreamHandler of stdout or stderr (SAM2's setup_logging sets its
    console's level by rank), not a file handler's."""
    held = dotted(c.func.value) if isinstance(c.func, ast.Attribute) else ""
    return any(isinstance(a, ast.Assign) and any(dotted(t) == held for t in a.targets) and isinstance(
        a.value, ast.Call) and callee(a.value) == "StreamHandler" and (not a.value.args or dotted(
            a.value.args[0]) in ("sys.stdout", "sys.stderr")) for a in ast.walk(m.enclosing(c) or m.tree))


def level_chosen_by_rank(f: Facts) -> bool:
    """Some `basicConfig(level=INFO if rank in [-1, 0] else WARN)` or `setLevel(...)` under a rank test (MSN's
    `if rank == 0: logger.setLevel(INFO) else: logger.setLevel(ERROR)`) picks the logging level by rank."""
    cache = f.cache.setdefault("level_chosen_by_rank", {})
    if "" not in cache:
        cache[""] = any(callee(c) in ("setLevel", "basicConfig") and (not re.search(r"handler", dotted(
            c.func), re.I) or _console_handler(mm, c)) and (any(
            involves_rank(a, mm.rank_tainted) or _set_under_rank_test(mm, c, a)
            for a in _level_values(c)) or _under_rank_test(
            mm, c)) for mm in f.p.modules.values() for c in mm.calls)
    return cache[""]


def _level_values(c: ast.Call) -> list[ast.AST]:
    """What sets the level: setLevel's argument, basicConfig's `level=` (not its per-rank `filename=`, CvT's
    `'{}_{}_rank{}.txt'.format(phase, time_str, rank)`, which chooses a file, not what reaches the console)."""
    if callee(c) == "basicConfig":
        return [k.value for k in c.keywords if k.arg == "level"]
    return [*c.args, *(k.value for k in c.keywords)]


def info_on_rank0_only(f: Facts, m: Module, c: ast.Call) -> bool:
    """`logger.info(...)` through the root logger, or a logger whose records reach it (`getLogger(__name__)`), in a
    project that picks the logging level by rank (Oscar, MSN): the INFO lines the user reads are rank 0's."""
    if not (isinstance(c.func, ast.Attribute) and c.func.attr in INFO_CALLS) or not level_chosen_by_rank(f):
        return False
    held = dotted(c.func.value)
    return held == "logging" or isinstance(c.func.value, ast.Name) and held_logger_name(m, c, held) is not None


def _basic_config_on_every_rank(f: Facts) -> bool:
    """`logging.basicConfig(level=logging.INFO)` that every rank runs (no rank guard, no level chosen by rank,
    no `setLevel(INFO if rank == 0 else WARN)` anywhere): each rank's root logger writes its INFO lines to the
    console, so a named logger's records (`getLogger(__name__)`) reach it from every rank."""
    configs = [(mm, b) for mm in f.p.modules.values() for b in mm.calls if callee(b) == "basicConfig"]
    return bool(configs) and not level_chosen_by_rank(f) and not any(
        f.g.effective(mm, b) in ("rank0", "not0") for mm, b in configs)


def _set_under_rank_test(m: Module, c: ast.Call, a: ast.AST) -> bool:
    """The level is a name the function sets under a rank test (gtn_applications: `level = logging.INFO; if
    world_rank != 0: level = logging.CRITICAL`, then `logging.getLogger().setLevel(level)`)."""
    scope = m.enclosing(c) or m.tree
    return isinstance(a, ast.Name) and any(isinstance(x, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == a.id for t in x.targets) and _under_rank_test(m, x)
        for x in walk(scope))


def _under_rank_test(m: Module, node: ast.AST) -> bool:
    """`if rank > 0: logger.setLevel(logging.ERROR)`, or either arm of `if rank == 0: ... else: ...`."""
    n = m.parent.get(id(node))
    while n is not None and not isinstance(n, ast.Module):
        if isinstance(n, ast.If) and involves_rank(n.test, m.rank_tainted):
            return True
        n = m.parent.get(id(n))
    return False


def _logger_class_on_every_rank(f: Facts, m: Module, c: ast.Call) -> bool:
    """`logger = Logger(path)` of a project class whose __init__ adds a StreamHandler under no rank test, and whose
    `info` method logs through it (BiRefNet's utils.Logger): every rank that builds one writes to the console."""
    found = f.any_class(m, c.func.value.id)
    if found is None or f"{found[1].name}.{c.func.attr}" not in found[0].functions:
        return False
    cm, cd = found
    consoles = [x for x in ast.walk(cd) if isinstance(x, ast.Call) and callee(x) == "StreamHandler"]
    return bool(consoles) and all(f.g.effective(cm, x) is None for x in consoles) and not level_chosen_by_rank(f)


def meter_prints(f: Facts, m: Module, c: ast.Call) -> str | None:
    """`metric_logger.log_every(loader, ...)` where the object's project class prints in that method (a
    MetricLogger): the call is a log of whatever the meter holds. Returns the method's log call name."""
    found = meter_print_calls(f, m, c)
    return ("print" if any(log_name(x) == "print" for _, x in found) else log_name(found[0][1])) if found else None


def _flag_left_off(meth: ast.AST, x: ast.Call, c: ast.Call) -> bool:
    """`x` sits under `if enable_print:`, a parameter of the method defaulting to False that the call `c` leaves
    out (SAM2's ProgressMeter.display(batch, enable_print=False): its print never runs)."""
    params = [a.arg for a in meth.args.args]
    defaults = dict(zip(params[len(params) - len(meth.args.defaults):], meth.args.defaults, strict=True))
    tests = [n.test for n in ast.walk(meth) if isinstance(n, ast.If) and any(y is x for s in n.body
                                                                              for y in ast.walk(s))]
    return any(isinstance(t, ast.Name) and isinstance(defaults.get(t.id), ast.Constant) and defaults[
        t.id].value is False and kw(c, t.id) is None and len(c.args) < params.index(t.id) for t in tests)


def meter_print_calls(f: Facts, m: Module, c: ast.Call) -> list:
    """(module, log call) of what the object's method (or what it calls) prints with; see meter_prints."""
    if isinstance(c.func, ast.Attribute) and isinstance(c.func.value, (ast.Name, ast.Attribute)):
        holder, method = dotted(c.func.value), c.func.attr
    elif isinstance(c.func, ast.Name):  # `pbar(step, {'loss': loss.item()})`: the object's __call__ (BERT-NER)
        holder, method = c.func.id, "__call__"
    else:
        return None
    found = f.any_class(m, holder) or (f.p.parameter_instance(m, c, holder) if "." not in holder and isinstance(
        c.func, ast.Attribute) else None)  # (a method of what a parameter receives: VAC_CSLR's recoder.print_log)
    meth = found[0].functions.get(f"{found[1].name}.{method}") if found else None
    if found is None and holder == "self" and (method in LOG_CALLS or LOGGING_METHOD.search(method)):
        found, meth = _inherited(f, m, c, method)  # `self.log(name, loss, step)`, `self.logging_metric(...)`:
        # defined by the class or a project base (dyMEAN's Trainer, InvSR's)
    if meth is None:
        return _helper_print_calls(f, m, c) if found is None else []
    logs = [(found[0], x) for x in ast.walk(meth) if isinstance(x, ast.Call) and _logs(meth, x)
            and not _arm_for_a_missing_part(f, found[0], found[1].name, meth, x)
            and not _flag_left_off(meth, x, c)]
    if not {callee(x) for _, x in logs} - {"add_scalar", "add_scalars", "log_metrics"}:
        # `logger.push(metrics)`, whose class prints in a method push calls; or a ProgressMeter.display whose own
        # calls write TensorBoard only and whose console line goes through its logger's add_line (DepthContrast)
        logs += [(mm, x) for mm, x in f.p.calls_in(f.p.reach(found[0], meth)) if callee(x) in LOG_CALLS
                 and (mm, x) not in logs and not (mm is found[0] and meth in _ancestors(mm, x))]
        logs += _held_printer_calls(f, found[0], found[1].name, meth)
    # (a print into the object's own file is no console line: YouReID's Logger.write prints to the console on
    # rank '0' only, and into each rank's log_<rank>.txt)
    return [(mm, x) for mm, x in logs if not (callee(x) == "print" and kw(x, "file") is not None
                                              and dotted(kw(x, "file")) not in ("sys.stdout", "sys.stderr"))]


LOGGING_METHOD = re.compile(r"^_?(log|logging|print|display|report|summar|write_(scalar|log|summar)|tb_|wandb)")


def _inherited(f: Facts, m: Module, c: ast.Call, method: str) -> tuple:
    """(the class whose method `self.method` runs, that method), through the enclosing class's project bases."""
    cls = m.class_of(m.enclosing(c)) if m.enclosing(c) is not None else None
    for bm, bf in f.p.methods(m, cls, method) if cls in m.classes else []:
        if bm.class_of(bf) in bm.classes:
            return (bm, bm.classes[bm.class_of(bf)]), bf
    return None, None


def _logs(fn: ast.AST, x: ast.Call) -> bool:
    """A log call, or a call of a local name bound to one (`print_func = print` ... `print_func(log_msg.format(...))`
    in an ALBEF-style MetricLogger.log_every, eP-ALM)."""
    if callee(x) in LOG_CALLS:
        return True
    bound = [dotted(a.value).split(".")[-1] for a in walk(fn) if isinstance(x.func, ast.Name) and isinstance(
        a, ast.Assign) and any(isinstance(t, ast.Name) and t.id == x.func.id for t in a.targets)
             and isinstance(a.value, (ast.Name, ast.Attribute))]
    if bound and all(b in LOG_CALLS for b in bound):
        x.log_alias = bound[0]  # what log_name() reports for it: a print is a console line
        return True
    return False


def _ancestors(m: Module, x: ast.AST) -> list:
    out, n = [], m.parent.get(id(x))
    while n is not None:
        out.append(n)
        n = m.parent.get(id(n))
    return out


def _arm_for_a_missing_part(f: Facts, m: Module, cls: str, meth: ast.AST, x: ast.AST) -> bool:
    """`x` sits in the arm of `if self.logger is None:` (DepthContrast's ProgressMeter.display prints only
    without a logger, else hands the line to it), and every construction of the class in the project hands that
    __init__ parameter a value: the arm never runs."""
    init = m.functions.get(f"{cls}.__init__")
    child, n = x, m.parent.get(id(x))
    while init is not None and n is not None and n is not meth:
        t = n.test if isinstance(n, ast.If) else None
        if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], (ast.Is, ast.IsNot)) and \
                isinstance(t.comparators[0], ast.Constant) and t.comparators[0].value is None and \
                dotted(t.left).startswith("self.") and (child in n.body) == isinstance(t.ops[0], ast.Is):
            attr = dotted(t.left)
            pairs = [(tt, v) for a in walk(init) if isinstance(a, ast.Assign) for tt in a.targets
                     for tt, v in (zip(tt.elts, a.value.elts, strict=False) if isinstance(tt, ast.Tuple) and
                                   isinstance(a.value, ast.Tuple) else [(tt, a.value)])]  # (`self.a, self.b = a, b`)
            param = next((v.id for tt, v in pairs if isinstance(v, ast.Name) and dotted(tt) == attr), None)
            names = [a.arg for a in init.args.args][1:]
            calls = f.p.callers(m, init)
            if param in names and calls and all(_hands(c, param, names.index(param)) for _, c in calls):
                return True
        child, n = n, m.parent.get(id(n))
    return False


def _held_printer_calls(f: Facts, m: Module, cls: str, meth: ast.AST) -> list:
    """The log calls of a print method of an object the class holds (`self.logger.add_line(line)` in DepthContrast's
    ProgressMeter.display, where `self.logger` is whatever the caller handed in): a method of that name that only
    one project class defines, and that prints what it is handed (`def add_line(self, content): if self.rank ==
    0: print(content)`)."""
    out = []
    for x in ast.walk(meth):
        if not (isinstance(x, ast.Call) and isinstance(x.func, ast.Attribute) and dotted(x.func.value).startswith(
                "self.") and dotted(x.func.value).count(".") == 1) or f.p.resolve(m, x) or \
                _arm_for_a_missing_part(f, m, cls, meth, x):
            continue
        homes = [(mm, fn) for mm in f.p.modules.values() for name, fn in mm.functions.items()
                 if name.endswith("." + x.func.attr) and mm.class_of(fn)]
        if len(homes) == 1 and not any(isinstance(y, (ast.For, ast.While)) for y in ast.walk(homes[0][1])):
            out += [(homes[0][0], y) for y in ast.walk(homes[0][1])  # (its file writes are no console line)
                    if isinstance(y, ast.Call) and callee(y) in LOG_CALLS - {"write"}]
    return out


def _hands(c: ast.Call, param: str, i: int) -> bool:
    v = kw(c, param) if kw(c, param) is not None else c.args[i] if i < len(c.args) else None
    return v is not None and not (isinstance(v, ast.Constant) and v.value is None)


def _helper_print_calls(f: Facts, m: Module, c: ast.Call) -> list:
    """(module, log call) of a project function that hands its own parameter to a print or a logger: MiniMind's
    `def Logger(content): if is_main_process(): print(content)`, called as `Logger(f'loss: {loss:.4f}')`, logs
    what it is given, on the ranks its print runs on. Methods are the meters' case above."""
    out = []
    for hm, fn in f.p.resolve(m, c, exact=True):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or not _a_print_wrapper(fn) or hm.class_of(
                fn) and not (isinstance(c.func, ast.Attribute) and dotted(c.func.value) == "self"):
            continue  # (a method of the caller's own object: PICK's `self.logger_info(msg)`, which logs msg)
        params = {a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]}
        params |= {fn.args.vararg.arg} if fn.args.vararg else set()
        # the parameter itself is printed (`print(content)`, `print(*args)`), not a part of it: `print(
        # loss_dict['loss'])` in a helper is a log the rule reads inside the helper, where it sees the value's source
        out += [(hm, x) for x in walk(fn) if isinstance(x, ast.Call) and callee(x) in LOG_CALLS and any(
            isinstance(a.value if isinstance(a, ast.Starred) else a, ast.Name) and
            (a.value if isinstance(a, ast.Starred) else a).id in params for a in x.args)]
    return out


def _a_print_wrapper(fn: ast.AST) -> bool:
    """A few statements and no loop (`if is_main_process(): print(content)`), printing to a console: a function
    that also trains or writes files (UFLD's `train(net, loader, ..., logger)`, llm.c's `write_state`) is not a
    log of what it is handed."""
    stmts = [x for x in walk(fn) if isinstance(x, ast.stmt) and x is not fn]
    return len(stmts) <= 6 and not any(isinstance(x, (ast.For, ast.While, ast.With)) for x in stmts) and not any(
        isinstance(x, ast.Call) and log_name(x) in ("write", "add_scalar", "add_scalars") for x in walk(fn))


def log_name(c: ast.Call) -> str:
    """A log call's name; `sys.stdout.write(...)` is a print, and `print(x, file=fh)` into an opened file (MSN's
    CSVLogger, one file per rank) a file write, which no console shows."""
    if callee(c) == "print" and kw(c, "file") is not None and dotted(kw(c, "file")) not in ("sys.stdout",
                                                                                         "sys.stderr"):
        return "write"
    return "print" if dotted(c.func) in ("sys.stdout.write", "sys.stderr.write") else getattr(
        c, "log_alias", callee(c))  # (`print_func = print`: set by _logs)


def shared_file_write(f: Facts, m: Module, c: ast.Call) -> tuple[Module, ast.Call] | None:
    """The `open(path, "a").write(...)` that logs: `c` itself, or the line a meter's method writes with
    (PaCo's ProgressMeter.display). A file write is not silenced by replacing print off rank 0, so every rank that
    runs it appends its own line to one file; a path made with the rank (`log_{rank}.txt`) is each rank's own file."""
    found = [(m, c)] if callee(c) == "write" else [x for x in meter_print_calls(f, m, c) or []
                                                    if callee(x[1]) == "write"]
    for wm, w in found:
        opened = _opened_file(wm, w)
        if opened is not None and not any(involves_rank(a, wm.rank_tainted) for a in opened.args[:1]):
            return wm, w
    return None


def _opened_file(m: Module, w: ast.Call) -> ast.Call | None:
    """The `open(...)` call a `.write()` writes to: `open(p, "a").write(x)`, or `fh.write(x)` where `fh` is bound
    by `fh = open(...)` or `with open(...) as fh` in the write's function; None for sys.stdout, a logger, a
    TensorBoard writer."""
    if not isinstance(w.func, ast.Attribute):
        return None
    held = w.func.value
    if isinstance(held, ast.Call):
        return held if callee(held) == "open" else None
    if not isinstance(held, ast.Name):
        return None
    for a in ast.walk(m.enclosing(w) or m.tree):
        if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and callee(a.value) == "open" and any(
                dotted(t) == held.id for t in a.targets):
            return a.value
        if isinstance(a, (ast.With, ast.AsyncWith)):
            for item in a.items:
                if isinstance(item.context_expr, ast.Call) and callee(item.context_expr) == "open" and \
                        dotted(item.optional_vars) == held.id:
                    return item.context_expr
    return None


def bar_on_every_rank(m: Module, c: ast.Call) -> bool:
    """`pbar = tqdm(enumerate(train_loader))` with no `disable=`, then `pbar.set_description(f"Loss {...}")`
    (PointNeXt): every rank draws its own bar with its own loss."""
    if not (isinstance(c.func, ast.Attribute) and c.func.attr in ("set_description", "set_postfix",
                                                                     "set_description_str", "set_postfix_str")):
        return False
    name, scope = dotted(c.func.value), m.enclosing(c) or m.tree
    made = [a.value for a in walk(scope) if isinstance(a, ast.Assign) and any(
        dotted(t) == name for t in a.targets)]
    # (the name's last binding before the bar's use decides: StyleMapGAN's `pbar = range(start, n)`, then `pbar =
    # tqdm(pbar, initial=start)`)
    made = sorted((v for v in made if v.lineno < c.lineno), key=lambda v: v.lineno)[-1:] or made
    # `with tqdm(total=len(loader)) as pbar:` (RawNeXt's trainer)
    made += [i.context_expr for w in walk(scope) if isinstance(w, ast.With) for i in w.items
             if i.optional_vars is not None and dotted(i.optional_vars) == name]
    return bool(made) and all(isinstance(v, ast.Call) and callee(v) == "tqdm" and kw(v, "disable") is None
                              for v in made)


def forwarded_log(m: Module, c: ast.Call) -> ast.Call | None:
    """The log call inside a closure of the caller's function that hands on what it is given (nanodrz's `def
    wandb_log(*args, **kwargs): if is_main_process: wandb.log(*args, **kwargs)`): calling the closure logs its
    arguments there, on the ranks that reach that line."""
    if not isinstance(c.func, ast.Name):
        return None
    scope = m.enclosing(c)
    # (or a small printer of the same file that prints a parameter unguarded, first thing in its body: M3M's `def
    # subprint(rank, content): print(f"Worker {rank}: " + content)`, called with the loss in its text)
    for d in (d for d in m.tree.body if isinstance(d, ast.FunctionDef) and d.name == c.func.id and len(d.body) <= 3):
        given = {a.arg for a in d.args.args}
        for s in d.body:
            x = s.value if isinstance(s, ast.Expr) else None
            if isinstance(x, ast.Call) and callee(x) == "print" and any(
                    isinstance(n, ast.Name) and n.id in given for a in x.args for n in ast.walk(a)):
                return x
    if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    defs = [d for d in walk(scope) if isinstance(d, ast.FunctionDef) and m.enclosing(d) is scope]
    for d in defs:
        if d.name == c.func.id and (d.args.vararg or d.args.args):
            given = {a.arg for a in d.args.args} | {d.args.vararg.arg if d.args.vararg else ""}
            for x in ast.walk(d):
                if isinstance(x, ast.Call) and callee(x) in LOG_CALLS and any(
                        isinstance(a, ast.Starred) and dotted(a.value) in given or dotted(a) in given for a in x.args):
                    return x
    return None

