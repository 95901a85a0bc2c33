"""flopwise.compress: INT8 PTQ / QAT, magnitude pruning and 2:4 sparsity, measured before and after.

`load_compressed(path)` loads what `flopwise compress` wrote.
"""


def load_compressed(path, compile: bool = False, trust: bool = False):
    """Load a compressed model folder written by `flopwise compress` (see flopwise.compress.artifact).

    Folders not written by this user's flopwise are refused unless `trust=True`: loading a
    `.pt2` can run code stored in it (docs/compress.md, "Trust boundary").
    """
    from flopwise.compress.artifact import load_compressed as _load

    return _load(path, compile=compile, trust=trust)
