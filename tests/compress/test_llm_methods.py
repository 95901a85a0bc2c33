"""LLM compression methods: the registry, HF folders transformers loads, and honest timing words."""

from __future__ import annotations

import json

import pytest
import torch

from flopwise.compress.config import parse_compress_config
from flopwise.compress.llm_timing import Timing, speedup_text, time_call
from flopwise.compress.methods import LLM_METHODS, get_method, registry
from flopwise.errors import UserError
from tests.hf_fixtures import write_pretrained


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    return write_pretrained(tmp_path_factory.mktemp("llm") / "model")


def test_registry_holds_the_llm_methods_by_name():
    assert tuple(name for name, method in registry().items() if method.flow == "llm") == LLM_METHODS
    assert LLM_METHODS == ("int8-weight-only", "int4-weight-only", "w8a8-dynamic")
    with pytest.raises(UserError, match="not a compression method"):
        get_method("int3")


def test_llm_methods_do_not_apply_to_the_digits_tasks():
    with pytest.raises(UserError, match="compresses a trained causal LM"):
        parse_compress_config({"method": "int8-weight-only", "task": "digits-cnn"})


@pytest.mark.parametrize("method", LLM_METHODS)
def test_each_method_writes_a_folder_transformers_loads_and_generates_from(pretrained, tmp_path, method):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from flopwise.compress.llm import quantize_folder

    out = quantize_folder(pretrained, tmp_path / method, get_method(method).torchao_config("cpu"))
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "torchao"
    assert (out / "tokenizer.json").is_file()
    with safe_open(str(out / "model.safetensors"), framework="pt") as handle:
        assert handle.metadata()  # torchao's tensor-subclass description, read without unpickling
    float_model = AutoModelForCausalLM.from_pretrained(str(pretrained)).eval()
    model = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    weight = model.model.layers[0].mlp.up_proj.weight
    assert type(weight).__name__ != "Parameter" or type(weight.data).__name__ != "Tensor"
    ids = torch.randint(1, 384, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, reference = model(input_ids=ids).logits, float_model(input_ids=ids).logits
    bound = 0.15 if method.startswith("int4") else 0.05  # of the largest logit: 4-bit weights err more
    assert (ours - reference).abs().max() < bound * reference.abs().max()
    assert model.generate(ids, max_new_tokens=4, do_sample=False).shape[1] == 20


def test_speedup_is_claimed_only_when_interquartile_ranges_are_apart():
    slow = Timing(median_s=1.0, q1_s=0.95, q3_s=1.05, blocks=5, threads=1)
    fast = Timing(median_s=0.5, q1_s=0.48, q3_s=0.52, blocks=5, threads=1)
    overlapping = Timing(median_s=0.9, q1_s=0.8, q3_s=0.97, blocks=5, threads=1)
    ratio, words = speedup_text(slow, fast)
    assert ratio == pytest.approx(2.0) and "2.00x faster" in words
    ratio, words = speedup_text(slow, overlapping)
    assert ratio is None and "no measurable difference" in words


def test_time_call_reports_median_and_quartiles_at_the_pinned_thread_count():
    timing = time_call(lambda: torch.ones(64, 64) @ torch.ones(64, 64), threads=1, min_run_time=0.05)
    assert timing.blocks >= 5 and timing.threads == 1
    assert timing.q1_s <= timing.median_s <= timing.q3_s
