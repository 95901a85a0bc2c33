"""`flopwise eval` on an HF folder: perplexity that matches the model's own loss, a local lm-eval task, one-line errors."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from flopwise.cli import main
from tests.hf_fixtures import corpus_lines, write_jsonl, write_pretrained


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    return write_pretrained(tmp_path_factory.mktemp("tiny-llama"))


def _invoke(capsys, *args) -> tuple[int, str]:
    """(exit code, stdout + stderr) of `flopwise ARGS` through the real entry point."""
    try:
        main(list(args))
        code = 0
    except SystemExit as exit_info:
        code = exit_info.code or 0
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_perplexity_is_the_exponential_of_the_models_own_loss(tmp_path, pretrained, capsys):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    data = write_jsonl(tmp_path / "val.jsonl", n=6)
    out = tmp_path / "eval.json"
    code, output = _invoke(capsys, "eval", str(pretrained), "--data", str(data), "--seq-len", "4096", "--out", str(out))
    assert code == 0, output
    written = json.loads(out.read_text())["perplexity"]

    tokenizer = AutoTokenizer.from_pretrained(str(pretrained))
    model = AutoModelForCausalLM.from_pretrained(str(pretrained)).eval()
    ids = []
    for line in corpus_lines(6):
        ids += tokenizer(line, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    with torch.no_grad():
        loss = model(input_ids=torch.tensor([ids]), labels=torch.tensor([ids])).loss
    assert written["tokens"] == len(ids) - 1
    assert written["perplexity"] == pytest.approx(math.exp(float(loss)), rel=1e-4)
    assert written["perplexity"] > 10  # an untrained model is far from certain


def test_eval_errors_are_one_line(tmp_path, pretrained, capsys):
    code, output = _invoke(capsys, "eval", str(tmp_path / "nowhere"), "--data", "x.txt")
    assert code != 0 and output.strip().splitlines() == [f"error: eval: {tmp_path / 'nowhere'} does not exist"]
    code, output = _invoke(capsys, "eval", str(pretrained))
    assert code != 0 and "nothing to do" in output and len(output.strip().splitlines()) == 1
    code, output = _invoke(capsys, "eval", str(pretrained), "--data", str(tmp_path / "no.jsonl"))
    assert code != 0 and output.strip().splitlines() == [f"error: eval --data: {tmp_path / 'no.jsonl'} does not exist"]


TASK_YAML = """task: flopwise_local_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""


def write_choice_task(folder: Path) -> Path:
    """A 6-question two-choice JSONL and the lm-eval task `flopwise_local_choice` over it, in `folder`;
    returns the folder to pass as `--include`."""
    data = folder / "choice.jsonl"
    data.write_text("".join(json.dumps({"question": f"how many apples {i}", "choices": ["pears", "apples"],
                                         "answer": i % 2}) + "\n" for i in range(6)))
    tasks = folder / "tasks"
    tasks.mkdir()
    (tasks / "local.yaml").write_text(TASK_YAML.format(data=data))
    return tasks


@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm-eval (extra `eval`) is not installed")
def test_local_lm_eval_task_runs_offline(tmp_path, pretrained, monkeypatch, capsys):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tasks = write_choice_task(tmp_path)
    code, output = _invoke(capsys, "eval", str(pretrained), "--tasks", "flopwise_local_choice", "--include", str(tasks))
    assert code == 0, output
    scores = json.loads((pretrained / "eval.json").read_text())["tasks"]["flopwise_local_choice"]
    assert 0.0 <= scores["acc,none"] <= 1.0


@pytest.mark.slow  # an unknown name is looked up among the harness's built-in tasks too (minutes on a small CPU)
@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm-eval (extra `eval`) is not installed")
def test_unknown_task_is_one_line(tmp_path, pretrained, capsys):
    code, output = _invoke(capsys, "eval", str(pretrained), "--tasks", "no_such_task", "--include", str(tmp_path))
    assert code != 0 and output.strip().splitlines() == [
        f"error: eval --tasks: no task named 'no_such_task' in lm-eval or in {tmp_path}"]
