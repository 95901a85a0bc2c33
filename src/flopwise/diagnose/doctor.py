"""`flopwise doctor`: is this machine ready to train, and if not, what to change.

Each check is a row: a name, a status (ok / warn / fail), what was found, and a one-line
fix. The checks follow the seed articles' troubleshooting list (CUDA version vs driver,
"H100 needs CUDA 12+", Ascend needs its own PyTorch adapter, NCCL_DEBUG=INFO when NCCL
misbehaves) plus what a torchrun / FSDP2 / DeepSpeed job needs. Everything here works
where torch is absent: that is itself a finding, not a crash.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

STATUSES = ("ok", "warn", "fail")

TORCH_INSTALL = "pip install torch (choose the CUDA or CPU build at https://pytorch.org/get-started/locally/)"

OPTIONAL_PACKAGES = {
    "deepspeed": "flopwise[deepspeed]",
    "transformers": "flopwise[hf]",
    "torchao": "flopwise[compress]",
    "tokenizers": "flopwise[train]",
    "tensorboard": "flopwise[train]",
    "wandb": "flopwise[wandb]",
    "matplotlib": "flopwise[train]",
    "psutil": "flopwise[train]",
}

# First CUDA toolkit that can build native code (cubin) for a compute capability.
# Sources: NVIDIA Ampere/Hopper/Blackwell compatibility guides and CUDA release notes
# (sm_80: 11.0, sm_86: 11.1, sm_89 and sm_90: 11.8, sm_100 / sm_120: 12.8).
MIN_CUDA_FOR_CAPABILITY = {
    (7, 0): (9, 0),
    (7, 5): (10, 0),
    (8, 0): (11, 0),
    (8, 6): (11, 1),
    (8, 9): (11, 8),
    (9, 0): (11, 8),
    (10, 0): (12, 8),
    (12, 0): (12, 8),
}


@dataclass(frozen=True)
class Check:
    """One doctor row. `fix` says what to do; empty when nothing needs doing."""

    name: str
    status: str
    value: str
    fix: str = ""

    def to_dict(self) -> dict:
        """Plain dict for `--json`."""
        return asdict(self)


def run_checks() -> list[Check]:
    """Run every check in a fixed order: interpreter, torch, GPUs, host, distributed, packages, env."""
    checks = [check_python(sys.version_info[:3])]
    checks += accelerator_checks()
    try:
        import torch
    except ImportError:
        checks.append(Check("torch", "fail", "not installed", TORCH_INSTALL))
    else:
        checks += torch_checks(torch)
    checks += host_checks()
    checks += package_checks()
    checks += env_checks()
    return checks


def has_failures(checks: list[Check]) -> bool:
    """True when any row failed; the CLI exits non-zero then."""
    return any(c.status == "fail" for c in checks)


# --------------------------------------------------------------------------- python


def check_python(version: tuple[int, int, int]) -> Check:
    """flopwise needs Python 3.10+ (pyproject `requires-python`)."""
    text = ".".join(str(v) for v in version)
    if version[:2] < (3, 10):
        return Check("python", "fail", text, "use Python 3.10 or newer")
    return Check("python", "ok", text)


# --------------------------------------------------------------------------- accelerators seen by the OS


def nvidia_gpu_visible_to_os() -> bool:
    """An NVIDIA kernel driver is loaded (independent of how torch was built)."""
    return Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi") is not None


def ascend_npu_visible_to_os() -> bool:
    """Huawei Ascend devices show up as /dev/davinci<N>; `npu-smi` ships with the driver."""
    return Path("/dev/davinci0").exists() or shutil.which("npu-smi") is not None


def amd_gpu_visible_to_os() -> bool:
    """ROCm's kernel driver exposes /dev/kfd."""
    return Path("/dev/kfd").exists()


def accelerator_checks() -> list[Check]:
    """Which accelerator the OS shows, and advice for the ones that need a special PyTorch."""
    rows: list[Check] = []
    if ascend_npu_visible_to_os():
        try:
            import torch_npu  # noqa: F401
        except ImportError:
            rows.append(
                Check(
                    "ascend",
                    "fail",
                    "Ascend NPU present, torch_npu not installed",
                    "install Huawei's torch_npu adapter matching your torch version "
                    "(pip install torch==X torch_npu==X) and source the CANN toolkit "
                    "(/usr/local/Ascend/ascend-toolkit/set_env.sh)",
                )
            )
        else:
            rows.append(
                Check(
                    "ascend",
                    "warn",
                    "Ascend NPU with torch_npu",
                    "collectives on Ascend use the 'hccl' backend; flopwise's train and bench "
                    "use nccl/gloo, so run them on CPU (gloo) here or use Ascend's own launcher",
                )
            )
    if nvidia_gpu_visible_to_os():
        rows += nvidia_smi_checks()
    if not rows and not amd_gpu_visible_to_os():
        rows.append(Check("accelerator", "ok", "none found: CPU only (gloo backend)"))
    return rows


