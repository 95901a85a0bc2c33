"""`flopwise diagnose RUN_DIR`: what slowed a run down, in plain words, with the next step.

Reads what `flopwise train` wrote, through `flopwise.runrecord.run_data` (`metrics.rank<R>.jsonl`,
one `StepRecord` per optimizer step per rank; `predicted_vs_measured.json`, a `Comparison`;
`config.yaml`) and looks for the problems the seed articles list: a slow gradient sync
or a straggling rank (load imbalance), a starved data pipeline, unstable loss, and a
plan that does not match reality. Pure Python (no torch): it runs anywhere the run
directory can be copied to. Missing optional fields are skipped, never guessed.
"""

from __future__ import annotations

import math
import statistics
from functools import reduce
from pathlib import Path

from flopwise.runrecord.diagnosis import Diagnosis, Finding, RankBreakdown
from flopwise.runrecord.run_data import (
    COMPONENT_LABELS,
    COMPONENTS,
    PlanRow,
    RunData,
    finite_number,
    is_memory_figure,
    load_run,
)

# Thresholds. Chosen so run-to-run noise on a shared CPU host (a few %) stays quiet while a
# throttled GPU or an uneven shard (tens of %) shows; all are ratios, so units do not matter.
STRAGGLER_EXCESS = 0.15  # a rank's median compute/step time this much above the other ranks' median
SYNC_WAIT_SHARE = 0.10  # others wait this share of a step at gradient sync while one rank does not
IMBALANCE_SPREAD = 0.15  # tokens/s: (best - worst) / best across ranks
DATA_SHARE_WARN = 0.10  # median data wait / median step time
STALL_FACTOR = 5.0  # a data wait this many times the rank's median...
STALL_MIN_STEP_SHARE = 0.2  # ...and at least this share of a median step is a stall
OUTLIER_FACTOR = 1.5  # a step this many times the median...
OUTLIER_MADS = 5.0  # ...and this many robust deviations above it is an outlier
SPIKE_FACTOR = 1.3  # a loss this many times the median of the last 5 steps...
SPIKE_MADS = 6.0  # ...and this many robust step-to-step deviations above it is a spike
SPIKE_WINDOW = 20
PLAN_TOLERANCE = 1.5  # measured / predicted outside [1/1.5, 1.5] is worth a look
MEMORY_IMBALANCE = 0.25
MAX_LISTED = 5

SEVERITIES = ("info", "warn", "critical")
# --------------------------------------------------------------------------- statistics


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[index]


def mad(values: list[float]) -> float:
    """Median absolute deviation scaled to a normal sigma (x 1.4826): a spread that outliers do not inflate."""
    med = statistics.median(values)
    return 1.4826 * statistics.median(abs(v - med) for v in values)


def steady_records(records: list[dict]) -> list[dict]:
    """Drop the first step of a rank (allocator warm-up, compilation) when there are enough others."""
    return records[1:] if len(records) > 5 else records


def with_other(record: dict) -> dict:
    """Component seconds of a step, with 'other' = step minus the timed components."""
    parts = {c: finite_number(record.get(c)) for c in COMPONENTS}
    parts = {c: v for c, v in parts.items() if v is not None}
    step = float(record["step_seconds"])
    parts["other_seconds"] = max(0.0, step - sum(parts.values())) if parts else 0.0
    parts["step_seconds"] = step
    return parts


def timed_apart(records: list[dict]) -> list[dict]:
    """The steps whose sync wait was timed, when a run probes only some (`training.measure_every`):
    on the others the wait is inside `compute_seconds`, so components come from these alone."""
    probed = [r for r in records if finite_number(r.get("sync_wait_seconds")) is not None]
    return probed or records


def rank_breakdown(rank: int, records: list[dict]) -> RankBreakdown:
    """Median / p90 of each component over a rank's steady steps (those with the sync wait timed
    apart, when it was sampled); the step time and tokens/s over all steady steps."""
    steady_all = steady_records(records)
    steady = [with_other(r) for r in timed_apart(steady_all)]
    keys = [k for k in (*COMPONENTS, "other_seconds") if all(k in s for s in steady)]
    steps = [float(r["step_seconds"]) for r in steady_all]
    tps = [v for v in (finite_number(r.get("tokens_per_second")) for r in steady_all) if v is not None]
    memory: dict[str, int] = {}
    for record in records:
        for key, value in record.items():
            if key.startswith("memory_") and key.endswith("_bytes") and finite_number(value) is not None:
                name = key[len("memory_") : -len("_bytes")]
                memory[name] = max(memory.get(name, 0), int(value))
    return RankBreakdown(
        rank=rank,
        steps=len(records),
        median={**{k: statistics.median(s[k] for s in steady) for k in keys}, "step_seconds": statistics.median(steps)},
        p90={**{k: percentile([s[k] for s in steady], 90) for k in keys}, "step_seconds": percentile(steps, 90)},
        tokens_per_second=statistics.median(tps) if tps else None,
        peak_memory_bytes=memory,
    )


