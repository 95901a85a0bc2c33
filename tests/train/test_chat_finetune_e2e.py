"""The small team's fine-tune end to end, offline on CPU, through the CLI a user types: a small pretrained
llama with its tokenizer -> QLoRA (NF4 base, FSDP2 on 2 processes) on packed chat rows with loss on the
answers only -> killed with SIGKILL after a published checkpoint, and the same command continues bit for
bit -> `flopwise eval` (perplexity and a local lm-eval task) -> a merged export that transformers loads and
an adapter export that PEFT loads, agreeing on the logits -> `compress --method int4-weight-only` ->
`generate` from the run and from the compressed folder."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
import torch

from tests.artifacts.test_export_lora import cli
from tests.evaluate.test_eval import write_choice_task
from tests.hf_fixtures import export_logits
from tests.torchrun_runs import assert_killed_run_continues_bit_for_bit, rank_mean_losses, run_to_end
from tests.train.checkpoint.test_policy import write
from tests.train.test_chat_training_distributed import STEPS, config, folders  # noqa: F401 (fixture)

pytest.importorskip("peft")
pytest.importorskip("torchao")
pytest.importorskip("psutil")


def qlora_config(folders, run_dir, **checkpoint) -> dict:  # noqa: F811
    cfg = config(folders, run_dir, **checkpoint)
    cfg["parallel"]["strategy"] = "fsdp"
    cfg["finetune"]["method"] = "qlora"
    return cfg


@pytest.mark.slow
@pytest.mark.distributed
def test_qlora_chat_fine_tune_resumes_then_evaluates_exports_compresses_and_generates(folders, tmp_path,  # noqa: F811
                                                                                     monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ref_dir = tmp_path / "ref" / "run"
    out = run_to_end(write(qlora_config(folders, ref_dir), ref_dir.parent / "config.yaml"), timeout=900)
    assert "stored in NF4" in out and "(loss_on assistant)" in out
    steps = rank_mean_losses(ref_dir)  # each rank logs its share
    assert steps[-1] < steps[0], steps

    run_dir = tmp_path / "killed" / "run"
    path = write(qlora_config(folders, run_dir, every_steps=2), run_dir.parent / "config.yaml")
    assert_killed_run_continues_bit_for_bit(path, run_dir, ref_dir, STEPS, kill_after=5)

    # eval on the run (exported on first use): perplexity on local text, and a local lm-eval task
    text = tmp_path / "held_out.txt"
    text.write_text("the cat sat on the mat and the dog ran to the park\n" * 20)
    done = cli("eval", str(run_dir), "--data", str(text), "--seq-len", "64", "--out", str(tmp_path / "ppl.json"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    perplexity = json.loads((tmp_path / "ppl.json").read_text())
    assert "perplexity" in json.dumps(perplexity)
    if importlib.util.find_spec("lm_eval") is not None:
        tasks = write_choice_task(tmp_path)
        done = cli("eval", str(run_dir), "--tasks", "flopwise_local_choice", "--include", str(tasks),
                   "--out", str(tmp_path / "tasks.json"))
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        scores = json.loads((tmp_path / "tasks.json").read_text())["tasks"]["flopwise_local_choice"]
        assert 0.0 <= scores["acc,none"] <= 1.0

    # merged (transformers) and adapter-only (PEFT) exports of the resumed run agree, and differ from the base
    ids = torch.arange(1, 33).view(1, 32)
    base_logits, merged_logits, adapted_logits = export_logits(run_dir, tmp_path, folders / "pretrained", ids)
    assert torch.isfinite(merged_logits).all()
    torch.testing.assert_close(merged_logits, adapted_logits, atol=1e-3, rtol=1e-3)
    assert not torch.allclose(merged_logits, base_logits, atol=1e-3)  # the adapters were trained

    # int4 weight-only compression of the trained model, then generation from the run and from the compressed folder
    done = cli("compress", str(run_dir), "--method", "int4-weight-only")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    compressed = run_dir / "compressed" / "int4-weight-only"
    assert compressed.is_dir(), done.stdout[-2000:]
    for target in (run_dir, compressed):
        done = cli("generate", str(target), "--prompt", "alpha", "--max-new-tokens", "8", "--temperature", "0")
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert done.stdout.strip(), "generate printed nothing"
    assert math.isfinite(steps[-1])
