"""Starting workers: `processes` (worker processes, `NodeTask`) → `workers` (`run_sweep` on this machine) and
`cluster` (job arrays through submitit: Slurm or local)."""

__all__: list[str] = []
