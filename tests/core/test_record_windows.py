"""Windows for a script of your own (lab_utils/core/record.py): `Recorder(window_every=k)` saves the training state
every k steps on the DDP side, `record.replay` runs the single-GPU step from those states, and `ddp-lab doctor A B
--replay R T` judges B window by window. Real runs of tests/outside/multigpu_torchrun_recorded.py: the single run
and two 2-rank runs through the launcher (gloo on CPU), one of them with a late bug planted (set_epoch skipped in
epoch 4, steps 16-19, as after a resume that enters the loop past it); the replays and their float twins run the
script's own replay in this process, as a user's script would call record.replay."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from lab_utils import cli
from lab_utils.core import record, runfiles, windows
from lab_utils.launch import launcher

pytestmark = pytest.mark.timeout(600)

SCRIPT = Path(__file__).resolve().parents[1] / "outside" / "multigpu_torchrun_recorded.py"
KEYS = {"steps": 24, "n_samples": 64, "global_batch_size": 16}  # 4 steps per epoch
EVERY, BUG_EPOCH, BUG_STEP = 4, 4, 16  # the bug acts in steps 16-19 only: from step 20 on B's data is right again


def _outside_script():
    spec = importlib.util.spec_from_file_location("outside_multigpu_torchrun_recorded", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("record_windows")
    specs = {"single": ("single", 1, KEYS),
             "ddp": ("ddp", 2, {**KEYS, "window_every": EVERY}),
             "late": ("late", 2, {**KEYS, "window_every": EVERY}, {"extra_env": {"SKIP_SET_EPOCH": str(BUG_EPOCH)}})}
    launcher.launch_many(launcher.requests_from_specs(specs, runs_dir=root, timeout=300, script=SCRIPT), max_workers=2,
                         raise_on_failure=True)
    script = _outside_script()
    for b in ("ddp", "late"):  # the replay (micro=1) and its float twin (micro=2), from B's window states
        for name, micro in ((f"{b}_replay", 1), (f"{b}_twin", 2)):
            script.main({**{k: str(v) for k, v in KEYS.items()}, "out_dir": str(root / name),
                         "replay_from": str(root / b), "micro_batches": str(micro)})
    return root


def doctor(runs, b, capsys, *extra) -> tuple[int, dict]:
    code = cli.main(["doctor", str(runs / "single"), str(runs / b), "--json",
                     "--replay", str(runs / f"{b}_replay"), str(runs / f"{b}_twin"), *extra])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_the_ddp_side_saves_a_window_state_every_k_steps(runs):
    assert windows.steps(runs / "ddp") == [4, 8, 12, 16, 20, 24]
    assert windows.steps(runs / "single") == []  # window_every=0: none
    state = torch.load(windows.state_path(runs / "ddp", 8), weights_only=True)
    assert state["step"] == 8 and set(state["model"]) == {"weight", "bias"}  # no `module.` prefix
    assert "param_groups" in state["optimizer"] and state["extra_state"] == {}
    assert runfiles.read_config(runs / "ddp")["config"]["window_every"] == EVERY


@pytest.mark.slow
def test_a_replay_folder_is_what_the_judgement_reads(runs):
    for name in ("ddp_replay", "ddp_twin"):
        assert [m["step"] for m in runfiles.read_metrics(runs / name)] == list(range(24))
        ends = [json.loads(line) for line in (runs / name / runfiles.WINDOW_ENDS).read_text().splitlines()]
        assert [e["step"] for e in ends] == [4, 8, 12, 16, 20]  # every window start in 0 < s < 24
        # the correct port's state is A's program's to float order: the replay arrives within ulps of it
        assert all(e["max_abs_param_diff"] < 1e-6 for e in ends), ends
    late = [json.loads(line) for line in (runs / "late_replay" / runfiles.WINDOW_ENDS).read_text().splitlines()]
    assert late[-1]["step"] == 20 and late[-1]["max_abs_param_diff"] > 1e-4  # after the bug's epoch: B is elsewhere


@pytest.mark.slow
def test_a_correct_port_is_within_every_window(runs, capsys):
    code, d = doctor(runs, "ddp", capsys)
    assert code == 0, d
    assert d["windows"]["first_over"] is None and len(d["windows"]["windows"]) == 6
    assert all(w["first_over"] is None and not w["unjudged"] for w in d["windows"]["windows"])


@pytest.mark.slow
def test_a_late_bug_is_caught_at_its_first_step_and_only_in_its_window(runs, capsys):
    code, d = doctor(runs, "late", capsys)
    assert code == 1 and d["windows"]["first_over"] == BUG_STEP, d
    by_start = {w["start"]: w for w in d["windows"]["windows"]}
    assert by_start[BUG_STEP]["first_over"] == BUG_STEP and by_start[BUG_STEP]["worst_ratio"] > 100
    assert all(by_start[s]["first_over"] is None for s in (0, 4, 8, 12))
    # From step 20 B's data is right again: the replay took B's state there, so the window is B's program
    # from B's own weights, within. Without the snap it would carry the bug's whole difference.
    assert by_start[20]["first_over"] is None, d["windows"]
    assert d["causes"][0]["code"] == "sampler_epoch"


@pytest.mark.slow
def test_compare_takes_the_replay_too(runs, capsys):
    assert cli.main(["compare", str(runs / "single"), str(runs / "late"), "--json", "--replay",
                     str(runs / "late_replay"), str(runs / "late_twin")]) == 0
    assert json.loads(capsys.readouterr().out)["windows"]["first_over"] == BUG_STEP


@pytest.mark.slow
def test_a_replay_of_another_run_is_refused(runs, capsys):
    code = cli.main(["doctor", str(runs / "single"), str(runs / "late"), "--replay", str(runs / "single"),
                     str(runs / "ddp_twin")])
    err = capsys.readouterr().err
    assert code == 2 and "did not take B's state" in err and len(err.strip().splitlines()) == 1


def _trace(runs, b: str, step: int, tag: str, **b_keys) -> tuple:
    """The script's own trace runs (core/op_record.py): B's program first (its ranks emulated, layout=ranks,
    B's own switches), then A's from B's state at the step."""
    script, base = _outside_script(), {k: str(v) for k, v in KEYS.items()}
    tb, ta = runs / f"{tag}_trace_b", runs / f"{tag}_trace_a"
    script.main({**base, **b_keys, "out_dir": str(tb), "replay_from": str(runs / b), "trace_step": str(step),
                 "micro_batches": "2", "layout": "ranks"})
    script.main({**base, "out_dir": str(ta), "replay_from": str(runs / b), "trace_step": str(step),
                 "trace_state": str(tb)})
    return ta, tb


@pytest.mark.slow
def test_ops_traces_of_a_recorded_script_name_the_first_op(runs, capsys):
    ta, tb = _trace(runs, "late", BUG_STEP, "late", skip_set_epoch=str(BUG_EPOCH))
    code, d = doctor(runs, "late", capsys, "--ops-traces", str(ta), str(tb))
    assert code == 1 and d["first_op"]["phase"] == "data" and d["first_op"]["step"] == BUG_STEP, d["ops"]
    assert d["ops"]["start"] == BUG_STEP  # from B's own window state at the step
    # the correct port: its first step not bitwise, traced, is nothing beyond float noise in any op
    _, ok = doctor(runs, "ddp", capsys)
    step = ok["first_diverging_step"] if ok["first_diverging_step"] is not None else ok["first_diff_step"]
    ta, tb = _trace(runs, "ddp", step, "ddp")
    code, d = doctor(runs, "ddp", capsys, "--ops-traces", str(ta), str(tb))
    assert code == 0 and d["first_op"] is None and d["ops_not_judged"] is None, d["ops"]
    phases = {o["phase"] for o in d["ops"]["diffs"]}
    assert {"data", "forward", "reduction", "optimizer"} <= phases, phases  # SGD: the update is judged too
    # a trace of another step than the doctor names is not judged, and says which step to trace
    code, d = doctor(runs, "late", capsys, "--ops-traces", str(ta), str(tb))
    assert code == 3 and f"trace_step={BUG_STEP}" in d["ops_not_judged"], d


# ------------------------------------------------------------------ in this process: the recorder's rules


def _toy(steps: int, out: Path | None, window_every: int = 0):
    """A tiny training loop with dropout (the global RNG) and a momentum SGD with a scheduler."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    rec = record.Recorder(out, model, window_every=window_every) if out else None
    for step in range(steps):
        model(torch.randn(6, 4)).pow(2).mean().backward()
        opt.step()
        sched.step()
        if rec:
            rec.step(step, 1.0, model, optimizer=opt, extra_state={"scheduler": sched.state_dict()})
        opt.zero_grad()
    if rec:
        rec.close(model)
    return {k: v.clone() for k, v in model.state_dict().items()}, torch.get_rng_state()


def test_window_states_change_nothing_in_the_training(tmp_path):
    plain, rng_plain = _toy(5, None)
    rec, rng_rec = _toy(5, tmp_path / "run", window_every=2)
    assert all(torch.equal(plain[k], rec[k]) for k in plain) and torch.equal(rng_plain, rng_rec)
    assert windows.steps(tmp_path / "run") == [2, 4]
    state = torch.load(windows.state_path(tmp_path / "run", 4), weights_only=True)
    assert state["step"] == 4 and state["optimizer"]["state"]  # the momentum buffers
    assert state["extra_state"]["scheduler"]["last_epoch"] == 4


def test_window_every_without_the_optimizer_is_named(tmp_path):
    model = torch.nn.Linear(2, 1)
    rec = record.Recorder(tmp_path, model, window_every=2)
    with pytest.raises(ValueError, match=r"optimizer=optimizer"):
        rec.step(0, 1.0, model)
    with pytest.raises(ValueError, match="window_every=-1"):
        record.Recorder(tmp_path, model, window_every=-1)


def test_a_replay_from_its_own_states_is_bitwise_its_run(tmp_path):
    """The helper's alignment: B's state after s steps is taken before step s, so a single run replayed from its
    own window states is the same run to the bit (every window end 0.0); extra_load gets each state's dict."""
    def program(out, replay_from=None):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        seen = []

        def train_step(step, micro):
            x = torch.randn(8, 4, generator=torch.Generator().manual_seed(step))
            opt.zero_grad()
            loss = 0
            for part in record.micro_batches(x, micro):
                p = model(part).pow(2).mean()
                (p / micro).backward()
                loss = loss + p.detach() / micro
            opt.step()
            return loss, range(step * 8, step * 8 + 8)

        if replay_from:
            record.replay(replay_from, model, opt, train_step, out, 7, extra_load=seen.append)
            return seen
        rec = record.Recorder(out, model, window_every=3)
        for step in range(7):
            loss, ids = train_step(step, 1)
            rec.step(step, loss, model, sample_ids=ids, optimizer=opt, extra_state={"at": step + 1})
        rec.close(model)

    program(tmp_path / "b")
    seen = program(tmp_path / "r", replay_from=tmp_path / "b")
    assert seen == [{"at": 3}, {"at": 6}]
    mb, mr = runfiles.read_metrics(tmp_path / "b"), runfiles.read_metrics(tmp_path / "r")
    assert [(m["loss"], m["grad_norm"], m["param_hash"]) for m in mb] == [
        (m["loss"], m["grad_norm"], m["param_hash"]) for m in mr]
    ends = [json.loads(line) for line in (tmp_path / "r" / runfiles.WINDOW_ENDS).read_text().splitlines()]
    assert [(e["step"], e["max_abs_param_diff"]) for e in ends] == [(3, 0.0), (6, 0.0)]
    with pytest.raises(ValueError, match="extra_load"):  # B saved extra_state: dropping it is not a replay
        record.replay(tmp_path / "b", torch.nn.Linear(4, 1), torch.optim.SGD([torch.zeros(1)], lr=0.1),
                      lambda s, m: 0.0, tmp_path / "r2", 7)
    with pytest.raises(ValueError, match="no window states"):
        record.replay(tmp_path / "r", torch.nn.Linear(4, 1), torch.optim.SGD([torch.zeros(1)], lr=0.1),
                      lambda s, m: 0.0, tmp_path / "r3", 7)
