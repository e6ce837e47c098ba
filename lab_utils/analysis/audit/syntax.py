"""The vocabulary the audit reads code with: name patterns (what a rank, a world size, a loss, a loader is called)
and small `ast` helpers. Nothing here knows a rule."""

from __future__ import annotations

import ast
import re

# a rank value's name; `per_rank`, `negative_all_rank` (BLIP's flag: negatives from every rank) name no rank
RANKISH = re.compile(r"(^|(?<!per)(?<!all)(?<!each)(?<!every)(?<!cross)_)rank$|^rank|local_rank|master_process"
                     r"|is_main|is_master|main_process|is_rank_zero|^RANK$|^LOCAL_RANK$|^gpu$|^rank\d|^dist_id$"
                     r"|^[A-Z_]*(?<!PER)(?<!ALL)(?<!EACH)(?<!EVERY)(?<!CROSS)_RANK$")  # (yacs: GPU_WORLD_RANK)
PER_RANK = re.compile(r"_per_\w+_rank$", re.I)  # a count per rank (torchtitan's num_tokens_..._per_dp_rank)
WORLDISH = re.compile(r"world_size|num_replicas|n_gpus|ngpus|num_gpus?|NUM_GPUS|get_world_size|num_processes|nprocs"
                      r"|WORLD_SIZE|device_count|get_global_size|\bglobal_size\b")
# (num_gpu: SMAP's `len(engine.devices)`; NUM_GPUS: pycls/XNAS configs; device_count: `batch_size *
# torch.cuda.device_count()`, one process per visible GPU, BISS; DINOv2's `distributed.get_global_size()`)
RANK0_NAME = re.compile(r"master|is_?main|main_?process|rank_zero|is_rank0|is_primary|rank0$")  # (ismainprocess)
BATCHISH = re.compile(r"batch_size|batch$|^bs$|b_sz")
ACCUMISH = re.compile(r"accum|accu_|grad(ient)?_?acc(?!ura)")  # gradient_accumulation_steps, accum_iter, gradient_acc
# a loss by name, or a GAN loss by DCGAN's convention (`errD = errD_real + errD_fake`, `errG`)
LOSSISH = re.compile(r"(?i:loss)|\berr_?[DG](?:_\w*)?\b")
EVALISH = re.compile(r"val|eval|test|(?<![a-z])dev(?=_|\b)", re.I)  # (`dev_loader`, not `device`: Diffusion-BERT)
# a whole word (a name part between _ or .) that names an evaluation: `val_loader`, `cfg.TEST.SPLIT`,
# `evaluate`; not a word that merely holds the letters (`interval`, `value`)
EVAL_WORD = re.compile(r"val|valid|validate|validation|eval|evaluate|evaluation|test|testing|inference", re.I)
TRAIN_WORD = re.compile(r"train|training", re.I)
# `sync` as a word of the name (`sync_meters`, `synchronize_between_processes`), not inside one: LatentSync's
# `syncnet(...)` and LipsyncPipeline build a model and a pipeline, they average nothing over ranks
REDUCEISH = re.compile(r"reduce|gather|average|allreduce|(?:^|_)sync(?:hroni[sz]e|_|$)|mean_over|dist_mean")
COLLECTIVES = {"all_reduce", "all_gather", "all_gather_object", "broadcast", "broadcast_object_list", "barrier",
               "reduce", "gather", "scatter", "reduce_scatter", "all_to_all", "reduce_scatter_tensor",
               "all_gather_into_tensor", "monitored_barrier", "gather_object", "scatter_object_list"}
# the collectives that combine values over ranks (a barrier or a broadcast averages nothing)
REDUCING = {"all_reduce", "reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "reduce_scatter",
            "reduce_scatter_tensor", "gather", "gather_object"}
# torch's old one-tensor-per-GPU forms (removed in 2.x, still in public code): a list of tensors, each reduced
MULTIGPU = {"all_reduce_multigpu", "reduce_multigpu", "all_gather_multigpu"}
COLLECTIVES |= MULTIGPU | {"broadcast_multigpu"}
REDUCING |= MULTIGPU
LOG_CALLS = {"print", "info", "log", "write", "add_scalar", "add_scalars", "set_description", "set_postfix",
             "set_description_str", "set_postfix_str", "log_metrics", "warning", "debug"}
TORCH_SEEDS = {"torch.manual_seed", "torch.random.manual_seed", "manual_seed", "seed_everything", "set_seed",
               "pl.seed_everything", "L.seed_everything", "transformers.set_seed", "accelerate.utils.set_seed"}
