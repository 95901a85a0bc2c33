"""Distribution: process groups, the mesh, FSDP2/DDP/TP/pipeline, strategies, comm bytes."""
