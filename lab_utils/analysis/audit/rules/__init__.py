"""The audit's rules, one module per chapter group; importing this package registers them (registry.REGISTRY)."""

from . import (  # noqa: F401  (registration)
    accumulation,
    batchnorm,
    collectives,
    eval_padding,
    every_rank_logs,
    every_rank_saves,
    fsdp2,
    gradients,
    launching,
    loading,
    logging,
    outside_switch,
    samplers,
    saving,
    seeds,
)
