"""`flopwise plan` as a real process: default example, --json, one-line errors, no torch."""

import json
import os
import subprocess
import sys

import pytest

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "120"}


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flopwise", "plan", *args], capture_output=True, text=True,
                          env=ENV, timeout=60)


def test_default_example_prints_every_section():
    out = run()
    assert out.returncode == 0, out.stderr
    for title in ("Parameters", "FLOPs", "Memory per device", "Time", "Energy and cost", "assumptions"):
        assert title in out.stdout
    assert "Llama 2 7B" in out.stdout and "fits" in out.stdout


def test_json_output_parses_and_carries_inputs():
    out = run("--json", "--model", "gpt3-175b", "--hardware", "a100-80gb", "--gpus", "1024", "--tp", "8",
              "--pp", "8", "--tokens", "300B", "--sequence-parallel", "--recompute", "selective")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["inputs"]["model"] == "gpt3-175b" and data["inputs"]["layout"]["dp"] == 16
    assert data["flops"]["kaplan_6nd_total"] == pytest.approx(3.14e23, rel=5e-3)
    assert isinstance(data["fits"], bool) and data["time"]["mfu"] > 0


@pytest.mark.parametrize("args", [
    ("--gpus", "8", "--dp", "3"),
    ("--tp", "3", "--gpus", "3"),
    ("--pp", "100", "--gpus", "100"),
    ("--model", "no-such-model"),
    ("--hardware", "no-such-chip"),
    ("--tokens", "a lot"),
    ("--precision", "int3"),
])
def test_bad_input_exits_2_with_one_line(args):
    out = run(*args)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and out.stderr.startswith("error:"), out.stderr
    assert "Traceback" not in out.stderr


def test_calibrate_option_uses_the_measured_mfu(tmp_path):
    (tmp_path / "predicted_vs_measured.json").write_text(json.dumps({"measured": {"mfu": 0.25, "hardware": "h100-sxm"}}))
    data = json.loads(run("--json", "--calibrate", str(tmp_path)).stdout)
    assert data["time"]["efficiency"] == 0.25 and data["time"]["mfu"] <= 0.25 + 1e-12


NO_TORCH = """
import sys
{body}
assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:5]
print('ok')
"""


def test_planner_import_does_not_import_torch():
    body = "import flopwise.plan.planner, flopwise.plan.calibration; flopwise.plan.planner.plan(flopwise.plan.planner.build_runspec())"
    out = subprocess.run([sys.executable, "-c", NO_TORCH.format(body=body)], capture_output=True, text=True, env=ENV)
    assert out.stdout.strip() == "ok", out.stderr


