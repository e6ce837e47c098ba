"""The ``bn_net`` workload: a small BatchNorm CNN on real 8x8 digits, with per-sample augmentation.

Introduced in notebooks/04_per_sample_rng.ipynb (augmentation and dropout keyed by visit id);
its BatchNorm layers are the subject of notebooks/07_batchnorm.ipynb.

Data.  scikit-learn's bundled ``load_digits`` (1797 grayscale 8x8 digits, 10 classes): real images
that ship inside the package, so nothing is downloaded.  Each image is padded with 1 px of
background to 10x10, so a shift of up to +-1 px moves the digit without cutting it off (and a
``torch.roll`` is then the same as a shift with background fill).

Augmentation (``DigitsDataset(augment=...)``): a random shift of up to +-1 px in each direction
plus a random contrast gain in [0.8, 1.2].  Not +-2 px: on an 8 px digit that is a quarter of its
width (25 placements per digit instead of 9), and it kept every variant of the model near chance
for the few dozen steps the chapters run.  The gain is continuous, so two augmentations are
either drawn from the same random numbers or visibly different -- which makes "same augmentation
or not?" an exact question.  The four modes are the chapter's comparison:

* ``"none"``    -- no augmentation.
* ``"keyed"``   -- the lab's fix: draws from ``sample_generator(seed, visit_id, AUG_SITE)``.  A pure
  function of the visit id, so it changes every epoch and is the same on any rank, in any
  DataLoader worker and at any world size.
* ``"article"`` -- the article's section 4.2: ``random.Random(seed + idx)``.  Keyed by the dataset
  index, not the visit id, so every epoch sees the *same* augmentation of each image (the bug).
* ``"global"``  -- the common per-process approach: torch's global RNG inside ``__getitem__``.  The
  draw depends on the process's seed (``42 + rank``), on how DataLoader seeds its workers, and on
  how many samples this process fetched before: a 2-rank run cannot reproduce the 1-rank run.

Model (``BNNet``): conv(1->16) + BN + ReLU, conv(16->32, stride 2) + BN + ReLU, flatten the 5x5
map, ``fc1`` = Linear(800->64) *with bias* + BatchNorm1d + ReLU, optional dropout, ``head`` =
Linear(64->10); about 57 k parameters.  Flatten, not global average pooling: without BatchNorm a
spatial mean of ReLU features is nearly the same vector for every digit (at init the logits' std
across samples was 0.005 of their overall 0.06), so with ``norm="none"`` the net sat at chance
(ln 10) at any lr; only BatchNorm's batch centring recovered the small differences.  Keeping
*where* the strokes are gives the head a signal it learns from with or without BatchNorm.

``fc1.bias`` sits right before a BatchNorm on purpose: training-mode BN subtracts the batch mean,
so that bias has no effect on the output and its gradient is zero up to float rounding -- and
Adam, which divides by the gradient's running RMS, turns that rounding noise into full-size steps
(notebooks/07_batchnorm.ipynb).  The conv layers have no bias before their BN, as is usual, so
``fc1.bias`` is the only such specimen.
"""

from __future__ import annotations

import functools
import random

import torch
import torch.nn.functional as F
from torch import nn

from lab_utils.core.keyed_rng import KeyedDropout, dropout_keys, sample_generator

__all__ = ["DigitsDataset", "BNNet", "loss_fn", "AUGMENT_MODES", "DROPOUT_MODES", "NORMS",
           "IMAGE_SIZE", "NUM_CLASSES", "MAX_SHIFT", "AUG_SITE", "DROPOUT_SITE"]

AUGMENT_MODES = ("none", "keyed", "article", "global")
DROPOUT_MODES = ("keyed", "torch")
NORMS = ("batch", "none")

