"""grad_reduction=tree (lab_utils/core/tree_reduce.py, chapter 13): the tree's arithmetic, the refusals, and real
gloo runs at 1 and 4 ranks (recursive halving) resumed at 2 (bn_net: BatchNorm's running stats included)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lab_utils.analysis import parity
from lab_utils.core import config, runfiles, tree_reduce
from lab_utils.core.config import ConfigError
from lab_utils.launch import launcher


def _leaves(n: int, size: int = 4096) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    # magnitudes over 6 decades, so that the order of the additions shows in the last bits
    return [torch.randn(size, generator=g) * 10.0 ** torch.randint(-3, 3, (size,), generator=g) for _ in range(n)]


def _left_fold(values):
    total = values[0].clone()
    for v in values[1:]:
        total = total + v
    return total


def test_binary_counter_is_the_balanced_tree_and_holds_log2_c_plus_1_nodes():
    leaves = _leaves(8)
    counter, held = tree_reduce.BinaryCounter(), []
    for leaf in leaves:
        counter.push([leaf.clone()])
        held.append(len(counter.stack))
    a, b, c, d, e, f, g, h = leaves
    expected = ((a + b) + (c + d)) + ((e + f) + (g + h))
    assert torch.equal(counter.root()[0], expected)
    assert max(held) <= 3 + 1 and held == [1, 1, 2, 1, 2, 2, 3, 1]  # the binary digits of 1..8 that are set
    assert not torch.equal(expected, _left_fold(leaves))  # the order matters, so the check above can fail
    with pytest.raises(RuntimeError, match="not a power of two"):
        c7 = tree_reduce.BinaryCounter()
        for leaf in leaves[:7]:
            c7.push([leaf.clone()])
        c7.root()


def test_finish_is_the_last_push_for_one_buckets_tensors():
    """The comm hook's view: the last chunk arrives one bucket (some parameters, flat) at a time."""
    pairs = [(x, y[:100]) for x, y in zip(_leaves(8), _leaves(8)[::-1], strict=True)]
    full, partial = tree_reduce.BinaryCounter(), tree_reduce.BinaryCounter()
    for x, y in pairs[:7]:
        full.push([x.clone(), y.clone()])
        partial.push([x.clone(), y.clone()])
    last_x, last_y = pairs[7]
    flat = partial.finish([1, 0], torch.cat([last_y, last_x]))  # a bucket may hold the parameters in any order
    full.push([last_x.clone(), last_y.clone()])
    root = full.root()
    assert torch.equal(flat, torch.cat([root[1], root[0]]))


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_subtree_roots_then_top_levels_are_the_whole_tree_at_any_world_size(world):
    chunks = _leaves(16)
    per = len(chunks) // world
    roots = [tree_reduce.tree_sum(chunks[r * per:(r + 1) * per]) for r in range(world)]
    assert torch.equal(tree_reduce.tree_sum(roots), tree_reduce.tree_sum(chunks))
    if world > 1:  # what the stock step does instead (each rank a left fold, then the ranks): another result
        folds = [_left_fold(chunks[r * per:(r + 1) * per]) for r in range(world)]
        assert not torch.equal(_left_fold(folds), _left_fold(chunks))


TREE = ["grad_reduction=tree", "sampler=global", "global_batch_size=16", "micro_batch_size=2"]


@pytest.mark.parametrize("keys, world, message", [
    (["grad_reduction=tree", "sampler=global", "global_batch_size=12", "micro_batch_size=2"], 2,
     r"C = global_batch_size / micro_batch_size = 12/2 = 6 is not a power of two"),
    (["grad_reduction=tree", "sampler=global", "global_batch_size=8", "micro_batch_size=4"], 4,
     r"C = global_batch_size / micro_batch_size = 2 is not a multiple of the world size 4"),
    (["grad_reduction=tree", "sampler=global", "global_batch_size=16", "micro_batch_size=3"], 1,
     r"global_batch_size=16 is not a multiple of micro_batch_size=3"),
    (["grad_reduction=tree", "sampler=global"], 2, r"needs micro_batch_size set"),
    ([*TREE[:1], *TREE[2:]], 2, r"needs sampler=global \(got sampler=distributed\)"),
    ([*TREE, "no_sync=false"], 2, r"needs no_sync=true"),
    ([*TREE, "gradient_as_bucket_view=true"], 2, r"needs gradient_as_bucket_view=false"),
])
def test_bad_chunking_is_refused_naming_the_keys(keys, world, message):
    with pytest.raises(ConfigError, match=message):
        config.resolve(keys, world)


def test_refused_before_launch(tmp_path):
    with pytest.raises(ConfigError, match="not a power of two"):
        launcher.launch(launcher.request("bad", 2, [*TREE, "global_batch_size=24"], runs_dir=tmp_path))
    assert not (tmp_path / "bad").exists()


SCRIPT = Path(__file__).resolve().parents[1] / "outside" / "tree_outside_example.py"
BN_KEYS = [*TREE, "model=bn_net", "dropout=0.1", "steps=4"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every real run of this module: the independent ones 3 at a time (mostly process start-up on 2 cores),
    then the resize, which needs the 4-rank checkpoint."""
    root = tmp_path_factory.mktemp("tree") / "runs"
    launcher.launch_many(launcher.requests_from_specs({
        "w1": ("w1", 1, BN_KEYS),
        "w4stop": ("w4stop", 4, [*BN_KEYS, "steps=2", "checkpoint_every=2", "tree_comm=halving"]),
        "out1": ("out1", 1, {"steps": 6}, {"script": SCRIPT}), "out2": ("out2", 2, {"steps": 6}, {"script": SCRIPT}),
    }, runs_dir=root, timeout=300), max_workers=3, raise_on_failure=True)
    launcher.launch(launcher.request("w4to2", 2, [*BN_KEYS, f"resume={root / 'w4stop'}"], runs_dir=root, timeout=300,
                                     progress=False)).raise_for_status()
    return root


@pytest.mark.slow
def test_bn_net_is_bitwise_at_1_and_4_ranks_and_across_a_4_to_2_resize(runs):
    """One tree, any W: losses, fingerprints, every final tensor (BatchNorm's running stats and counters
    included, which torch's own per-rank update would leave W-dependent) and the probe outputs."""
    report = parity.compare(runs / "w1", runs / "w4to2")  # steps 0-1 at 4 ranks (halving), 2-3 at 2 ranks
    assert report.tier == 3, report.format()
    # (the 2-rank run without a resize is the port-bug suite's tree_at_2_ranks entry)

    def losses(run):
        return [(r["step"], r["loss"], r["param_hash"]) for r in runfiles.read_metrics(runs / run)]

    assert losses("w4stop") == losses("w1")[:2] and losses("w4to2") == losses("w1")
    weights = torch.load(runs / "w4to2" / "model.pt", weights_only=True)
    assert int(weights["bn1.num_batches_tracked"]) == 4 * 8  # one count per chunk, as one process counts


@pytest.mark.slow
def test_a_users_own_script_is_bitwise_at_1_and_2_ranks(runs):
    """TreeAccumulator outside train.py: tests/outside/tree_outside_example.py, a few added lines."""
    report = parity.compare(runs / "out1", runs / "out2")
    assert report.tier == 3 and report.steps_compared == 6, report.format()
