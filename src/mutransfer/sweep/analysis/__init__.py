"""What the trials say, numbers only: `analysis` (per-cell results) → `statistics` → `verdict`,
`hparam_fits`, `loss_law`, `flop_law`, `forecasts`, `trajectory` → `summary` (summary.json)."""

__all__: list[str] = []