# --------------------------------------------------------------------------- checks


def find_stragglers(breakdown: list[RankBreakdown], on_cpu: bool = False) -> list[Finding]:
    """A rank whose compute (or, without it, step) time stands out from the other ranks.

    In synchronous data parallelism every rank waits for the slowest at the gradient
    all-reduce, so step times look alike. The straggler shows in its own compute time
    when the wait is timed apart from compute (`sync_wait_seconds`), or as the one rank
    that does not wait while the others do. Compared with the median of the *other*
    ranks so that one straggler out of two still stands out. When the gradient sync is
    timed inside backward and no wait is recorded, the waits hide a straggler; the
    report says so.
    """
    if len(breakdown) < 2:
        return []
    key = "compute_seconds" if all("compute_seconds" in b.median for b in breakdown) else "step_seconds"
    label = "compute (forward+backward)" if key == "compute_seconds" else "step"
    findings = []
    for b in breakdown:
        others = [o.median[key] for o in breakdown if o.rank != b.rank]
        baseline = statistics.median(others)
        if baseline <= 0:
            continue
        excess = b.median[key] / baseline - 1
        if excess > STRAGGLER_EXCESS:
            waiting = [o.rank for o in breakdown if o.rank != b.rank]
            findings.append(
                Finding(
                    kind="straggler",
                    severity="warn" if excess < 0.5 else "critical",
                    rank=b.rank,
                    message=f"rank {b.rank} is {excess:.0%} slower in {label} time "
                    f"({b.median[key]:.3f} s vs {baseline:.3f} s median of the other ranks); "
                    f"rank{'s' if len(waiting) > 1 else ''} {_ranks(waiting)} wait{'' if len(waiting) > 1 else 's'} for it "
                    "at every gradient sync",
                    next_step=_straggler_next_step(b.rank, on_cpu),
                    evidence={"metric": key, "rank_median_seconds": b.median[key], "others_median_seconds": baseline, "excess": excess},
                )
            )
    flagged = {f.rank for f in findings}
    if all("sync_wait_seconds" in b.median for b in breakdown):
        findings += _late_arrivals(breakdown, flagged)
    return sorted(findings, key=lambda f: -f.evidence.get("excess", 0.0))


def _straggler_next_step(rank: int, on_cpu: bool) -> str:
    if on_cpu:
        return (f"on a CPU the ranks share the host's cores: look for other processes using them (top), "
                f"give each rank its own cores (OMP_NUM_THREADS x ranks <= cores), and check for uneven "
                f"sequence lengths or batch sizes in rank {rank}'s data shard")
    return (f"check rank {rank}'s device: clocks and temperature (nvidia-smi -q -d CLOCK,TEMPERATURE, "
            "or `flopwise doctor` on that host), other processes on it, and uneven sequence lengths or "
            "batch sizes in its data shard")


def _late_arrivals(breakdown: list[RankBreakdown], flagged: set[int]) -> list[Finding]:
    """The rank that arrives last at gradient sync waits least; everyone else waits for it."""
    findings = []
    for b in breakdown:
        others = [o for o in breakdown if o.rank != b.rank]
        others_wait = statistics.median(o.median["sync_wait_seconds"] for o in others)
        step = statistics.median(o.median["step_seconds"] for o in others)
        mine = b.median["sync_wait_seconds"]
        if b.rank in flagged or step <= 0 or others_wait < SYNC_WAIT_SHARE * step or mine > others_wait / 2:
            continue
        findings.append(
            Finding(
                kind="straggler",
                severity="warn",
                rank=b.rank,
                message=f"rank {b.rank} arrives last at gradient sync: the other ranks wait {others_wait:.3f} s "
                f"({others_wait / step:.0%} of a step) for it, it waits {mine:.3f} s",
                next_step=f"find what slows rank {b.rank} before the sync: its device clocks/temperature, other "
                "processes on its host, or longer sequences in its data shard",
                evidence={"metric": "sync_wait_seconds", "others_wait_seconds": others_wait, "rank_wait_seconds": mine},
            )
        )
    return findings


