"""The audit's rules, one module per chapter group; importing this package registers them (registry.REGISTRY)."""

from . import accumulation, batchnorm, collectives, fsdp2, gradients, launching, logging, samplers, saving, seeds  # noqa: F401  (registration)