CUDA_SEEDS = {"torch.cuda.manual_seed", "torch.cuda.manual_seed_all", "cuda.manual_seed", "cuda.manual_seed_all"}
OTHER_SEEDS = {"random.seed", "np.random.seed", "numpy.random.seed"}
SEED_HELPER = re.compile(r"seed", re.I)  # an unseen helper named like a seeder (init_seeds, fix_random_seeds)
SPAWNS = {"spawn", "start_processes"}


def handed_a_seed(c: ast.Call) -> bool:
    """A function (lower-case: no class, no sampler) handed a seed-named value: `setup_determinacy(seed +
    get_rank(), ...)`, BasicTS's call of easytorch's seeder, which these files lack."""
    return callee(c)[:1].islower() and callee(c) not in ("default_rng", "RandomState", "Generator", "str", "int",
                                                          "format", "append") and callee(c) not in LOG_CALLS and any(
        isinstance(n, (ast.Name, ast.Attribute)) and SEED_HELPER.search(dotted(n).split(".")[-1])
        for a in [*c.args, *(k.value for k in c.keywords)] for n in ast.walk(a))
DDP_NAMES = {"DistributedDataParallel", "DDP"}
ENTRY_CALLS = {"init_process_group", "DistributedDataParallel", "DDP", "spawn", "backward", "main", "train", "run",
               "manual_seed"}
# a flag that says whether the run is distributed (`args.distributed`, `self.is_ddp`, `cfg.MODEL.DIST_TRAIN`)
DIST_SWITCH = re.compile(r"distribute|ddp|multigpu|multi_gpu|^dist_?(train|training|mode|run)$|^use_?dist$|"
                         r"^is_?dist$", re.I)
ITERABLE_NOT_LOADER = {"items", "values", "keys", "parameters", "named_parameters", "buffers", "named_buffers",
                       "children", "modules", "named_modules", "state_dict"}
LOADERISH = re.compile(r"loader|train_data|val_data|test_data|^data$|^dl$|dataloader|_dl$|batches", re.I)
NOT_A_LOSS = re.compile(r"loss_?scal|loss_?fn|loss_?func|loss_?type|criterion|loss_?weight|loss_?cfg|loss_?config|"
                        r"loss_?lambda|loss_?coef|^(use|with|enable|apply|add)_\w*loss|"
                        r"loss_?(every|freq|interval|period|names?|keys?|num_steps|steps)$|loss\w*_time[rs]?$|"
                        r"gloss_?(dict|vocab|ids?|idx|list|map|seqs?|tokens?|len|lgt|labels?)|glosses", re.I)
# (`loss_time`, `loss_start_time`: how long the loss took, ContrastiveSeg's meter; `use_aux_loss`: a switch
# that turns a loss term on, nanoMoE's, printed with the model's settings; img2pose's
# `tensorboard_loss_every` and `loss_name`: how often, and under which key, not a loss value; sign language's
# `gloss_dict`, the glosses' vocabulary, VAC_CSLR's)


def walk(node: ast.AST) -> list[ast.AST]:
    """ast.walk's nodes, listed once and kept on the node: the rules ask dozens of questions of one function and each
    walked all of it again (YANMTT's 600-line train(): 17 s of audit, most of it in ast.walk). The audit never
    changes a tree after parsing it, so the list stays true."""
    got = node.__dict__.get("_walked")
    if got is None:
        got = node._walked = list(ast.walk(node))
    return got


def calls_of(node: ast.AST) -> list[ast.Call]:
    """The calls under node, listed once and kept like walk's (function_does asks it of one function per rule)."""
    got = node.__dict__.get("_calls")
    if got is None:
        got = node._calls = [n for n in walk(node) if isinstance(n, ast.Call)]
    return got


def dotted(node: ast.AST) -> str:
    """`torch.cuda.manual_seed` for an Attribute chain, the name for a Name, '' otherwise."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else node.attr
    if isinstance(node, ast.Call):
        return dotted(node.func) + "()"
    if isinstance(node, ast.Subscript):
        return dotted(node.value) + "[]"
    return ""


# option declarations under another name: optparse's add_option, a project's thin wrapper (CroCo's
# `add_arg('--accum_iter', default=1, ...)`): read as argparse's add_argument by every rule that asks for defaults
OPTION_DECLARERS = {"add_option", "add_arg", "add"}  # (configargparse's `group.add("--seed", ...)`: OpenNMT-py)


def callee(call: ast.Call) -> str:
    name = dotted(call.func).split(".")[-1].rstrip("()[]")
    return "add_argument" if name in OPTION_DECLARERS and call.args and (
        const_str(call.args[0]) or "").startswith("-") else name


def root(node: ast.AST) -> str:
    """The variable an expression reads from: `loss` for `loss.data.item()`, `self.x` for `self.x.y`."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            return f"self.{node.attr}"
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


