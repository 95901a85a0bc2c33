"""The HF export of every model kind: transformers' model computes the same logits as flopwise's.

Stated tolerance: fp32 logits agree within 1e-4 absolute (both compute in fp32; the
difference is summation order, e.g. rotary halves vs pairs, fused vs separate q/k/v).
"""

from __future__ import annotations

import stat
import subprocess
import sys

import pytest
import torch

from flopwise.errors import UserError
from flopwise.config.loading import load_config
from flopwise.artifacts.export_hf import permute_for_rotate_half, write_hf_folder
from flopwise.train.model import build_model
from flopwise.train.data.tokenizer import train_bpe

ATOL = 1e-4
VOCAB = 300


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_bpe([f"def f{i}(x):\n    return x + {i}\n" for i in range(300)], VOCAB).save(str(path))
    return path


def exported_logits(tmp_path, tokenizer_file, *overrides: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = load_config(None, ["model.n_layers=2", "model.hidden=64", "model.n_heads=4", "model.max_seq_len=64", "data.seq_len=32",
                             *overrides])
    torch.manual_seed(0)
    model = build_model(cfg.model, VOCAB).eval()
    folder = write_hf_folder(model, cfg, tokenizer_file, tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    ids = torch.randint(0, VOCAB, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model(ids), hf(input_ids=ids).logits, hf, tokenizer, folder


@pytest.mark.parametrize("overrides,cls", [
    ((), "LlamaForCausalLM"),
    (("model.n_kv_heads=2",), "LlamaForCausalLM"),  # grouped-query attention
    (("model.tie_embeddings=true",), "LlamaForCausalLM"),
    (("model.kind=gpt2",), "GPT2LMHeadModel"),
    (("model.kind=gpt2", "model.tie_embeddings=true"), "GPT2LMHeadModel"),
])
def test_builtin_kinds_export_to_transformers_classes_with_equal_logits(tmp_path, tokenizer_file, overrides, cls):
    ours, theirs, hf, _, _ = exported_logits(tmp_path, tokenizer_file, *overrides)
    assert type(hf).__name__ == cls
    assert ours.shape == theirs.shape
    torch.testing.assert_close(theirs, ours, atol=ATOL, rtol=0)


def test_export_writes_the_tokenizer_with_its_end_of_text_token(tmp_path, tokenizer_file):
    _, _, hf, tokenizer, folder = exported_logits(tmp_path, tokenizer_file)
    assert tokenizer.eos_token == "<|endoftext|>"
    assert hf.generation_config.eos_token_id == tokenizer.eos_token_id == 0
    text = "def f3(x):\n    return x + 3\n"
    assert tokenizer.decode(tokenizer(text).input_ids) == text
    for path in folder.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path.name


def test_rotary_permutation_moves_pairs_to_halves():
    rows = torch.arange(8).float().unsqueeze(1)  # one head of dim 8: pairs (0,1) (2,3) (4,5) (6,7)
    assert permute_for_rotate_half(rows, 1).flatten().tolist() == [0, 2, 4, 6, 1, 3, 5, 7]


def test_gpt2_with_grouped_query_attention_has_no_hf_class(tmp_path, tokenizer_file):
    with pytest.raises(UserError, match="GPT-2 has no grouped-query attention"):
        exported_logits(tmp_path, tokenizer_file, "model.kind=gpt2", "model.n_kv_heads=2")


def test_exporting_a_missing_run_is_one_line_and_creates_nothing(tmp_path):
    missing = tmp_path / "no-such-run"
    done = subprocess.run([sys.executable, "-m", "flopwise", "export", str(missing)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: {missing}: no such run directory"
    assert not missing.exists()  # the library log must not create RUN_DIR/export