def find_throughput_imbalance(breakdown: list[RankBreakdown]) -> list[Finding]:
    """Ranks processing tokens at different rates: uneven shards or a slow rank."""
    rated = [b for b in breakdown if b.tokens_per_second]
    if len(rated) < 2:
        return []
    best = max(rated, key=lambda b: b.tokens_per_second)
    worst = min(rated, key=lambda b: b.tokens_per_second)
    spread = 1 - worst.tokens_per_second / best.tokens_per_second
    if spread <= IMBALANCE_SPREAD:
        return []
    return [
        Finding(
            kind="imbalance",
            severity="warn",
            rank=worst.rank,
            message=f"tokens/s differ by {spread:.0%} across ranks: rank {worst.rank} {worst.tokens_per_second:,.0f} "
            f"vs rank {best.rank} {best.tokens_per_second:,.0f}",
            next_step="give every rank the same number of tokens per step (same micro-batch and sequence length; "
            "pack sequences), then look for a slow device on the lagging rank",
            evidence={"spread": spread, "tokens_per_second": {b.rank: b.tokens_per_second for b in rated}},
        )
    ]


def find_data_stalls(run: RunData, breakdown: list[RankBreakdown]) -> list[Finding]:
    """Data loading that takes a real share of every step, and single steps where it stalled."""
    findings = []
    slow_share = []
    for b in breakdown:
        if "data_seconds" in b.median and b.median["step_seconds"] > 0:
            share = b.median["data_seconds"] / b.median["step_seconds"]
            if share > DATA_SHARE_WARN:
                slow_share.append((b.rank, share))
    if slow_share:
        worst_rank, worst = max(slow_share, key=lambda x: x[1])
        findings.append(
            Finding(
                kind="data_wait",
                severity="critical" if worst > 0.3 else "warn",
                rank=worst_rank,
                message=f"data loading takes {worst:.0%} of a median step on rank {worst_rank}"
                + (f" (also ranks {_ranks([r for r, _ in slow_share if r != worst_rank])})" if len(slow_share) > 1 else ""),
                next_step="pre-tokenize once (data.format=tokens, memory-mapped), raise data.prefetch, and keep the "
                "data on local fast storage; the accelerator idles while it waits",
                evidence={"share_by_rank": dict(slow_share)},
            )
        )
    for b in breakdown:
        records = steady_records(run.steps_by_rank[b.rank])
        waits = [(r["step"], finite_number(r.get("data_seconds"))) for r in records]
        waits = [(s, w) for s, w in waits if w is not None]
        if len(waits) < 5:
            continue
        typical = statistics.median(w for _, w in waits)
        limit = max(STALL_FACTOR * typical, STALL_MIN_STEP_SHARE * b.median["step_seconds"])
        stalls = [(s, w) for s, w in waits if w > limit]
        if not stalls:
            continue
        longest = max(stalls, key=lambda x: x[1])
        findings.append(
            Finding(
                kind="data_stall",
                severity="warn",
                rank=b.rank,
                message=f"{len(stalls)} data-loader stall{'s' if len(stalls) > 1 else ''} on rank {b.rank} "
                f"(step{'s' if len(stalls) > 1 else ''} {_steps([s for s, _ in stalls])}); longest {longest[1]:.3f} s "
                f"vs a typical {typical:.3f} s wait",
                next_step="look for what the loader was doing then: a new file or shard being opened, tokenization "
                "on the fly, a slow network file system, or the host swapping; raise data.prefetch to hide short stalls",
                evidence={"steps": [s for s, _ in stalls], "seconds": [w for _, w in stalls], "typical_seconds": typical},
            )
        )
    return findings


