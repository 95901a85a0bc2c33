"""Megatron-LM's and NeMo's recompute and sharding flags, read into `flopwise plan` options.

A run is often stated in its launcher's own words (Megatron-LM `megatron/training/arguments.py`; NeMo
`scripts/performance/argument_parser.py` and `helpers.py` `set_recompute_configs`):

    --recompute-granularity full --recompute-method uniform [--recompute-num-layers 1]  -> --recompute full
    --recompute-granularity full --recompute-method block --recompute-num-layers N      -> --recompute block-layers:N
    --recompute-layers N (NeMo: granularity full, method block, N layers)               -> --recompute block-layers:N
    --recompute-granularity selective                                                   -> --recompute selective
    --recompute-modules mla_up_proj mlp moe (selective granularity, any separator)      -> --recompute modules:…
    --use-distributed-optimizer                                                         -> --zero 1
    --use-torch-fsdp2, --use-megatron-fsdp (--use-custom-fsdp), NeMo --use-mcore-fsdp true -> --zero 3
    --data-parallel-sharding-strategy no_shard|optim|optim_grads|optim_grads_params     -> --zero 0|1|2|3
    --sharding-strategy FULL_SHARD|SHARD_GRAD_OP|NO_SHARD (llm-foundry's fsdp_config)      -> --zero 3|2|0
    --activation-checkpointing true|false (llm-foundry's fsdp_config)                    -> --recompute full|none
    --bf16, --fp16; --fp8-format e4m3|hybrid (Transformer Engine's fp8)                  -> --precision bf16|fp16|fp8
    --activation-cpu-offload [true|false] (llm-foundry's fsdp_config, every block)        -> --offload-activations all|0
    --cpu-offloading (Megatron's switch; its blocks are --cpu-offloading-num-layers, an alias) -> dropped

NeMo's underscored spellings of any plan flag read as the dashed one (`--tensor_parallel_size`,
`--micro_batch_size`, `--compute_dtype`).

`block-layers:N` becomes the share of blocks it recomputes once the model and pipeline are known
(`planner.blocks_of_stage`). Megatron's `--recompute-modules` takes several words; they are read
up to the next flag (words with "=" stay `--config` overrides). Underscored spellings
(`--recompute_modules`, as NeMo's scripts take them) read the same.
"""

from __future__ import annotations

from flopwise.errors import UserError

RECOMPUTE_FLAGS = ("--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--recompute-modules",
                   "--recompute-layers", "--activation-checkpointing", "--fsdp-config-activation-checkpointing")
SHARDING_FLAGS = ("--use-mcore-fsdp", "--data-parallel-sharding-strategy", "--sharding-strategy",
                  "--fsdp-config-shard-strategy")
"""Flags that take a value."""
SHARDING_SWITCHES = {"--use-distributed-optimizer": 1, "--use-torch-fsdp2": 3, "--use-megatron-fsdp": 3,
                     "--use-custom-fsdp": 3}
"""Flags without a value and the ZeRO stage each means."""
SHARDING_STRATEGIES = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
"""Megatron FSDP's `--data-parallel-sharding-strategy` (megatron/core/distributed/fsdp): what it shards."""
FSDP_STRATEGIES = {"full_shard": 3, "shard_grad_op": 2, "no_shard": 0}
"""PyTorch FSDP's `ShardingStrategy` as llm-foundry's `fsdp_config.sharding_strategy` and MosaicML's
throughput table name it; HYBRID_SHARD (HSDP) needs its replica groups, read from `--config` only."""
PRECISION_SWITCHES = {"--bf16": "bf16", "--fp16": "fp16"}
"""Megatron-LM's (and HF Trainer's) precision switches."""
PRECISION_FLAGS = ("--fp8-format",)
"""Megatron-LM's `--fp8-format e4m3|hybrid`: fp8 GEMMs under Transformer Engine (with --bf16 for the rest)."""
TRUE_WORDS, FALSE_WORDS = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
OFFLOAD_SWITCHES = ("--activation-cpu-offload", "--fsdp-config-activation-cpu-offload")
"""llm-foundry's `fsdp_config.activation_cpu_offload` (torch's offload_wrapper on every block), bare or true|false."""


