"""flopwise diagnose: finds injected stragglers, data stalls, loss trouble and plan misses in run dirs."""

import json

import pytest
from tests.diagnose.synthetic_runs import write_run_dir

from flopwise.cli import main
from flopwise.diagnose.analyze import diagnose_run_dir, load_run
from flopwise.errors import UserError


def kinds(diagnosis):
    return {f.kind for f in diagnosis.findings}


def finding(diagnosis, kind):
    return next(f for f in diagnosis.findings if f.kind == kind)


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    captured = capsys.readouterr()
    return exit_info.value.code or 0, captured.out, captured.err


def test_clean_run_has_no_findings_and_a_breakdown_per_rank(tmp_path):
    d = diagnose_run_dir(write_run_dir(tmp_path / "run", ranks=3))
    assert d.findings == [] and d.notes == []
    assert d.ranks == [0, 1, 2] and d.steps == 40
    b = d.breakdown[0]
    assert set(b.median) >= {"data_seconds", "compute_seconds", "optimizer_seconds", "sync_wait_seconds", "other_seconds"}
    assert b.p90["step_seconds"] >= b.median["step_seconds"]
    assert b.peak_memory_bytes["optimizer"] == 8_000_000


def test_straggler_rank_is_named_with_its_excess(tmp_path):
    d = diagnose_run_dir(write_run_dir(tmp_path / "run", ranks=4, straggler=(2, 0.35), hardware="h100-sxm"))
    f = finding(d, "straggler")
    assert f.rank == 2
    assert "rank 2" in f.message and "slower in compute" in f.message
    assert f.evidence["excess"] == pytest.approx(0.35, abs=0.05)
    assert "clocks" in f.next_step and "nvidia-smi" in f.next_step


def test_straggler_advice_on_a_cpu_run_is_about_cores_not_gpus(tmp_path):
    f = finding(diagnose_run_dir(write_run_dir(tmp_path / "run", ranks=2, straggler=(1, 0.35))), "straggler")
    assert "nvidia-smi" not in f.next_step and "cores" in f.next_step


def test_a_cpu_run_slower_than_an_unprofiled_plan_is_a_note_not_a_finding(tmp_path):
    d = diagnose_run_dir(write_run_dir(tmp_path / "run", plan_step_seconds=0.05))
    assert "plan_mismatch" not in kinds(d)
    assert any("not judged on a CPU" in note and "step_seconds 2.40x" in note for note in d.notes)


def test_a_cpu_run_slower_than_its_device_profile_predicts_is_a_finding(tmp_path):
    profile = {"path": "/tmp/p.json", "device": "cpu (Test)", "created": "2026-12-03T00:00:00+00:00",
               "threads": 1, "processes": 2, "dtypes": ["fp32"]}
    d = diagnose_run_dir(write_run_dir(tmp_path / "run", plan_step_seconds=0.05, profile=profile))
    f = finding(d, "plan_mismatch")
    assert "slower than planned" in f.message and "step_seconds 2.40x" in f.message
    assert "uptime" in f.next_step and "flopwise calibrate" in f.next_step
    assert not any("not judged" in note for note in d.notes)
    # within the tolerance there is nothing to say
    close = diagnose_run_dir(write_run_dir(tmp_path / "close", plan_step_seconds=0.11, profile=profile))
    assert "plan_mismatch" not in kinds(close) or all("memory" in f.message for f in close.findings
                                                      if f.kind == "plan_mismatch")


@pytest.mark.parametrize("calibrated, run_load, verdict", [
    (0.1, {"start": 3.5, "end": 5.0}, "busy during the run, not when calibrated"),
    (0.9, {"start": 0.2, "end": 2.2}, "profile was measured on a busy machine"),
    (0.9, {"start": 3.5, "end": 5.0}, "busy both times"),
    (0.1, {"start": 0.2, "end": 2.2}, "quiet machine both times: the model is wrong"),
])
def test_diagnose_says_whether_a_busy_machine_or_the_model_explains_a_speed_miss(tmp_path, calibrated, run_load,
                                                                                  verdict):
    profile = {"path": "/tmp/p.json", "sha256": "ab" * 32, "source": "cache", "busy_load_per_core": calibrated}
    load = {**run_load, "cpu_count": 4, "own_threads": 2}
    d = diagnose_run_dir(write_run_dir(tmp_path / "run", plan_step_seconds=0.05, profile=profile, machine_load=load))
    line = next(note for note in d.notes if note.startswith("profile /tmp/p.json"))
    assert "sha256 abababababab" in line and "cache" in line and f"calibrated under load {calibrated:.2f}" in line
    assert verdict in line and "\n" not in line
    # on time, the same line says so and blames nothing
    close = diagnose_run_dir(write_run_dir(tmp_path / "close", plan_step_seconds=0.11, profile=profile,
                                           machine_load=load))
    assert any(note.startswith("profile /tmp/p.json") and note.endswith("speed as predicted") for note in close.notes)