NUM_CLASSES = 10
MAX_SHIFT = 1  # pixels, in each direction
PAD = MAX_SHIFT  # 8x8 digit + 1 px of background on each side
IMAGE_SIZE = 8 + 2 * PAD  # 10
FEATURE_SIZE = (IMAGE_SIZE + 1) // 2  # side of conv2's output (stride 2): 5
GAIN_RANGE = (0.8, 1.2)
# Sites (see keyed_rng): the augmentation's generator and the dropout mask are separate consumers
# of one visit's randomness.  (sample_generator and keyed_uniform are also domain-separated, so
# these only need to be distinct among users of the same function.)
AUG_SITE = 1
DROPOUT_SITE = 0


@functools.lru_cache(maxsize=1)
def _load_digits() -> tuple[torch.Tensor, torch.Tensor, float, float]:
    """All 1797 digits, padded to 10x10 in [0, 1], their labels, and the pixel mean/std.

    Cached per process.  The mean/std are over the *full* set, so a subset (``n=...``) is
    normalised exactly like the full set.
    """
    from sklearn.datasets import load_digits  # imported here: sklearn takes ~1 s to import

    digits = load_digits()
    images = torch.from_numpy(digits.images).to(torch.float32) / 16.0  # pixel values are 0..16
    images = F.pad(images, (PAD, PAD, PAD, PAD))  # (N, 10, 10), zero = background
    labels = torch.from_numpy(digits.target).to(torch.int64)
    return images, labels, float(images.mean()), float(images.std())


class DigitsDataset(torch.utils.data.Dataset):
    """The digits, indexed by *visit id* ``v = epoch * n + idx``.

    ``__getitem__(v)`` returns ``{"x": (1, 10, 10) float32, "y": long scalar, "key": long scalar = v}``.
    ``"key"`` travels with the sample through the DataLoader, so the model side (keyed dropout) can
    key its randomness by the same visit id.  ``len()`` is ``n``; a sampler that emits visit ids
    beyond ``n`` (later epochs) is expected -- see lab_utils/core/global_sampler.py.
    """

    def __init__(self, augment: str = "none", seed: int = 0, n: int | None = None):
        if augment not in AUGMENT_MODES:
            raise ValueError(f"augment must be one of {AUGMENT_MODES}, got {augment!r}")
        images, labels, self.mean, self.std = _load_digits()
        if n is None:
            n = len(images)
        if not 1 <= int(n) <= len(images):
            raise ValueError(f"n must be in [1, {len(images)}] (the number of digits), got {n!r}")
        self.n = int(n)
        self.images, self.labels = images[: self.n], labels[: self.n]
        self.augment, self.seed = augment, int(seed)

    def __len__(self) -> int:
        return self.n

    def _draw(self, visit_id: int, idx: int) -> tuple[int, int, float]:
        """(dy, dx, gain) for this visit, from the RNG the mode prescribes."""
        lo, hi = GAIN_RANGE
        if self.augment == "keyed":
            g = sample_generator(self.seed, visit_id, AUG_SITE)
            dy, dx = torch.randint(-MAX_SHIFT, MAX_SHIFT + 1, (2,), generator=g).tolist()
            u = float(torch.rand((), generator=g))
        elif self.augment == "article":
            # The article's code: seeded by the dataset index, so epoch 1 repeats epoch 0.
            r = random.Random(self.seed + idx)
            dy, dx = r.randint(-MAX_SHIFT, MAX_SHIFT), r.randint(-MAX_SHIFT, MAX_SHIFT)
            u = r.random()
        else:  # "global": whatever state this process's (or worker's) global generator is in
            dy, dx = torch.randint(-MAX_SHIFT, MAX_SHIFT + 1, (2,)).tolist()
            u = float(torch.rand(()))
        return dy, dx, lo + (hi - lo) * u

    def __getitem__(self, visit_id: int) -> dict[str, torch.Tensor]:
        visit_id = int(visit_id)
        if visit_id < 0:
            raise IndexError(f"visit id must be >= 0, got {visit_id}")
        idx = visit_id % self.n  # epoch = visit_id // self.n; only the augmentation may depend on it
        img = self.images[idx]
        if self.augment != "none":
            dy, dx, gain = self._draw(visit_id, idx)
            # The 1 px border is background and |shift| <= 1, so roll == shift with background fill.
            img = torch.roll(img, shifts=(dy, dx), dims=(0, 1)) * gain
        x = ((img - self.mean) / self.std).unsqueeze(0)  # (1, 10, 10), a new tensor either way
        return {"x": x, "y": self.labels[idx].clone(), "key": torch.tensor(visit_id, dtype=torch.int64)}