def nvidia_smi_checks() -> list[Check]:
    """Per-GPU snapshot from nvidia-smi: driver, clocks, temperature, utilisation.

    Works without torch, and gives the clocks / thermal view a straggling GPU needs.
    """
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return [Check("nvidia driver", "ok", read_nvidia_proc_version() or "loaded")]
    fields = "index,name,driver_version,temperature.gpu,utilization.gpu,clocks.sm,clocks.max.sm"
    try:
        out = subprocess.run(
            [exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=15,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError) as err:
        return [Check("nvidia-smi", "fail", f"did not answer: {err}", "check the NVIDIA driver (dmesg, `nvidia-smi`)")]
    rows = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 7:
            continue
        idx, name, driver, temp, util, sm, sm_max = parts
        rows.append(
            Check(
                f"gpu{idx} (nvidia-smi)",
                "ok",
                f"{name}, driver {driver}, {temp} C, util {util}%, SM clock {sm}/{sm_max} MHz",
            )
        )
    return rows


def read_nvidia_proc_version() -> str:
    """Driver version line from /proc, '' when absent."""
    try:
        return Path("/proc/driver/nvidia/version").read_text().splitlines()[0].strip()
    except (OSError, IndexError):
        return ""


def driver_cuda_version() -> tuple[int, int] | None:
    """Highest CUDA version the installed driver supports (cuDriverGetVersion), None without libcuda."""
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        version = ctypes.c_int()
        if lib.cuDriverGetVersion(ctypes.byref(version)) == 0:
            return version.value // 1000, (version.value % 1000) // 10
    return None


# --------------------------------------------------------------------------- torch


def parse_version(text: str | None) -> tuple[int, ...]:
    """'12.8' / '2.13.0+cu128' -> (12, 8) / (2, 13, 0); () when unparseable."""
    if not text:
        return ()
    core = text.split("+")[0]
    out = []
    for part in core.split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
        if not part.isdigit():
            break
    return tuple(out)


def torch_checks(torch) -> list[Check]:
    """torch version, build flavour, devices, distributed backends, FSDP2 and pipelining."""
    version = torch.__version__
    rows = [
        Check("torch", "ok", version)
        if parse_version(version) >= (2, 6)
        else Check("torch", "warn", version, "FSDP2 fully_shard needs torch >= 2.6: " + TORCH_INSTALL)
    ]
    rows.append(
        build_check(
            torch.version.cuda,
            getattr(torch.version, "hip", None),
            nvidia_gpu_visible_to_os(),
            amd_gpu_visible_to_os(),
        )
    )
    if torch.version.cuda or getattr(torch.version, "hip", None):
        rows += cuda_device_checks(torch)
    rows += distributed_checks(torch)
    return rows


def build_check(cuda: str | None, hip: str | None, nvidia_gpu_present: bool, amd_gpu_present: bool = False) -> Check:
    """Which build of torch is installed, and whether it matches the hardware."""
    if hip:
        return Check(
            "torch build",
            "ok",
            f"ROCm {hip}",
            "on ROCm the 'nccl' backend is RCCL and torch.cuda.* addresses AMD GPUs; "
            "select devices with HIP_VISIBLE_DEVICES, watch them with rocm-smi",
        )
    if cuda:
        return Check("torch build", "ok", f"CUDA {cuda}")
    if nvidia_gpu_present:
        return Check(
            "torch build",
            "fail",
            "CPU-only build on a machine with an NVIDIA GPU",
            "reinstall a CUDA build: " + TORCH_INSTALL,
        )
    if amd_gpu_present:
        return Check(
            "torch build",
            "warn",
            "CPU-only build on a machine with an AMD GPU (/dev/kfd)",
            "install the ROCm build of torch: " + TORCH_INSTALL,
        )
    return Check("torch build", "ok", "CPU build (gloo backend, CPU training)")


def arch_supported(capability: tuple[int, int], arch_list: list[str]) -> bool:
    """Whether torch carries code for a GPU: a cubin runs on the same major, equal-or-higher minor;
    PTX (compute_XY) is JIT-compiled for any equal-or-newer GPU (NVIDIA compatibility guides)."""
    major, minor = capability
    for arch in arch_list:
        kind, _, num = arch.partition("_")
        digits = "".join(ch for ch in num if ch.isdigit())
        if len(digits) < 2:
            continue
        a_major, a_minor = int(digits[:-1]), int(digits[-1])
        if kind == "sm" and a_major == major and a_minor <= minor:
            return True
        if kind == "compute" and (a_major, a_minor) <= (major, minor):
            return True
    return False


def capability_check(
    index: int, name: str, capability: tuple[int, int], torch_cuda: str | None, arch_list: list[str]
) -> Check:
    """Can this torch build run kernels on this GPU, with a CUDA new enough for it?

    Hopper (cc 9.0, H100/H200) first appeared in CUDA 11.8 (NVIDIA Hopper compatibility
    guide); the seed article's "H100 needs CUDA 12+" is stricter than the vendor's floor,
    so 11.8 is a warning (FP8 and most Hopper-tuned kernels need 12.x) and < 11.8 a failure.
    """
    label = f"gpu{index}"
    cc_text = f"{name}, compute capability {capability[0]}.{capability[1]}"
    cuda = parse_version(torch_cuda)[:2]
    known = [cc for cc in MIN_CUDA_FOR_CAPABILITY if cc <= capability]
    need = MIN_CUDA_FOR_CAPABILITY[max(known)] if known else None
    if need and cuda and cuda < need:
        return Check(
            label,
            "fail",
            f"{cc_text}; torch built with CUDA {torch_cuda}",
            f"this GPU needs CUDA >= {need[0]}.{need[1]}: " + TORCH_INSTALL,
        )
    if arch_list and not arch_supported(capability, arch_list):
        return Check(
            label,
            "fail",
            f"{cc_text}; torch has kernels for {' '.join(arch_list)}",
            "install a torch build that includes sm_%d%d: " % capability + TORCH_INSTALL,
        )
    if capability >= (9, 0) and cuda and cuda < (12, 0):
        return Check(
            label,
            "warn",
            f"{cc_text}; torch built with CUDA {torch_cuda}",
            "Hopper runs on CUDA 11.8 but FP8 and Hopper-tuned kernels need CUDA 12+: " + TORCH_INSTALL,
        )
    return Check(label, "ok", cc_text)


def driver_check(driver: tuple[int, int] | None, torch_cuda: str | None) -> Check:
    """The driver must support the CUDA runtime torch was built with.

    CUDA minor-version compatibility (CUDA compatibility guide): a 12.x runtime runs on any
    12.y driver, with limits (no PTX JIT of newer code), so a newer minor is a warning and
    a newer major is a failure.
    """
    runtime = parse_version(torch_cuda)[:2]
    if driver is None:
        return Check("cuda driver", "fail", "libcuda not found", "install the NVIDIA driver (nvidia-smi must work)")
    text = f"driver supports CUDA {driver[0]}.{driver[1]}; torch runtime {torch_cuda}"
    if not runtime or driver >= runtime:
        return Check("cuda driver", "ok", text)
    if driver[0] < runtime[0]:
        return Check("cuda driver", "fail", text, f"upgrade the NVIDIA driver to one for CUDA {runtime[0]}.x, or install a torch built for CUDA {driver[0]}.x")
    return Check("cuda driver", "warn", text, "works by minor-version compatibility; upgrade the driver if kernels fail to load (PTX JIT)")


def cuda_device_checks(torch) -> list[Check]:
    """Devices, capability, driver, bf16, NCCL and free memory, as torch sees them."""
    try:
        available = torch.cuda.is_available()
        count = torch.cuda.device_count()
    except Exception as err:  # a broken driver raises from inside torch
        return [Check("cuda", "fail", f"torch.cuda failed: {err}", "check the driver with nvidia-smi")]
    if not available or count == 0:
        hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
        why = " (CUDA_VISIBLE_DEVICES='%s')" % hidden if hidden is not None else ""
        return [Check("cuda", "fail", f"CUDA build but no usable GPU{why}", "check nvidia-smi, the driver, and CUDA_VISIBLE_DEVICES")]
    rows = []
    is_rocm = bool(getattr(torch.version, "hip", None))
    arch_list = list(torch.cuda.get_arch_list()) if not is_rocm else []
    for i in range(count):
        cap = torch.cuda.get_device_capability(i)
        name = torch.cuda.get_device_name(i)
        rows.append(
            capability_check(i, name, cap, torch.version.cuda, arch_list)
            if not is_rocm
            else Check(f"gpu{i}", "ok", f"{name} ({torch.cuda.get_device_properties(i).gcnArchName})")
        )
        free, total = torch.cuda.mem_get_info(i)
        used_share = 1 - free / total
        rows.append(
            Check(
                f"gpu{i} memory",
                "ok" if used_share < 0.1 else "warn",
                f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB free",
                "" if used_share < 0.1 else "another process holds GPU memory: see nvidia-smi and stop it",
            )
        )
    if not is_rocm:
        rows.append(driver_check(driver_cuda_version(), torch.version.cuda))
    bf16 = torch.cuda.is_bf16_supported()
    rows.append(
        Check("bf16", "ok", "supported")
        if bf16
        else Check("bf16", "warn", "not supported (pre-Ampere GPU)", "use precision.mode=fp16 (loss scaling) instead of bf16")
    )
    try:
        nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
        rows.append(Check("nccl", "ok", nccl))
    except Exception as err:
        rows.append(Check("nccl", "fail", f"unavailable: {err}", "install a torch build with NCCL: " + TORCH_INSTALL))
    return rows


def distributed_checks(torch) -> list[Check]:
    """torch.distributed backends and the two APIs flopwise trains with (FSDP2, pipelining)."""
    import torch.distributed as dist

    if not dist.is_available():
        return [Check("torch.distributed", "fail", "not built in", TORCH_INSTALL)]
    backends = {
        "gloo": dist.is_gloo_available(),
        "nccl": dist.is_nccl_available(),
        "mpi": dist.is_mpi_available(),
    }
    have = ", ".join(k for k, v in backends.items() if v) or "none"
    needs_nccl = bool(torch.version.cuda) and not backends["nccl"]
    rows = [
        Check(
            "distributed backends",
            "fail" if not backends["gloo"] or needs_nccl else "ok",
            have,
            "install an official torch build (it ships gloo, and nccl on CUDA)" if not backends["gloo"] or needs_nccl else "",
        )
    ]
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401

        rows.append(Check("fsdp2 (fully_shard)", "ok", "importable"))
    except ImportError as err:
        rows.append(Check("fsdp2 (fully_shard)", "fail", f"import failed: {err}", "needs torch >= 2.6: " + TORCH_INSTALL))
    try:
        import torch.distributed.pipelining  # noqa: F401

        rows.append(Check("pipelining", "ok", "importable"))
    except ImportError as err:
        rows.append(Check("pipelining", "warn", f"import failed: {err}", "parallel.strategy=pipeline needs torch >= 2.4"))
    return rows


# --------------------------------------------------------------------------- host


def host_checks() -> list[Check]:
    """CPU cores, RAM and intra-op threads: the limits of the CPU (gloo) path and of data loading."""
    logical = os.cpu_count() or 1
    try:
        import psutil

        physical = psutil.cpu_count(logical=False) or logical
        mem = psutil.virtual_memory()
        total, available = mem.total, mem.available
    except ImportError:
        physical = logical
        pages = os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
        total = available = pages * os.sysconf("SC_PAGE_SIZE") if pages else 0
    rows = [Check("cpu cores", "ok", f"{logical} logical, {physical} physical")]
    if total:
        low = available < 4 * 2**30
        rows.append(
            Check(
                "ram",
                "warn" if low else "ok",
                f"{available / 2**30:.1f} of {total / 2**30:.1f} GiB available",
                "under 4 GiB free: use a smaller model or batch, or close other jobs" if low else "",
            )
        )
    rows.append(threads_check(os.environ.get("OMP_NUM_THREADS"), logical))
    return rows


def threads_check(omp_num_threads: str | None, logical_cores: int) -> Check:
    """OMP_NUM_THREADS x processes should not exceed the cores, or CPU ranks fight for them."""
    if omp_num_threads is None:
        return Check(
            "threads",
            "ok",
            f"OMP_NUM_THREADS unset ({logical_cores} cores)",
            "torchrun sets it to 1 per process; for CPU runs set OMP_NUM_THREADS = cores / processes",
        )
    try:
        n = int(omp_num_threads)
    except ValueError:
        return Check("threads", "fail", f"OMP_NUM_THREADS={omp_num_threads!r}", "set OMP_NUM_THREADS to a whole number, e.g. 1")
    if n > logical_cores:
        return Check("threads", "warn", f"OMP_NUM_THREADS={n} > {logical_cores} cores", f"set OMP_NUM_THREADS <= {logical_cores}")
    return Check("threads", "ok", f"OMP_NUM_THREADS={n} ({logical_cores} cores)")


# --------------------------------------------------------------------------- packages


def package_checks() -> list[Check]:
    """Versions of optional packages, read from metadata (no import: deepspeed's import is slow)."""
    rows = []
    for name, extra in OPTIONAL_PACKAGES.items():
        try:
            rows.append(Check(name, "ok", importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            rows.append(Check(name, "warn", "not installed", f"pip install '{extra}' if you need it"))
    return rows


# --------------------------------------------------------------------------- environment variables


def network_interfaces() -> list[str]:
    """Names of this host's network interfaces."""
    try:
        return [name for _, name in socket.if_nameindex()]
    except OSError:
        return []


def socket_ifname_check(value: str | None, interfaces: list[str]) -> Check:
    """NCCL_SOCKET_IFNAME must match an interface: a prefix list, '^' excludes, '=' exact (NCCL env docs)."""
    if value is None:
        return Check("NCCL_SOCKET_IFNAME", "ok", "unset (NCCL picks an interface)", "set it to your fast NIC (e.g. ib0, eth0) if NCCL picks the wrong one")
    if value.startswith("^"):
        return Check("NCCL_SOCKET_IFNAME", "ok", value)
    exact = value.startswith("=")
    wanted = [w for w in value.lstrip("=").split(",") if w]
    hits = [i for i in interfaces if any((i == w) if exact else i.startswith(w) for w in wanted)]
    if hits:
        return Check("NCCL_SOCKET_IFNAME", "ok", f"{value} -> {', '.join(hits)}")
    return Check(
        "NCCL_SOCKET_IFNAME",
        "fail",
        f"{value} matches no interface (have: {', '.join(interfaces) or 'none'})",
        "set NCCL_SOCKET_IFNAME to one of the interfaces listed (ip addr), or unset it",
    )


def master_checks(addr: str | None, port: str | None) -> list[Check]:
    """MASTER_ADDR must resolve and MASTER_PORT be a port number (torchrun sets both itself)."""
    rows = []
    if addr is None:
        rows.append(Check("MASTER_ADDR", "ok", "unset (torchrun sets it)"))
    else:
        try:
            rows.append(Check("MASTER_ADDR", "ok", f"{addr} -> {socket.gethostbyname(addr)}"))
        except OSError:
            rows.append(Check("MASTER_ADDR", "fail", f"{addr} does not resolve", "use an IP address or a host name this machine can resolve"))
    if port is None:
        rows.append(Check("MASTER_PORT", "ok", "unset (torchrun sets it)"))
    elif port.isdigit() and 0 < int(port) < 65536:
        rows.append(Check("MASTER_PORT", "ok", port))
    else:
        rows.append(Check("MASTER_PORT", "fail", repr(port), "set MASTER_PORT to a free port number 1024-65535"))
    return rows


def env_checks() -> list[Check]:
    """Environment variables that change how distributed jobs behave."""
    env = os.environ
    debug = env.get("NCCL_DEBUG")
    rows = [
        Check("NCCL_DEBUG", "ok", debug)
        if debug
        else Check("NCCL_DEBUG", "ok", "unset", "set NCCL_DEBUG=INFO when a NCCL job hangs or is slow: it logs rings, transports (NVLink/IB/socket)")
    ]
    rows.append(socket_ifname_check(env.get("NCCL_SOCKET_IFNAME"), network_interfaces()))
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        rows.append(Check("CUDA_VISIBLE_DEVICES", "ok", "unset (all GPUs visible)"))
    elif visible.strip() in ("", "-1"):
        rows.append(Check("CUDA_VISIBLE_DEVICES", "warn", repr(visible) + " hides every GPU", "unset it to use the GPUs"))
    else:
        rows.append(Check("CUDA_VISIBLE_DEVICES", "ok", visible))
    rows += master_checks(env.get("MASTER_ADDR"), env.get("MASTER_PORT"))
    return rows