def offload_switches(argv: list[str]) -> list[str]:
    """`argv` with llm-foundry's activation offload switch as `--offload-activations all|0`, and Megatron's
    bare `--cpu-offloading` dropped (its block count, `--cpu-offloading-num-layers`, is an alias)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        name, eq, value = argv[i].partition("=")
        flag = _dashed_name(name)
        i += 1
        if flag == "--cpu-offloading" and not eq:
            continue
        if flag not in OFFLOAD_SWITCHES:
            out.append(argv[i - 1])
            continue
        if not eq and i < len(argv) and argv[i].lower() in TRUE_WORDS + FALSE_WORDS:
            value = argv[i]
            i += 1
        word = (value or "true").lower()
        if word not in TRUE_WORDS + FALSE_WORDS:
            raise UserError(f"{flag} takes true or false, got '{value}'")
        out += ["--offload-activations", "all" if word in TRUE_WORDS else "0"]
    return out


def _dashed_name(name: str) -> str:
    """A flag's name with its dashes and underscores as Megatron's argparse reads them (`--a_b` is `--a-b`)."""
    return "--" + name.lstrip("-").replace("_", "-") if name.startswith("-") else name


def _flag(word: str) -> tuple[str | None, str | None]:
    """(the launcher flag `word` is, its `=value` if written so), (None, None) for any other word."""
    name, eq, value = word.partition("=")
    name = _dashed_name(name)
    if (name in RECOMPUTE_FLAGS or name in SHARDING_FLAGS or name in SHARDING_SWITCHES or name in PRECISION_SWITCHES
            or name in PRECISION_FLAGS):
        return name, (value if eq else None)
    return None, None


def _plan_flags() -> frozenset[str]:
    """Every `flopwise plan` flag and alias (`plan/options.py`)."""
    from flopwise.plan.options import OPTIONS

    flags = set()
    for option in OPTIONS:
        flags.update(option.flag.split("/"))
        flags.update(option.aliases)
    return frozenset(flags)


def dashed(argv: list[str]) -> list[str]:
    """`argv` with NeMo's underscored spellings of plan flags dashed (`--micro_batch_size 1`,
    `--tensor_parallel_size=2`, `--compute_dtype fp8`); other words unchanged."""
    known = None
    out = []
    for word in argv:
        name, eq, value = word.partition("=")
        if word.startswith("--") and "_" in name:
            known = known or _plan_flags()
            if name.replace("_", "-") in known:
                word = name.replace("_", "-") + eq + value
        out.append(word)
    return out


def rewrite(argv: list[str]) -> list[str]:
    """`argv` with Megatron's / NeMo's recompute and sharding flags replaced by `--recompute` and `--zero`,
    and NeMo's underscored spellings of plan flags dashed (unchanged without any)."""
    argv = dashed(offload_switches(argv))
    seen: dict[str, list[str]] = {}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        name, value = _flag(argv[i])
        if name is None:
            rest.append(argv[i])
            i += 1
            continue
        i += 1
        if name in SHARDING_SWITCHES or name in PRECISION_SWITCHES:
            seen[name] = [value or "true"]
            continue
        values = [value] if value else []
        while i < len(argv) and (value is None) and not argv[i].startswith("-") and "=" not in argv[i]:
            values.append(argv[i])
            i += 1
            if name != "--recompute-modules":
                break
        if not values:
            raise UserError(f"{name} needs a value")
        seen[name] = values
    if not seen:
        return argv
    recompute = {name: values for name, values in seen.items() if name in RECOMPUTE_FLAGS}
    precision = {name: values for name, values in seen.items() if name in PRECISION_SWITCHES or name in PRECISION_FLAGS}
    sharding = {name: values for name, values in seen.items() if name not in recompute and name not in precision}
    out = list(rest)
    for option, flags, value in (("--recompute", recompute, policy), ("--zero", sharding, zero_stage),
                                 ("--precision", precision, precision_of)):
        if not flags:
            continue
        if any(word == option or word.startswith(option + "=") for word in rest):
            raise UserError(f"give {option} or the launcher's flags ({', '.join(sorted(flags))}), not both")
        stated = value(flags)
        if stated is not None:
            out += [option, stated]
    return out


