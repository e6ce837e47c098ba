"""One optimizer step traced op by op, for `ddp-lab doctor --ops` (the judgement: lab_utils/analysis/ops.py).

Two runs part at some step; this module says what each program did *in* that step, from one shared state. Both
programs run in this process: A's keys at A's own layout (one process, or its emulated ranks), B's keys with B's
world size emulated (`emulate_ranks=W`, core/emulate.py: the same bits as a real 2-rank run). The state before
the step is B's own: the latest window state (`window_every`) or checkpoint (`checkpoint_every`) of B at or
before the step, advanced to it by B's program; at step 0, B's initial weights. A's program is set to that state
(weights, optimizer, rank buffers), as the window replay does (core/windows.py).

What a trace records, with torch's own hooks (nothing is patched), for every micro-batch of every rank:
- data: each micro-batch's visit ids (`key`) and inputs, by a loader wrapper (the loaders are train.py's);
- forward: every module's output (`register_forward_hook`), when its first dimension is the micro-batch;
- backward: every parameter's gradient as each micro-batch's backward produces it (`Tensor.register_hook`,
  before it is added into `.grad`, so before any clipping or reduction), divided by the factor the program put
  on the loss (1/grad_accum_steps for a mean, x world_size for sum_loss_fix, GradScaler's scale): the gradient
  of that micro-batch's own loss. DDP's x W for a sum loss exists only to cancel its / W, so it belongs with
  the reduction: an unscaled sum loss is then a reduction fault, as chapter 05 teaches it;
- reduction: `.grad` after the step's reduction (emulated all-reduce, or the single run's accumulation), unscaled;
- optimizer: `.grad` after clipping (what the optimizer applies, unscaled) and the update (weights after -
  before). For B also `a_update`: A's optimizer applied to B's clipped gradients from the same state, because
  Adam turns a float-noise sign flip of a near-zero gradient into a full-size update: the update is judged
  against A's optimizer on B's own inputs, the clipping against A's clipped gradients.
A's reference for B's backward (`chunk_grads`) is A's loss on each of B's micro-batches, from the same state.

Not traced (OpsUnsupported names it): sync_bn (the emulated ranks run on threads), grad_reduction=tree,
loss_normalization=global_tokens, wrap=fsdp2, compile, and on B's ranks per-rank seeds (seed_mode=article) or
torch's global-RNG dropout (one process cannot draw each rank's own stream); runs not of scripts/train.py.
Core side: imports core/ only; train.py's build_optimizer is loaded from the file, as the launch zygote does.
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import torch

from lab_utils.core import checkpoint, resume, runfiles, samplers, token_norm, windows, workloads
from lab_utils.core import config as config_mod
from lab_utils.core.emulate import emulated_step
from lab_utils.core.fsdp2 import clip_grad_norm_
from lab_utils.core.schedule import lr_at
from lab_utils.core.step import AMP_DTYPES, rank_step, to_device

# A's or B's keys that a traced step does not take: where the run wrote, how it was started, stopped or saved
# (the same set as launch/replay.NOT_REPLAYED, which core may not import).
NOT_TRACED = {"out_dir", "resume", "replay_from", "fault", "fault_rank", "fault_step", "window_every",
              "checkpoint_every", "checkpoint_write", "checkpoint_style"}
CPU = torch.device("cpu")


class OpsUnsupported(Exception):
    """Why a step cannot be traced op by op (the doctor reports it as not judged, exit 3)."""


def _train_module():
    spec = importlib.util.spec_from_file_location("lab_train_for_ops", runfiles.TRAIN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def program_cfg(run_dir: Path) -> dict:
    """The run's keys resolved for one process, its world size emulated; OpsUnsupported if it cannot be traced."""
    try:
        meta = runfiles.read_config(run_dir)
    except (OSError, ValueError):
        raise OpsUnsupported(f"{run_dir.name}: no readable {runfiles.CONFIG}: its program's keys are unknown") from None
    keys = {k: v for k, v in (meta.get("config") or {}).items() if v is not None and k not in NOT_TRACED}
    if not keys or set(keys) - set(config_mod.KEYS):
        raise OpsUnsupported(f"{run_dir.name}: not a run of scripts/train.py (config.json holds no lab keys)")
    world = int(meta.get("world_size") or 1)
    if world > 1:
        keys["emulate_ranks"] = world
    try:
        cfg = config_mod.resolve(keys, world_size=1)
    except config_mod.ConfigError as e:
        raise OpsUnsupported(f"{run_dir.name}: its keys do not make a one-process program here: {e}") from None
    ranks_differ = world > 1  # what one process cannot emulate: each real rank's own seed or RNG stream
    refused = (("seed_mode", ranks_differ and cfg["seed_mode"] != "lab"),
               ("dropout_mode", ranks_differ and cfg["dropout"] > 0 and cfg["dropout_mode"] == "torch"),
               ("sync_bn", cfg["sync_bn"] != "none"), ("grad_reduction", cfg["grad_reduction"] == "tree"),
               ("loss_normalization", cfg["loss_normalization"] == "global_tokens"),
               ("wrap", cfg["wrap"] != "ddp"), ("compile", cfg["compile"]))
    why = [f"{k}={cfg[k]}" for k, bad in refused if bad]
    if why:
        raise OpsUnsupported(f"{run_dir.name}: {', '.join(why)} is not traced op by op yet")
    return cfg