def test_straggler_seen_from_sync_waits_alone(tmp_path):
    run_dir = write_run_dir(tmp_path / "run", ranks=2, straggler=(1, 0.35))
    # A trainer that times the wait but not compute separately: drop compute_seconds.
    for path in run_dir.glob("metrics.rank*.jsonl"):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        for record in lines:
            record.pop("compute_seconds")
        path.write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    d = diagnose_run_dir(run_dir)
    assert d.notes == []
    stragglers = [f for f in d.findings if f.kind == "straggler"]
    assert [f.rank for f in stragglers] == [1]
    assert "arrives last" in stragglers[0].message


def test_sampled_meters_still_name_the_straggler_and_read_the_peak_memory(tmp_path):
    """Sync wait and memory on 14 of 40 steps (measure_every=4): the other steps' compute holds
    the wait, so the breakdown is taken from the probed steps and the straggler keeps its excess."""
    run_dir = write_run_dir(tmp_path / "run", ranks=2, straggler=(1, 0.35), measure_every=4)
    rows = [json.loads(line) for line in (run_dir / "metrics.rank0.jsonl").read_text().splitlines()]
    probed = [r["step"] for r in rows if "sync_wait_seconds" in r]
    assert probed == [1, 2, 3, 4, 5, *range(8, 41, 4)] == [r["step"] for r in rows if "memory_optimizer_bytes" in r]
    d = diagnose_run_dir(run_dir)
    f = finding(d, "straggler")
    assert f.rank == 1 and f.evidence["excess"] == pytest.approx(0.35, abs=0.05)
    assert all("sync_wait_seconds" in b.median for b in d.breakdown) and d.notes == []
    assert d.breakdown[1].peak_memory_bytes["saved_activations"] == 12_001_000


def test_data_stall_steps_and_rank_are_named(tmp_path):
    d = diagnose_run_dir(write_run_dir(tmp_path / "run", ranks=2, stall=(1, [20, 21, 22], 0.6)))
    f = finding(d, "data_stall")
    assert f.rank == 1 and f.evidence["steps"] == [20, 21, 22]
    assert "rank 1" in f.message
    outliers = finding(d, "outlier_steps")
    assert outliers.evidence["steps"] == [20, 21, 22] and "data wait" in outliers.message
    assert "straggler" not in kinds(d)


def test_chronic_data_wait_share(tmp_path):
    d = diagnose_run_dir(write_run_dir(tmp_path / "run", ranks=2, data_share={0: 0.35}))
    f = finding(d, "data_wait")
    assert f.rank == 0 and f.severity == "critical"
    assert "35%" in f.message


def test_loss_nan_and_spike(tmp_path):
    d = diagnose_run_dir(write_run_dir(tmp_path / "run", nan_from=30, spike_at=20))
    nan = finding(d, "loss_nan")
    assert nan.severity == "critical" and "step 30" in nan.message
    assert finding(d, "loss_spike").evidence["steps"] == [20]
    assert d.findings[0].kind == "loss_nan", "critical findings come first"


def test_periodic_slow_steps_point_at_checkpoints(tmp_path):
    run_dir = write_run_dir(tmp_path / "run", slow_steps=[10, 20, 30])
    config = run_dir / "config.yaml"
    config.write_text(config.read_text() + "checkpoint:\n  every_steps: 10\n")
    f = finding(diagnose_run_dir(run_dir), "outlier_steps")
    assert f.evidence["steps"] == [10, 20, 30]
    assert "every 10 steps" in f.message and "checkpoint" in f.message


def test_plan_mismatch_from_predicted_vs_measured(tmp_path):
    d = diagnose_run_dir(write_run_dir(tmp_path / "run", plan_step_seconds=0.05, hardware="a100-80gb"))
    rows = {r.name: r for r in d.plan_rows}
    assert rows["step_seconds"].ratio == pytest.approx(2.4)
    assert rows["tokens_per_second"].ratio == pytest.approx(1 / 2.4)
    assert rows["memory_bytes.activations"].ratio == pytest.approx(1.2)
    assert "mfu" not in rows, "a figure the plan did not predict is not compared"
    mismatches = [f for f in d.findings if f.kind == "plan_mismatch"]
    assert len(mismatches) == 1, "tokens/s and step time are one speed finding; memory is within tolerance"
    assert "slower than planned" in mismatches[0].message
    assert f"--calibrate {d.run_dir}" in mismatches[0].next_step