class BNNet(nn.Module):
    """Small CNN with BatchNorm for 10x10 digits; ``forward(x) -> logits`` of shape (B, 10).

    ``dropout``: probability before the head (0 = none).  ``dropout_mode``: ``"keyed"``
    (:class:`KeyedDropout`, mask keyed by visit id; the forward must run under ``dropout_keys``,
    which :func:`loss_fn` does) or ``"torch"`` (``nn.Dropout``, global RNG: differs across ranks).
    ``norm``: ``"batch"`` (BatchNorm) or ``"none"`` (no normalisation; convs get biases instead).
    """

    def __init__(self, dropout: float = 0.0, dropout_mode: str = "keyed", norm: str = "batch"):
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        if dropout_mode not in DROPOUT_MODES:
            raise ValueError(f"dropout_mode must be one of {DROPOUT_MODES}, got {dropout_mode!r}")
        if norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
        self.dropout, self.dropout_mode, self.norm = float(dropout), dropout_mode, norm
        bn = norm == "batch"

        def bn2d(c):
            return nn.BatchNorm2d(c) if bn else nn.Identity()

        # A conv bias right before BN is redundant (BN subtracts the mean), hence bias=not bn.
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1, bias=not bn)  # 10x10
        self.bn1 = bn2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=not bn)  # 5x5
        self.bn2 = bn2d(32)
        # The deliberate exception: a Linear *with* bias before BatchNorm1d (see module docstring).
        self.fc1 = nn.Linear(32 * FEATURE_SIZE**2, 64, bias=True)
        self.bn3 = nn.BatchNorm1d(64) if bn else nn.Identity()
        if dropout == 0.0:
            self.drop = nn.Identity()
        elif dropout_mode == "keyed":
            self.drop = KeyedDropout(dropout, site=DROPOUT_SITE)
        else:
            self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(64, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        x = x.flatten(1)  # (B, 800): keeps where the strokes are (module docstring)
        x = F.relu(self.bn3(self.fc1(x)))
        return self.head(self.drop(x))


def loss_fn(model: nn.Module, batch: dict, reduction: str = "mean", seed: int = 0) -> torch.Tensor:
    """Cross entropy of ``model`` on ``batch`` (a dict from :class:`DigitsDataset` + collate).

    ``reduction="sum"`` is what a DDP port wants when ranks hold unequal shares of a global batch:
    sum locally, divide by the *global* count.  The forward always runs under
    ``dropout_keys(batch["key"], seed)`` when the batch has keys: harmless without KeyedDropout,
    and it works through wrappers (DDP's ``.module``) without inspecting the model.  ``seed`` is
    the dropout seed (the same on every rank).  Inputs are moved to the model's device.
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    device = next(model.parameters()).device
    x, y = batch["x"].to(device), batch["y"].to(device)
    if "key" in batch:
        with dropout_keys(batch["key"], seed):
            logits = model(x)
    else:
        logits = model(x)  # KeyedDropout, if training with p > 0, raises and says what to do
    return F.cross_entropy(logits, y, reduction=reduction)


def build(cfg: dict):
    """The `bn_net` workload (registered in workloads.BUILDERS)."""
    from lab_utils.core.workloads import Workload

    data = DigitsDataset(augment=cfg["augment"], seed=cfg["data_seed"], n=cfg["n_samples"] or None)
    model = BNNet(dropout=cfg["dropout"], dropout_mode=cfg["dropout_mode"], norm=cfg["norm"])
    return Workload(model, data, loss_fn)
