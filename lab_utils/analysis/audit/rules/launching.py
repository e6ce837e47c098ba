"""Chapter 09: the rendezvous port. A fixed MASTER_PORT or tcp:// address, written in the code, an option's
default, a helper's default parameter or the project's configuration, with no environment fallback: a second job
on the host collides on it."""

from __future__ import annotations

import ast
import json
import re

from ..facts import Facts
from ..files import project_files, shell_scripts
from ..project import Module
from ..registry import Hit, rule
from ..switches import one_process_arm
from ..syntax import callee, const_str, dotted, kw, walk

TCP_PORT = re.compile(r"tcp://[^:]+:\d+")
LOOPBACK_PORT = re.compile(r"tcp://(localhost|127\.0\.0\.1|0\.0\.0\.0|\[::1\]):\d+")
LOOPBACK_HEAD = re.compile(r"tcp://(localhost|127\.0\.0\.1|0\.0\.0\.0|\[::1\]):$")
# ... or a host the code computes (`f"tcp://{get_master_ip()}:{args.port}"`, E2FGVI, whose helper gives 127.0.0.1
# unless a cluster variable names another): the port is still the option's default on whatever host that is
HOST_HEAD = re.compile(r"tcp://(localhost|127\.0\.0\.1|0\.0\.0\.0|\[::1\]|\{\}):$")


def _fixed_port(v: ast.AST) -> str | None:
    """The text of a rendezvous address whose port is written in the code: 'tcp://localhost:58472',
    f'tcp://{host}:58472'; None otherwise."""
    if const_str(v) is not None:
        return v.value if TCP_PORT.search(v.value) else None
    if isinstance(v, ast.JoinedStr):
        text = "".join(str(p.value) if isinstance(p, ast.Constant) else "{}" for p in v.values)
        return ast.unparse(v) if TCP_PORT.search(text) else None
    if isinstance(v, ast.Call) and callee(v) == "format" and isinstance(v.func, ast.Attribute) and \
            const_str(v.func.value) and not v.keywords and all(isinstance(a, ast.Constant) for a in v.args):
        try:  # `"tcp://{}:{}".format("localhost", "10001")` (PointContrast): constants all through
            text = const_str(v.func.value).format(*(a.value for a in v.args))
        except (IndexError, KeyError, ValueError):
            return None
        return ast.unparse(v) if TCP_PORT.search(text) else None
    return None


def _default_kept(f: Facts, m: Module, v: ast.AST):
    """The constant a value really is when it is a parameter's default that every project call keeps:
    `os.environ['MASTER_PORT'] = str(port)` in `def init_distributed(port=40112, ...)`, called as
    `init_distributed()` or with other arguments only. None when a caller passes the parameter (or none is
    seen: the default may be a placeholder)."""
    if isinstance(v, ast.Call) and callee(v) in ("str", "int") and len(v.args) == 1:
        v = v.args[0]
    fn = m.enclosing(v)
    if not isinstance(v, ast.Name) or not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    args = fn.args.args
    defaults = dict(zip([a.arg for a in args][len(args) - len(fn.args.defaults):], fn.args.defaults, strict=True))
    default = defaults.get(v.id)
    if not (isinstance(default, ast.Constant) and isinstance(default.value, (int, str))) or any(
            isinstance(x, ast.Assign) and v.id in {dotted(t) for t in x.targets} for x in walk(fn)):
        return None
    position = [a.arg for a in args if a.arg not in ("self", "cls")].index(v.id)
    sites = f.p.callers(m, fn)
    if not sites or any(len(c.args) > position or any(k.arg in (v.id, None) for k in c.keywords)
                        for _, c in sites):
        return None
    return default.value