def test_plan_command_does_not_import_torch():
    body = ("from flopwise.cli import main\nsys.argv = ['flopwise', 'plan', '--json']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "sys.stdout = sys.__stdout__")
    out = subprocess.run([sys.executable, "-c", NO_TORCH.format(body=body)], capture_output=True, text=True, env=ENV)
    assert out.stdout.strip().endswith("ok"), out.stderr


NUMBER = (int, float)
CONTRACT = {
    "schema_version": int, "params": NUMBER, "active_params": NUMBER, "flops_per_token": NUMBER,
    "training_flops": NUMBER, "pf_days": NUMBER, "gpu_hours": NUMBER, "energy_kwh": NUMBER,
}
MEMORY_PARTS = ("weights", "gradients", "optimizer", "activations", "other", "total")
TIME_KEYS = ("step_seconds", "tokens_per_second", "mfu", "total_seconds")
LAYOUT_KEYS = ("dp", "tp", "pp", "cp", "ep", "micro_batch", "grad_accum", "zero")


def check_contract(data: dict) -> None:
    """Every key of the `plan --json` contract (docs/planner.md), with its type."""
    for key, kind in CONTRACT.items():
        assert isinstance(data[key], kind) and not isinstance(data[key], bool), key
    per_device = data["memory"]["per_device_bytes"]
    for part in MEMORY_PARTS:
        assert isinstance(per_device[part], NUMBER) and per_device[part] >= 0, part
    assert per_device["total"] == pytest.approx(sum(per_device[p] for p in MEMORY_PARTS[:-1]))
    assert isinstance(data["memory"]["device_bytes"], NUMBER) and isinstance(data["memory"]["fits"], bool)
    for key in TIME_KEYS:
        assert isinstance(data["time"][key], NUMBER) and data["time"][key] >= 0, key
    assert set(data["cost_usd"]) == {"on_demand", "spot"}
    assert all(v is None or isinstance(v, NUMBER) for v in data["cost_usd"].values())
    for key in LAYOUT_KEYS:
        assert isinstance(data["layout"][key], int) and not isinstance(data["layout"][key], bool), key
    assert data["schema_version"] == 2
    assert isinstance(data["stack"], str) and all(isinstance(o, str) for o in data["fits_with"])
    for key in ("per_day", "expected_interruptions", "expected_seconds", "expected_device_hours", "overhead",
                "effective_training_time"):
        assert isinstance(data["interruptions"][key], NUMBER) and data["interruptions"][key] >= 0, key
    assert data["interruptions"]["expected_seconds"] >= data["time"]["total_seconds"]


def test_compile_flag_plans_compiled_blocks():
    plain, compiled = (json.loads(run("--json", *extra).stdout) for extra in ((), ("--compile",)))
    assert compiled["layout"]["compiled"] is True and plain["layout"]["compiled"] is False
    assert compiled["memory"]["activations"] < 0.85 * plain["memory"]["activations"]
    assert "torch.compile" in run("--compile").stdout


def test_fsdp_sync_flag_plans_gradient_shards_and_more_reduce_scatters():
    held, synced = (json.loads(run("--json", "--zero", "3", *extra).stdout)
                    for extra in ((), ("--fsdp-sync-every-micro-step",)))
    assert synced["memory"]["gradients"] * 8 <= held["memory"]["gradients"] / 2  # 2 bytes / 8 ranks vs 4 whole
    # 128 reduce-scatters a step instead of one, beside the 256 gathers ZeRO-3 issues either way
    assert synced["comm"]["dp_bytes"] > 1.4 * held["comm"]["dp_bytes"]
    assert synced["time"]["step_seconds"] > held["time"]["step_seconds"]


def test_json_contract_every_key_and_type():
    out = run("--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    check_contract(data)
    assert data["params"] == data["details"]["params"]["total"]
    assert data["layout"]["zero"] == 2 and data["defaults"][0].startswith("zero 2:")
    assert data["facility"]["node_watts"] > 0 and isinstance(data["facility"]["exceeds_air_cooling"], bool)


def test_json_contract_for_a_pipeline_with_the_typer_command_too():
    args = ("--json", "--model", "llama3-70b", "--gpus", "64", "--tp", "8", "--pp", "4", "--sequence-parallel",
            "--framework", "megatron", "--recompute", "every:2")
    fast = run(*args)
    assert fast.returncode == 0, fast.stderr
    check_contract(json.loads(fast.stdout))
    # the same command line through the typer app (what `plan --json` ran before the fast path)
    code = ("import json, sys; from flopwise.cli import build_app; "
            f"build_app()(args=['plan', *{list(args)!r}], prog_name='flopwise', standalone_mode=False)")
    slow = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=60)
    assert slow.returncode == 0, slow.stderr
    assert json.loads(slow.stdout) == json.loads(fast.stdout)


def test_search_json_without_the_typer_app_is_the_typer_commands_output():
    """`plan --search --json` takes the fast path (no typer, rich or pydantic) and prints what
    the typer command prints, error bands included."""
    args = ("--search", "--json", "--model", "llama2-7b", "--hardware", "a100-80gb", "--gpus", "16",
            "--global-batch", "512", "--top", "2")
    code = ("import json, sys; from flopwise.cli import main; main(['plan', *{args!r}]); "
            "print(json.dumps(sorted(m for m in ('typer', 'rich', 'pydantic') if m in sys.modules)), file=sys.stderr)")
    fast = subprocess.run([sys.executable, "-c", code.format(args=list(args))], capture_output=True, text=True,
                          env=ENV, timeout=120)
    assert fast.returncode == 0, fast.stderr
    assert json.loads(fast.stderr.strip().splitlines()[-1]) == []
    typer_code = ("from flopwise.cli import build_app; "
                  f"build_app()(args=['plan', *{list(args)!r}], prog_name='flopwise', standalone_mode=False)")
    slow = subprocess.run([sys.executable, "-c", typer_code], capture_output=True, text=True, env=ENV, timeout=120)
    assert slow.returncode == 0, slow.stderr
    assert json.loads(slow.stdout) == json.loads(fast.stdout)
    assert all(row["plan"]["band"]["expected_error"] > 0 for row in json.loads(fast.stdout)["ranked"])


def test_plain_plan_tables_without_the_typer_app_are_the_typer_commands_tables():
    """A plain `flopwise plan` prints through the fast path without building the whole app
    (no trainer or compress command module), and prints what the typer command prints."""
    args = ["--model", "llama2-13b", "--gpus", "16", "--tp", "2"]
    code = ("import sys; from flopwise.cli import main; main(['plan', *{args!r}]); "
            "print(sorted(m for m in ('flopwise.train.commands', 'flopwise.compress.commands') if m in sys.modules), "
            "file=sys.stderr)")
    env = {**ENV, "COLUMNS": "120"}
    fast = subprocess.run([sys.executable, "-c", code.format(args=args)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert fast.returncode == 0, fast.stderr
    assert fast.stderr.strip().splitlines()[-1] == "[]"
    typer_code = ("from flopwise.cli import build_app; "
                  f"build_app()(args=['plan', *{args!r}], prog_name='flopwise', standalone_mode=False)")
    slow = subprocess.run([sys.executable, "-c", typer_code], capture_output=True, text=True, env=env, timeout=120)
    assert slow.returncode == 0, slow.stderr
    assert slow.stdout == fast.stdout and "expected error (validated)" in fast.stdout


def test_help_shows_every_default():
    out = run("--help")
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    for flag in ("--model", "--gpus", "--zero", "--framework", "--allocator-reserve", "--recompute", "--tokens"):
        assert flag in text
    assert text.count("[default:") >= 30


def test_stack_flag_through_a_real_process():
    """`plan --json --stack nemo`: NVIDIA's performance recipes on Megatron-Core, the published Llama 2 7B
    fp8 layout fits as NeMo's fp8 recipes run it (bf16 gradients); stated fp32 gradients need TE's fp8
    weights to fit; an unknown stack or reduce dtype is one line, exit != 0."""
    args = ("--json", "--stack", "nemo", "--precision", "fp8", "--seq-len", "4096", "--global-batch", "128",
            "--micro-batch", "1", "--zero", "1")
    out, fp32 = run(*args), run(*args, "--grad-reduce", "fp32")
    assert out.returncode == 0 == fp32.returncode, out.stderr + fp32.stderr
    data, wide = json.loads(out.stdout), json.loads(fp32.stdout)
    check_contract(data)
    assert data["stack"] == "nemo" and data["fits"] and data["fits_with"] == []
    assert wide["memory"]["gradients"] == pytest.approx(2 * data["memory"]["gradients"])
    assert wide["comm"]["dp_bytes"] > data["comm"]["dp_bytes"]
    assert (data["layout"]["grad_reduce"], wide["layout"]["grad_reduce"]) == ("bf16", "fp32")
    assert data["layout"]["fp32_params"] is False
    assert run("--grad-reduce", "fp16").returncode != 0
    bad = run("--stack", "paxml")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and "--stack" in bad.stderr + bad.stdout


def test_recipe_short_names_plan_the_same_run():
    """--mbs, --gbs, --vp and --seq-length (the names NeMo and Megatron recipes print) are the
    long options, on the typer path and on the fast --json path alike."""
    long = run("--model", "llama3-70b", "--stack", "nemo", "--gpus", "64", "--tp", "4", "--pp", "4",
               "--virtual-stages", "5", "--micro-batch", "1", "--global-batch", "128", "--seq-len", "8192", "--json")
    short = run("--model", "llama3-70b", "--stack", "nemo", "--gpus", "64", "--tp", "4", "--pp", "4",
                "--vp", "5", "--mbs", "1", "--gbs", "128", "--seq-length", "8192", "--json")
    assert long.returncode == 0 and short.returncode == 0, short.stderr
    assert json.loads(short.stdout) == json.loads(long.stdout)
    assert json.loads(short.stdout)["layout"]["grad_accum"] == 32
    table = run("--model", "llama3-70b", "--stack", "nemo", "--gpus", "64", "--tp", "4", "--pp", "4",
                "--vp", "5", "--mbs", "1", "--gbs", "128", "--seq-length", "8192")
    assert table.returncode == 0 and "4+4+4+4+4,4+4+4+4+4" in table.stdout
    # the header names the layout as the recipe states it: sequence parallelism and the chunks
    assert "(dp 4, tp 4+SP, pp 4 interleaved x5)" in table.stdout.replace("\n", " ")


def test_megatron_argument_names_plan_the_same_run():
    """Megatron-LM's own argument names (--tensor-model-parallel-size, --seq-length, ...) and the
    plain "H100" of a paper plan exactly the run the short names do, on both parsing paths."""
    short = ("--model", "mixtral-8x7b", "--hardware", "h100-sxm", "--stack", "nemo", "--gpus", "64", "--tp", "1",
             "--pp", "4", "--vp", "8", "--ep", "8", "--cp", "1", "--mbs", "1", "--gbs", "256", "--seq-len", "4096")
    spelled = ("--model", "mixtral-8x7b", "--hardware", "H100", "--stack", "nemo", "--num-gpus", "64",
               "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "4",
               "--virtual-pipeline-model-parallel-size", "8", "--expert-model-parallel-size", "8",
               "--context-parallel-size", "1", "--micro-batch-size", "1", "--global-batch-size", "256",
               "--seq", "4096")
    for tail in (("--json",), ()):
        a, b = run(*short, *tail), run(*spelled, *tail)
        assert a.returncode == 0 and b.returncode == 0, b.stderr
        assert a.stdout == b.stdout
    assert json.loads(run(*spelled, "--sequence-length", "4096", "--vpp", "8", "--json").stdout)["layout"]["pp"] == 4


def test_a_run_typed_as_its_source_states_it_plans_as_the_canonical_names():
    """MosaicML's table row "MPT-7B, H100-80GB, 8 GPUs, 1 x 2, act. ckpt yes" typed with the
    table's own words plans exactly as the catalog's keys and `--recompute full` do."""
    source = run("--model", "MPT-7B", "--hardware", "H100 SXM5 80GB", "--stack", "MosaicML", "--gpus", "8",
                 "--mbs", "1", "--gbs", "16", "--seq-length", "65536", "--recompute", "yes", "--json")
    canonical = run("--model", "mpt-7b", "--hardware", "h100-sxm", "--stack", "composer", "--gpus", "8",
                    "--mbs", "1", "--gbs", "16", "--seq-length", "65536", "--recompute", "full", "--json")
    assert source.returncode == 0 and canonical.returncode == 0, source.stderr
    assert json.loads(source.stdout) == json.loads(canonical.stdout)
    assert json.loads(source.stdout)["layout"]["recompute"] == "full"


@pytest.mark.parametrize(("typed", "precision"), [
    ("FP8", "fp8"), ("BF16", "bf16"), ("bf16-mixed", "bf16"), ("amp_bf16", "bf16"), ("16-mixed", "fp16"),
    ("amp_fp8", "fp8"), ("Bf16-True", "bf16-true"), ("pure bf16", "bf16-true"), ("true-bf16", "bf16-true"),
    ("e4m3", "fp8"), ("hybrid", "fp8")])
def test_precision_as_trainers_and_papers_spell_it(typed, precision):
    from flopwise.plan.planner import build_runspec

    assert build_runspec(precision=typed).workload.precision == precision


@pytest.mark.parametrize(("typed", "recipe"), [
    ("Row-wise", "rowwise"), ("current scaling", "tensorwise"), ("MXFP8", "mxfp8"), ("delayed scaling", "delayed"),
    ("Tensor-wise", "tensorwise"), ("hybrid", "delayed"),
    # NeMo's performance scripts (--fp8_recipe ds|cs|mxfp8|ss) and Transformer Engine's recipe classes
    ("ds", "delayed"), ("cs", "tensorwise"), ("ss", "blockwise"), ("Float8CurrentScaling", "tensorwise"),
    ("DelayedScaling", "delayed"), ("Float8BlockScaling", "blockwise"), ("MXFP8BlockScaling", "mxfp8"),
    ("per-tensor delayed", "delayed"), ("sub-channel", "blockwise")])
def test_fp8_recipe_as_sources_spell_it(typed, recipe):
    from flopwise.plan.planner import build_runspec

    assert build_runspec(precision="fp8", fp8_recipe=typed).cluster.extra["fp8_recipe"] == recipe


@pytest.mark.parametrize(("typed", "recipe"), [
    ("FP8-CS", "tensorwise"), ("fp8 (DS)", "delayed"), ("MXFP8", "mxfp8"), ("fp8_blockwise", "blockwise"),
    ("FP8-MX", "mxfp8"), ("fp8", None), ("fp8-mixed", None)])
def test_a_precision_that_names_its_fp8_recipe_plans_fp8_with_it(typed, recipe):
    """NVIDIA's tables print the recipe in the precision column ("FP8-CS", "MXFP8"): fp8 with that
    recipe, unless --fp8-recipe says otherwise; "fp8" alone keeps the stack's recipe."""
    from flopwise.plan.planner import build_runspec

    spec = build_runspec(precision=typed, stack="nemo")
    assert spec.workload.precision == "fp8"
    assert spec.cluster.extra["fp8_recipe"] == (recipe or "delayed")  # megatron-core's default: delayed
    assert build_runspec(precision=typed, fp8_recipe="rowwise").cluster.extra["fp8_recipe"] == "rowwise"


@pytest.mark.parametrize(("typed", "policy"), [("yes", "full"), ("ckpt", "full"), ("off", "none"),
                                              ("core_attn", "selective"), ("Selective", "selective")])
def test_recompute_as_sources_name_it(typed, policy):
    """llm-foundry's "activation checkpointing: yes" and Megatron-Core's --recompute-modules core_attn
    (the attention core alone: Korthikanti et al.'s selective recompute) plan as the policy they are."""
    from flopwise.plan.planner import build_runspec

    assert build_runspec(model="llama3-8b", stack="nemo", recompute=typed).layout.recompute == policy


def test_an_unknown_precision_still_names_the_choices():
    bad = run("--precision", "fp9", "--json")
    assert bad.returncode == 2
    assert bad.stderr.strip() == "error: --precision 'fp9' is not one of fp32, tf32, bf16, fp16, fp8, bf16-true"


def test_choices_in_any_case_plan_as_the_lower_case_ones():
    from flopwise.plan.planner import build_runspec

    typed = build_runspec(pp=2, schedule="Interleaved", optimizer="AdamW", framework="Megatron")
    plain = build_runspec(pp=2, schedule="interleaved", optimizer="adamw", framework="megatron")
    assert typed == plain and typed.layout.pipeline_schedule == "interleaved"
    lora = build_runspec(finetune="LoRA", lora_targets="QKVO")
    assert lora == build_runspec(finetune="lora", lora_targets="qkvo")
    assert build_runspec(optimizer="adam").workload.optimizer == "adamw"  # the same states and step