def start_state(run_b: Path, step: int) -> tuple[int, dict | None]:
    """(w, state): B's latest recorded state at or before `step` (window states and checkpoints), or (0, None)
    at step 0 (B's initial weights); OpsUnsupported naming what to record when there is none."""
    found = {s: windows.state_path(run_b, s) for s in windows.steps(run_b) if s <= step}
    for p in sorted(checkpoint.checkpoint_path(run_b, 0).parent.glob("step_*.pt")):
        s = int(p.stem.split("_")[1])
        if s <= step and s not in found:
            found[s] = p
    if not found:
        if step == 0:
            return 0, None
        raise OpsUnsupported(f"{run_b.name} holds no window state or checkpoint at or before step {step}: run it "
                             f"with window_every=k (k <= {step}; lab runs default to 10) or checkpoint_every=k, or "
                             f"Recorder(..., window_every=k) in your own script")
    w = max(found)
    state = checkpoint.load_checkpoint(found[w], CPU)
    if "step" not in state:  # checkpoint_style=article: model, optimizer, epoch; where in the epoch is lost
        raise OpsUnsupported(f"{found[w]} is an article-style checkpoint (no data position): run B with "
                             f"window_every=k or checkpoint_style=lab")
    return w, state


class _Recorder:
    """What the hooks saw, per micro-batch (the index of the draw in rank-major order)."""

    def __init__(self):
        self.draws: list[dict] = []   # {"rank", "key", "x", "batch"}
        self.outputs: list[dict] = []  # per draw: {(module, call): tensor}
        self.grads: list[dict] = []    # per draw: {param: tensor}
        self.after: list[dict] = []    # per draw: {param: .grad right after that backward accumulated into it}
        self.calls: list[dict] = []    # per draw: {module: forward calls so far} (a module called twice: two keys)
        self.factor = 1.0

    def loader(self, it, rank: int):
        for batch in it:
            self.draws.append({"rank": rank, "key": batch["key"].clone(), "x": batch["x"].clone(), "batch": batch})
            self.outputs.append({})
            self.grads.append({})
            self.after.append({})
            self.calls.append({})
            yield batch