def _config_url(f: Facts, url: ast.AST):
    """((module, node), text) when `init_method=cfg["DIST_URL"]` (or `cfg.DIST_URL`) names a key that every
    definition in the project sets to one constant address on this host with a port (CurricularFace's config.py:
    `dict(..., DIST_URL='tcp://localhost:23456')`); None otherwise, or when any definition is computed."""
    key = const_str(url.slice) if isinstance(url, ast.Subscript) else url.attr if isinstance(url, ast.Attribute) \
        else None
    if not key or not key.isupper():
        return None  # a config key (`DIST_URL`), not an object's field (`args.dist_url`, an option's)
    defs = []
    for mm in f.p.modules.values():
        for n in mm.nodes:
            if isinstance(n, ast.Dict):
                defs += [(mm, v) for k, v in zip(n.keys, n.values, strict=True)
                         if k is not None and const_str(k) == key]
            elif isinstance(n, ast.keyword) and n.arg == key:
                defs.append((mm, n.value))
            elif isinstance(n, ast.Assign) and any(dotted(t).split(".")[-1] == key or isinstance(t, ast.Subscript)
                                                   and const_str(t.slice) == key for t in n.targets):
                defs.append((mm, n.value))
    texts = {const_str(v) for _, v in defs}
    if defs and len(texts) == 1 and None not in texts and LOOPBACK_PORT.search(next(iter(texts))):
        return defs[0], next(iter(texts))
    return None


def _config_values(f: Facts, key: str) -> dict[str, str]:
    """{config file: value} for every JSON or YAML file of the project that sets `key` (at any depth)."""
    found: dict[str, str] = {}
    for path in [*project_files(f.p.root, ".yaml"), *project_files(f.p.root, ".yml")]:
        try:
            text = path.read_text(encoding="utf-8", errors="replace") if path.stat().st_size < 1_000_000 else ""
        except OSError:
            continue
        for line in text.splitlines():
            hit = re.match(rf"\s*{re.escape(key)}\s*:\s*['\"]?([^'\"#\s]+)", line)
            if hit:
                found[str(path.relative_to(f.p.root))] = hit.group(1)
    for path in project_files(f.p.root, ".json"):
        try:
            if path.stat().st_size > 1_000_000:
                continue
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        todo = [data]
        while todo:
            d = todo.pop()
            if isinstance(d, dict):
                if key in d:
                    v = d[key]  # (a number too: DisCoder's `"master_port": 12359`)
                    found[str(path.relative_to(f.p.root))] = str(v) if isinstance(v, (str, int)) and not isinstance(
                        v, bool) else ""
                todo += list(d.values())
            elif isinstance(d, list):
                todo += d
    return found


def _json_config_url(f: Facts, url: ast.AST) -> tuple[str, str] | None:
    """(the file, the address) when `init_method=h.dist_config['dist_url']` reads a key that the project's JSON
    configs (MP-SENet's and HiFi-GAN's config.json: `"dist_url": "tcp://localhost:54321"`) all set to one address on
    this host with a port, or `init_method=f"{args.dist_url}"` an attribute no option defines that its YAML configs
    set so (CBIM's `dist_url: 'tcp://localhost:10000'`); None when a config sets it otherwise, or none holds it."""
    key = const_str(url.slice) if isinstance(url, ast.Subscript) else None
    if isinstance(url, ast.JoinedStr) and len(url.values) == 1 and isinstance(url.values[0], ast.FormattedValue):
        url = url.values[0].value  # f"{args.dist_url}"
    if isinstance(url, ast.Attribute) and not any(callee(c) == "add_argument" and any(
            (const_str(a) or "").lstrip("-").replace("-", "_") == url.attr for a in c.args)
            for mm in f.p.modules.values() for c in mm.calls) and not any(
            isinstance(a, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == url.attr for t in a.targets)
            for mm in f.p.modules.values() for a in mm.nodes):  # (Stratified-Transformer sets it to a free port)
        key = url.attr  # `args.dist_url` that no option defines: the YAML config the script loads into args (CBIM)
    if not key or not f.p.on_disk:
        return None
    found = _config_values(f, key)
    texts = set(found.values())
    if len(texts) == 1 and LOOPBACK_PORT.search(next(iter(texts))):
        return next(iter(found)), next(iter(texts))
    return None


