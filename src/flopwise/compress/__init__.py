"""flopwise.compress: INT8 PTQ / QAT, magnitude pruning and 2:4 sparsity, measured before and after.

`load_compressed(path)` loads what `flopwise compress` wrote.
"""


def load_compressed(path, compile: bool = False):
    """Load a compressed model folder written by `flopwise compress` (see flopwise.compress.artifact)."""
    from flopwise.compress.artifact import load_compressed as _load

    register_quantized_ops()
    return _load(path, compile=compile)


def register_quantized_ops() -> None:
    """Register the `quantized_decomposed` ops an INT8 `.pt2` graph calls; without them a fresh
    process cannot deserialize it ("failed to resolve torch.ops.quantized_decomposed...")."""
    import logging

    logging.getLogger("torchao").setLevel(logging.ERROR)  # CUDA-library load notices on a CPU
    import torchao.quantization.pt2e  # noqa: F401  (registers the ops on import)