def branches(v: ast.AST) -> list:
    """The values an expression can take: both arms of `a if c else b` (`DistributedSampler(d) if ddp else None`)."""
    return branches(v.body) + branches(v.orelse) if isinstance(v, ast.IfExp) else [v]


def rank_reducing_name(c: ast.Call) -> bool:
    """A call named like a reduction over ranks (`reduce_dict`, `all_gather_tensor`, `sync_meters`), but not one
    that reduces a tensor over its own elements, which says so with a `reduction=` keyword or a 'mean'/'sum'
    argument (mmseg's `weight_reduce_loss(loss, weight=None, reduction="mean")` in WeakTr's engine)."""
    if not REDUCEISH.search(callee(c)):
        return False
    return not (any(k.arg == "reduction" for k in c.keywords) or any(
        isinstance(a, ast.Constant) and a.value in ("mean", "sum", "none") for a in c.args))


def kw(call: ast.Call, name: str):
    return next((k.value for k in call.keywords if k.arg == name), None)


def spread_kw(m, call: ast.Call, name: str) -> list:
    """The values keyword `name` takes at `call`: given directly, or through `**params` where the function binds
    `params = dict(..., name=...)` or `{'name': ...}` (Openpilot-Deepdive's `DistributedSampler(val,
    **dist_sampler_params)`, whose dict sets drop_last=True): one value per binding that sets it."""
    if kw(call, name) is not None:
        return [kw(call, name)]
    spreads = {k.value.id for k in call.keywords if k.arg is None and isinstance(k.value, ast.Name)}
    scope = m.enclosing(call) or m.tree
    out = []
    for a in walk(scope) if spreads else []:
        if isinstance(a, ast.Assign) and any(isinstance(t, ast.Name) and t.id in spreads for t in a.targets):
            v = a.value
            if isinstance(v, ast.Call) and callee(v) == "dict" and kw(v, name) is not None:
                out.append(kw(v, name))
            elif isinstance(v, ast.Dict):
                out += [val for k, val in zip(v.keys, v.values, strict=True) if const_str(k) == name]
    return out


def const_str(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def is_rankish_node(n: ast.AST, tainted: set[str]) -> bool:
    if isinstance(n, (ast.Name, ast.Attribute)):
        leaf = dotted(n).split(".")[-1]
        if WORLDISH.search(leaf) or PER_RANK.search(leaf):
            return False
        return bool(RANKISH.search(leaf)) or dotted(n) in tainted
    if isinstance(n, ast.Call) and callee(n) in ("get_rank", "get_local_rank", "get_global_rank"):
        return True
    if isinstance(n, ast.Constant) and n.value in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "SLURM_LOCALID"):
        return True
    if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, str):
        return bool(RANKISH.search(n.slice.value)) and not WORLDISH.search(n.slice.value)  # config["rank"]
    return False


def involves_rank(node: ast.AST, tainted: set[str] = frozenset(), skip_conditional: bool = False) -> bool:
    """Whether an expression depends on the rank; with skip_conditional, a rank term inside `a if c else b`
    is a deliberate switch and does not count."""
    skip = set()
    if skip_conditional:
        for n in ast.walk(node):
            if isinstance(n, ast.IfExp):
                skip |= {id(m) for m in ast.walk(n)}
    return any(is_rankish_node(n, tainted) for n in ast.walk(node) if id(n) not in skip)


def involves(node: ast.AST, pattern: re.Pattern) -> bool:
    """A name in `node` matches `pattern`, or a launcher variable it reads does (`int(os.environ.get('WORLD_SIZE',
    1)) > 1`)."""
    return any(isinstance(n, (ast.Name, ast.Attribute)) and pattern.search(dotted(n).split(".")[-1] or "")
               or pattern.search(_environ_key(n) or "") for n in ast.walk(node))


def _environ_key(n: ast.AST) -> str | None:
    if isinstance(n, ast.Subscript) and dotted(n.value).endswith("environ"):
        return const_str(n.slice)
    if isinstance(n, ast.Call) and n.args and re.search(r"environ\.get$|getenv$", dotted(n.func)):
        return const_str(n.args[0])
    return None