def _address_and_port(url: ast.AST | None):
    """(the constant text before the port, the port's expression) of `f'tcp://127.0.0.1:{args.port}'`,
    `'tcp://127.0.0.1:' + args.port` or `'tcp://{}:{}'.format(addr, args.port)`; (None, None) otherwise."""
    if isinstance(url, ast.JoinedStr) and len(url.values) >= 2 and isinstance(url.values[-1], ast.FormattedValue):
        return "".join(str(p.value) if isinstance(p, ast.Constant) else "{}" for p in url.values[:-1]), \
            url.values[-1].value
    if isinstance(url, ast.BinOp) and isinstance(url.op, ast.Add):
        return const_str(url.left), url.right
    # `'tcp://{}:{}'.format(args.master_addr, args.port)` (CASS-NAT's train_asr.py)
    if isinstance(url, ast.Call) and isinstance(url.func, ast.Attribute) and url.func.attr == "format" and \
            const_str(url.func.value) is not None and url.func.value.value.endswith(":{}") and url.args and \
            url.func.value.value.count("{}") == len(url.args):
        head = url.func.value.value[:-2]
        return (head if head.count("{}") <= 1 else None), url.args[-1]
    return None, None


def _computed_port(m: Module, v: ast.AST | None) -> str | None:
    """'tcp://127.0.0.1:<port>' for `default=f"tcp://127.0.0.1:{port}"` whose `port` the module computes without
    the environment, a free-port probe or a random draw (VQ-VAE-2: `port = 2 ** 15 + 2 ** 14 + hash(os.getuid()) %
    2 ** 14`, the same port for every job of one user); None otherwise."""
    if isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr == "format" and len(
            v.args) == 1 and isinstance(v.args[0], ast.Name) and (const_str(v.func.value) or "").endswith(":{}"):
        # (`"tcp://127.0.0.1:{}".format(port)`: detectron2's default_argument_parser, copied by SMOKE, fast-reid)
        v = ast.JoinedStr(values=[ast.Constant(v.func.value.value[:-2]), ast.FormattedValue(v.args[0], -1)])
    if not (isinstance(v, ast.JoinedStr) and len(v.values) == 2 and const_str(v.values[0]) is not None
            and LOOPBACK_HEAD.search(v.values[0].value) and isinstance(v.values[1], ast.FormattedValue)
            and isinstance(v.values[1].value, ast.Name)):
        return None
    name = v.values[1].value.id
    binds = [a for a in m.nodes if isinstance(a, ast.Assign) and any(dotted(t) == name for t in a.targets)]
    if not binds or any(re.search(r"environ|getenv|socket|free|rand|port|argv", ast.unparse(a.value), re.I)
                        for a in binds):
        return None
    return f"{v.values[0].value}{{{name}}}"


def _address_option(f: Facts, url: ast.AST) -> str | None:
    """'tcp://127.0.0.1:1234' for `'tcp://%s' % args.dist_address` (or f'tcp://{args.dist_address}') whose every
    add_argument defaults to one 'host:port' on this host; None otherwise."""
    if isinstance(url, ast.BinOp) and isinstance(url.op, ast.Mod) and const_str(url.left) == "tcp://%s":
        opt = url.right
    elif isinstance(url, ast.JoinedStr) and len(url.values) == 2 and const_str(url.values[0]) == "tcp://" and \
            isinstance(url.values[1], ast.FormattedValue):
        opt = url.values[1].value
    else:
        return None
    if not isinstance(opt, ast.Attribute):
        return None
    defaults = {const_str(kw(c, "default")) for mm in f.p.modules.values() for c in mm.calls
                if callee(c) == "add_argument" and any(
                    (const_str(a) or "").lstrip("-").replace("-", "_") == opt.attr for a in c.args)}
    text = f"tcp://{next(iter(defaults))}" if len(defaults) == 1 and None not in defaults else None
    return text if text and LOOPBACK_PORT.search(text) else None


