"""The world-size benches' command line (drivers/bench_args.py) and bench fsdp2's byte counts: bad input named
on one line before any launch; the bytes one rank receives as the bench's docstring derives them."""

import pytest

from lab_utils.drivers import bench_args, bench_fsdp2


@pytest.mark.parametrize("argv, said", [
    (["--ranks", "2,x"], "expected comma-separated integers"),
    (["--ranks", "1,2"], "every world size must be >= 2"),
    (["--warmup", "12"], "--warmup 12 must be >= 1 and < --steps 12"),
])
def test_bad_input_is_named(argv, said, capsys):
    with pytest.raises(SystemExit) as e:
        bench_args.parse(bench_args.parser("ddp-lab bench x", "", "2,4"), argv)
    assert e.value.code == 2 and said in capsys.readouterr().err


def test_worlds_parsed():
    args, worlds = bench_args.parse(bench_args.parser("ddp-lab bench x", "", "2,4"), ["--ranks", "2,4,8"])
    assert worlds == [2, 4, 8] and args.steps == 12


def test_fsdp2_bytes_received():
    n = 4e6  # 1M fp32 parameters
    assert bench_fsdp2.bytes_received(n, 2, "ddp", "allreduce") == pytest.approx(n)          # ring: 2(W-1)/W N
    assert bench_fsdp2.bytes_received(n, 4, "ddp", "ordered") == pytest.approx(3 * n)       # all-gather: (W-1) N
    assert bench_fsdp2.bytes_received(n, 4, "fsdp2", "allreduce") == pytest.approx(2.25 * n)  # 2 gathers + RS
    assert bench_fsdp2.bytes_received(n, 4, "fsdp2", "ordered") == pytest.approx(3 * n)     # + the norm's gather
    # the tree, 2 micro-batches a rank: gathers and all-to-all twice, the norm's gather once
    assert bench_fsdp2.bytes_received(n, 4, "fsdp2", "tree", 2) == pytest.approx(5.25 * n)
    assert bench_fsdp2.bytes_received(n, 4, "ddp", "tree", 2) == pytest.approx(3 * n)      # the W subtree roots