def const_value(node):
    """The value of a constant node (`shuffle=False` -> False), None for anything else."""
    return node.value if isinstance(node, ast.Constant) else None


def is_switch_value(v: ast.AST) -> bool:
    """An expression that says whether the run is distributed, not which rank this is: `rank != -1`,
    `int(os.environ.get("RANK", -1)) != -1`, `local_rank >= 0`, `"RANK" in os.environ`. A name assigned from it
    (`ddp = ...`) is a switch, true on every rank of a distributed run."""
    if isinstance(v, ast.BoolOp):
        return all(is_switch_value(x) for x in v.values)
    if isinstance(v, ast.UnaryOp) and isinstance(v.op, ast.Not):
        return is_switch_value(v.operand)
    if not (isinstance(v, ast.Compare) and len(v.ops) == 1):
        return False
    op, right = v.ops[0], v.comparators[0]
    if isinstance(op, (ast.In, ast.NotIn)) and "environ" in dotted(right):
        return True
    try:
        value = ast.literal_eval(right)
    except ValueError:
        return False
    return (isinstance(op, (ast.NotEq, ast.Eq, ast.Gt, ast.LtE)) and value == -1
            or isinstance(op, (ast.GtE, ast.Lt)) and value == 0)


# Where a rank only says which device a value lives on: `torch.device("cuda", local_rank)`, `.to(device)`,
# `.cuda(rank)`, `DDP(model, device_ids=[local_rank])`. What such a value holds is the same on every rank.
PLACEMENT_CALLS = {"device", "cuda", "to", "set_device"}
PLACEMENT_KEYWORDS = {"device", "device_ids", "output_device", "map_location", "device_id"}
SHARDING = re.compile(r"Sampler|DataLoader")


def placement_only(value: ast.AST, tainted: set[str]) -> bool:
    """The rank enters `value` only as a device placement (DLRM: `device = torch.device("cuda", my_local_rank)`,
    then every tensor moved there, and the DDP model, counted as holding a rank, made `if Z_test.is_cuda:` a
    guard that excludes rank 0), or as a sampler's or loader's shard (VAR: `ld_train = DataLoader(...,
    batch_sampler=DistInfiniteBatchSampler(rank=dist.get_rank(), ...))`, then `iters_train = len(ld_train)` and
    every step counter, made `if g_it == 0:` a rank-0 guard)."""
    placed: set[int] = set()
    for n in ast.walk(value):
        if isinstance(n, ast.Call):
            if callee(n) in PLACEMENT_CALLS:
                placed |= {id(x) for a in n.args for x in ast.walk(a)}
            if SHARDING.search(callee(n)):  # a loader or sampler given the rank holds this rank's shard, no rank
                placed |= {id(x) for a in [*n.args, *(k.value for k in n.keywords)] for x in ast.walk(a)}
            placed |= {id(x) for k in n.keywords if k.arg in PLACEMENT_KEYWORDS for x in ast.walk(k.value)}
        if _device_text(n):  # 'cuda:%d' % local_rank, f"cuda:{rank}", "cuda:{}".format(gpu): a device's name
            placed |= {id(x) for x in ast.walk(n)}
        if isinstance(n, ast.Call) and re.fullmatch(r"[A-Z]\w*[a-z]\w*", callee(n)) and not callee(n).endswith(
                "Tensor"):  # an object built with the rank (`XMemTrainer(config, local_rank=local_rank)`) keeps
            # it inside (its class's parameters hold it: taint.taint_parameters); what its methods return is no rank
            placed |= {id(x) for a in [*n.args, *(k.value for k in n.keywords)] for x in ast.walk(a)}
    return not any(is_rankish_node(n, tainted) for n in ast.walk(value) if id(n) not in placed)


def _device_text(n: ast.AST) -> bool:
    """A device name built from the rank: `'cuda:%d' % local_rank`, `f"cuda:{rank}"`, `"cuda:{}".format(gpu)`."""
    if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Mod, ast.Add)):
        head = n.left
    elif isinstance(n, ast.JoinedStr):
        head = n.values[0] if n.values else None
    elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "format":
        head = n.func.value
    else:
        return False
    return isinstance(head, ast.Constant) and isinstance(head.value, str) and head.value.startswith(("cuda", "xpu"))


