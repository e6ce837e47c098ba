"""Chapter 15's speed keys (lab_utils/core/speed.py) and `ddp-lab bench speed` (lab_utils/drivers/bench_speed.py).

Fast: a bad value or combination is refused before anything launches, naming the key; TF32 goes through torch's
current switch with no warning; the bench's command line names a bad value; overlap=none really registers its
blocking hook (a 1-rank gloo group in this process). Real runs (2 gloo ranks, the toy GPT): many small buckets and
overlap=none are the same bits as the stock port; fused AdamW is tier 2 against the eager run and its twin (not
bitwise), and tier 3 against a fused reference (one process emulating the 2 ranks).
"""

import warnings

import pytest
import torch
import torch.distributed as dist

from lab_utils.analysis import parity
from lab_utils.core import config, ddp, distenv, speed
from lab_utils.drivers import bench_speed
from lab_utils.launch import launcher


def refused(keys: dict, nproc: int = 2) -> str:
    with pytest.raises(config.ConfigError) as e:
        distenv.check_launchable(config.resolve(keys, world_size=nproc), nproc)
    return str(e.value)


def test_bad_speed_values_and_combinations_are_refused_by_name():
    assert "overlap='sometimes'" in refused({"overlap": "sometimes"})
    assert "bucketed, none" in refused({"overlap": "sometimes"})
    msg = refused({"overlap": "none", "grad_reduction": "ordered"})
    assert "overlap=none" in msg and "grad_reduction=ordered" in msg
    msg = refused({"overlap": "none", "wrap": "fsdp2"})
    assert "overlap=none" in msg and "wrap=fsdp2" in msg
    assert "bucket_cap_mb" in refused({"bucket_cap_mb": 0})
    if not torch.cuda.is_available():
        assert "tf32=true needs a CUDA device" in refused({"tf32": True, "device": "cpu"})
        assert "compile=true needs a CUDA device" in refused({"compile": True, "device": "cpu"})
    distenv.check_launchable(config.resolve({"overlap": "none", "bucket_cap_mb": 0.02}, world_size=2), 2)


def test_set_tf32_keeps_both_apis_readable_without_a_warning():
    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for flag in (True, False):
                speed.set_tf32(flag)
                assert torch.backends.cuda.matmul.allow_tf32 is flag and torch.backends.cudnn.allow_tf32 is flag
                assert torch.backends.cuda.matmul.fp32_precision == ("tf32" if flag else "ieee")
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cudnn.allow_tf32 = before[1]


@pytest.mark.parametrize("argv, words", [
    (["--variants", "fused,warp"], "unknown 'warp'"),
    (["--ranks", "0"], "every world size must be >= 1"),
    (["--ranks", "two"], "expected comma-separated integers"),
    (["--warmup", "5", "--steps", "6"], "--warmup 5"),
    (["--preset", "huge"], "invalid choice: 'huge'"),
])
def test_bench_speed_names_a_bad_argument(argv, words, capsys):
    with pytest.raises(SystemExit) as e:
        bench_speed.parse(argv)
    assert e.value.code == 2 and words in capsys.readouterr().err


def test_bench_speed_variants_and_keys():
    _, worlds, names = bench_speed.parse(["--ranks", "1,2", "--variants", "all"])
    assert worlds == [1, 2] and names == list(bench_speed.VARIANTS)
    assert bench_speed.keys_of("small_buckets", "cpu") == ["bucket_cap_mb=0.02"]
    assert bench_speed.keys_of("small_buckets", "workshop") == ["bucket_cap_mb=1"]
    assert bench_speed.runnable("no_overlap", 1, cuda=True) == "needs >= 2 ranks"
    assert bench_speed.runnable("tf32", 2, cuda=False) == "needs CUDA"
    assert bench_speed.runnable("fused", 1, cuda=False) is None
    for name in bench_speed.VARIANTS:  # every variant's keys are keys the training script takes
        config.resolve(bench_speed.keys_of(name, "cpu"), world_size=2)


def test_overlap_none_registers_the_blocking_hook(monkeypatch, tmp_path):
    calls, blocking = [], speed.no_overlap_hook

    def counting(state, bucket):
        calls.append(bucket.index())
        return blocking(state, bucket)

    monkeypatch.setattr(speed, "no_overlap_hook", counting)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    wrapped = None
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 4))
        cfg = config.resolve({"overlap": "none"}, world_size=1)
        wrapped = ddp.wrap(model, cfg, torch.device("cpu"))
        wrapped(torch.randn(8, 64)).sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
    finally:
        # the DDP wrapper (its Reducer holds the gloo group) goes before the group: freed after
        # destroy_process_group, ~ProcessGroupGloo joined a gloo thread that never ended (make test hung here once,
        # py-spy: Reducer::~Reducer -> ProcessGroupGloo::~ProcessGroupGloo -> std::thread::join)
        del wrapped
        dist.destroy_process_group()
    assert calls == [0], calls  # the first iteration's one bucket (DDP's first bucket holds up to 1 MiB)
    assert all(g.abs().sum() > 0 for g in grads)


KEYS = {"steps": 8, "log_every": 4, "window_every": 0}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("speed")
    specs = {
        "eager": ("eager", 2, KEYS),
        "twin": ("eager-twin-accum2", 2, {**KEYS, "grad_accum_steps": 2}),  # float_twin.twin_of's twin
        "fused": ("fused", 2, {**KEYS, "fused_optimizer": True}),
        "fused_emul": ("fused_emul", 1, {**KEYS, "fused_optimizer": True, "emulate_ranks": 2}),
        "small_buckets": ("small_buckets", 2, {**KEYS, "bucket_cap_mb": 0.02}),
        "no_overlap": ("no_overlap", 2, {**KEYS, "overlap": "none"}),
    }
    launcher.launch_many(launcher.requests_from_specs(specs, runs_dir=root, timeout=300), max_workers=2,
                         raise_on_failure=True)
    return root


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("variant", ["small_buckets", "no_overlap"])
def test_communication_only_speed_keys_keep_the_bits(runs, variant):
    report = parity.compare(runs / "eager", runs / variant)
    assert report.tier == 3 and report.bitwise, report.format()
    assert any(d.startswith(("bucket_cap_mb", "overlap")) for d in report.config_diffs + report.order_diffs), \
        (report.config_diffs, report.order_diffs)  # the runs did differ in the key


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_fused_adamw_is_float_noise_against_eager_and_bitwise_against_a_fused_reference(runs):
    report = parity.compare(runs / "eager", runs / "fused", noise_runs=[runs / "eager-twin-accum2"])
    assert report.tier == 2 and report.certified and not report.bitwise, report.format()
    assert parity.compare(runs / "fused_emul", runs / "fused").bitwise
    row = bench_speed.judge(runs / "eager", runs / "eager-twin-accum2", runs / "fused", warmup=2)
    assert row["tier"] == 2 and row["ms_per_step"] > 0 and row["max_abs_param_diff"] > 0
