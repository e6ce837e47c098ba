"""What a float twin of a run is, as keys: the one place the rank side, the launcher and the analysis agree on it.

A float twin of run A differs from A only in the float order of its sums (lab_utils/analysis/noise.py judges
ports against its distance from A). `twin_of` picks the twin the lab makes for a set of keys; `KEYS` are the keys
a twin may change; a twin run is named A + SEPARATOR + its suffix (what `--noise auto` finds). Pure data: no torch.
"""

from __future__ import annotations

SEPARATOR = "-twin-"
# Keys a float twin may change: they move the float order of the sums, never the samples or the randomness.
KEYS = {"grad_accum_steps", "micro_batch_size", "emulate_ranks", "no_sync", "nudge_init", "threads"}


def twin_of(overrides: dict, cfg: dict) -> tuple[str, dict]:
    """(name suffix, keys) of the float twin the lab makes for a run: its `overrides` (key -> value, as given)
    and `cfg` (the same keys resolved, for the derived batch sizes).

    Two micro-batches where the run has one (`accum2`) is the usual twin: the same samples, summed in another
    order. It is a twin only when a micro-batch's loss is a plain per-sample mean with no draw from the global
    RNG; BatchNorm (statistics per micro-batch), in-batch negatives, per-micro-batch token means, sum losses and
    global-RNG dropout or augmentation change *what* is computed when the batch is split. For those the twin
    is `nudge_init=1` (every initial weight one ulp up), which is a twin of anything.
    """
    splits = (cfg.get("model") == "gpt" and not cfg.get("padding") and cfg.get("loss_reduction") == "mean"
              and not (cfg.get("dropout", 0) > 0 and cfg.get("dropout_mode") == "torch")
              and cfg.get("micro_batch_size", 1) % 2 == 0)
    keys = {k: v for k, v in overrides.items() if k not in ("micro_batch_size", "grad_accum_steps", "nudge_init")}
    if splits:
        return "accum2", {**keys, "grad_accum_steps": 2 * cfg["grad_accum_steps"]}
    return "nudge1", {**keys, "nudge_init": 1}

