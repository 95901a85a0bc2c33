"""Consolidate a sharded checkpoint into one `model.safetensors` for inference and `flopwise compress`.

`flopwise export RUN_DIR [--step N] [--out DIR]` writes, by default into `RUN_DIR/export/`:

    model.safetensors   every model tensor, full (unsharded), keyed like `build_model(...)`'s state_dict
    config.yaml         the run's resolved config (to rebuild the model)
    hf/                 config.json + model.safetensors + tokenizer files, loadable with
                        `AutoModelForCausalLM.from_pretrained(path)` / `AutoTokenizer.from_pretrained(path)`
                        (every model kind: see `artifacts/export_hf.py`)

The checkpoint is verified first (sha256), and only the model part of the DCP checkpoint is
read (the optimizer state is never loaded). DCP reassembles the shards of any world size
into the plain tensors of a freshly built model on the CPU, in this process alone. A DeepSpeed
checkpoint (any ZeRO stage) is merged by DeepSpeed's own `zero_to_fp32`, reading weights-only
(`checkpoint/deepspeed_state.py`); the export holds its fp32 master weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from flopwise.errors import UserError
from flopwise.runrecord.run_dir import RunDir


@dataclass
class ExportResult:
    """Where the export went and what it holds."""

    checkpoint: Path
    out: Path
    step: int
    tensors: int
    parameters: int
    hf_folder: Path | None = None
    adapter_folder: Path | None = None


def export_checkpoint(run_dir: Path, step: int | None = None, out: Path | None = None, *,
                      adapter: bool = False, trust_remote_code: bool = False,
                      accept_run: bool = False) -> ExportResult:
    """Export the latest valid checkpoint of `run_dir` (or step `step`) as safetensors into `out`;
    a LoRA/QLoRA run's adapters merged into its base, or with `adapter` only them in PEFT's format
    (`artifacts/export_lora.py`).

    The manifest must carry this user's signature unless `accept_run`; the model is rebuilt
    from its config with remote code only when `trust_remote_code` (the command line's flag).
    """
    from safetensors.torch import save_file

    # torch loads only when an export runs, not when the CLI starts
    from flopwise.train.checkpoint.store import latest_valid, read_manifest, resolve_checkpoint
    from flopwise.config.loading import dump_config
    from flopwise.config.signature import check_manifest, manifest_config, signed_config_text
    from flopwise.hf_logging import quiet_hf_libraries
    from flopwise.safe_write import make_folder, write_file
    from flopwise.train.model import build_model

    quiet_hf_libraries()
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such run directory")
    if step is not None:
        path = resolve_checkpoint(run_dir, step, what="--step")
    else:
        path = latest_valid(run_dir, report=lambda line: print(line, flush=True))
        if path is None:
            raise UserError(
                f"{run_dir}: no valid checkpoint under {RunDir(run_dir).checkpoints} "
                "(train with checkpoint.at_end=true or checkpoint.every_steps=N)"
            )
    manifest = read_manifest(path)
    check_manifest(path / "manifest.json", manifest, accept_run=accept_run)
    cfg = manifest_config(path / "manifest.json", manifest, trust_remote_code=trust_remote_code)
    out = Path(out) if out is not None else RunDir(run_dir).export
    adapters = cfg.finetune is not None and cfg.finetune.adapters
    if adapter and not adapters:
        raise UserError(f"--adapter: {run_dir} trained every weight (no finetune.method lora or qlora); "
                        "it has no adapter to export")
    if adapters:  # LoRA/QLoRA: the base from model.pretrained, the adapters from the checkpoint
        from flopwise.artifacts.export_lora import adapted_model, merge_adapters, write_adapter

        model, peft_model = adapted_model(cfg, int(manifest["vocab_size"]), path)
        if adapter:
            trained = [p for name, p in peft_model.named_parameters() if "lora_" in name]
            return ExportResult(checkpoint=path, out=out, step=int(manifest["step"]), tensors=len(trained),
                                parameters=sum(p.numel() for p in trained),
                                adapter_folder=write_adapter(peft_model, make_folder(out) / "adapter"))
        model = merge_adapters(model, peft_model)
    else:
        model = build_model(cfg.model, int(manifest["vocab_size"]))
        load_model_state(model, manifest, path)

    out = make_folder(out)  # one line when it cannot be one
    tensors = _unshared(model.state_dict())
    metadata = {"format": "pt", "step": str(manifest["step"]), "checkpoint": str(path),
                "tokens_seen": str(manifest.get("tokens_seen", ""))}
    tmp = out / ".model.safetensors.tmp"
    try:
        save_file(tensors, str(tmp), metadata=metadata)
        tmp.replace(out / "model.safetensors")
    except OSError as err:
        raise UserError(f"{out / 'model.safetensors'}: cannot write the export ({err.strerror or err})") from None
    config_text = signed_config_text(dump_config(cfg))
    write_file(out / "config.yaml", config_text)  # an export's own copy, beside its weights
    if not RunDir(run_dir).config.exists():
        RunDir(run_dir).write_config(config_text)
    from flopwise.artifacts.export_hf import write_hf_folder

    hf_folder = write_hf_folder(model, cfg, run_tokenizer(run_dir, cfg), out / "hf")
    return ExportResult(
        checkpoint=path, out=out, step=int(manifest["step"]), tensors=len(tensors),
        parameters=sum(p.numel() for p in model.parameters()), hf_folder=hf_folder,
    )


def load_model_state(model, manifest: dict, path: Path) -> None:
    """Fill a freshly built `model` from checkpoint `path` (DCP, or DeepSpeed's merged partitions)."""
    from flopwise.train.checkpoint.safe_read import LOAD_ERRORS, safe_dcp_load
    from flopwise.train.checkpoint.store import quiet_single_process_notice

    if manifest.get("state_format", "dcp") == "deepspeed":  # the engine's own files, ZeRO partitions merged
        from flopwise.train.checkpoint.deepspeed_state import consolidated_fp32_state

        load_deepspeed_state(model, consolidated_fp32_state(path), path)
        return
    state = model.state_dict()
    try:
        with quiet_single_process_notice():
            safe_dcp_load({"model": state}, path)
    except UserError:
        raise
    except LOAD_ERRORS as exc:
        raise UserError(f"checkpoint {path} does not fit the model in its manifest: "
                        f"{str(exc).splitlines()[0][:160]}") from None
    model.load_state_dict(state)


def load_deepspeed_state(model, state: dict, path: Path) -> None:
    """Load DeepSpeed's merged fp32 state; every parameter must be there (buffers the model rebuilds may not)."""
    expected = dict(model.named_parameters(remove_duplicate=False))
    missing = sorted(name for name in expected if name not in state and not _tied_to_present(model, name, state))
    unknown = sorted(name for name in state if name not in model.state_dict())
    if missing or unknown:
        raise UserError(f"checkpoint {path} does not fit the model in its manifest: "
                        f"missing {missing[:3]}, unexpected {unknown[:3]}")
    model.load_state_dict(state, strict=False)


def _tied_to_present(model, name: str, state: dict) -> bool:
    """A tied weight (e.g. the head sharing the embedding) is stored once by DeepSpeed under one of its names."""
    tensor = dict(model.named_parameters(remove_duplicate=False))[name]
    return any(other in state for other, p in model.named_parameters(remove_duplicate=False) if p is tensor)


def _unshared(state: dict) -> dict:
    """safetensors refuses tensors that share memory (tied embeddings): give each its own copy."""
    seen = set()
    result = {}
    for name, tensor in state.items():
        tensor = tensor.detach().cpu()
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        result[name] = tensor.clone().contiguous() if key in seen else tensor.contiguous()
        seen.add(key)
    return result


def run_tokenizer(run_dir: Path, cfg) -> Path | None:
    """The tokenizer.json the run trained with: the copy in the run directory, else `data.tokenizer`."""
    copy = RunDir(run_dir).tokenizer
    if copy.is_file():
        return copy
    return Path(cfg.data.tokenizer) if cfg.data.tokenizer is not None else None
