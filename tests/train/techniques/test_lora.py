"""LoRA and QLoRA on a real pretrained llama (saved by the test), one process: config errors, what is
frozen, what trains, what the optimizer and the checkpoint hold, NF4 weights, the base's dtype.
The 2-process runs (DDP, FSDP2 with kill -9 and exact resume) are in test_lora_distributed.py."""

from __future__ import annotations

import math

import pytest
import torch

from flopwise.config.loading import load_config
from flopwise.config.resolve import resolve_run
from flopwise.errors import UserError
from tests.hf_fixtures import write_jsonl, write_pretrained

pytest.importorskip("peft")
pytest.importorskip("torchao")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    write_pretrained(root / "pretrained")
    write_jsonl(root / "data.jsonl")
    return root


def overrides(folders, tmp_path, method: str, *extra: str) -> list[str]:
    return ["model.kind=hf", f"model.pretrained={folders / 'pretrained'}", f"data.hf_dataset={folders / 'data.jsonl'}",
            f"data.cache_dir={folders / 'cache'}", "data.seq_len=32", "data.prefetch=0",
            "parallel.strategy=single", "parallel.nproc_per_node=1", f"finetune.method={method}",
            "finetune.rank=4", "training.micro_batch_size=4", "training.lr=1e-2", "training.min_lr=1e-3",
            "training.warmup_steps=0", "training.eval_every=100", "training.eval_batches=1",
            f"logging.run_dir={tmp_path / 'run'}", "logging.progress=false", *extra]


# -- config ------------------------------------------------------------------------------------

def test_lora_without_a_pretrained_model_is_one_line(tmp_path):
    with pytest.raises(UserError, match=r"finetune.method: lora adapts a pretrained model; set model.pretrained"):
        load_config(None, ["finetune.method=lora"])


def test_unknown_target_and_method_are_one_line(folders, tmp_path):
    with pytest.raises(UserError, match=r"finetune.target_modules.*'attn' is not all-linear, qkvo or a list"):
        load_config(None, overrides(folders, tmp_path, "lora", "finetune.target_modules=attn"))
    with pytest.raises(UserError, match=r"finetune.method"):
        load_config(None, overrides(folders, tmp_path, "dora"))
    with pytest.raises(UserError, match=r"finetune.rank"):
        load_config(None, overrides(folders, tmp_path, "lora", "finetune.rank=0"))


def test_target_names_the_model_lacks_are_one_line_with_its_linear_names(folders):
    from transformers import AutoModelForCausalLM

    from flopwise.train.techniques.lora import check_target_modules

    hf = AutoModelForCausalLM.from_pretrained(str(folders / "pretrained"))
    check_target_modules(hf, ["q_proj", "self_attn.v_proj", "model.layers.1.mlp.down_proj"])  # as PEFT matches
    check_target_modules(hf, "all-linear")
    linears = "its linear modules: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head"
    for targets, unknown in ((["q_proj", "foo_proj"], "foo_proj"), (["foo_proj"], "foo_proj")):
        with pytest.raises(UserError, match=rf"^finetune.target_modules: LlamaForCausalLM has no linear module "
                                            rf"named {unknown}; {linears} \(the trainer adapts"):
            check_target_modules(hf, targets)
    # the planner's and torchtune's spellings: refused here, with the model's name for the same matrix
    with pytest.raises(UserError, match=r"named wq, wv; .*wq is q_proj here; wv is v_proj here\)$"):
        check_target_modules(hf, ["wq", "wv"])


def test_a_run_with_an_unknown_target_stops_before_training(folders, tmp_path):
    with pytest.raises(UserError, match=r"^finetune.target_modules: LlamaForCausalLM has no linear module named foo_proj"):
        built_state(folders, tmp_path, "lora", "finetune.target_modules=[q_proj,foo_proj]")


def test_adapters_refuse_deepspeed_and_pipeline(folders, tmp_path):
    with pytest.raises(UserError, match=r"runs under parallel.strategy single, ddp or fsdp \(got deepspeed\)"):
        load_config(None, overrides(folders, tmp_path, "qlora", "parallel.strategy=deepspeed"))


@pytest.mark.parametrize("mode", ["fp16", "fp16-params"])
def test_qlora_refuses_fp16_in_one_line(folders, tmp_path, mode):
    """torchao's NF4 base dequantises to bf16, which fp16 autocast stops on ("Unexpected floating
    ScalarType"): refused while the config loads, before any process starts."""
    with pytest.raises(UserError, match=rf"precision.mode: {mode} does not combine with finetune.method=qlora "
                                        r".*use bf16, bf16-true, bf16-params \(fsdp\) or fp32"):
        load_config(None, overrides(folders, tmp_path, "qlora", f"precision.mode={mode}", "parallel.strategy=fsdp"))
    load_config(None, overrides(folders, tmp_path, "lora", f"precision.mode={mode}", "parallel.strategy=fsdp"))


# -- one process -------------------------------------------------------------------------------

