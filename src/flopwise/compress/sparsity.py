"""2:4 semi-structured sparsity: in every group of 4 consecutive input weights, 2 are zero.

Masks keep the 2 largest |w| of each group along the input dimension (the layout NVIDIA
Sparse Tensor Cores accelerate; Mishra et al. 2021, arXiv:2104.08378). On a CUDA GPU with
compute capability >= 8.0, `torch.sparse.to_sparse_semi_structured` swaps in the
compressed format for real speed, only for matrices large enough to gain. On a CPU there
is no 2:4 kernel: flopwise applies the masks and measures quality only, and says so.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import prune

# cuSPARSELt / CUTLASS semi-structured kernels need both dims to be multiples of 64 (fp16/bf16);
# below ~1k the dense GEMM is launch-bound and the sparse one is not faster
# (PyTorch "Accelerating BERT with semi-structured sparsity" tutorial).
SEMI_STRUCTURED_MULTIPLE = 64
SEMI_STRUCTURED_MIN_DIM = 1024
CPU_NOTE = "2:4 on CPU: masks and quality only; no CPU kernel exploits 2:4, so latency is unchanged"


def two_four_mask(weight: torch.Tensor) -> torch.Tensor:
    """A 0/1 mask keeping the 2 largest-magnitude weights of each group of 4 along the last (input) dim."""
    out_features = weight.shape[0]
    flat = weight.detach().reshape(out_features, -1)
    groups = flat.abs().reshape(out_features, -1, 4)
    keep = groups.topk(2, dim=-1).indices
    mask = torch.zeros_like(groups).scatter_(-1, keep, 1.0)
    return mask.reshape(weight.shape)


def two_four_layers(model: nn.Module) -> tuple[list[tuple[str, nn.Linear]], list[str]]:
    """Linear layers whose input dim is a multiple of 4 (eligible), and the names of those skipped."""
    from flopwise.compress.prune import prunable_layers

    eligible, skipped = [], []
    for name, module in prunable_layers(model):
        if isinstance(module, nn.Linear) and module.in_features % 4 == 0:
            eligible.append((name, module))
        else:
            skipped.append(name)
    return eligible, skipped


def apply_two_four(model: nn.Module) -> list[str]:
    """Attach fixed 2:4 masks (they do not change during fine-tuning); returns the skipped layer names."""
    eligible, skipped = two_four_layers(model)
    for _, module in eligible:
        prune.custom_from_mask(module, "weight", two_four_mask(module.weight))
    return skipped


def is_two_four(weight: torch.Tensor) -> bool:
    """True when every group of 4 along the input dim has at least 2 zeros."""
    groups = weight.detach().reshape(weight.shape[0], -1, 4)
    return bool(((groups == 0).sum(-1) >= 2).all())


def semi_structured_supported() -> tuple[bool, str]:
    """Whether this machine has the 2:4 kernels, with the reason when it does not."""
    if not torch.cuda.is_available():
        return False, CPU_NOTE
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        return False, f"CUDA compute capability {major}.{minor} < 8.0: no Sparse Tensor Cores; masks and quality only"
    return True, f"CUDA compute capability {major}.{minor}: to_sparse_semi_structured on eligible layers"


def accelerate_two_four(model: nn.Module) -> list[str]:
    """On a capable GPU, store eligible 2:4 weights (fp16/bf16, big enough) in the compressed sparse format.

    Returns the names of the layers converted; an empty list where the hardware cannot.
    """
    supported, _ = semi_structured_supported()
    if not supported:
        return []
    from torch.sparse import to_sparse_semi_structured

    converted = []
    eligible, _ = two_four_layers(model)
    for name, module in eligible:
        w = module.weight
        big_enough = min(w.shape) >= SEMI_STRUCTURED_MIN_DIM and all(d % SEMI_STRUCTURED_MULTIPLE == 0 for d in w.shape)
        if w.is_cuda and w.dtype in (torch.float16, torch.bfloat16) and big_enough and is_two_four(w):
            module.weight = nn.Parameter(to_sparse_semi_structured(w.detach()), requires_grad=False)
            converted.append(name)
    return converted
