"""Running trials: `storage` (Optuna RDB, `_sql`) → `studies` (one per cell) → `trials` (claiming, running,
outcomes; `flops`, `recording`, `interrupts`) → `runner` (the `Sweep` facade, the work loop; `rundir`,
`independent`: the per-parameter sampler)."""

__all__: list[str] = []
