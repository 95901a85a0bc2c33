"""Megatron-LM's and NeMo's recompute flags, read into `flopwise plan --recompute`.

A run is often stated in its launcher's own words (Megatron-LM `arguments.py`; NeMo
`scripts/performance/argument_parser.py` and `helpers.py` `set_recompute_configs`):

    --recompute-granularity full --recompute-method uniform [--recompute-num-layers 1]  -> full
    --recompute-granularity full --recompute-method block --recompute-num-layers N      -> block-layers:N
    --recompute-layers N (NeMo: granularity full, method block, N layers)               -> block-layers:N
    --recompute-granularity selective                                                   -> selective
    --recompute-modules mla_up_proj mlp moe (selective granularity, any separator)      -> modules:…

`block-layers:N` becomes the share of blocks it recomputes once the model and pipeline are known
(`planner.blocks_of_stage`). Megatron's `--recompute-modules` takes several words; they are read
up to the next flag (words with "=" stay `--config` overrides). Underscored spellings
(`--recompute_modules`, as NeMo's scripts take them) read the same.
"""

from __future__ import annotations

from flopwise.errors import UserError

FLAGS = ("--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--recompute-modules",
         "--recompute-layers")


def _flag(word: str) -> tuple[str | None, str | None]:
    """(the recompute flag `word` is, its `=value` if written so), (None, None) for any other word."""
    name, eq, value = word.partition("=")
    name = "--" + name.lstrip("-").replace("_", "-") if name.startswith("-") else name
    if name in FLAGS:
        return name, (value if eq else None)
    return None, None


def rewrite(argv: list[str]) -> list[str]:
    """`argv` with Megatron's / NeMo's recompute flags replaced by one `--recompute` (unchanged without them)."""
    seen: dict[str, list[str]] = {}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        name, value = _flag(argv[i])
        if name is None:
            rest.append(argv[i])
            i += 1
            continue
        values = [value] if value else []
        i += 1
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
    if any(word == "--recompute" or word.startswith("--recompute=") for word in rest):
        raise UserError("give --recompute or Megatron's recompute flags (" + ", ".join(sorted(seen)) + "), not both")
    return rest + ["--recompute", policy(seen)]


def policy(seen: dict[str, list[str]]) -> str:
    """The `--recompute` policy Megatron's flags state."""
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
