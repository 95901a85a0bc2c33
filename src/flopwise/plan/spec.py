"""RunSpec: the one description of a training job that the planner and the trainer share.

Model numbers + layout + hardware + workload. Frozen plain data; no torch, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flopwise.catalog.hardware import HardwareSpec
from flopwise.catalog.models import ModelSpec

PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8", "bf16-true")
"""`bf16-true`: pure bf16 (no fp32 master copy, bf16 optimizer states; plan/memory.py `state_bytes`)."""
OPTIMIZERS = ("adamw", "sgd", "adam8bit")
RECOMPUTE = ("none", "selective", "full")
"""Policies the layout search tries; `op` and `every:K` are accepted too (plan/memory.py)."""
FRAMEWORKS = ("fsdp", "megatron", "deepspeed")
OFFLOAD = ("none", "optimizer", "params")
SCHEDULES = ("1f1b", "gpipe", "interleaved")
INTERLEAVED_VARIANTS = ("1f1b", "looped-bfs", "zero-bubble")
"""How an interleaved pipeline orders its work: depth-first 1F1B (Narayanan et al. 2021),
breadth-first looped BFS (Lamy-Poirier 2023) or 1F1B with the backward split into input and
weight gradients (zero bubble, Qi et al. 2024). Same bubble model, different memory."""


@dataclass(frozen=True)
class Layout:
    """How the job is split over devices.

    dp * tp * pp devices in all. `zero_stage` shards over the data-parallel group:
    0 none, 1 optimizer states, 2 + gradients, 3 + parameters (FSDP FULL_SHARD is 3,
    SHARD_GRAD_OP is 2). `grad_accum` micro-steps of `micro_batch_size` sequences per
    data-parallel rank make one optimizer step.
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    micro_batch_size: int = 1
    grad_accum: int = 1
    zero_stage: int = 0
    sequence_parallel: bool = False
    recompute: str = "none"
    offload: str = "none"
    pipeline_schedule: str = "1f1b"
    virtual_stages: int = 1
    interleaved_variant: str = "1f1b"  # INTERLEAVED_VARIANTS; only read when pipeline_schedule is interleaved
    flash_attention: bool = True
    # torch.compile (inductor): the partitioner saves a norm's input, not its output, and SwiGLU's two
    # projections, not the SiLU output (tests/plan/test_memory.py measures it): the fused conventions
    compiled: bool = False
    tp_comm_overlap: bool = False  # TP collectives chunked behind the GEMMs (Transformer Engine userbuffers)
    framework: str = "fsdp"
    # FSDP2 units of consecutive blocks up to this many MiB of parameters (plan/fsdp_units.py); 0 = one per block
    fsdp_unit_mb: float = 0.0
    dp_replicate: int = 1  # HSDP (Zhao et al. 2023, PyTorch FSDP §3.2.1): ZeRO shards within dp / dp_replicate
    # FSDP reduce-scatters on every accumulation micro-step (flopwise `parallel.fsdp_grad_sync=every_micro_step`)
    # rather than on the last one only: no unsharded gradients held, a reduce-scatter per micro-step
    fsdp_sync_every_micro_step: bool = False
    # context parallelism: each sequence split over cp ranks, K/V passed round a ring (Megatron-Core
    # `--context-parallel-size`, torchtitan `context_parallel_degree`); the cp ranks of a replica hold
    # the same weights, so gradients reduce and ZeRO shards over dp x cp
    cp: int = 1
    # expert parallelism (MoE): each rank of an ep group holds E/ep of every block's routed experts and
    # tokens reach them by all-to-all (Megatron-Core `--expert-model-parallel-size`); the ep ranks are
    # data-parallel ranks for everything else, so ep divides dp x cp and the experts' gradients reduce
    # and ZeRO shards over dp x cp / ep
    ep: int = 1
    # expert tensor parallelism: the routed experts' own tensor-parallel width (Megatron-Core
    # `--expert-tensor-parallel-size`, 0 = tp, its default). Below tp the experts "fold" (Megatron-
    # Core's MoE parallel folding, the layout NeMo's MoE recipes run with etp 1): a rank holds whole
    # experts, the ep group spans the tensor-parallel ranks too, so ep x etp divides dp x cp x tp
    etp: int = 0
    # how MoE tokens reach their experts (plan/expert_comm.py): Megatron-Core's all-to-all dispatcher or DeepEP
    # (its flex dispatcher, `moe_enable_deepep`); and whether the shared expert runs beside the dispatch and
    # combine (Megatron-Core `moe_shared_expert_overlap`)
    moe_dispatcher: str = "alltoall"
    moe_shared_expert_overlap: bool = False
    # activation offload: the saved activations of this many blocks of each stage (every micro-batch's)
    # go to host memory in the forward and come back before their backward (Megatron-Core / Transformer
    # Engine `cpu_offloading_num_layers`, NeMo `activation_offload_layers`, Composer
    # `activation_cpu_offload`: every block); plan/activation_offload.py
    offload_activations: int = 0

    @property
    def expert_tp(self) -> int:
        """Tensor-parallel width of the routed experts: `etp`, or tp when it is not set."""
        return self.etp or self.tp

    @property
    def shard_group(self) -> int:
        """Devices one ZeRO/FSDP shard set spans: dp × cp, or that / dp_replicate under HSDP."""
        return max(1, self.dp * self.cp // self.dp_replicate)

    @property
    def expert_shard_group(self) -> int:
        """Devices holding the same experts, that reduce and ZeRO-shard their states: dp × cp / ep,
        × tp / etp when the experts fold over the tensor-parallel ranks."""
        return max(1, self.shard_group * self.tp // (self.ep * self.expert_tp))

    @property
    def gradient_group(self) -> int:
        """Devices that hold the same weights and reduce their gradients together: dp × cp."""
        return self.dp * self.cp

    @property
    def devices(self) -> int:
        """Devices in all: dp × tp × pp × cp."""
        return self.dp * self.tp * self.pp * self.cp

    @property
    def global_batch_size(self) -> int:
        """Sequences (or samples) per optimizer step."""
        return self.dp * self.micro_batch_size * self.grad_accum


@dataclass(frozen=True)
class Workload:
    """What is trained: precision, optimizer, sequence length and how many tokens in all.

    `total_tokens` (or `total_samples` for a CNN) sets the whole job's length.
    `dropout`: whether attention/residual dropout is on (its masks cost activation memory;
    GPT-3-era models used it, LLaMA-style pre-training does not).
    `finetune`: full training, or LoRA / QLoRA adapters of rank `lora_rank` on `lora_targets`
    (all-linear | qkvo) over a frozen base (plan/finetune.py); `lora_dropout` > 0 keeps a
    dropped copy of each adapted input.
    """

    precision: str = "bf16"
    optimizer: str = "adamw"
    seq_len: int = 2048
    total_tokens: float = 0.0
    total_samples: float = 0.0
    dropout: bool = False
    finetune: str = "full"
    lora_rank: int = 16
    lora_targets: str = "all-linear"
    lora_dropout: float = 0.0
    # AMP as torch.autocast runs it (HF Trainer --bf16, Lightning bf16-mixed, flopwise's plain bf16): the
    # parameters and their gradients stay fp32 and each weight is cast to 16 bits for its matmul;
    # None: as the stack trains 16-bit (`Stack.fp32_params`)
    fp32_params: bool | None = None


@dataclass(frozen=True)
class Cluster:
    """The hardware the job runs on and the assumptions for time, energy and cost.

    `efficiency` overrides the calibration table's achieved fraction of peak;
    `price_per_device_hour` overrides the catalog price; `pue` scales energy.
    `memory_reserve_gib` is kept back from the device (CUDA context); `allocator_reserve`
    is the caching allocator's slack as a fraction of allocated memory (plan/memory.py).
    """

    hardware: HardwareSpec
    devices_per_node: int = 0  # 0: the catalog's figure
    efficiency: float | None = None
    price_per_device_hour: float | None = None
    spot: bool = False
    pue: float = 1.1
    memory_reserve_gib: float = 2.0
    allocator_reserve: float = 0.10
    nodes_per_rack: int = 4
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class RunSpec:
    """A whole planned run: the spine shared by `flopwise plan` and `flopwise train`."""

    model: ModelSpec
    layout: Layout
    workload: Workload
    cluster: Cluster
    stack: str = "flopwise"  # plan/stacks: whose kernels and memory conventions are planned


def local_seq_len(spec: RunSpec) -> int:
    """Tokens of one sequence that one rank computes and keeps: a cp-th under context parallelism
    (rounded up; Megatron-Core and torchtitan need the sequence to divide by 2·cp)."""
    return -(-spec.workload.seq_len // spec.layout.cp)