def precision_of(seen: dict[str, list[str]]) -> str | None:
    """The precision Megatron-LM's switches state: fp8 with --fp8-format (Transformer Engine's e4m3 or
    hybrid, both fp8 GEMMs), else bf16 or fp16; None when the switches are turned off."""
    if "--fp8-format" in seen:
        word = seen["--fp8-format"][0].strip().lower()
        if word not in ("e4m3", "hybrid"):
            raise UserError(f"--fp8-format must be e4m3 or hybrid, got {seen['--fp8-format'][0]!r}")
        if "--fp16" in seen and seen["--fp16"][0].strip().lower() not in FALSE_WORDS:
            raise UserError("--fp8-format with --fp16 is not planned (fp8 plans with bf16 for the rest, as --bf16)")
        return "fp8"
    on = [PRECISION_SWITCHES[name] for name in PRECISION_SWITCHES
          if name in seen and seen[name][0].strip().lower() not in FALSE_WORDS]
    if len(on) > 1:
        raise UserError("--bf16 and --fp16 both given: give one")
    return on[0] if on else None


def zero_stage(seen: dict[str, list[str]]) -> str | None:
    """The ZeRO stage Megatron's / NeMo's sharding flags state, None when they turn sharding off."""
    stage = None
    for name, value in SHARDING_SWITCHES.items():
        if name in seen and seen[name][0].strip().lower() not in FALSE_WORDS:
            stage = value if stage is None else max(stage, value)
    if "--use-mcore-fsdp" in seen:
        word = seen["--use-mcore-fsdp"][0].strip().lower()
        if word not in TRUE_WORDS + FALSE_WORDS:
            raise UserError(f"--use-mcore-fsdp must be true or false, got {word!r}")
        if word in TRUE_WORDS:
            stage = 3
    for name in ("--sharding-strategy", "--fsdp-config-shard-strategy"):
        if name in seen:
            word = seen[name][0].strip().lower()
            if word.startswith("hybrid") or word.startswith("_hybrid"):
                raise UserError(f"{name} {seen[name][0]}: HSDP's replica groups are planned from a train config "
                                "(--config with parallel.dp_replicate); give --zero 3 to plan it fully sharded")
            if word not in FSDP_STRATEGIES:
                raise UserError(f"{name} must be FULL_SHARD, SHARD_GRAD_OP or NO_SHARD, got {seen[name][0]!r}")
            stage = FSDP_STRATEGIES[word]
    if "--data-parallel-sharding-strategy" in seen:
        word = seen["--data-parallel-sharding-strategy"][0].strip().lower()
        if word not in SHARDING_STRATEGIES:
            raise UserError(f"--data-parallel-sharding-strategy must be one of {', '.join(SHARDING_STRATEGIES)}, "
                            f"got {word!r}")
        if stage == 3 or stage is None:  # the strategy of Megatron FSDP (its default: optim_grads_params)
            stage = SHARDING_STRATEGIES[word]
    return None if stage is None else str(stage)


def policy(seen: dict[str, list[str]]) -> str:
    """The `--recompute` policy Megatron's flags state."""
    for name in ("--activation-checkpointing", "--fsdp-config-activation-checkpointing"):  # llm-foundry's fsdp_config
        if name in seen:
            word = seen[name][0].strip().lower()
            if word not in TRUE_WORDS + FALSE_WORDS:
                raise UserError(f"{name} must be true or false, got {seen[name][0]!r}")
            if len(seen) == 1:
                return "full" if word in TRUE_WORDS else "none"
            raise UserError(f"{name} and Megatron's recompute flags ({', '.join(sorted(set(seen) - {name}))}) "
                            "say the same thing twice: give one")
    granularity = seen.get("--recompute-granularity", [""])[0].strip().lower()
    method = seen.get("--recompute-method", [""])[0].strip().lower()
    layers = seen.get("--recompute-num-layers", [""])[0].strip()
    if "--recompute-layers" in seen:  # NeMo: full granularity, block method
        granularity, method, layers = "full", "block", seen["--recompute-layers"][0].strip()
        if layers == "0":
            granularity = ""
    if granularity not in ("", "full", "selective"):
        raise UserError(f"--recompute-granularity must be full or selective, got {granularity!r}")
    if granularity == "full":
        if method not in ("", "uniform", "block"):
            raise UserError(f"--recompute-method must be uniform or block, got {method!r}")
        if method == "block":
            if not layers:
                raise UserError("--recompute-method block needs --recompute-num-layers N")
            return f"block-layers:{layers}"
        return "full"  # uniform: every block's input kept (groups of N blocks keep less; planned as one each)
    if "--recompute-modules" in seen:
        return "modules:" + "+".join(" ".join(seen["--recompute-modules"]).replace(",", " ").replace("/", " ").split())
    return "selective" if granularity == "selective" else "none"