def find_outlier_steps(run: RunData, breakdown: list[RankBreakdown]) -> list[Finding]:
    """Steps far slower than usual, with the component that grew; periodic ones hint at checkpoints."""
    slow: dict[int, tuple[int, float, str]] = {}
    for b in breakdown:
        records = steady_records(run.steps_by_rank[b.rank])
        if len(records) < 5:
            continue
        times = [float(r["step_seconds"]) for r in records]
        med, spread = statistics.median(times), mad(times)
        medians = b.median
        for record in records:
            t = float(record["step_seconds"])
            if t > OUTLIER_FACTOR * med and t > med + OUTLIER_MADS * spread:
                parts = with_other(record)
                grown = max(
                    (k for k in parts if k != "step_seconds" and k in medians),
                    key=lambda k: parts[k] - medians[k],
                    default="step_seconds",
                )
                if record["step"] not in slow or slow[record["step"]][1] < t / med:
                    slow[record["step"]] = (b.rank, t / med, grown)
    if not slow:
        return []
    steps = sorted(slow)
    worst = max(steps, key=lambda s: slow[s][1])
    causes = {slow[s][2] for s in steps}
    cause_text = ", ".join(sorted(COMPONENT_LABELS.get(c, c) for c in causes))
    period = reduce(math.gcd, steps) if len(steps) >= 3 else 0
    hint = ""
    if period >= 5:
        hint = f"; they recur every {period} steps"
        every = (run.config.get("checkpoint") or {}).get("every_steps")
        if every and period % int(every) == 0:
            hint += f", like checkpoint.every_steps={every}: checkpoint writes stall training"
    return [
        Finding(
            kind="outlier_steps",
            severity="info" if len(steps) <= 2 else "warn",
            rank=slow[worst][0],
            message=f"{len(steps)} step{'s' if len(steps) > 1 else ''} took over {OUTLIER_FACTOR:g}x the median "
            f"(steps {_steps(steps)}; worst step {worst} at {slow[worst][1]:.1f}x on rank {slow[worst][0]}); "
            f"the time went to {cause_text}{hint}",
            next_step="if checkpoints: write them less often or asynchronously; if data wait: see the data findings; "
            "if forward+backward: look for recompilation (changing shapes) or another job sharing the device",
            evidence={"steps": steps, "times_median": {s: slow[s][1] for s in steps}, "cause": {s: slow[s][2] for s in steps}},
        )
    ]


