"""`flopwise generate`: seeded sampling and greedy decoding from an HF folder, and its errors."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from flopwise.errors import UserError
from flopwise.artifacts.generate import Sampling, generate_text, load_for_generation, resolve_hf_folder
from tests.hf_fixtures import write_pretrained


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_pretrained(tmp_path_factory.mktemp("gen") / "model")


def test_same_seed_same_text_and_greedy_is_deterministic(folder):
    model, tokenizer = load_for_generation(folder)
    a = generate_text(model, tokenizer, "the model", Sampling(max_new_tokens=10, seed=7))
    b = generate_text(model, tokenizer, "the model", Sampling(max_new_tokens=10, seed=7))
    assert a.text == b.text and a.text.startswith("the model") and a.new_tokens == 10
    greedy = [generate_text(model, tokenizer, "the model", Sampling(max_new_tokens=10, temperature=0, seed=s)).text
              for s in (1, 2)]
    assert greedy[0] == greedy[1]


def test_bad_sampling_options_are_one_line_errors(folder):
    model, tokenizer = load_for_generation(folder)
    with pytest.raises(UserError, match="--top-p"):
        generate_text(model, tokenizer, "x", Sampling(top_p=1.5))
    with pytest.raises(UserError, match="--max-new-tokens"):
        generate_text(model, tokenizer, "x", Sampling(max_new_tokens=0))
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(UserError, match="--temperature"):
            generate_text(model, tokenizer, "x", Sampling(temperature=bad))
    with pytest.raises(UserError, match="--top-p"):
        generate_text(model, tokenizer, "x", Sampling(top_p=float("nan")))


def test_a_folder_that_is_neither_model_nor_run_is_refused(tmp_path):
    with pytest.raises(UserError, match="neither an HF folder"):
        resolve_hf_folder(tmp_path)


def test_cli_prints_text_and_speed(folder, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", "flopwise", "generate", str(folder), "--prompt", "the model",
                          "--max-new-tokens", "5", "--temperature", "0"], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("the model") and "tokens/s, KV cache" in out.stdout
    assert "Failed to load" not in out.stderr
    missing = subprocess.run([sys.executable, "-m", "flopwise", "generate", str(tmp_path), "--prompt", "x"],
                             capture_output=True, text=True, env=env, timeout=300)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "neither an HF folder" in missing.stderr
