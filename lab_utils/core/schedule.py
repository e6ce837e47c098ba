"""The learning rate as a function of the step, so a checkpoint's step is its schedule's position too.

`lr_schedule=warmup_cosine`: linear warm-up over `warmup_steps` from lr/warmup_steps to lr, then a cosine to 10%
of lr at the last step. train.py sets every parameter group's lr from the step before each optimizer step, the
way a stateless schedule (or torch's LambdaLR restored with its state_dict) continues after a resume.

`lr_bug=restart_on_resume` is the classic resume bug: the scheduler's state_dict is not in the checkpoint, so
a resumed run starts its warm-up again from the resumed step. It acts only from the resume on, long after the
float twins have gone blind in a real run (lab_utils/drivers/bench_late.py).
"""

from __future__ import annotations

import math


def lr_at(cfg: dict, step: int, resumed_at: int | None = None) -> float:
    """The learning rate of optimizer step `step` (0-based)."""
    if cfg["lr_schedule"] == "none":
        return cfg["lr"]
    if cfg["lr_bug"] == "restart_on_resume" and resumed_at:
        step -= resumed_at  # the scheduler was built afresh at the resume and never loaded
    warm = cfg["warmup_steps"]
    if step < warm:
        return cfg["lr"] * (step + 1) / warm
    done = (step - warm) / max(1, cfg["steps"] - warm)
    return cfg["lr"] * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, done))))