def _option_port(f: Facts, v: ast.AST):
    """`os.environ['MASTER_PORT'] = args.port` (or str(args.port)) where every add_argument of --port defaults to
    a constant port number (voxceleb_trainer's '8888')."""
    if isinstance(v, ast.Call) and callee(v) in ("str", "int") and len(v.args) == 1:
        v = v.args[0]
    if isinstance(v, ast.BinOp) and isinstance(v.op, ast.Mod) and const_str(v.left) in ("%d", "%s"):
        v = v.right  # CLD-SGM's `os.environ['MASTER_PORT'] = '%d' % config.master_port`
    if isinstance(v, ast.JoinedStr) and len(v.values) == 1 and isinstance(v.values[0], ast.FormattedValue):
        v = v.values[0].value  # f"{args.port}"
    if not isinstance(v, ast.Attribute):
        return None
    defaults = [kw(c, "default") for mm in f.p.modules.values() for c in mm.calls
                if callee(c) == "add_argument" and any(
                    (const_str(a) or "").lstrip("-").replace("-", "_") == v.attr for a in c.args)]
    # absl's `flags.DEFINE_string("master_port", "12355", ...)` (conditional-flow-matching's CIFAR script)
    defaults += [c.args[1] if len(c.args) > 1 else kw(c, "default") for mm in f.p.modules.values() for c in mm.calls
                 if callee(c) in ("DEFINE_string", "DEFINE_integer") and c.args and const_str(c.args[0]) == v.attr]
    ports = {str(d.value) for d in defaults if isinstance(d, ast.Constant) and str(d.value).isdigit()}
    # (one option, or the same default in each script that defines it: ExpansionNet's train.py and test.py)
    port = ports.pop() if defaults and len(ports) == 1 and all(isinstance(d, ast.Constant) for d in defaults) \
        else None
    if v.attr in f._passed_in_launch_scripts():
        # the project's launch script passes the port: a variable (OpenUnReID's dist_train.sh, `--tcp-port ${PORT}`)
        # leaves it open, and so does a number there over an open default (a value the user edits in one place,
        # Depth-Anything-V2's `--port 20596`); the code's fixed default written again (ECAPA's 54323) stays fixed
        return _launch_script_port(f, v.attr) if port is not None else None
    return port


def _launch_script_port(f: Facts, attr: str) -> str | None:
    """The one number every launch script of the project passes as `--attr` (`--master_port 54323`); None when a
    script passes a variable or two scripts pass different numbers."""
    flag = re.compile(r"(?<![\w-])--" + re.escape(attr).replace("_", "[_-]") + r"(?:[= ]+)(\S+)")
    values = {v.strip("'\"") for path in shell_scripts(f.p.root) for v in flag.findall(
        path.read_text(encoding="utf-8", errors="replace"))}
    return values.pop() if len(values) == 1 and re.fullmatch(r"\d{2,5}", *values) else None


def _parameter_port(f: Facts, m: Module, v: ast.AST):
    """(port, call sites) when `v` is a parameter (`def ddp_setup(rank, world_size, master_port)`) that every
    project call fills with an option fixed to one port (`ddp_setup(rank, world_size, args.master_port)`, --master_port
    defaulting to '54323': ECAPA-TDNN); None otherwise."""
    if isinstance(v, ast.Call) and callee(v) in ("str", "int") and len(v.args) == 1:
        v = v.args[0]
    fn = m.enclosing(v)
    if not isinstance(v, ast.Name) or not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    names = [a.arg for a in fn.args.args if a.arg not in ("self", "cls")]
    if v.id not in names or any(isinstance(x, ast.Assign) and v.id in {dotted(t) for t in x.targets}
                                or isinstance(x, ast.AugAssign) and dotted(x.target) == v.id for x in walk(fn)):
        return None  # (rebound, or moved on: PccAI's `master_port += 1` until a socket finds it free)
    position, ports = names.index(v.id), set()
    sites = f.p.callers(m, fn)
    for cm, c in sites:
        passed = c.args[position] if len(c.args) > position and not any(
            isinstance(a, ast.Starred) for a in c.args[:position + 1]) else kw(c, v.id)
        passed = _one_binding(cm, c, passed)
        if passed is None and any(k.arg is None for k in c.keywords):  # `ddp_init(gpu_id, **ddp_args)`, the dict
            passed = ast.Attribute(value=ast.Name("args"), attr=v.id)  # of the parsed options (Hyperion): its option
        ports.add((_option_port(f, passed) or _config_port(f, passed)) if passed is not None else None)
    return (ports.pop(), tuple(sites[:2])) if sites and len(ports) == 1 and None not in ports else None