def layer_call(nodes, n: ast.Call) -> bool:
    """`self.reduce(c1)` where the module's class set `self.reduce = nn.Sequential(...)`: a layer named like a
    reduction (UniMatch's DeepLabV3+), not one over ranks; or a tensor's own gather (`torch.gather(mask, dim=1,
    index=ids)`, `x.gather(1, idx)`, UniTS's masking), which indexes along a dimension of one rank's tensor."""
    if callee(n) == "gather" and (dotted(n.func) == "torch.gather" or any(k.arg in ("dim", "index")
                                                                         for k in n.keywords)
                                  or n.args and isinstance(n.args[0], ast.Constant)):
        return True
    if isinstance(n.func, ast.Name):  # `loss_reducer = LossReducer(cfg)`, then `loss_reducer(loss_dict)` (HiSup):
        # an object built from a class of the project's, which sums the loss terms; no rank talks to another
        return any(isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and callee(a.value)[:1].isupper()
                   and not re.search(r"Dist|All|Sync|Gather", callee(a.value)) and any(
                       isinstance(t, ast.Name) and t.id == n.func.id for t in a.targets) for a in nodes)
    if not (isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name) and n.func.value.id == "self"):
        return False
    target = f"self.{n.func.attr}"
    return any(isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and any(
        dotted(t) == target for t in a.targets) for a in nodes)


def reduces_or_gathers(m, c) -> bool:
    """A collective that brings every rank's values together: all_reduce, or torch.distributed's all_gather of
    tensors (UniTS's gathered predictions)."""
    return callee(c) in ("all_reduce", "reduce") or callee(c) == "all_gather" and "dist" in dotted(c.func)


def dict_view(it: ast.AST) -> bool:
    """`test_stats.keys()` / `.items()` / `.values()` (also sorted or listed): a loop over a results dict, not
    over an evaluation loader."""
    while isinstance(it, ast.Call) and callee(it) in ("sorted", "list", "enumerate") and it.args:
        it = it.args[0]
    return isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and it.func.attr in ("keys", "items",
                                                                                               "values")


def always_returns(body: list) -> bool:
    """The block ends in a return on every path: `return x`, or an if/else whose arms both do
    (`if get_world_size() == 1: if cat: return input else: return input.unsqueeze(0)`, GANgealing's all_gather)."""
    if not body:
        return False
    last = body[-1]
    if isinstance(last, (ast.Return, ast.Raise)):
        return True
    return isinstance(last, ast.If) and always_returns(last.body) and always_returns(last.orelse)


def always_raises(body: list) -> bool:
    """The block ends in a raise on every path, an elif chain's arms included (`elif args.gpu is not None: ...;
    raise NotImplementedError(...) else: raise ...`, MoCo's and AdCo's arms without DDP)."""
    if len(body) == 1 and isinstance(body[0], ast.If):
        return always_raises(body[0].body) and always_raises(body[0].orelse)
    return bool(body) and isinstance(body[-1], ast.Raise)


DISTRIBUTED_SETUP = {"init_process_group", "fully_shard", "FullyShardedDataParallel"}  # besides a DDP wrap


def mentions_ddp(m) -> bool:
    """DDP, the process group, or FSDP (torch's fully_shard, FSDP1's wrapper) in a module: a distributed project."""
    for _mod, attr, _ in m.imports.values():
        if attr and ("DistributedDataParallel" in attr or attr in DISTRIBUTED_SETUP):
            return True
    names = {dotted(n).split(".")[-1] for n in m.nodes if isinstance(n, (ast.Name, ast.Attribute))}
    return bool(({"DistributedDataParallel"} | DISTRIBUTED_SETUP) & names) or \
        any(callee(c) == "DDP" for c in m.calls)


def local_def(m, call: ast.Call) -> ast.AST | None:
    """The function a call names by a bare name when a function around the call defines it (`def
    compute_accuracy(model, loader):` inside main's rank-0 block, then `compute_accuracy(model, val_loader)`):
    the nearest such def, which shadows any module-level one of that name."""
    fn = m.enclosing(call)
    while fn is not None:
        defs = [d for d in ast.walk(fn) if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)) and d is not fn
                and d.name == call.func.id and m.enclosing(d) is fn]
        if defs:
            return defs[0]
        fn = m.enclosing(fn)
    return None