def test_memory_mismatch_is_its_own_finding(tmp_path):
    run_dir = write_run_dir(tmp_path / "run")
    pvm = json.loads((run_dir / "predicted_vs_measured.json").read_text())
    pvm["measured"]["memory_bytes"]["activations"] = 40_000_000
    (run_dir / "predicted_vs_measured.json").write_text(json.dumps(pvm))
    f = finding(diagnose_run_dir(run_dir), "plan_mismatch")
    assert "memory differs" in f.message and "memory_bytes.activations 4.00x" in f.message


def test_predicted_vs_measured_is_read_as_the_run_record_contract(tmp_path):
    run_dir = write_run_dir(tmp_path / "run", plan_step_seconds=None)
    pvm = {"schema_version": 1, "predicted": {"step_seconds": 0.1, "mfu": None}, "measured": {"step_seconds": 0.11}}
    (run_dir / "predicted_vs_measured.json").write_text(json.dumps(pvm))
    d = diagnose_run_dir(run_dir)
    assert [(r.name, r.measured) for r in d.plan_rows] == [("step_seconds", 0.11)]
    assert "plan_mismatch" not in kinds(d)
    # another shape is not guessed at: one line naming the file and what it lacks
    (run_dir / "predicted_vs_measured.json").write_text(json.dumps([{"name": "step_seconds", "predicted": 0.1}]))
    with pytest.raises(UserError, match="predicted_vs_measured.json: not a flopwise predicted-vs-measured record"):
        diagnose_run_dir(run_dir)
    pvm["schema_version"] = 99
    (run_dir / "predicted_vs_measured.json").write_text(json.dumps(pvm))
    with pytest.raises(UserError, match="schema_version 99 is newer"):
        diagnose_run_dir(run_dir)


def test_minimal_records_and_a_truncated_last_line_are_tolerated(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lines = [json.dumps({"step": s, "rank": 0, "loss": 5.0 - s / 100, "tokens_per_second": 1000.0, "step_seconds": 0.1}) for s in range(1, 21)]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 21, "rank": 0, "lo')
    run = load_run(run_dir)
    assert run.skipped_lines == 1 and len(run.steps_by_rank[0]) == 20
    d = diagnose_run_dir(run_dir)
    assert d.findings == [] and d.breakdown[0].median["step_seconds"] == pytest.approx(0.1)


def test_resumed_run_keeps_the_last_record_of_a_step(tmp_path):
    run_dir = write_run_dir(tmp_path / "run", ranks=1, steps=10)
    path = run_dir / "metrics.rank0.jsonl"
    extra = json.loads(path.read_text().splitlines()[-1]) | {"step_seconds": 0.5}
    path.write_text(path.read_text() + json.dumps(extra) + "\n")
    run = load_run(run_dir)
    assert len(run.steps_by_rank[0]) == 10 and run.steps_by_rank[0][-1]["step_seconds"] == 0.5


def test_cli_json_names_the_straggler(tmp_path, capsys):
    run_dir = write_run_dir(tmp_path / "run", straggler=(1, 0.4), stall=(0, [15], 0.8))
    code, out, _ = run_cli(["diagnose", str(run_dir), "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    by_kind = {f["kind"]: f for f in data["findings"]}
    assert by_kind["straggler"]["rank"] == 1 and by_kind["data_stall"]["rank"] == 0
    assert len(data["breakdown"]) == 2


def test_cli_table_output(tmp_path, capsys):
    code, out, _ = run_cli(["diagnose", str(write_run_dir(tmp_path / "run", straggler=(1, 0.4)))], capsys)
    assert code == 0 and "rank 1 is" in out and "next:" in out


@pytest.mark.parametrize("make", ["missing", "empty", "no_steps", "file"])
def test_bad_run_dir_is_one_line_and_exit_2(tmp_path, capsys, make):
    target = tmp_path / "run"
    if make == "empty":
        target.mkdir()
    elif make == "no_steps":
        target.mkdir()
        (target / "metrics.rank0.jsonl").write_text("")
    elif make == "file":
        target.write_text("x")
    with pytest.raises(UserError):
        load_run(target)
    code, _, err = run_cli(["diagnose", str(target)], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("error:") and str(target) in err


def test_runs_without_sync_wait_say_what_that_hides(tmp_path):
    d = diagnose_run_dir(write_run_dir(tmp_path / "run", sync_wait=False))
    assert len(d.notes) == 1 and "inside forward+backward" in d.notes[0]
    assert "sync_wait_seconds" not in d.breakdown[0].median
