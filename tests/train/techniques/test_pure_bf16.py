"""`precision.mode=bf16-true`: a real run holds parameters, gradients and AdamW states in bf16
(no fp32 copy anywhere), prints the trade-off once, and its loss falls."""

from __future__ import annotations

import pytest
import torch

from flopwise.config.loading import load_config
from flopwise.config.precision import precision_of
from flopwise.errors import UserError
from flopwise.train.data.prepare import prepare_data
from flopwise.train.loop import build_state, run_training
from flopwise.train.parallel.distributed import init_distributed
from flopwise.train.step import train_step
from flopwise.train.techniques.precision import PURE_BF16_TRADE_OFF, fsdp_mixed_precision_policy
from tests.train.test_loop import corpus, tiny_cfg  # noqa: F401


def test_bf16_true_is_pure_and_needs_no_fsdp():
    p = precision_of("bf16-true")
    assert (p.compute_dtype, p.param_dtype, p.master_dtype, p.loss_scaling, p.pure) == (
        "bf16", "bf16", "bf16", False, True)
    assert not precision_of("bf16-params").pure
    assert fsdp_mixed_precision_policy(precision_of("bf16-true")) is None  # the parameters are bf16 already
    load_config(None, ["precision.mode=bf16-true", "parallel.strategy=ddp"])  # allowed beyond FSDP2
    with pytest.raises(UserError, match="needs parallel.strategy=fsdp"):
        load_config(None, ["precision.mode=bf16-params", "parallel.strategy=ddp"])


def test_parameters_gradients_and_optimizer_states_are_bf16(corpus, tmp_path):  # noqa: F811
    cfg = tiny_cfg(corpus, tmp_path, "precision.mode=bf16-true", "training.max_steps=2")
    env = init_distributed(cfg.parallel)
    state = build_state(cfg, env, prepare_data(cfg.data))
    train_step(state, env, 1, None)
    params = list(state.built.module.parameters())
    assert params and all(p.dtype == torch.bfloat16 for p in params)
    for p in params:
        for value in state.optimizer.state[p].values():
            if value.dim() > 0:
                assert value.dtype == torch.bfloat16
    assert PURE_BF16_TRADE_OFF in state.built.notes


def test_a_pure_bf16_run_lowers_the_loss(corpus, tmp_path, capsys):  # noqa: F811
    cfg = tiny_cfg(corpus, tmp_path, "precision.mode=bf16-true", "training.max_steps=20", "training.lr=1e-2",
                   "training.min_lr=1e-3")
    result = run_training(cfg, init_distributed(cfg.parallel))
    assert sum(result.train_losses[-3:]) / 3 < sum(result.train_losses[:3]) / 3 - 0.3, result.train_losses
    assert capsys.readouterr().out.count("precision bf16-true:") == 1


def test_a_pretrained_run_takes_bf16_only_where_the_device_has_it(tmp_path):
    from flopwise.train.techniques.precision import pretrained_precision_default

    (tmp_path / "config.json").write_text('{"model_type": "llama", "max_position_embeddings": 256}')
    cfg = load_config(None, ["model.kind=hf", f"model.pretrained={tmp_path}"])
    assert pretrained_precision_default(cfg, torch.device("cpu")) is None and cfg.precision.mode == "fp32"
    given = load_config(None, ["model.kind=hf", f"model.pretrained={tmp_path}", "precision.mode=fp16"])
    assert pretrained_precision_default(given, torch.device("cuda")) is None  # given: never replaced
    assert given.precision.mode == "fp16"