def a_loss_value(v: ast.AST) -> bool:
    """`loss.item()`, `float(loss)`, `loss.detach().mean()`: a loss's number; not a text built from it (`msg +=
    print_train_result(loss_info)`) nor a metric a loss module computes (`mean_lpips += self.lpips_loss(x, y)`)."""
    calls = [x for x in ast.walk(v) if isinstance(x, ast.Call)]
    if isinstance(v, ast.JoinedStr) or any(callee(x) not in ("item", "float", "detach", "cpu", "mean", "sum", "numpy",
                                                             "tolist") for x in calls):
        return False
    return any(LOSSISH.search(root(n)) and not NOT_A_LOSS.search(root(n)) for n in ast.walk(v)
               if isinstance(n, (ast.Name, ast.Attribute)))


def functools_reduce(m, c: ast.Call) -> bool:
    """`reduce(lambda x, y: x + y, features)` in module `m`: functools' fold, no reduction over ranks (GLNet)."""
    return callee(c) == "reduce" and (dotted(c.func) == "functools.reduce" or bool(c.args) and isinstance(
        c.args[0], ast.Lambda) or isinstance(c.func, ast.Name) and m.imports.get("reduce", ("",))[0] == "functools")


NOT_A_FORWARD = {"parameters", "named_parameters", "buffers", "named_buffers", "modules", "named_modules",
                 "children", "state_dict", "load_state_dict", "train", "eval", "to", "cuda", "cpu", "zero_grad",
                 "requires_grad_", "apply", "half", "float"}


def not_a_forward(c: ast.Call) -> bool:
    """`model.parameters()`, `model.state_dict()`: a call on the model that runs no forward, so what it makes
    (PointTAD's `n_parameters = sum(p.numel() for p in model.parameters() ...)`) holds no rank's activations."""
    return isinstance(c.func, ast.Attribute) and c.func.attr in NOT_A_FORWARD


def negated(v: ast.AST) -> ast.AST | None:
    """X of `not X`, `X is not True`, `X is False` or `X == False` (DIST_KD's `(args.distributed is not True) or
    (args.distributed and args.local_rank == 0)`); None otherwise."""
    if isinstance(v, ast.UnaryOp) and isinstance(v.op, ast.Not):
        return v.operand
    if isinstance(v, ast.Compare) and len(v.ops) == 1 and isinstance(v.comparators[0], ast.Constant) and (
            isinstance(v.ops[0], ast.IsNot) and v.comparators[0].value is True or
            isinstance(v.ops[0], (ast.Is, ast.Eq)) and v.comparators[0].value is False):
        return v.left
    return None


def held_conditions(m, node: ast.AST) -> set[tuple[str, bool]]:
    """(condition, truth) for each `if` around `node` in its function: the test (each conjunct of an `and`) holds
    in the body, the test (a single one) fails in the else arm; `not X` counts as X failing."""
    out, n = set(), node
    while True:
        up = m.parent.get(id(n))
        if up is None or isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
            return out
        if isinstance(up, ast.If) and n is not up.test:
            parts = up.test.values if isinstance(up.test, ast.BoolOp) and isinstance(up.test.op, ast.And) else [
                up.test]
            if n in up.body:
                out |= {(ast.unparse(negated(p)), False) if negated(p) is not None else (ast.unparse(p), True)
                        for p in parts}
            elif len(parts) == 1:
                p = parts[0]
                out.add((ast.unparse(negated(p)), True) if negated(p) is not None else (ast.unparse(p), False))
        n = up


def never_together(m, a: ast.AST, b: ast.AST) -> bool:
    """`a` and `b` sit under opposite outcomes of one test (Coconut's `parallel_model = DDP(...)` under `if
    configs.only_eval:` and its save under `if ... and not configs.only_eval:`): no run reaches both."""
    held = held_conditions(m, a)
    return any((t, not v) in held for t, v in held_conditions(m, b))


def leaves_block(block: list) -> bool:
    """The block ends by leaving: a return, continue or break."""
    return bool(block) and isinstance(block[-1], (ast.Return, ast.Continue, ast.Break))


def others_may_leave(s: ast.AST) -> bool:
    """The shape of ranks.Guards._only_rank0_goes_on: an if whose else leaves, or an if without else around one."""
    return isinstance(s, ast.If) and (leaves_block(s.orelse) and not leaves_block(s.body) or not s.orelse and any(
        others_may_leave(x) for x in s.body))


def is_stub(fn: ast.AST) -> bool:
    """A method with no body of its own: `pass`, `...`, a docstring, `raise NotImplementedError`."""
    return all(isinstance(b, (ast.Pass, ast.Raise)) or isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)
               for b in fn.body)
