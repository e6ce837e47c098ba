"""Chapter 05's logic without launches: keyed padding, the global token count (single vs emulated ranks),
the new keys' refusals, the contrastive loss, and the readers of the flags probe's records."""

import pytest
import torch

from lab_utils.core import config, token_norm, workloads
from lab_utils.core.emulate import emulated_step
from lab_utils.core.step import rank_step
from lab_utils.lessons import ch05_ddp_flags


def cfg_for(world_size=1, **keys):
    return config.resolve({"n_embd": 16, "n_head": 2, "block_size": 16, "global_batch_size": 8, **keys}, world_size)


def batches(n_steps=1, start=0, per=8, block=16):
    wl = workloads.build(cfg_for())
    out = []
    for s in range(n_steps):
        items = [wl.dataset[start + s * per + i] for i in range(per)]
        out.append(torch.utils.data.default_collate(items))
    return out


def test_padding_is_keyed_by_visit_id_and_bounded():
    keys = torch.arange(100, 164)
    full = token_norm.pad_lengths(keys, seed=3, padding=5)
    assert full.min() >= 0 and full.max() <= 5 and len(set(full.tolist())) > 3
    # the same sample gets the same padding whatever batch (rank, micro-batch) it sits in
    assert torch.equal(token_norm.pad_lengths(keys[10:20].flip(0), seed=3, padding=5), full[10:20].flip(0))
    assert not torch.equal(token_norm.pad_lengths(keys, seed=4, padding=5), full)


def test_mask_padding_masks_exactly_the_trailing_targets():
    cfg = cfg_for(padding=6)
    b = batches()[0]
    masked = token_norm.mask_padding(b, cfg)
    pad = token_norm.pad_lengths(b["key"], cfg["data_seed"], 6)
    for row, n in zip(masked["y"], pad, strict=True):
        T = row.numel()
        assert (row[T - int(n):] == token_norm.IGNORE).all() and (row[: T - int(n)] != token_norm.IGNORE).all()
    assert token_norm.real_tokens(masked) == b["y"].numel() - int(pad.sum())
    assert token_norm.mask_padding(b, cfg_for()) is b  # padding=0: untouched


@pytest.mark.parametrize("keys, match", [
    ({"padding": 16}, "padding=16 needs"),
    ({"padding": 2, "model": "bn_net"}, "padding=2 needs"),
    ({"loss_normalization": "global_tokens", "loss_reduction": "sum"}, "global_tokens needs"),
    ({"contrastive_gather": "plain"}, "needs model=contrastive"),
    ({"model": "contrastive", "contrastive_gather": "autograd", "emulate_ranks": 2}, "has none"),
])
def test_new_keys_refuse_what_means_nothing(keys, match):
    with pytest.raises(config.ConfigError, match=match):
        cfg_for(**keys)


def grads_after(cfg, rank_batch_lists):
    """Gradients and logged loss of one step: one process (one list) or emulated ranks (several lists)."""
    torch.manual_seed(0)
    wl = workloads.build(cfg)
    model = wl.model
    if len(rank_batch_lists) == 1:
        loss = rank_step(wl, model, iter(rank_batch_lists[0]), cfg, torch.device("cpu"), world_size=1)
    else:
        rank_buffers = [[b.clone() for b in model.buffers()] for _ in rank_batch_lists]
        loss = emulated_step(wl, model, [iter(b) for b in rank_batch_lists], cfg, torch.device("cpu"), rank_buffers)
    return loss, [p.grad.clone() for p in model.parameters()]


def split(b, parts):
    n = len(b["key"]) // parts
    return [[{k: v[r * n:(r + 1) * n] for k, v in b.items()}] for r in range(parts)]


@pytest.mark.parametrize("norm, equal", [("global_tokens", True), ("per_rank", False)])
def test_global_token_count_makes_two_ranks_equal_the_single_run(norm, equal):
    b = batches()[0]
    single_loss, single = grads_after(cfg_for(padding=10, loss_normalization=norm), [[b]])
    two_loss, two = grads_after(cfg_for(padding=10, loss_normalization=norm, emulate_ranks=2), split(b, 2))
    close = all(torch.allclose(x, y, atol=1e-6) for x, y in zip(single, two, strict=True))
    assert close is equal
    assert (abs(float(single_loss) - float(two_loss)) <= 1e-6) is equal


