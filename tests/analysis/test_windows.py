"""Never certify what was not judged (lab_utils/analysis/noise.py's caps, analysis/windows.py), on synthetic runs
whose noise and bugs are known: a bug that starts after the whole-run envelope went blind is not tier 2 "no bug";
windows restarted from a shared state catch it at any step; a window whose own twin goes blind says so."""

import math

import torch

from lab_utils.analysis import doctor, noise, parity, windows
from lab_utils.analysis.parity import classify

N = 100
A = [4.0 - 0.02 * i for i in range(N)]
G = [1.0 - 0.005 * i for i in range(N)]
W = {"w": torch.ones(3, 3)}


def growth(step: int) -> float:
    """Float noise of a long run: ~1e-7, then x10 every 10 steps from step 20, to 2e-3 (blind from step ~57)."""
    return min(1e-7 * 10 ** (max(0, step - 20) / 10), 2e-3)


def rows(loss, grad=G):
    return [{"step": i, "loss": x, "grad_norm": g} for i, (x, g) in enumerate(zip(loss, grad, strict=True))]


def drifted(sign=1, bug_at=None, bug=0.0, noise_at=growth):
    step_bug = [bug if bug_at is not None and i >= bug_at else 0.0 for i in range(N)]
    return rows([x + sign * noise_at(i) + step_bug[i] for i, x in enumerate(A)],
                [g * (1 + sign * noise_at(i)) for i, g in enumerate(G)])


def twin():
    return noise.Twin("twin", drifted(-1), {"w": 1e-3}, 1e-4)


def test_bounds_are_capped_so_a_late_bug_is_never_certified():
    late = drifted(bug_at=80, bug=0.02)  # 0.5% of the loss: inside the grown envelope
    r = classify(rows(A), late, W, {"w": W["w"] + 1e-3}, output_diff=1e-4, twins=[twin()])
    assert r.tier == 2 and not r.certified and r.blind_from_step is not None and r.blind_from_step < 80
    assert r.not_judged[0] == r.blind_from_step and r.not_judged[-1] == N - 1
    assert "not judged" in r.tier_text() and "not judged" in r.format()
    # every bound the report certifies with can fail: below the caps
    judged = [s for s in range(N) if s not in r.not_judged]
    assert all(r.loss_bounds[s] <= noise.LOSS_CAP * A[s] and r.grad_bounds[s] <= noise.GRAD_CAP for s in judged)


def test_a_difference_over_the_uncapped_bound_is_still_out():
    r = classify(rows(A), drifted(bug_at=90, bug=3.0), W, {"w": W["w"]}, output_diff=0.0, twins=[twin()])
    assert r.first_step_over_tol == 90 and r.tier < 2


def _window_runs(bug_at=None, bug=0.0, twin_noise=1e-7):
    """R: A's program replayed from B's states every 10 steps; T: its twin; B: the port (1 ulp-ish off R)."""
    r = rows(A)
    t = rows([x + twin_noise for x in A], [g * (1 + twin_noise) for g in G])
    b = drifted(bug_at=bug_at, bug=bug, noise_at=lambda s: 2e-7)
    return b, r, t


def test_windows_catch_a_bug_at_any_step_and_pass_a_correct_port():
    starts = list(range(10, N, 10))
    b, r, t = _window_runs()
    ok = windows.judge(b, r, t, starts, N)
    assert ok.first_over is None and not ok.unjudged and len(ok.windows) == 10
    assert all(w.worst_ratio < 1 for w in ok.windows)
    for onset in (3, 47, 95):
        b, r, t = _window_runs(bug_at=onset, bug=1e-3)
        bad = windows.judge(b, r, t, starts, N)
        assert bad.first_over == onset, (onset, bad.table())
        assert bad.first_window_over.start == onset // 10 * 10