def built_state(folders, tmp_path, method: str, *extra: str):
    from flopwise.train.data.prepare import prepare_data
    from flopwise.train.loop import build_state
    from flopwise.train.parallel.distributed import init_distributed

    cfg = load_config(None, overrides(folders, tmp_path, method, *extra))
    return cfg, build_state(cfg, init_distributed(cfg.parallel), prepare_data(cfg.data))


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_only_adapters_train_and_the_optimizer_holds_only_them(folders, tmp_path, method):
    cfg, state = built_state(folders, tmp_path, method)
    named = dict(state.built.module.named_parameters())
    trainable = {name for name, p in named.items() if p.requires_grad}
    assert trainable and all("lora_A" in name or "lora_B" in name for name in trainable)
    # all-linear: 7 linears per block x 2 blocks x (A, B)
    assert len(trainable) == 2 * 7 * 2
    in_optimizer = {id(p) for group in state.optimizer.param_groups for p in group["params"]}
    assert in_optimizer == {id(named[name]) for name in trainable}
    assert all(named[name].dtype == torch.float32 for name in trainable)
    # one step moves the adapters (B starts at zero) and leaves every base weight as it was
    from flopwise.train.step import train_step
    from flopwise.train.parallel.distributed import init_distributed

    before = {name: p.detach().clone() for name, p in named.items() if type(p.data) is torch.Tensor}
    train_step(state, init_distributed(cfg.parallel), 1, None)
    for name, value in before.items():
        moved = not torch.equal(named[name].detach(), value)
        if name not in trainable:
            assert not moved, f"the frozen {name} changed"
        elif "lora_B" in name:
            assert moved, f"the adapter {name} did not train"


@pytest.mark.parametrize("mode", ["bf16", "bf16-true"])
def test_qlora_trains_under_the_bf16_modes(folders, tmp_path, mode):
    from flopwise.train.parallel.distributed import init_distributed
    from flopwise.train.step import train_step

    cfg, state = built_state(folders, tmp_path, "qlora", f"precision.mode={mode}")
    step = train_step(state, init_distributed(cfg.parallel), 1, None)
    assert math.isfinite(step.loss) and step.loss > 0


def test_qlora_stores_block_linears_in_nf4_and_lora_does_not(folders, tmp_path):
    from flopwise.train.techniques.lora import nf4_api

    NF4Tensor = nf4_api()[0]
    _, qlora = built_state(folders, tmp_path, "qlora")
    hf = qlora.built.module.hf
    q = hf.model.layers[0].self_attn.q_proj
    assert isinstance(q.base_layer.weight, NF4Tensor) and not q.base_layer.weight.requires_grad
    assert isinstance(hf.model.layers[1].mlp.down_proj.base_layer.weight, NF4Tensor)
    assert not isinstance(hf.lm_head.weight, NF4Tensor)
    _, lora = built_state(folders, tmp_path / "b", "lora")
    assert type(lora.built.module.hf.model.layers[0].self_attn.q_proj.base_layer.weight.data) is torch.Tensor


def test_qkvo_targets_only_attention_projections(folders, tmp_path):
    _, state = built_state(folders, tmp_path, "lora", "finetune.target_modules=qkvo")
    trainable = [n for n, p in state.built.module.named_parameters() if p.requires_grad]
    assert len(trainable) == 2 * 4 * 2 and not any("mlp" in name for name in trainable)


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_a_run_lowers_the_loss_and_checkpoints_only_adapters(folders, tmp_path, method, capsys):
    from flopwise.train.loop import run_training
    from flopwise.train.parallel.distributed import init_distributed

    cfg = load_config(None, overrides(folders, tmp_path, method, "training.max_steps=12",
                                      "training.gradient_checkpointing=true"))
    result = run_training(cfg, init_distributed(cfg.parallel))
    first, last = sum(result.train_losses[:3]) / 3, sum(result.train_losses[-3:]) / 3
    assert last < first - 0.05, result.train_losses
    out = capsys.readouterr().out  # the defaults the run took, with their reasons (weight decay was not given)
    assert "fine-tuning defaults for a pretrained model" in out and "training.weight_decay=0: no decay" in out
    # the checkpoint holds the adapters (and their optimizer state), not the frozen base
    from flopwise.train.checkpoint import store as ckpt

    (_, folder), = ckpt.published_steps(tmp_path / "run")
    import torch.distributed.checkpoint as dcp

    keys = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    model_keys = [k for k in keys if k.startswith("model.")]
    assert model_keys and all("lora_" in k for k in model_keys)


def test_nf4_groups_fit_each_fsdp_shard():
    from flopwise.train.techniques.lora import nf4_scaler_block

    assert nf4_scaler_block(4096 * 4096) == 256  # QLoRA's 256 constants per scale on a 7B's linears
    assert nf4_scaler_block(32 * 64) == 32  # a small weight: one group of its 32 blocks
    assert nf4_scaler_block(32 * 64, shards=2) == 16  # two shards: a group on each
    assert nf4_scaler_block(100) is None  # not a whole number of 64-weight blocks
    assert nf4_scaler_block(64 * 3, shards=2) is None


def test_a_bf16_run_reads_the_frozen_base_in_bf16_and_trains_fp32_adapters(folders, tmp_path):
    from flopwise.train.launch.machine_fit import weight_bytes_per_parameter
    from flopwise.train.parallel.distributed import init_distributed
    from flopwise.train.step import train_step

    cfg, state = built_state(folders, tmp_path, "lora", "precision.mode=bf16")
    named = dict(state.built.module.named_parameters())
    assert {p.dtype for n, p in named.items() if not p.requires_grad} == {torch.bfloat16}
    assert {p.dtype for n, p in named.items() if p.requires_grad} == {torch.float32}
    assert weight_bytes_per_parameter(cfg, resolve_run(cfg)) == 2  # the pre-launch memory bound counts 2 bytes, not 4
    fp32 = load_config(None, overrides(folders, tmp_path, "lora"))
    assert weight_bytes_per_parameter(fp32, resolve_run(fp32)) == 4
    step = train_step(state, init_distributed(cfg.parallel), 1, None)
    assert math.isfinite(step.loss) and step.loss > 0
