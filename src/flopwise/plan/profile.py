"""A device profile: what `flopwise calibrate` measured on one device, as plain data.

The planner's time model reads a profile instead of datasheet curves when one is given
(`flopwise plan --profile PATH`, and the trainer's own prediction). Standard library only,
so the planner stays torch-free and cheap to import.

What a profile holds (JSON, `schema_version` 3; version-1 and -2 files still load, without
the operator timings (1) or the FSDP unit costs by size (1, 2) below):

- GEMM points per dtype: C[M,N] = A[M,K]·B[K,N] as (m, n, k, achieved FLOP/s), timed as
  `torch.nn.functional.linear` (the call a model's layers make);
- memory bandwidth in bytes/s (a large device-to-device copy: read + write bytes / time);
- optionally the fixed time of one tiny operator (dispatch and launch: what each of a
  step's many small element-wise kernels pays whatever its size);
- optionally collectives (op, world size, bytes, bus bandwidth as nccl-tests defines it);
- optionally (CPU) the operators a step runs besides its GEMMs, each forward + backward as
  autograd runs them: seconds per element of the element-wise ones (`norm`, `swiglu`,
  `gelu`, `add`, `rope`; `cross_entropy` per logit) and the forward's share of each
  (`op_forward_share`, version 3), the fused attention's FLOP/s per dtype
  (FLOPs counted as `plan/ops.py` counts them), and the optimizer step per parameter
  (`adamw`: the trainer's foreach AdamW plus gradient clipping; `adamw_fsdp`: the same over
  FSDP2's sharded DTensor parameters, per parameter a rank owns);
- optionally (CPU, several processes) what one FSDP2-wrapped unit adds to a forward +
  backward, by the unit's weight bytes: the framework's per-unit work (hooks, copies into
  and out of flat buffers), its two all-gathers and one reduce-scatter, and the waits for
  the other processes they imply, measured against the same layers unwrapped
  (`fsdp_unit_seconds`, [[bytes, seconds], ...]);
- where and how: device name and kind, threads per process, processes measured at once,
  torch version, host, date, and the machine's load while it was measured (1-minute load
  average before and after, and its cores), so a profile measured on a busy machine can be
  told apart from a model that is wrong.

Interpolation rule (`gemm_flops_per_s`): a shape's rate is the inverse-distance weighted
mean (weights 1/d², nearest 4 points) of the measured rates, with d measured in
(log M, log N, log K) space: GEMM efficiency changes with the order of magnitude of each
dimension, not with its absolute size. An exact grid point returns its own rate. Below the
smallest measured work (M·N·K) the time of that smallest GEMM is a floor (launch and
loop overheads do not shrink with the shape), so the rate falls in proportion to the work.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from flopwise.errors import UserError

SCHEMA_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)  # older versions lack later measurements; the trainer re-measures them
ELEMENTWISE_OPS = ("norm", "swiglu", "gelu", "add", "rope", "cross_entropy")
NEAREST = 4  # points the interpolation weighs
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")


@dataclass(frozen=True)
class GemmPoint:
    """One timed GEMM: C[m,n] = A[m,k]·B[k,n] in `dtype` at `flops_per_s` (2·m·n·k / median time)."""

    dtype: str
    m: int
    n: int
    k: int
    flops_per_s: float


@dataclass(frozen=True)
class CollectivePoint:
    """One timed collective (nccl-tests conventions: whole-array bytes, bus bandwidth)."""

    op: str
    world_size: int
    size_bytes: int
    bus_bytes_per_s: float


@dataclass(frozen=True)
class AttentionPoint:
    """One timed fused causal attention, forward + backward, at sequence `seq` and head size
    `head_dim`; FLOPs counted as `plan/ops.py` counts them (forward 2·s²·d per head, causal;
    backward 2.5× the forward)."""

    dtype: str
    seq: int
    head_dim: int
    flops_per_s: float


@dataclass(frozen=True)
class DeviceProfile:
    """Measured speeds of one device (one process's share of it on a CPU)."""

    device: str  # e.g. "NVIDIA H100 80GB HBM3" or "cpu (AMD EPYC)"
    device_kind: str  # "cuda" or "cpu"
    gemm: tuple[GemmPoint, ...]
    memory_bandwidth_bytes_per_s: float
    collectives: tuple[CollectivePoint, ...] = ()
    kernel_overhead_seconds: float | None = None  # one tiny operator, start to end
    op_seconds_per_element: dict[str, float] = field(default_factory=dict, hash=False)  # forward + backward, fp32
    op_forward_share: dict[str, float] = field(default_factory=dict, hash=False)  # the forward's share of that
    attention: tuple[AttentionPoint, ...] = ()  # fused attention, forward + backward
    optimizer_seconds_per_param: dict[str, float] = field(default_factory=dict, hash=False)  # step + clipping
    fsdp_unit_seconds: tuple[tuple[float, float], ...] = ()  # (unit weight bytes, seconds it adds per step)
    threads: int | None = None  # torch threads per process while measuring
    processes: int = 1  # processes that measured at the same time (they share a CPU)
    torch_version: str = ""
    host: str = ""
    created: str = ""  # ISO 8601 date and time (UTC)
    load_before: float | None = None  # 1-minute load average when measuring started
    load_after: float | None = None  # ... and when it ended (this calibration's own processes included)
    cpu_count: int | None = None  # the machine's cores, which the load is measured against
    schema_version: int = SCHEMA_VERSION
    notes: tuple[str, ...] = field(default=())

    # ------------------------------------------------------------------ what the planner calls

    def dtypes(self) -> tuple[str, ...]:
        """The dtypes with GEMM measurements, in first-measured order."""
        return tuple(dict.fromkeys(p.dtype for p in self.gemm))

    def peak_flops(self, dtype: str) -> float | None:
        """The best measured GEMM FLOP/s for `dtype` (the MFU denominator where no datasheet peak
        exists), or None when that dtype was not measured."""
        rates = [p.flops_per_s for p in self.gemm if p.dtype == dtype]
        return max(rates) if rates else None

    def gemm_flops_per_s(self, m: int, n: int, k: int, dtype: str) -> float | None:
        """Achieved FLOP/s for an (m, n, k) GEMM in `dtype`, interpolated over the measured
        grid (module docstring), or None when `dtype` was not measured."""
        points = [p for p in self.gemm if p.dtype == dtype]
        if not points:
            return None
        m, n, k = max(1, int(m)), max(1, int(n)), max(1, int(k))
        where = (math.log(m), math.log(n), math.log(k))
        scored = []
        for p in points:
            d2 = sum((a - b) ** 2 for a, b in zip(where, (math.log(p.m), math.log(p.n), math.log(p.k))))
            if d2 == 0.0:
                scored = [(0.0, p)]
                break
            scored.append((d2, p))
        scored.sort(key=lambda item: item[0])
        nearest = scored[:NEAREST]
        if nearest[0][0] == 0.0:
            rate = nearest[0][1].flops_per_s
        else:
            weights = [1.0 / d2 for d2, _ in nearest]
            rate = sum(w * p.flops_per_s for w, (_, p) in zip(weights, nearest)) / sum(weights)
        smallest = min(points, key=lambda p: p.m * p.n * p.k)
        work, floor_work = m * n * k, smallest.m * smallest.n * smallest.k
        if work < floor_work:
            rate = min(rate, smallest.flops_per_s * work / floor_work)
        return rate

    @property
    def collective_bus_bytes_per_s(self) -> float | None:
        """Best measured all-reduce bus bandwidth (the largest messages saturate the link), or None."""
        rates = [c.bus_bytes_per_s for c in self.collectives if c.op == "all_reduce"]
        return max(rates) if rates else None

    def attention_flops_per_s(self, seq: int, head_dim: int, dtype: str) -> float | None:
        """Fused attention FLOP/s (forward + backward) at (seq, head_dim), inverse-distance
        weighted over the measured points in (log seq, log head_dim) like GEMMs; sequences
        beyond the measured range take the nearest measured rate. None when not measured."""
        points = [p for p in self.attention if p.dtype == dtype]
        if not points:
            return None
        longest = max(p.seq for p in points)
        where = (math.log(max(1, min(seq, longest))), math.log(max(1, head_dim)))
        scored = sorted((((where[0] - math.log(p.seq)) ** 2 + (where[1] - math.log(p.head_dim)) ** 2, p)
                         for p in points), key=lambda item: item[0])[:NEAREST]
        if scored[0][0] == 0.0:
            return scored[0][1].flops_per_s
        weights = [1.0 / d2 for d2, _ in scored]
        return sum(w * p.flops_per_s for w, (_, p) in zip(weights, scored)) / sum(weights)

    def fsdp_unit_cost(self, unit_bytes: float) -> float | None:
        """Seconds one FSDP unit of `unit_bytes` weights adds to a forward + backward (two
        all-gathers, one reduce-scatter and the framework's work), linear between the measured
        sizes and along the last two points' slope beyond them; None when not measured."""
        points = sorted(self.fsdp_unit_seconds)
        if not points:
            return None
        if len(points) == 1 or unit_bytes <= points[0][0]:
            return points[0][1]
        for (b0, t0), (b1, t1) in zip(points, points[1:]):
            if unit_bytes <= b1:
                return t0 + (t1 - t0) * (unit_bytes - b0) / (b1 - b0)
        (b0, t0), (b1, t1) = points[-2], points[-1]
        return t1 + max(0.0, (t1 - t0) / (b1 - b0)) * (unit_bytes - b1)

    def collective_seconds(self, op: str, size_bytes: float, world_size: int | None = None) -> float | None:
        """Seconds of one `op` over the whole-array `size_bytes` (nccl-tests sizes), from the
        measured points of that op (and world size, when given), or None when none was measured.

        Time is interpolated linearly in size between measured sizes; below the smallest it is
        the smallest's time (per-call latency dominates), above the largest it grows at the
        largest's bandwidth."""
        points = sorted((c for c in self.collectives if c.op == op
                         and (world_size is None or c.world_size == world_size)), key=lambda c: c.size_bytes)
        if not points or size_bytes <= 0:
            return None if not points else 0.0
        times = [(c.size_bytes, c.size_bytes * _bus_factor(op, c.world_size) / c.bus_bytes_per_s) for c in points]
        if size_bytes <= times[0][0]:
            return times[0][1]
        for (s0, t0), (s1, t1) in zip(times, times[1:]):
            if size_bytes <= s1:
                return t0 + (t1 - t0) * (size_bytes - s0) / (s1 - s0)
        last_size, last_time = times[-1]
        return last_time * size_bytes / last_size

    # ------------------------------------------------------------------ JSON

    def to_dict(self) -> dict:
        """JSON-able form; GEMMs are grouped by dtype as [m, n, k, flops_per_s] rows."""
        gemm: dict[str, list[list[float]]] = {}
        for p in self.gemm:
            gemm.setdefault(p.dtype, []).append([p.m, p.n, p.k, p.flops_per_s])
        attention: dict[str, list[list[float]]] = {}
        for p in self.attention:
            attention.setdefault(p.dtype, []).append([p.seq, p.head_dim, p.flops_per_s])
        return {
            "schema_version": self.schema_version,
            "device": self.device,
            "device_kind": self.device_kind,
            "threads": self.threads,
            "processes": self.processes,
            "torch_version": self.torch_version,
            "host": self.host,
            "created": self.created,
            "load_before": self.load_before,
            "load_after": self.load_after,
            "cpu_count": self.cpu_count,
            "gemm_flops_per_s": gemm,
            "memory_bandwidth_bytes_per_s": self.memory_bandwidth_bytes_per_s,
            "kernel_overhead_seconds": self.kernel_overhead_seconds,
            "op_seconds_per_element": dict(self.op_seconds_per_element),
            "op_forward_share": dict(self.op_forward_share),
            "attention_flops_per_s": attention,
            "optimizer_seconds_per_param": dict(self.optimizer_seconds_per_param),
            "fsdp_unit_seconds": [list(point) for point in self.fsdp_unit_seconds],
            "collectives": [asdict(c) for c in self.collectives],
            "notes": list(self.notes),
        }

    def save(self, path: str | Path) -> Path:
        """Write the profile (see `save_keeping_previous`); returns the path."""
        self.save_keeping_previous(path)
        return Path(path)

    def save_keeping_previous(self, path: str | Path) -> Path | None:
        """Write the profile as JSON atomically (a temporary file of its own in the same folder, fsync,
        rename): two calibrations writing at once leave one whole profile, never a torn one. A profile
        already at `path` is never lost silently: it is kept at `previous_profile_path(path)`, which is
        returned (None when there was none to replace)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(json.dumps(self.to_dict(), indent=2) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, 0o644)
            try:
                os.link(tmp, path)  # the first profile for this key: created only if none is there, atomically
                return None
            except FileExistsError:
                previous = previous_profile_path(path)
                with contextlib.suppress(FileNotFoundError):
                    os.replace(_copy_beside(path), previous)
                os.replace(tmp, path)
                return previous
            except OSError:  # a file system without hard links: replace, keeping what was there
                previous = previous_profile_path(path) if path.exists() else None
                if previous is not None:
                    os.replace(_copy_beside(path), previous)
                os.replace(tmp, path)
                return previous
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def busy_load_per_core(self) -> float | None:
        """The load other work put on the machine while this profile was measured, per core: the larger of
        the 1-minute load before and after, less this calibration's own busy threads; None when not recorded."""
        if self.cpu_count is None or (self.load_before is None and self.load_after is None):
            return None
        own = (self.threads or 1) * self.processes if self.device_kind == "cpu" else self.processes
        before = self.load_before or 0.0
        after = max(0.0, (self.load_after or 0.0) - own)
        return max(before, after) / max(1, self.cpu_count)


def profile_from_dict(data: object, where: str = "profile") -> DeviceProfile:
    """Validate plain data read from JSON and build a DeviceProfile (UserError naming the field)."""
    if not isinstance(data, dict):
        raise UserError(f"{where}: not a JSON object")
    version = data.get("schema_version")
    if version not in READABLE_VERSIONS:
        raise UserError(f"{where}: schema_version {version!r} is not one of "
                        f"{', '.join(map(str, READABLE_VERSIONS))}; measure it again with `flopwise calibrate`")
    device = data.get("device")
    kind = data.get("device_kind")
    if not isinstance(device, str) or not device:
        raise UserError(f"{where}: 'device' must be a non-empty string")
    if kind not in ("cpu", "cuda"):
        raise UserError(f"{where}: 'device_kind' must be 'cpu' or 'cuda', got {kind!r}")
    table = data.get("gemm_flops_per_s")
    if not isinstance(table, dict) or not table:
        raise UserError(f"{where}: 'gemm_flops_per_s' must map a dtype to [m, n, k, flops_per_s] rows")
    points = []
    for dtype, rows in table.items():
        if dtype not in DTYPES:
            raise UserError(f"{where}: gemm dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        if not isinstance(rows, list) or not rows:
            raise UserError(f"{where}: gemm_flops_per_s.{dtype} must be a non-empty list")
        for row in rows:
            if not (isinstance(row, list) and len(row) == 4 and all(_number(v) for v in row)
                    and all(v > 0 for v in row)):
                raise UserError(f"{where}: gemm_flops_per_s.{dtype} row {row!r} is not [m, n, k, flops_per_s] > 0")
            points.append(GemmPoint(dtype, int(row[0]), int(row[1]), int(row[2]), float(row[3])))
    bandwidth = data.get("memory_bandwidth_bytes_per_s")
    if not _number(bandwidth) or bandwidth <= 0:
        raise UserError(f"{where}: 'memory_bandwidth_bytes_per_s' must be a number > 0, got {bandwidth!r}")
    collectives = []
    for row in data.get("collectives") or []:
        try:
            point = CollectivePoint(str(row["op"]), int(row["world_size"]), int(row["size_bytes"]),
                                    float(row["bus_bytes_per_s"]))
        except (TypeError, KeyError, ValueError):
            raise UserError(f"{where}: collective {row!r} needs op, world_size, size_bytes, bus_bytes_per_s") from None
        collectives.append(point)
    overhead = data.get("kernel_overhead_seconds")
    if overhead is not None and (not _number(overhead) or overhead <= 0):
        raise UserError(f"{where}: 'kernel_overhead_seconds' must be a number > 0 or null, got {overhead!r}")
    elementwise = _rates(data, "op_seconds_per_element", where, ELEMENTWISE_OPS)
    forward_share = _rates(data, "op_forward_share", where, ELEMENTWISE_OPS)
    if any(share > 1 for share in forward_share.values()):
        raise UserError(f"{where}: 'op_forward_share' values must be in (0, 1]")
    attention = []
    table = data.get("attention_flops_per_s") or {}
    if not isinstance(table, dict):
        raise UserError(f"{where}: 'attention_flops_per_s' must map a dtype to [seq, head_dim, flops_per_s] rows")
    for dtype, rows in table.items():
        if dtype not in DTYPES or not isinstance(rows, list):
            raise UserError(f"{where}: attention_flops_per_s.{dtype} must be a dtype's list of [seq, head_dim, flops_per_s]")
        for row in rows:
            if not (isinstance(row, list) and len(row) == 3 and all(_number(v) and v > 0 for v in row)):
                raise UserError(f"{where}: attention_flops_per_s.{dtype} row {row!r} is not [seq, head_dim, flops_per_s] > 0")
            attention.append(AttentionPoint(dtype, int(row[0]), int(row[1]), float(row[2])))
    optimizer = _rates(data, "optimizer_seconds_per_param", where, ("adamw", "adamw_fsdp"))
    units = _fsdp_units(data.get("fsdp_unit_seconds") if version >= 3 else None, where)
    threads = data.get("threads")
    if threads is not None and not (isinstance(threads, int) and threads >= 1):
        raise UserError(f"{where}: 'threads' must be an integer >= 1 or null, got {threads!r}")
    processes = data.get("processes", 1)
    if not (isinstance(processes, int) and processes >= 1):
        raise UserError(f"{where}: 'processes' must be an integer >= 1, got {processes!r}")
    loads = {}
    for name in ("load_before", "load_after"):
        value = data.get(name)
        if value is not None and (not _number(value) or value < 0):
            raise UserError(f"{where}: '{name}' must be a number >= 0 or null, got {value!r}")
        loads[name] = float(value) if value is not None else None
    cpu_count = data.get("cpu_count")
    if cpu_count is not None and not (isinstance(cpu_count, int) and cpu_count >= 1):
        raise UserError(f"{where}: 'cpu_count' must be an integer >= 1 or null, got {cpu_count!r}")
    return DeviceProfile(
        device=device, device_kind=kind, gemm=tuple(points), memory_bandwidth_bytes_per_s=float(bandwidth),
        collectives=tuple(collectives), kernel_overhead_seconds=overhead, op_seconds_per_element=elementwise, op_forward_share=forward_share,
        attention=tuple(attention), optimizer_seconds_per_param=optimizer, fsdp_unit_seconds=units, threads=threads, processes=processes,
        torch_version=str(data.get("torch_version", "")), host=str(data.get("host", "")),
        created=str(data.get("created", "")), **loads, cpu_count=cpu_count, schema_version=version,
        notes=tuple(str(n) for n in data.get("notes") or ()),
    )


def load_profile(path: str | Path) -> DeviceProfile:
    """Read a profile written by `flopwise calibrate`; a missing, unreadable or malformed file
    is a UserError of one line naming the file."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--profile: {path} not found (write one with `flopwise calibrate --out {path}`)")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        reason = str(err).splitlines()[0] if str(err) else err.__class__.__name__
        raise UserError(f"--profile: {path} is not valid JSON ({reason})") from None
    return profile_from_dict(data, f"--profile {path}")


def _fsdp_units(rows: object, where: str) -> tuple[tuple[float, float], ...]:
    """The [[bytes, seconds], ...] FSDP unit costs (a version-2 file's single tiny-unit figure
    is not one of them: it is left out)."""
    if rows is None:
        return ()
    if not isinstance(rows, list) or not all(
            isinstance(row, list) and len(row) == 2 and all(_number(v) for v in row) and row[0] >= 0 and row[1] > 0
            for row in rows):
        raise UserError(f"{where}: 'fsdp_unit_seconds' must be a list of [bytes >= 0, seconds > 0] rows")
    return tuple((float(b), float(t)) for b, t in rows)


def _rates(data: dict, name: str, where: str, keys: tuple[str, ...]) -> dict[str, float]:
    """An optional {key: number > 0} table of a profile (empty when absent: version 1 files)."""
    table = data.get(name) or {}
    if not isinstance(table, dict):
        raise UserError(f"{where}: '{name}' must map a name to a number > 0")
    for key, value in table.items():
        if key not in keys:
            raise UserError(f"{where}: {name}.{key} is not one of {', '.join(keys)}")
        if not _number(value) or value <= 0:
            raise UserError(f"{where}: {name}.{key} must be a number > 0, got {value!r}")
    return {key: float(value) for key, value in table.items()}


def _bus_factor(op: str, n: int) -> float:
    """busbw / algbw (nccl-tests doc/PERFORMANCE.md): 2(n-1)/n for all-reduce, (n-1)/n for gathers."""
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    return 1.0


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# ---------------------------------------------------------------------- where profiles are cached


def device_slug(device: str, threads: int | None = None, processes: int = 1) -> str:
    """A file-name-safe key for a device and how it was measured, e.g. 'nvidia-h100-80gb-hbm3'
    or 'cpu-amd-epyc-1t-2p' (CPU speed depends on threads and on processes sharing it)."""
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "device"
    if threads is not None:
        slug += f"-{threads}t"
    if processes > 1:
        slug += f"-{processes}p"
    return slug


def profile_cache_dir() -> Path:
    """$XDG_CACHE_HOME/flopwise/profiles (default ~/.cache/flopwise/profiles)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "flopwise" / "profiles"


def profile_key(device: str, threads: int | None = None, processes: int = 1, host: str = "",
                torch_version: str = "") -> str:
    """What one cached profile is for: the device and how it was measured, the machine (host) and the
    torch build, e.g. 'cpu-amd-epyc-1t-2p-node7-torch2.5.1-cpu'. Two machines or two torch builds sharing
    a home directory each get their own file."""
    key = device_slug(device, threads, processes)
    if host:
        key += "-" + (re.sub(r"[^a-z0-9]+", "-", host.lower()).strip("-") or "host")
    if torch_version:
        key += "-torch" + (re.sub(r"[^a-z0-9.]+", "-", torch_version.lower()).strip("-") or "unknown")
    return key


def default_profile_path(device: str, threads: int | None = None, processes: int = 1, host: str = "",
                         torch_version: str = "") -> Path:
    """The cache file `flopwise calibrate` writes and the trainer reads, named by `profile_key`."""
    return profile_cache_dir() / f"{profile_key(device, threads, processes, host, torch_version)}.json"


def previous_profile_path(path: str | Path) -> Path:
    """Where a replaced profile is kept (`<name>.prev.json`): a new calibration never silently loses the old one."""
    path = Path(path)
    return path.with_name(f"{path.stem}.prev{path.suffix or '.json'}")


def _copy_beside(path: Path) -> str:
    """A copy of `path` in a fresh temporary file of the same folder (renamed into place by the caller)."""
    data = path.read_bytes()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".prev.tmp", dir=path.parent)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(tmp, 0o644)
    return tmp


BUSY_LOAD_PER_CORE = 0.5  # other work's 1-minute load per core above which a measurement is suspect


def busy_warning(profile: DeviceProfile) -> str | None:
    """One line when the machine was busy with other work while `profile` was measured, else None."""
    busy = profile.busy_load_per_core()
    if busy is None or busy <= BUSY_LOAD_PER_CORE:
        return None
    return (f"warning: the machine was busy while this profile was measured (other work's 1-minute load "
            f"{busy:.2f} per core, above {BUSY_LOAD_PER_CORE}); its speeds may be low: calibrate again "
            "when the machine is idle")


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file's bytes (hex): which exact profile a run was predicted with."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def hardware_from_profile(profile: DeviceProfile, key: str = "cpu-measured", memory_bytes: float | None = None):
    """A catalog-like HardwareSpec for a device the catalog has no entry for (a CPU): peaks are
    the profile's best GEMM per dtype, memory bandwidth its measured copy rate, memory (CPU, when
    not given) this machine's physical memory shared by the profile's processes."""
    from flopwise.catalog.hardware import HardwareSpec

    if memory_bytes is None and profile.device_kind == "cpu":
        try:
            memory_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / profile.processes
        except (ValueError, OSError, AttributeError):
            memory_bytes = None
    source = f"device profile of {profile.device} ({profile.created or 'undated'}), best measured GEMM per dtype"
    return HardwareSpec(
        key=key,
        name=f"{profile.device}, measured",
        vendor=profile.device_kind,
        peak_tflops={dtype: profile.peak_flops(dtype) / 1e12 for dtype in profile.dtypes()},
        sparse_factor=None,
        memory_gb=memory_bytes / 2**30 if memory_bytes else None,
        memory_unit="GiB",
        memory_bandwidth_gbs=profile.memory_bandwidth_bytes_per_s / 1e9,
        scale_up_gbs=(profile.collective_bus_bytes_per_s or 0) / 1e9 or None,
        devices_per_node=profile.processes,
        scale_out_gbs=None,
        tdp_w=None,
        sources={"peak_tflops": source, "memory_bandwidth_gbs": "device profile: large copy",
                 "memory_gb": "physical memory / processes" if memory_bytes else "unknown"},
        confidence={"peak_tflops": "measured", "memory_bandwidth_gbs": "measured"},
        notes="stands in for a catalog entry: built from a device profile",
    )