def test_global_tokens_equals_the_token_mean_in_one_process():
    b = batches()[0]
    loss_global, g_global = grads_after(cfg_for(padding=10, loss_normalization="global_tokens"), [[b]])
    loss_mean, g_mean = grads_after(cfg_for(padding=10), [[b]])
    assert float(loss_global) == pytest.approx(float(loss_mean), abs=1e-6)
    assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(g_global, g_mean, strict=True))


def test_contrastive_loss_is_infonce_over_the_batch():
    cfg = config.resolve({"model": "contrastive", "block_size": 16}, 1)
    torch.manual_seed(0)
    wl = workloads.build(cfg)
    b = torch.utils.data.default_collate([wl.dataset[i] for i in range(6)])
    loss = wl.loss_fn(wl.model, b)
    z = torch.nn.functional.normalize(wl.model(torch.cat([b["x"][:, :8], b["x"][:, 8:]])), dim=-1)
    logits = z[:6] @ z[6:].T / 0.1
    assert loss.item() == pytest.approx(torch.nn.functional.cross_entropy(logits, torch.arange(6)).item(), rel=1e-6)
    # a cross-sample loss: one sample's loss depends on the others in its batch
    assert wl.loss_fn(wl.model, {k: v[:3] for k, v in b.items()}).item() != pytest.approx(loss.item(), rel=1e-3)


def test_probe_readers():
    records = {r: {"broadcast_buffers=True": {"before_forward": ["a", "b"], "after_step": [f"x{r}", "y"]},
                   "broadcast_buffers=False": {"before_forward": ["a", f"c{r}"], "after_step": [f"x{r}", f"y{r}"]}}
               for r in (0, 1)}
    table = ch05_ddp_flags.buffer_table(records)
    assert table["broadcast_buffers=True"] == {"before_forward": [True, True], "after_step": [False, True]}
    assert table["broadcast_buffers=False"] == {"before_forward": [True, False], "after_step": [False, False]}
    tb = ('Traceback (most recent call last):\n  File "x.py"\nRuntimeError: Expected to have finished reduction\n'
          'Parameter indices which did not receive grad for rank 0: 4 5')
    assert ch05_ddp_flags.first_error_line(tb) == "RuntimeError: Expected to have finished reduction"


def test_schedule_spread_and_grid_readers():
    sched = {"forwards": ["a", "b"], "kinds": ["no_sync", "sync"]}
    records = {r: {"schedule": {**sched, "before_forward": ["x", f"y{r}"]}} for r in (0, 1)}
    assert [row["equal_before"] for row in ch05_ddp_flags.buffer_schedule(records)] == [True, False]
    # paired per-step ratios, the slowest rank's step: clearly slower, then indistinguishable
    slow = {r: {"step_seconds": {"plain": [1.0] * 8, "find_unused_parameters": [1.5 + 0.01 * i for i in range(8)]}}
            for r in (0, 1)}
    assert ch05_ddp_flags.unused_cost_spread(slow)["measured"] is True
    noisy = {r: {"step_seconds": {"plain": [1.0] * 8, "find_unused_parameters": [0.8, 1.2] * 4}} for r in (0, 1)}
    spread = ch05_ddp_flags.unused_cost_spread(noisy)
    assert spread["measured"] is False and "not measurable" in spread["sentence"]
    cell = {"kept_reference_changed": True, "accumulated_into_final_grads": False, "accumulated_into_storages": 4,
            "grad_storages_after_backward": 1}
    grid = {0: {"set_to_none_grid": {"True/True": cell}}}
    row = ch05_ddp_flags.kept_reference_grid(grid)[0]
    assert row["gradient_as_bucket_view"] and row["set_to_none"] and not row["written_into_bucket"]
