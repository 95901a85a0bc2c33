"""Starting a run: in-process or torchrun, cluster job files, the run lock, heartbeats."""
