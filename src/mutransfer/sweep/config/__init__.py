"""The sweep config: `schema` (every key as data) → `_checks` (each key's checks) → `config` (`SweepConfig`,
`load_config`); beside them `cells`, `space` (grids), `urls` (storage URLs, masked) and `placement` (the
devices key parsed, slots planned). Imports nothing of the sweep engine."""

__all__: list[str] = []
