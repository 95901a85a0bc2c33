"""Two gloo ranks under torchrun: a tiny model sharded with FSDP2 after a technique is applied gives the
loss and gradients of the same model without it (the technique's tests share this run)."""

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import os, sys, torch, torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from flopwise.train.techniques.activation_checkpointing import apply_activation_checkpointing
    from flopwise.train.techniques.activation_offload import apply_activation_offload
    from flopwise.config.schema import ModelConfig
    from flopwise.train.model import build_model, transformer_blocks

    dist.init_process_group("gloo")
    cfg = ModelConfig(n_layers=2, hidden=32, n_heads=4, max_seq_len=16)

    def sharded(applied):
        torch.manual_seed(0)
        model = build_model(cfg, 61)
        if applied:
    {apply}
        for block in transformer_blocks(model):
            fully_shard(block)
        fully_shard(model)
        return model

    torch.manual_seed(dist.get_rank())
    ids = torch.randint(0, 61, (2, 16))
    results = []
    for applied in (False, True):
        model = sharded(applied)
        loss = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
        loss.backward()
        results.append((loss.detach(), {{n: p.grad.full_tensor() for n, p in model.named_parameters()}}))
    (loss_a, grads_a), (loss_b, grads_b) = results
    {compare_loss}
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-5, atol=1e-7)
    print(f"rank {{dist.get_rank()}} ok")
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown, as train/launch/worker.py: gloo threads can abort there
    """
)


def run_fsdp_equivalence(tmp_path, apply: list[str], compare_loss: str) -> None:
    """Run SCRIPT on two ranks with `apply` (lines run on the model when the technique is on) and
    `compare_loss` (how the two losses must agree); both ranks must report success."""
    body = "\n".join("        " + line for line in apply)
    script = tmp_path / "fsdp_equivalence.py"
    script.write_text(SCRIPT.format(apply=body, compare_loss=compare_loss))
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "rank 0 ok" in result.stdout and "rank 1 ok" in result.stdout
