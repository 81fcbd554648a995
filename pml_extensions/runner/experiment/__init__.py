"""Where a run's files are written: the experiment folder, checkpoints, the epoch loop, torchrun ranks."""