def find_loss_problems(run: RunData) -> list[Finding]:
    """Non-finite loss (the trainer writes NaN/inf as null), loss spikes, skipped optimizer steps."""
    findings = []
    for rank in run.ranks:
        records = run.steps_by_rank[rank]
        bad = [r["step"] for r in records if "loss" in r and finite_number(r["loss"]) is None]
        if bad:
            findings.append(
                Finding(
                    kind="loss_nan",
                    severity="critical",
                    rank=rank,
                    message=f"loss is NaN/inf on rank {rank} from step {bad[0]} ({len(bad)} step{'s' if len(bad) > 1 else ''})",
                    next_step="resume from the last checkpoint before that step with a lower training.lr or longer "
                    "warmup_steps, keep training.grad_clip on, prefer bf16 over fp16",
                    evidence={"steps": bad[:50]},
                )
            )
            break
    first = run.steps_by_rank[run.ranks[0]]
    series = [(r["step"], finite_number(r.get("loss"))) for r in first]
    series = [(s, v) for s, v in series if v is not None]
    spikes = []
    for i in range(SPIKE_WINDOW // 2, len(series)):
        window = [v for _, v in series[max(0, i - SPIKE_WINDOW) : i]]
        # Noise from step-to-step changes, so the downward trend of a loss curve is not mistaken for noise.
        noise = 1.4826 * statistics.median(abs(b - a) for a, b in zip(window, window[1:]))
        recent = statistics.median(window[-5:])
        step, value = series[i]
        if value > SPIKE_FACTOR * recent and value - recent > SPIKE_MADS * noise:
            spikes.append((step, value, recent))
    if spikes:
        findings.append(
            Finding(
                kind="loss_spike",
                severity="warn",
                rank=run.ranks[0],
                message=f"{len(spikes)} loss spike{'s' if len(spikes) > 1 else ''} (step{'s' if len(spikes) > 1 else ''} "
                f"{_steps([s for s, _, _ in spikes])}; largest {max(v / m for _, v, m in spikes):.1f}x the recent median)",
                next_step="lower training.lr or lengthen warmup_steps, keep grad_clip on, and check the batches at "
                "those steps for corrupt or repeated data",
                evidence={"steps": [s for s, _, _ in spikes]},
            )
        )
    skipped = [r["step"] for r in first if r.get("skipped_step") is True]
    if skipped:
        share = len(skipped) / len(first)
        findings.append(
            Finding(
                kind="skipped_steps",
                severity="warn" if share > 0.05 else "info",
                rank=run.ranks[0],
                message=f"{len(skipped)} optimizer step{'s' if len(skipped) > 1 else ''} skipped for inf/NaN gradients "
                f"({share:.0%}; steps {_steps(skipped)})",
                next_step="a few early skips are fp16 loss scaling finding its level; many mean overflow: use bf16 "
                "or lower precision.initial_scale",
                evidence={"steps": skipped[:50]},
            )
        )
    return findings


def find_memory_imbalance(breakdown: list[RankBreakdown]) -> list[Finding]:
    """One rank holding much more memory than another runs out first."""
    totals = {}
    for b in breakdown:
        m = b.peak_memory_bytes
        total = m.get("cuda_peak_allocated") or sum(v for k, v in m.items() if k != "cuda_peak_allocated")
        if total:
            totals[b.rank] = total
    if len(totals) < 2:
        return []
    high = max(totals, key=totals.get)
    low = min(totals, key=totals.get)
    spread = totals[high] / totals[low] - 1
    if spread <= MEMORY_IMBALANCE:
        return []
    return [
        Finding(
            kind="memory_imbalance",
            severity="warn",
            rank=high,
            message=f"rank {high} peaks at {totals[high] / 2**20:,.0f} MiB, {spread:.0%} more than rank {low}",
            next_step="with a pipeline, the first stage keeps the most activations (move a layer off it); "
            "otherwise check that parameters are sharded evenly (parallel.fsdp_min_params)",
            evidence={"peak_bytes": totals},
        )
    ]


SPEED_FIGURES = ("tokens_per_second", "step_seconds", "mfu")


def find_plan_mismatch(rows: list[PlanRow], run_dir: Path, on_cpu: bool = False,
                       profiled: bool = True) -> list[Finding]:
    """Predicted figures that reality missed by more than PLAN_TOLERANCE either way.

    Speed (tokens/s, step time, MFU: one fact seen three ways) and memory are separate
    findings because they have different fixes. A CPU run's speed is judged when its
    prediction came from this machine's measured device profile (within ~15 % on an idle
    machine, docs/planner.md); without one it is an assumed efficiency over a timed matmul
    peak, and only memory is judged (the diagnosis notes why).
    """
    off = [r for r in rows if r.predicted > 0 and not (1 / PLAN_TOLERANCE <= r.ratio <= PLAN_TOLERANCE)]
    judged = profiled or not on_cpu
    speed = [r for r in off if r.name.split(".")[-1] in SPEED_FIGURES] if judged else []
    memory = [r for r in off if is_memory_figure(r.name)]
    findings = []
    if speed:
        first = next((r for name in SPEED_FIGURES for r in speed if r.name.split(".")[-1] == name), speed[0])
        text = ", ".join(f"{r.name} {r.ratio:.2f}x" for r in speed)
        faster = (first.ratio > 1) == (first.name.split(".")[-1] != "step_seconds")
        findings.append(
            Finding(
                kind="plan_mismatch",
                severity="warn",
                message=f"the run is {'faster' if faster else 'slower'} than planned (measured / predicted: {text})",
                next_step=(
                    "the prediction comes from this machine's device profile: other processes on the cores slow a "
                    "run but not the profile, so check the load (`uptime`); if the machine or its threads changed, "
                    "measure it again with `flopwise calibrate --nproc N`" if on_cpu else
                    f"run `flopwise plan --calibrate {run_dir}` so the planner uses this run's measured MFU"),
                evidence={r.name: r.ratio for r in speed},
            )
        )
    if memory:
        text = ", ".join(f"{r.name} {r.ratio:.2f}x" for r in memory[:MAX_LISTED])
        findings.append(
            Finding(
                kind="plan_mismatch",
                severity="warn",
                message=f"memory differs from the plan (measured / predicted: {text})",
                next_step="check that the plan and the run agree on activation checkpointing, precision and "
                "sharding (zero stage, fsdp); large activation gaps often mean the plan assumed another sequence length",
                evidence={r.name: r.ratio for r in memory},
            )
        )
    return findings


BUSY_LOAD_PER_CORE = 0.5  # other work's 1-minute load per core above which a machine counts as busy


def run_load_per_core(load: dict | None) -> float | None:
    """Other work's 1-minute load per core during a run: the larger of the load before step 1 and the
    load at the end less the run's own busy threads; None when the run did not record it."""
    if not load or not finite_number(load.get("cpu_count")):
        return None
    start, end = finite_number(load.get("start")), finite_number(load.get("end"))
    if start is None and end is None:
        return None
    own = finite_number(load.get("own_threads")) or 0.0
    return max(start or 0.0, max(0.0, (end or 0.0) - own)) / max(1.0, load["cpu_count"])


def profile_line(run: RunData) -> str | None:
    """One line: the profile that predicted the run, its hash, the load it was calibrated under vs the
    load during the run, and which explanation fits when measured speed is off the prediction."""
    profile = run.profile
    if not profile:
        return None
    sha = str(profile.get("sha256") or "")[:12] or "no hash"
    where = f"profile {profile.get('path', '?')} (sha256 {sha}, {profile.get('source', 'source unknown')})"
    calibrated = finite_number(profile.get("busy_load_per_core"))
    during = run_load_per_core(run.machine_load)
    loads = (f"calibrated under load {_per_core(calibrated)}, run under {_per_core(during)} "
             "(other work, 1-minute load per core)")
    missed = [r for r in run.plan_rows if r.name.split(".")[-1] in SPEED_FIGURES and r.predicted > 0
              and not (1 / PLAN_TOLERANCE <= r.ratio <= PLAN_TOLERANCE)]
    if not missed:
        verdict = "speed as predicted"
    elif calibrated is None or during is None:
        verdict = "speed off the prediction; the load was not recorded, so a busy machine cannot be ruled out"
    else:
        run_busy, profile_busy = during > BUSY_LOAD_PER_CORE, calibrated > BUSY_LOAD_PER_CORE
        verdict = {
            (True, False): "speed off the prediction: the machine was busy during the run, not when calibrated",
            (False, True): "speed off the prediction: the profile was measured on a busy machine; "
                           "calibrate again when it is idle",
            (True, True): "speed off the prediction: the machine was busy both times; measure both again when idle",
            (False, False): "speed off the prediction on a quiet machine both times: the model is wrong for this run",
        }[(run_busy, profile_busy)]
    return f"{where}: {loads}: {verdict}"


def _per_core(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.2f}"


def diagnose(run: RunData) -> Diagnosis:
    """All checks over a loaded run, most severe findings first."""
    breakdown = [rank_breakdown(rank, run.steps_by_rank[rank]) for rank in run.ranks]
    findings = (
        find_stragglers(breakdown, run.on_cpu)
        + find_throughput_imbalance(breakdown)
        + find_data_stalls(run, breakdown)
        + find_outlier_steps(run, breakdown)
        + find_loss_problems(run)
        + find_memory_imbalance(breakdown)
        + find_plan_mismatch(run.plan_rows, run.run_dir, run.on_cpu, run.profiled)
    )
    findings.sort(key=lambda f: -SEVERITIES.index(f.severity))
    steps = max(len(v) for v in run.steps_by_rank.values())
    notes = [line] if (line := profile_line(run)) else []
    missed = [r for r in run.plan_rows if r.name.split(".")[-1] in SPEED_FIGURES and r.predicted > 0
              and not (1 / PLAN_TOLERANCE <= r.ratio <= PLAN_TOLERANCE)]
    if run.on_cpu and not run.profiled and missed:
        notes.append(
            f"speed differs from the plan ({', '.join(f'{r.name} {r.ratio:.2f}x' for r in missed)}) but is not "
            "judged on a CPU whose prediction had no measured device profile (it assumed an efficiency over a "
            "timed matmul peak); `flopwise calibrate --nproc N` measures one for the next run"
        )
    if len(run.ranks) > 1 and not all("sync_wait_seconds" in b.median for b in breakdown):
        notes.append(
            "this run times gradient sync inside forward+backward, so a rank that is slow before the sync "
            "lengthens every rank's compute time; a straggler shows only through its own data or optimizer time"
        )
    return Diagnosis(str(run.run_dir), run.ranks, steps, breakdown, findings, run.plan_rows, run.skipped_lines, notes)


def diagnose_run_dir(run_dir: str | Path) -> Diagnosis:
    """Load and diagnose a run directory."""
    return diagnose(load_run(run_dir))


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)


def _steps(steps: list[int]) -> str:
    shown = ", ".join(str(s) for s in steps[:MAX_LISTED])
    return shown + (f" and {len(steps) - MAX_LISTED} more" if len(steps) > MAX_LISTED else "")
