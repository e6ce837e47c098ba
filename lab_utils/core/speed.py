"""The speed-ups chapter 15 measures, as keys: TF32 under torch's current switch, and `overlap=none`.

What each speed key does to a rank (the keys themselves are in config.py):
- `tf32`: fp32 matmuls and convolutions on the tensor cores with 10-bit mantissa inputs. `set_tf32` sets it with
  `torch.set_float32_matmul_precision("high")` (matmuls) and `torch.backends.cudnn.allow_tf32` (convolutions):
  on torch 2.9+ both keep the old flags and the new `fp32_precision` settings agreeing, whereas setting
  `torch.backends.cuda.matmul.fp32_precision` / `torch.backends.cudnn.conv.fp32_precision` directly makes any
  later read of `allow_tf32` (by torch or a library) raise "a mix of the legacy and new APIs" (torch 2.13,
  measured in tests/core/test_speed.py). CUDA only (config refuses it elsewhere: distenv.check_cuda_keys).
- `compile`: `model.compile()` before the DDP wrap (scripts/train.py), CUDA only.
- `fused_optimizer`: `torch.optim.AdamW(fused=True)` (scripts/train.py), on CPU too.
- `bucket_cap_mb`: DDP's gradient bucket size (core/ddp.py).
- `overlap`: `bucketed` (DDP's default: a bucket's all-reduce starts while the backward computes the next
  layers' gradients) or `none` (`no_overlap_hook`: each bucket's all-reduce runs to the end inside its hook,
  so the backward waits for it: the same sums in the same buckets, nothing overlapped).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from lab_utils.core.config import ConfigError


def set_tf32(flag: bool) -> None:
    """TF32 on or off for CUDA matmuls and cuDNN convolutions, so that both of torch's APIs read the same."""
    torch.set_float32_matmul_precision("high" if flag else "highest")  # matmul.fp32_precision "tf32" / "ieee"
    torch.backends.cudnn.allow_tf32 = flag


def check(cfg: dict) -> None:
    """Speed keys that cannot go together with others, named before anything launches."""
    if cfg.get("overlap", "bucketed") == "none":
        if cfg.get("wrap", "ddp") != "ddp":
            raise ConfigError(f"overlap=none is a DDP comm hook; wrap={cfg['wrap']} has no DDP buckets "
                              f"(use wrap=ddp or overlap=bucketed)")
        if cfg.get("grad_reduction", "allreduce") != "allreduce":
            raise ConfigError(f"overlap=none replaces DDP's all-reduce hook; grad_reduction="
                              f"{cfg['grad_reduction']} brings its own (use grad_reduction=allreduce or "
                              f"overlap=bucketed)")


def no_overlap_hook(state, bucket):  # no annotations: DDP checks them against dist.GradBucket at run time
    """DDP's default all-reduce (divide by the world size, then sum), but blocking: the backward resumes only
    when this bucket's sum has arrived, so no communication overlaps computation. The same buckets and the same
    sums as the default hook, in the same order: the bits do not change, only the time."""
    tensor = bucket.buffer()
    tensor.div_(dist.get_world_size())
    dist.all_reduce(tensor)  # synchronous: returns when the sum is in `tensor`
    if tensor.is_cuda:
        torch.cuda.current_stream().synchronize()  # NCCL only queued it: wait for the GPU too
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(tensor)
    return fut
