"""The options of `flopwise plan`, once, as plain data.

`plan/commands.py` builds the typer command from this table (help, `--help` defaults) and
`plan/fast_json.py` parses `flopwise plan --json` from it without loading typer, rich or
pydantic, which cost more than the plan itself. Every option's default is shown in `--help`:
a fixed one by typer, a derived one (None here) in its help text.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PlanOption:
    """One `flopwise plan` option: keyword name, flag, value type, default and help."""

    name: str
    flag: str
    type: type
    default: object
    help: str
    aliases: tuple[str, ...] = ()  # the short names NeMo / Megatron recipes use (mbs, gbs, vp)


OPTIONS = (
    PlanOption("model", "--model", str, None, "Catalog key (see `flopwise models`) or a config.json path. [default: llama2-7b]"),
    PlanOption("hardware", "--hardware", str, None, "Catalog key (see `flopwise hardware`). [default: h100-sxm]",
               ("--gpu",)),
    PlanOption("gpus", "--gpus", int, None, "Devices in all. [default: 8, or dp*tp*pp]", ("--num-gpus",)),
    PlanOption("dp", "--dp", int, None, "Data-parallel size. [default: gpus/(tp*pp)]"),
    PlanOption("tp", "--tp", int, None, "Tensor-parallel size. [default: 1]",
               ("--tensor-model-parallel-size", "--tensor-parallel-size")),
    PlanOption("pp", "--pp", int, None, "Pipeline-parallel stages. [default: 1]",
               ("--pipeline-model-parallel-size", "--pipeline-parallel-size")),
    PlanOption("cp", "--cp", int, None, "Context-parallel size: each sequence split over cp ranks, K/V passed "
               "round a ring (Megatron-Core --context-parallel-size). [default: 1]", ("--context-parallel-size",)),
    PlanOption("ep", "--ep", int, None, "Expert-parallel size (MoE): each rank holds E/ep of the routed experts, "
               "tokens reach them by all-to-all; divides dp x cp (Megatron-Core --expert-model-parallel-size). "
               "[default: 1]", ("--expert-model-parallel-size", "--expert-parallel-size")),
    PlanOption("etp", "--etp", int, None, "Expert tensor-parallel size (MoE): the routed experts' own tp width; "
               "below --tp the experts fold over the tensor-parallel ranks and ep x etp divides dp x cp x tp "
               "(Megatron-Core --expert-tensor-parallel-size). [default: tp, or 1 when --ep needs the "
               "tensor-parallel ranks]", ("--expert-tensor-parallel-size",)),
    PlanOption("micro_batch", "--micro-batch", int, None, "Sequences per device per micro-step. [default: 1]",
               ("--mbs", "--micro-batch-size", "--train-micro-batch-size-per-gpu", "--per-device-train-batch-size")),
    PlanOption("global_batch", "--global-batch", int, None, "Sequences per optimizer step. [default: batch-tokens / seq-len]",
               ("--gbs", "--global-batch-size", "--train-batch-size")),
    PlanOption("grad_accum", "--grad-accum", int, None,
               "Gradient-accumulation micro-steps per optimizer step (a table's GA): the global batch is dp x "
               "micro-batch x this; given with --global-batch, they must agree. [default: global batch / "
               "(dp x micro-batch)]", ("--ga", "--gradient-accumulation-steps", "--accumulate-grad-batches", "--accum")),
    PlanOption("batch_tokens", "--batch-tokens", str, None, "Tokens per optimizer step, e.g. 4M. [default: 4Mi]"),
    PlanOption("seq_len", "--seq-len", int, None, "Training sequence length. [default: the model's]",
               ("--seq", "--seq-length", "--sequence-length")),
    PlanOption("tokens", "--tokens", str, None, "Tokens (CNN: samples) to train on: 300B, 1.4T, 2e12. [default: 2T]"),
    PlanOption("precision", "--precision", str, None, "bf16|fp16|fp32|tf32|fp8|bf16-true (pure bf16: no fp32 master, bf16 AdamW states, 8 bytes/param; "
               "updates below bf16's resolution are lost); any case, and the trainers' names (bf16-mixed, amp_bf16, "
               "16-mixed); fp8 with its recipe as NVIDIA's tables print it (FP8-CS, FP8-DS, MXFP8). [default: bf16; "
               "bf16-true under --stack torchtune, and for a LoRA / QLoRA under --stack litgpt]",
               ("--compute-dtype",)),
    PlanOption("optimizer", "--optimizer", str, None, "adamw|sgd|adam8bit. [default: adamw]"),
    PlanOption("framework", "--framework", str, "fsdp",
               "Memory conventions: fsdp|megatron|deepspeed (gradient dtype, buffers, ZeRO-3 gathers)."),
    PlanOption("stack", "--stack", str, "flopwise",
               "Training software stack whose kernels and memory conventions are planned: flopwise|megatron-core"
               "(nemo, megatron-bridge)|megatron-lm|deepspeed|megatron-deepspeed|composer|torchtitan|flash-attn|torchtune|litgpt."),
    PlanOption("fp8_recipe", "--fp8-recipe", str, None,
               "fp8 scaling: delayed|tensorwise|rowwise|blockwise|mxfp8 (current = tensorwise, hybrid = delayed; NeMo ds|cs|ss; "
               "'Row-wise', 'current scaling' read the same). "
               "[default: the stack's]"),
    PlanOption("moe_dispatcher", "--moe-dispatcher", str, None,
               "MoE with --ep: how tokens reach their experts: alltoall (Megatron-Core's all-to-all, each "
               "(token, expert) copy sent apart) | deepep (DeepEP, Megatron-Core's flex dispatcher: once per "
               "destination node over RDMA, then once per rank over NVLink); any case, all-to-all and flex read "
               "the same. [default: the stack's recipes: deepep under megatron-core for a DeepSeek-family MoE "
               "(MLA + routed experts) on Ampere or Hopper, as NeMo's DeepSeek recipes run it; else alltoall]"),
    PlanOption("zero", "--zero", int, None,
               "ZeRO stage 0-3 over data parallel (FSDP FULL_SHARD = 3; Megatron's --use-distributed-optimizer, "
               "--use-torch-fsdp2, --use-megatron-fsdp and NeMo's --use_mcore_fsdp read as 1, 3, 3, 3). "
               "[default: the fastest stage the "
               "framework offers that fits, printed with the reason; 0 without data parallelism]", ("--zero-stage",)),
    PlanOption("recompute", "--recompute", str, None,
               "Activation recompute: none|selective (Megatron: attention core, its --recompute-modules core_attn; --stack torchtitan: its per-op "
               "policy, op)|op (per-op: every second "
               "matmul)|full (or yes)|every:K (full on one block in K)|blocks:F (full on a share F of the blocks)|"
               "Megatron-Core modules, as NeMo lists them (mla_up_proj/mlp/moe; also core_attn, moe_act, "
               "layernorm, shared_experts). Megatron's own --recompute-granularity/-method/-num-layers/-modules "
               "and NeMo's --recompute-layers are read too. "
               "[default: none; full for a --finetune that "
               "does not fit without it]"),
    PlanOption("grad_reduce", "--grad-reduce", str, None,
               "Data-parallel gradient reduction dtype: bf16|fp32 (Megatron's --grad-reduce-in-bf16, NeMo's "
               "grad_reduce_in_fp32=False, FSDP2's MixedPrecisionPolicy reduce_dtype); Megatron keeps its gradient "
               "buffer in it. [default: the stack's: fp32 for megatron-core bf16, flopwise, torchtitan, "
               "flash-attn; bf16 for nemo (NVIDIA's performance recipes), megatron-core fp8, composer, deepspeed]",
               ("--grad-reduce-dtype",)),
    PlanOption("fp32_params", "--fp32-params/--no-fp32-params", bool, None,
               "AMP as torch.autocast runs it (HF Trainer --bf16, Lightning bf16-mixed, flopwise's plain bf16): fp32 "
               "weights and gradients (4 + 4 bytes/param, no separate master) and a 16-bit copy of every weight "
               "saved for the backward. [default: the stack's: on for flash-attn, off elsewhere, where 16-bit "
               "weights sit beside an fp32 master]"),
    PlanOption("offload", "--offload", str, "none", "none|optimizer|params (params needs --zero 3)."),
    PlanOption("offload_activations", "--offload-activations", str, None,
               "Blocks per pipeline stage whose saved activations wait in host memory between their forward "
               "and backward (N or all; Megatron's --cpu-offloading-num-layers, NeMo's "
               "--activation-offload-layers and llm-foundry's activation_cpu_offload are read too): less device "
               "memory, host-link copies that compute may not hide. [default: 0]",
               ("--cpu-offloading-num-layers", "--activation-offload-layers")),
    PlanOption("fsdp_unit_mb", "--fsdp-unit-mb", float, 0.0,
               "FSDP2 units of consecutive blocks up to this many MiB of parameters (the trainer's "
               "parallel.fsdp_unit_mb): fewer gathers, two larger units gathered at once. 0 = one per block."),
    PlanOption("schedule", "--schedule", str, "1f1b", "Pipeline schedule: 1f1b|gpipe|interleaved."),
    PlanOption("virtual_stages", "--virtual-stages", int, None, "Interleaved: model chunks per device. [default: 2]",
               ("--vp", "--vpp", "--virtual-pipeline-model-parallel-size", "--virtual-pipeline-parallel-size")),
    PlanOption("sequence_parallel", "--sequence-parallel/--no-sequence-parallel", bool, None,
               "Megatron sequence parallelism with TP: norms, dropout and the activations between blocks "
               "split over the tp ranks. [default: on with tp > 1 for stacks whose recipes run it "
               "(megatron-core, torchtitan), else off]"),
    PlanOption("no_flash_attention", "--no-flash-attention", bool, False, "Keep the s x s attention scores (no flash attention)."),
    PlanOption("fsdp_sync_every_micro_step", "--fsdp-sync-every-micro-step", bool, False,
               "FSDP reduce-scatters every accumulation micro-step (the trainer's parallel.fsdp_grad_sync="
               "every_micro_step): only gradient shards held, a reduce-scatter per micro-step."),
    PlanOption("compiled", "--compile", bool, False,
               "The blocks run under torch.compile (flopwise training.compile): a norm keeps only its input "
               "and SwiGLU no SiLU output, as inductor's partitioner saves them."),
    PlanOption("tp_comm_overlap", "--tp-comm-overlap", bool, False,
               "Overlap TP collectives with the GEMMs (Transformer Engine userbuffers)."),
    PlanOption("dropout", "--dropout/--no-dropout", bool, None,
               "Attention and residual dropout on: its masks in activation memory, its kernels in the step. "
               "[default: the stack's: on for flash-attn (its GPT configs keep GPT2Config's 0.1), off elsewhere]"),
    PlanOption("finetune", "--finetune", str, None,
               "full|lora|qlora: fine-tune every weight of a pretrained model, or LoRA adapters on a frozen base "
               "(qlora: base in NF4). A fine-tune (full included) defaults to 1B tokens, 128Ki-token batches and "
               "the model's context capped at 2048. [default: none: training from scratch]"),
    PlanOption("lora_rank", "--lora-rank", int, None, "--finetune lora|qlora: adapter rank r. [default: 16; 32 "
               "with --stack nemo, NeMo's LoRA default; 8 with --stack torchtune or litgpt]"),
    PlanOption("lora_targets", "--lora-targets", str, None,
               "--finetune lora|qlora: all-linear (every linear of the blocks) | qkvo (attention projections) | "
               "module names as the run lists them, e.g. q_proj,v_proj (PEFT's Llama default), wq,wv, linear_qkv. "
               "[default: all-linear; the stack's own under --stack torchtune (q,v,o and the MLP) or litgpt (q,v)]"),
    PlanOption("lora_dropout", "--lora-dropout", float, None,
               "--finetune lora|qlora: adapter dropout; > 0 keeps a dropped copy of each adapted input. "
               "[default: 0; 0.05 under --stack litgpt]"),
    PlanOption("efficiency", "--efficiency", float, None, "Achieved fraction of peak (overrides calibration). [default: the calibration table]"),
    PlanOption("price_per_hour", "--price-per-hour", float, None, "USD per device-hour (overrides the catalog). [default: cheapest dated catalog price]"),
    PlanOption("pue", "--pue", float, 1.1, "Data-centre power usage effectiveness."),
    PlanOption("calibrate", "--calibrate", str, None, "Run dir whose predicted_vs_measured.json MFU becomes the efficiency. [default: none]"),
    PlanOption("memory_reserve_gib", "--memory-reserve-gib", float, 2.0, "Device memory kept back (CUDA context)."),
    PlanOption("allocator_reserve", "--allocator-reserve", float, None,
               "Caching-allocator slack as a fraction of allocated memory, added to the reported total. "
               "[default: the stack's; 0.10 for flopwise]"),
    PlanOption("nodes_per_rack", "--nodes-per-rack", int, 4, "Nodes per rack for the rack power density."),
    PlanOption("profile", "--profile", str, None,
               "A device profile (JSON) from `flopwise calibrate`: GEMM rates and bandwidths measured on the "
               "device; a CPU profile with no --hardware plans that CPU. [default: none]"),
    PlanOption("as_json", "--json", bool, False, "Print the plan as JSON (schema in docs/planner.md)."),
    PlanOption("search", "--search", bool, False, "Search every layout for --gpus devices and rank those that fit."),
    PlanOption("objective", "--objective", str, "time", "--search ranks by time|cost|energy."),
    PlanOption("top", "--top", int, 5, "--search shows this many layouts."),
    PlanOption("spot", "--spot", bool, False, "Plan spot instances: checkpoint interval, expected time and cost."),
    PlanOption("preemptions_per_day", "--preemptions-per-day", float, None, "--spot: job interruptions per day. [default: the catalog's]"),
    PlanOption("checkpoint_seconds", "--checkpoint-seconds", float, None, "--spot: seconds to write one checkpoint. [default: estimated]"),
    PlanOption("restart_seconds", "--restart-seconds", float, None, "Seconds from an interruption (a --spot preemption or a hardware failure) to training again. [default: 0 with --spot; 600 for hardware interruptions, an assumption]"),
    PlanOption("interruptions_per_device_day", "--interruptions-per-device-day", float, None, "Hardware interruptions per device per day of an on-demand job (any device stops a synchronous job); the plan adds the expected restarts and lost work beside the uninterrupted job. 0 leaves them out. [default: 4.74e-4, Llama 3 405B's 419 in 54 days on 16,384 H100]"),
    PlanOption("spot_price_per_hour", "--spot-price-per-hour", float, None, "--spot: USD per device-hour (overrides the catalog). [default: the catalog's]"),
    PlanOption("storage_gbps", "--storage-gbps", float, None, "Plan checkpoints: write bandwidth of the checkpoint storage in GB/s, all writers together; prints the save's blocking and total time (and, with --preemptions-per-day, the interval to save at). [default: not planned]"),
    PlanOption("host_copy_gbps", "--host-copy-gbps", float, 63.0, "--storage-gbps: device-to-host copy bandwidth per device in GB/s (the part of a save the run waits for). [default: PCIe 5.0 x16, 63]"),
    PlanOption("host_memory_gib", "--host-memory-gib", float, None, "--search: host RAM per node for offloaded states. [default: unchecked]"),
)
"""Every `flopwise plan` option, in `--help` order."""

RUNSPEC_OPTIONS = (
    "model", "hardware", "gpus", "dp", "tp", "pp", "micro_batch", "global_batch", "grad_accum", "batch_tokens", "seq_len",
    "tokens", "precision", "optimizer", "zero", "recompute", "offload", "schedule", "virtual_stages",
    "sequence_parallel", "dropout", "efficiency", "price_per_hour", "pue", "calibrate", "memory_reserve_gib",
    "framework", "allocator_reserve", "nodes_per_rack", "tp_comm_overlap", "finetune", "lora_rank", "lora_targets",
    "lora_dropout", "stack", "fp8_recipe", "moe_dispatcher", "fsdp_unit_mb", "compiled", "cp", "ep", "etp",
    "fsdp_sync_every_micro_step", "interruptions_per_device_day", "restart_seconds", "host_copy_gbps",
    "offload_activations", "grad_reduce", "fp32_params",
)
"""The options passed straight to `build_runspec` (flash attention is the negated flag)."""


def search_devices_and_base(values: dict) -> tuple[int, dict]:
    """A `--search`'s device count and the option values its base spec is built from: the search
    picks dp, tp, pp, ZeRO and micro-batch, so those are cleared; cp stays as asked, and a base of
    cp devices keeps the global batch exactly as given. ep stays as asked too, but a base of cp
    devices has no data-parallel ranks to hold it: it is `search_ep`, applied by the search."""
    o = dict(values)
    cp = o["cp"] or 1
    devices = o["gpus"] or ((o["dp"] * (o["tp"] or 1) * (o["pp"] or 1) * cp) if o["dp"] else 8)
    if o.get("grad_accum") is not None:
        from flopwise.errors import UserError

        raise UserError("--search chooses the micro-batch and the accumulation: give the step's --global-batch "
                        "instead of --grad-accum")
    if o.get("offload_activations") not in (None, "0", 0):
        from flopwise.errors import UserError

        raise UserError("--search does not try activation offload: plan a layout with --offload-activations "
                        "without --search")
    o.update(gpus=cp, dp=None, tp=None, pp=None, zero=None, micro_batch=None, ep=None, etp=None,
             search_ep=o.get("ep") or 1)
    return devices, o


def runspec_kwargs(values: dict) -> dict:
    """`build_runspec` keyword arguments from parsed option values."""
    kwargs = {name: values[name] for name in RUNSPEC_OPTIONS}
    kwargs["flash_attention"] = not values["no_flash_attention"]
    return kwargs


def parse_json_plan_args(argv: list[str], allow_search: bool = False, allow_tables: bool = False) -> dict | None:
    """Option values of a plain `plan --json` command line (with `allow_search`, also
    `plan --search --json`; with `allow_tables`, also a plain `plan` printing its tables), or
    None for anything else (help, spot, a malformed value), which the typer command then
    handles with its own messages."""
    by_flag = {}
    for option in OPTIONS:
        on, _, off = option.flag.partition("/")  # "--x/--no-x": a switch with a negative form
        by_flag[on] = (option, True)
        for alias in option.aliases:
            by_flag[alias] = (option, True)
        if off:
            by_flag[off] = (option, False)
    values = {option.name: option.default for option in OPTIONS}
    i = 0
    while i < len(argv):
        flag, _, inline = argv[i].partition("=")
        option, switch = by_flag.get(flag, (None, True))
        if option is None:
            return None
        if option.type is bool:
            if inline:
                return None
            values[option.name] = switch
            i += 1
            continue
        if inline:
            raw = inline
        elif i + 1 < len(argv):
            raw = argv[i + 1]
            i += 1
        else:
            return None
        try:
            values[option.name] = option.type(raw)
        except ValueError:
            return None
        i += 1
    if values["spot"] or (values["search"] and not (allow_search and values["as_json"])):
        return None
    if not values["as_json"] and not allow_tables:
        return None
    return values
