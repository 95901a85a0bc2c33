"""Optional dependencies: a missing one is one line naming the `pip install` that adds it.

flopwise's core (plan, catalog, config checks) needs only pyyaml, pydantic, typer and
rich; the rest comes with extras (pyproject.toml `[project.optional-dependencies]`).
"""

from __future__ import annotations

# top-level import name -> the extra that installs it
EXTRA_OF_MODULE = {
    "torch": "train", "numpy": "train", "tokenizers": "train", "safetensors": "train",
    "tensorboard": "train", "matplotlib": "train", "tfrecord": "train", "psutil": "train",
    "transformers": "hf", "deepspeed": "deepspeed", "torchao": "compress", "sklearn": "compress",
    "wandb": "wandb", "peft": "finetune",
}
PACKAGE_OF_MODULE = {"sklearn": "scikit-learn"}


def missing_extra_message(err: ModuleNotFoundError) -> str | None:
    """`numpy is not installed: pip install 'flopwise[train]'` for a known optional module; None otherwise."""
    name = (err.name or "").split(".")[0]
    extra = EXTRA_OF_MODULE.get(name)
    if extra is None:
        return None
    package = PACKAGE_OF_MODULE.get(name, name)
    hint = " (install the torch build for your machine first, see README)" if name == "torch" else ""
    return f"{package} is not installed, and this command needs it: pip install 'flopwise[{extra}]'{hint}"