def test_windows_lift_the_blind_zone_in_the_report():
    starts = list(range(10, N, 10))
    late = drifted(bug_at=80, bug=0.02)
    b, r, t = _window_runs(bug_at=80, bug=0.02)
    judged = windows.judge(b, r, t, starts, N)
    rep = classify(rows(A), late, W, {"w": W["w"] + 1e-3}, output_diff=1e-4, twins=[twin()], windows=judged)
    assert rep.tier < 2 and rep.first_step_over_tol == 80
    b, r, t = _window_runs()
    rep = classify(rows(A), drifted(), W, {"w": W["w"] + 1e-3}, output_diff=1e-4, twins=[twin()],
                   windows=windows.judge(b, r, t, starts, N))
    assert rep.certified and rep.not_judged == [] and rep.blind_from_step is not None


def test_a_window_whose_twin_goes_blind_is_not_judged():
    b, r, t = _window_runs(twin_noise=3e-3)  # 100 x 3e-3 = 0.3 > 5% of a loss of ~3
    judged = windows.judge(b, r, t, [50], N)
    assert judged.first_over is None and judged.unjudged
    assert "not judged" in judged.table()


def test_a_replay_cut_short_is_refused():
    b, r, t = _window_runs()
    try:
        windows.judge(b, r[:50], t, [10], N)
    except ValueError as e:
        assert "0..99" in str(e)
    else:
        raise AssertionError("a replay with 50 of 100 steps was accepted")


def test_the_doctor_never_says_no_bug_while_a_training_key_differs():
    cfg = lambda **k: {"config": {"set_epoch": True, "global_batch_size": 16, **k}}  # noqa: E731
    r = classify(rows(A), rows(A), W, {"w": W["w"]}, output_diff=0.0, config_a=cfg(), config_b=cfg(set_epoch=False))
    assert r.tier == 2 and r.config_diffs == ["set_epoch=True vs False"]
    assert "set_epoch=True vs False" in r.format()
    d = doctor.Diagnosis("A", "B", r, "", None, None, [])
    assert not d.ok and d.exit_code == 1
    r = classify(rows(A), rows(A), W, {"w": W["w"]}, output_diff=0.0, config_a=cfg(log_every=10, window_every=10),
                 config_b=cfg(log_every=5, window_every=0))
    assert r.config_diffs == [] and "window_every" in " ".join(r.order_diffs)
    assert doctor.Diagnosis("A", "B", r, "", None, None, []).exit_code == 0


def test_not_judged_is_exit_3():
    r = classify(rows(A), drifted(), W, {"w": W["w"] + 1e-3}, output_diff=1e-4, twins=[twin()])
    assert r.tier == 2 and not r.certified
    assert doctor.Diagnosis("A", "B", r, "", None, None, []).exit_code == 3


def test_json_carries_the_judgement():
    b, r, t = _window_runs(bug_at=47, bug=1e-3)
    rep = classify(rows(A), drifted(bug_at=47, bug=1e-3), W, {"w": W["w"]}, output_diff=0.0, twins=[twin()],
                   windows=windows.judge(b, r, t, list(range(10, N, 10)), N))
    d = rep.to_dict()
    assert d["certified"] is False and d["windows"]["first_over"] == 47 and math.isfinite(d["max_abs_loss_diff"])
    assert isinstance(parity.ParityReport.to_json(rep), str)


def test_a_grad_jitter_spike_is_judged_by_the_window_median_and_a_scale_bug_is_still_out():
    b, r, t = _window_runs()
    t[55]["grad_norm"] *= 1.008  # the twin's grad norm jitters once (bf16 on the H200: 7.5e-3 at one step)
    ok = windows.judge(b, r, t, list(range(10, N, 10)), N)
    assert ok.first_over is None and not ok.unjudged, ok.table()
    halved = [dict(x, grad_norm=x["grad_norm"] * (0.5 if 50 <= i < 60 else 1)) for i, x in enumerate(b)]
    bad = windows.judge(halved, r, t, list(range(10, N, 10)), N)
    assert bad.first_over == 50, bad.table()


def test_a_run_keeps_a_bounded_number_of_window_states():
    from lab_utils.core import windows as states

    assert states.period({"window_every": 10, "steps": 100}) == 10
    assert states.period({"window_every": 10, "steps": 100_000}) == -(-100_000 // states.MAX_STATES)
    saved = [s for s in range(1, 100_001) if states.due({"window_every": 10, "steps": 100_000}, s)]
    assert len(saved) <= states.MAX_STATES
    assert states.period({"window_every": 0, "steps": 100}) == 0