def _config_port(f: Facts, v: ast.AST) -> str | None:
    """`config["backend"]["master_port"]` whose key the project's config files give one port (DisCoder's
    configs/config_z.json: `"master_port": 12359`)."""
    ports = set(_config_values(f, const_str(v.slice) or "").values()) if isinstance(v, ast.Subscript) and \
        f.p.on_disk else set()
    return ports.pop() if len(ports) == 1 and re.fullmatch(r"\d{2,6}", *ports) else None


def _one_binding(m: Module, c: ast.Call, v: ast.AST | None) -> ast.AST | None:
    """What a local name handed on holds when the caller binds it once (rfpp's `port = arg.port`, then
    `ddp_setup(..., port)`); `v` itself otherwise."""
    scope = m.enclosing(c)
    if not isinstance(v, ast.Name) or scope is None:
        return v
    binds = [a for a in walk(scope) if isinstance(a, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and v.id in {
        dotted(t) for t in (a.targets if isinstance(a, ast.Assign) else [a.target])}]
    return binds[0].value if len(binds) == 1 and isinstance(binds[0], ast.Assign) and len(binds[0].targets) == 1 \
        else v


def _default_text(f: Facts, m: Module, v: ast.AST) -> str | None:
    """The text a string expression holds in the default run, composed of constants and the defaults of options
    no launch script passes (`args.dist_url + ':{}'.format(args.port)`); None when any part is unknown."""
    if const_str(v) is not None:
        return const_str(v)
    if isinstance(v, ast.Attribute) and f._is_option(v.attr) and v.attr not in f._passed_in_launch_scripts():
        d = f.default_value(m, v)
        return str(d) if isinstance(d, (str, int)) and not isinstance(d, bool) else None
    if isinstance(v, ast.BinOp) and isinstance(v.op, ast.Add):
        left, right = _default_text(f, m, v.left), _default_text(f, m, v.right)
        return left + right if left is not None and right is not None else None
    if isinstance(v, ast.Call) and callee(v) == "format" and isinstance(v.func, ast.Attribute) and \
            const_str(v.func.value) is not None and not v.keywords:
        parts = [_default_text(f, m, a) for a in v.args]
        try:
            return None if None in parts else const_str(v.func.value).format(*parts)
        except (IndexError, KeyError, ValueError):
            return None
    if isinstance(v, ast.JoinedStr):
        parts = [_default_text(f, m, x.value if isinstance(x, ast.FormattedValue) else x) for x in v.values]
        return None if None in parts else "".join(parts)
    return None


def _env_fallback(m: Module, node: ast.Assign) -> bool:
    """The fixed value is only a fallback: under `if "MASTER_PORT" not in os.environ:` (a test of the very
    variable or environment key it sets), so a launcher's port wins."""
    keys = {"MASTER_PORT", "MASTER_ADDR"} | {dotted(t) for t in node.targets
                                             if isinstance(t, (ast.Name, ast.Attribute))}  # (not opt['x']'s opt)
    n = m.parent.get(id(node))
    while n is not None and not isinstance(n, ast.Module):
        if isinstance(n, ast.If) and any(const_str(x) in keys or dotted(x) in keys for x in ast.walk(n.test)):
            return True
        n = m.parent.get(id(n))
    return False


def _slurm_arm(m: Module, node: ast.AST) -> bool:
    """`node` sits in an `elif "SLURM_PROCID" in os.environ:` arm after an arm for the launcher's own variables
    (`if "LOCAL_RANK" in os.environ:`, PFNs' init_dist): a torchrun run takes the first arm, and only a SLURM job
    (submitit) gets here."""
    child, n = node, m.parent.get(id(node))
    while n is not None and not isinstance(n, ast.Module):
        if isinstance(n, ast.If) and any(child is b for b in n.body) and any(
                "SLURM" in (const_str(x) or "") for x in ast.walk(n.test)):
            up = m.parent.get(id(n))
            if isinstance(up, ast.If) and n in up.orelse and any(
                    const_str(x) in ("RANK", "LOCAL_RANK", "WORLD_SIZE") for x in ast.walk(up.test)):
                return True
        child, n = n, m.parent.get(id(n))
    return False


def _init_method(c: ast.Call) -> ast.AST | None:
    """init_process_group's init_method, by keyword or as its second argument (`init_process_group("nccl",
    "tcp://127.0.0.1:12347", ...)`, DGL)."""
    return kw(c, "init_method") or (c.args[1] if len(c.args) > 1 else None)


@rule("hard-coded-master-port", "09_launching", "a fixed rendezvous port (MASTER_PORT or a tcp:// init_method) with "
      "no environment fallback: a second job on the host collides on it")
def hard_coded_master_port(f: Facts, m: Module):
    if any(callee(c) == "add_argument" and "--nproc_per_node" in map(const_str, c.args) for c in m.calls):
        return  # a copy of torch's own launcher (Multi-Singer's distributed/launch.py): its 29500 is torchrun's default
    advice = "a second job on this host (or a stale one) collides on the port — torchrun --standalone, or env://"
    urls = {dotted(_init_method(c)) for mm in f.p.modules.values() for c in mm.calls
            if callee(c) == "init_process_group" and isinstance(_init_method(c), (ast.Name, ast.Attribute))}
    # the keys an init_method is read from (`init_method=opt['init_method']`, Palette's option dict)
    keys = {const_str(_init_method(c).slice) for mm in f.p.modules.values() for c in mm.calls
            if callee(c) == "init_process_group" and isinstance(_init_method(c), ast.Subscript)} - {None}
    reported: set[str] = set()
    for a in sorted((a for a in m.nodes if isinstance(a, ast.Assign)), key=lambda a: a.lineno):
        if _env_fallback(m, a) or one_process_arm(m, a) or _slurm_arm(m, a):
            continue
        head, tail = _address_and_port(a.value)
        if (any(dotted(t) in urls for t in a.targets) or any(
                isinstance(t, ast.Subscript) and const_str(t.slice) in keys for t in a.targets)) and head is not None \
                and HOST_HEAD.search(head) and (port := _option_port(f, tail)) is not None:
            # opt['init_method'] = 'tcp://127.0.0.1:' + args.port, --port defaulting to '21012' (Palette)
            yield a, (f"{ast.unparse(a.value)} (passed as init_method) rendezvouses on an option whose default "
                      f"{port} is a fixed port on this host: {advice}"), "check-by-hand"
            continue
        sets_port = any(isinstance(t, ast.Subscript) and const_str(t.slice) == "MASTER_PORT" for t in a.targets)
        # (`str(12345)`, Segmenter's init_process: a constant all the same)
        fixed = a.value.args[0] if isinstance(a.value, ast.Call) and callee(a.value) == "str" and len(
            a.value.args) == 1 and isinstance(a.value.args[0], ast.Constant) else a.value
        if sets_port and (const_str(fixed) is not None or isinstance(fixed, ast.Constant) and isinstance(
                fixed.value, int)):
            yield a, f"MASTER_PORT fixed to {str(fixed.value)!r}: {advice}", "check-by-hand"
        elif sets_port and isinstance(a.value, ast.Name) and (value := _local_constant(m, a.value)) is not None:
            # (CTM's `num = 9; port = str(65535 - num); os.environ["MASTER_PORT"] = port`)
            yield a, f"MASTER_PORT fixed to {value!r} ({ast.unparse(a.value)}, computed from constants): {advice}", \
                "check-by-hand"
        elif sets_port and (default := _default_kept(f, m, a.value)) is not None:
            yield a, (f"MASTER_PORT set from a parameter whose default {default!r} no caller replaces: the port is "
                      f"fixed: {advice}"), "check-by-hand"
        elif sets_port and isinstance(a.value, ast.Attribute) and f.p.on_disk and len(
                ports := set(_config_values(f, a.value.attr).values())) == 1 and re.fullmatch(r"\d{2,6}", *ports):
            # os.environ['MASTER_PORT'] = dist_config.MASTER_PORT, "600010" in configs/default.json (WaveGrad)
            yield a, (f"MASTER_PORT set from {ast.unparse(a.value)}, which the project's config files fix to "
                      f"{next(iter(ports))!r}: {advice}"), "check-by-hand"
        elif sets_port and (default := _option_port(f, a.value)) is not None:
            yield a, (f"MASTER_PORT set from an option whose default is the fixed port {default!r}, overriding the "
                      f"environment: every run that keeps the default uses it: {advice}"), "check-by-hand"
        elif sets_port and (found := _parameter_port(f, m, a.value)) is not None:
            yield Hit(a, (f"MASTER_PORT set from {ast.unparse(a.value)}, which every caller fills with an option fixed "
                          f"to the port {found[0]!r}, overriding the environment: {advice}"), "check-by-hand",
                      related=found[1])
        elif any(dotted(t) in urls - reported for t in a.targets) and _fixed_port(a.value):
            # args.dist_url = 'tcp://localhost:58472' ... init_method=args.dist_url; one finding per variable,
            # however many branches fix it
            reported |= {dotted(t) for t in a.targets}
            yield a, f"{ast.unparse(a.value)} (passed as init_method) fixes the rendezvous port: {advice}", \
                "check-by-hand"
        elif any(dotted(t) in urls - reported for t in a.targets) and isinstance(a.value, (
                ast.BinOp, ast.Call, ast.JoinedStr)) and LOOPBACK_PORT.fullmatch(_default_text(f, m, a.value) or ""):
            # (an option copied whole is judged at its add_argument default, below)
            # dist_url = args.dist_url + ':{}'.format(args.port), --dist-url 'tcp://127.0.0.1' and --port '23459'
            # by default (CID): the options' defaults compose a fixed port on this host
            reported |= {dotted(t) for t in a.targets}
            yield a, (f"{ast.unparse(a.value)} (passed as init_method) is {_default_text(f, m, a.value)!r} with the "
                      f"options' defaults, a fixed port on this host with no environment fallback: {advice}"), \
                "check-by-hand"
    passed = any(callee(c) == "init_process_group" and _init_method(c) is not None
                 and const_str(_init_method(c)) is None for mm in f.p.modules.values() for c in mm.calls)
    for c in m.calls:
        url = _init_method(c) if callee(c) == "init_process_group" else None
        if url is not None and (const_str(url) or isinstance(url, (ast.JoinedStr, ast.Call))) and _fixed_port(url):
            # (or the port written into an f-string, `f'tcp://{master_ip}:23461'`: Color2Embed)
            shown = repr(url.value) if const_str(url) else ast.unparse(url)
            yield url, f"init_method={shown} fixes the rendezvous port: {advice}", "check-by-hand"
        handed = kw(c, "init_method") if url is None and passed else None  # (VidSitu's `launch_job(cfg,
        if handed is not None and LOOPBACK_PORT.search(const_str(handed) or ""):  # init_method='tcp://...:9997')`)
            yield handed, (f"init_method={handed.value!r}, handed on to the init_process_group that rendezvouses with "
                           f"it, fixes the rendezvous port: {advice}"), "check-by-hand"
        # an option whose default is a port on this very host (`--init_method default='tcp://localhost:9999'`),
        # in a project whose init_process_group takes its init_method from a variable: every single-host run that
        # keeps the default rendezvous there. A remote address as default must be replaced to run at all, so it
        # is no collision waiting to happen
        head, tail = _address_and_port(url)
        if head is not None and HOST_HEAD.search(head) and (port := _option_port(f, tail)) is not None:
            # f'tcp://127.0.0.1:{args.port}' with --port defaulting to 12361 (SAM-Med3D), or
            # 'tcp://127.0.0.1:' + args.port (Palette)
            yield url, (f"{ast.unparse(url)} rendezvouses on --port, whose default {port} is a fixed port on this host "
                        f"with no environment fallback: {advice}"), "check-by-hand"
        if url is not None and (text := _address_option(f, url)) is not None:
            # 'tcp://%s' % args.dist_address with --dist_address defaulting to '127.0.0.1:1234' (SimCLR, Atanov)
            yield url, (f"{ast.unparse(url)} rendezvouses at the option's default {text!r}, a fixed port on this "
                        f"host with no environment fallback: {advice}"), "check-by-hand"
        if url is not None and const_str(url) is None and (found := _json_config_url(f, url)) is not None:
            name, text = found  # (the config's own line as the related place: GPV-1's configs/exp/gpv.yaml)
            key = const_str(url.slice) if isinstance(url, ast.Subscript) else getattr(url, "attr", "")
            yield Hit(url, (f"{ast.unparse(url)} is {text!r}, written in the project's {name}, a fixed port on this "
                            f"host with no environment fallback: {advice}"), "check-by-hand",
                      related=tuple(f.yaml_places(key or "")[:3]))
        elif url is not None and const_str(url) is None:
            where = _config_url(f, url)
            if where is not None:
                (dm, d), text = where
                yield Hit(url, (f"{ast.unparse(url)} is {text!r}, written in the project's configuration, a fixed "
                                f"port on this host with no environment fallback: {advice}"), "check-by-hand",
                          related=((dm, d),))
        default = kw(c, "default") if callee(c) == "add_argument" else None
        text = default.value if default is not None and const_str(default) else _computed_port(m, default)
        if passed and text and (LOOPBACK_PORT.search(text) or default is not None and not const_str(default)):
            # where it happens: the init_process_group that takes its init_method from the options (UER-py's
            # uer/initialize.py), named with the option
            sites = [(mm, x) for mm in f.p.modules.values() for x in mm.calls if callee(x) == "init_process_group"
                     and _init_method(x) is not None and const_str(_init_method(x)) is None]
            # (the init_method line itself, where the call spans lines: USB's `init_method=args.dist_url,`)
            sites = [y for mm, x in sites for y in ((mm, x), (mm, _init_method(x)))]
            yield Hit(default, (f"the option's default {text!r} is a fixed port on this host, used by every run that "
                                f"keeps it: {advice}"), "check-by-hand", related=tuple(sites[:4]))


def _local_constant(m: Module, name: ast.Name, depth: int = 3):
    """The value `name` holds where every name it is computed from is bound once in its function to constants,
    arithmetic and str()/int() of them (`num = 9; port = str(65535 - num)`: '65526'); None otherwise."""
    fn = m.enclosing(name)
    scope = fn if fn is not None else m.tree

    def value(n: ast.AST, d: int):
        if isinstance(n, ast.Constant) and isinstance(n.value, (int, str)):
            return n.value
        if isinstance(n, ast.Name) and d > 0:
            binds = [a for a in walk(scope) if isinstance(a, ast.Assign) and len(a.targets) == 1
                     and isinstance(a.targets[0], ast.Name) and a.targets[0].id == n.id]
            return value(binds[0].value, d - 1) if len(binds) == 1 else None
        if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Add, ast.Sub, ast.Mult)):
            left, right = value(n.left, d), value(n.right, d)
            if isinstance(left, int) and isinstance(right, int):
                return {ast.Add: left + right, ast.Sub: left - right, ast.Mult: left * right}[type(n.op)]
            return None
        if isinstance(n, ast.Call) and callee(n) in ("str", "int") and len(n.args) == 1 and not n.keywords:
            inner = value(n.args[0], d)
            return None if inner is None else str(inner) if callee(n) == "str" else (
                int(inner) if str(inner).isdigit() else None)
        return None
    found = value(name, depth)
    return found if found is not None and re.fullmatch(r"\d{2,5}", str(found)) else None

