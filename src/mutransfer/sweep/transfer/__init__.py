"""From proxy to target: `target_hparams` → `transfer` (transfer.json) → `demo`."""

__all__: list[str] = []