class Program:
    """A run's program (its keys, its layout) in this process, at a given step, optionally recording."""

    def __init__(self, cfg: dict, state: dict | None, step: int, train_mod):
        self.cfg, self.R = cfg, cfg["emulate_ranks"]
        torch.manual_seed(cfg["seed"])  # as train.py: the model is built on the seeded global RNG
        self.wl = workloads.build(cfg)
        self.model = self.wl.model
        self.optimizer = train_mod.build_optimizer(self.model, cfg)
        self.scaler = torch.amp.GradScaler("cpu") if cfg["amp"] == "fp16" else None
        self.rank_buffers = None
        if state is not None:
            self.load(state)
        if self.rank_buffers is None:
            self.rank_buffers = [[b.detach().clone() for b in self.model.buffers()] for _ in range(self.R)]
        self.rec: _Recorder | None = None
        self.iters = [iter(samplers.make_loader(self.wl.dataset, r, self.R, cfg)) for r in range(self.R)]
        resume.fast_forward(self.iters, step * cfg["grad_accum_steps"])

    def load(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        # A copy: load_state_dict keeps the tensors it is given, and this program's step updates them in place.
        # It also takes the saved groups' hyperparameters: this program keeps its own (B's state is the moments).
        own = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        self.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
        for g, hyper in zip(self.optimizer.param_groups, own, strict=True):
            g.update(hyper)
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        if len(state.get("rank_buffers") or []) == self.R:
            self.rank_buffers = [[b.clone() for b in bufs] for bufs in state["rank_buffers"]]

    def state(self) -> dict:
        return {"model": copy.deepcopy(self.model.state_dict()),
                "optimizer": copy.deepcopy(self.optimizer.state_dict()),
                "rank_buffers": [[b.clone() for b in bufs] for bufs in self.rank_buffers],
                "scaler": self.scaler.state_dict() if self.scaler is not None else None}

    def loss_factor(self) -> float:
        """What the program multiplies each micro-batch's own loss by before backward (core/step.micro_backward)."""
        cfg = self.cfg
        f = 1.0 / cfg["grad_accum_steps"] if cfg["loss_reduction"] == "mean" else (
            float(self.R) if cfg["sum_loss_fix"] else 1.0)
        return f * (self.scaler.get_scale() if self.scaler is not None else 1.0)

    def step(self, step: int, record: bool = False) -> dict | None:
        """One optimizer step, as scripts/train.py takes it (emulated ranks when R > 1); the trace if `record`."""
        rec = _Recorder() if record else None
        iters = [rec.loader(it, r) for r, it in enumerate(self.iters)] if rec else self.iters
        handles = self._hooks(rec) if rec else []
        for g in self.optimizer.param_groups:
            g["lr"] = lr_at(self.cfg, step, None)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        scale = self.scaler.get_scale() if self.scaler is not None else 1.0
        try:
            if rec:
                rec.factor = self.loss_factor()
            if self.R > 1:
                loss = emulated_step(self.wl, self.model, iters, self.cfg, CPU, self.rank_buffers, self.scaler)
            else:
                loss = rank_step(self.wl, self.model, iters[0], self.cfg, CPU, 1, scaler=self.scaler)
        finally:
            for h in handles:
                h.remove()
        params = dict((n, p) for n, p in self.model.named_parameters() if p.requires_grad)
        reduced = {n: _grad(p) / scale for n, p in params.items()}
        self._clip(list(params.values()))
        still_scaled = self.scaler is not None and self.cfg["clip_bug"] == "scaled"  # scaler.step unscales later
        clipped = {n: _grad(p) / (scale if still_scaled else 1.0) for n, p in params.items()}
        before = {n: p.detach().clone() for n, p in params.items()}
        self._optimizer_step()
        if not rec:
            return None
        update = {n: p.detach() - before[n] for n, p in params.items()}
        return {"loss": float(loss), "draws": rec.draws, "outputs": rec.outputs, "grads": rec.grads,
                "after": rec.after, "factor": rec.factor, "scale": scale, "ranks": self.R,
                "reduced": reduced, "clipped": clipped, "update": update, "before": before,
                "amp": self.cfg["amp"], "param_order": list(params)}

    def _clip(self, params: list) -> None:
        """train.py's clipping: once, after the reduction, on unscaled gradients (clip_bug=scaled: before unscale_)."""
        cfg = self.cfg
        if self.scaler is not None and cfg["clip_bug"] != "scaled":
            self.scaler.unscale_(self.optimizer)
        inside = cfg["clip_bug"] in ("no_sync_window", "micro_batch")
        max_norm = cfg["grad_clip"] if cfg["grad_clip"] > 0 and not inside else float("inf")
        clip_grad_norm_(params, max_norm, ordered=cfg["grad_reduction"] == "ordered")

    def _optimizer_step(self) -> None:
        if self.scaler is None:
            self.optimizer.step()
        else:
            self.scaler.step(self.optimizer)
            self.scaler.update()

    def _hooks(self, rec: _Recorder) -> list:
        handles = []

        def fwd(name):
            def hook(module, args, out):
                out = out[0] if isinstance(out, (tuple, list)) and out else out
                if not rec.draws or not isinstance(out, torch.Tensor):
                    return
                calls = rec.calls[-1]
                k = calls[name] = calls.get(name, -1) + 1
                if out.dim() and out.shape[0] == rec.draws[-1]["key"].shape[0]:
                    rec.outputs[-1][(name, k)] = out.detach().float().clone()
            return hook

        def bwd(name):
            def hook(g):
                slot = rec.grads[-1]  # backward runs right after its micro-batch's forward, before the next draw
                slot[name] = slot.get(name, 0) + g.detach().float() / rec.factor
            return hook

        def after(name):  # .grad as this backward leaves it: what ran on .grad between two of them shows
            def hook(p):
                rec.after[-1][name] = p.grad.detach().float().clone()
            return hook

        for name, m in self.model.named_modules():
            handles.append(m.register_forward_hook(fwd(name or "model")))
        for name, p in self.model.named_parameters():
            if p.requires_grad:
                handles.append(p.register_hook(bwd(name)))
                handles.append(p.register_post_accumulate_grad_hook(after(name)))
        return handles


def _grad(p) -> torch.Tensor:
    return p.grad.detach().float().clone() if p.grad is not None else torch.zeros_like(p, dtype=torch.float32)


def chunk_grads(cfg_a: dict, state: dict, train_mod, batches: list[dict]) -> list[dict]:
    """A's gradient of its own loss (its loss_reduction, factor 1) on each of B's micro-batches, from `state`."""
    prog = Program(cfg_a, state, 0, train_mod)
    out = []
    for batch in batches:
        model = copy.deepcopy(prog.model)  # BatchNorm's running stats move in train mode: a fresh copy each
        model.train()
        b = token_norm.mask_padding(to_device(batch, CPU), cfg_a)  # as rank_step prepares a micro-batch
        with torch.autocast("cpu", dtype=AMP_DTYPES.get(cfg_a["amp"], torch.bfloat16),
                            enabled=cfg_a["amp"] in AMP_DTYPES):
            loss = prog.wl.loss_fn(model, b, reduction=cfg_a["loss_reduction"], seed=cfg_a["seed"])
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        gs = torch.autograd.grad(loss.float(), [p for _, p in named], allow_unused=True)
        out.append({n: (g if g is not None else torch.zeros_like(p)).detach().float()
                    for (n, p), g in zip(named, gs, strict=True)})
    return out


def a_update(cfg_a: dict, state: dict, train_mod, step: int, before: dict, clipped: dict) -> dict:
    """A's optimizer (its keys, its lr at `step`) applied to `clipped` gradients from weights `before`."""
    prog = Program(cfg_a, state, 0, train_mod)
    params = dict((n, p) for n, p in prog.model.named_parameters() if p.requires_grad)
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(before[n])
            p.grad = clipped[n].to(p.dtype).clone()
    for g in prog.optimizer.param_groups:
        g["lr"] = lr_at(cfg_a, step, None)
    prog.optimizer.step()
    return {n: p.detach() - before[n] for n, p in params.items()}


def trace(run_a: str | Path, run_b: str | Path, step: int) -> dict:
    """Both programs' step `step` from B's state before it: {"a": trace, "b": trace, "a_chunks": [...],
    "a_update": {...}, "start": w}. OpsUnsupported says why a step cannot be traced."""
    run_a, run_b = Path(run_a), Path(run_b)
    cfg_a, cfg_b = program_cfg(run_a), program_cfg(run_b)
    train_mod = _train_module()
    torch.use_deterministic_algorithms(True, warn_only=True)
    w, state = start_state(run_b, step)
    b = Program(cfg_b, state, w, train_mod)
    for s in range(w, step):  # B's program from its recorded state to the step (its emulated ranks)
        b.step(s)
    shared = b.state()
    if cfg_a["optimizer"] != cfg_b["optimizer"] and shared["optimizer"]["state"]:
        raise OpsUnsupported(f"A and B use other optimizers ({cfg_a['optimizer']} vs {cfg_b['optimizer']}): B's "
                             f"optimizer state at step {step} means nothing to A's program")
    try:
        a = Program(cfg_a, shared, step, train_mod)
    except (ValueError, KeyError, RuntimeError) as e:  # another model or optimizer: B's state does not fit A
        raise OpsUnsupported(f"A's program cannot take B's state (model or optimizer differ): {e}") from None
    tb = b.step(step, record=True)
    ta = a.step(step, record=True)
    chunks = chunk_grads(cfg_a, shared, train_mod, [d["batch"] for d in tb["draws"]])
    upd = a_update(cfg_a, shared, train_mod, step, tb["before"], tb["clipped"])
    for t in (ta, tb):
        for d in t["draws"]:
            d.pop("batch")
    return {"a": ta, "b": tb, "a_chunks": chunks, "a_update": upd, "start": w, "step": step,
            "ranks": (cfg_a["emulate_ranks"], cfg_b["emulate_ranks"])}
