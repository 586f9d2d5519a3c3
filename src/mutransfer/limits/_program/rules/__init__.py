"""The op rules, one module per family of ops; each rule is a function `rule(run, ...)` of the
current `Run` and the op's arguments, returning the op's value (a `Field` for a width tensor).
`..dispatch` maps every op (module class, torch function, tensor method) to its rule.

- `linear`: Linear and Conv layers (the random matrices), weight sharing refused
- `elementwise`: nonlinearities, clamp/pow/sign, sums, scalar products, gated products
- `normalization`: LayerNorm over the width
- `shape`: view/reshape/permute/flatten, concatenation along the width, `.size()`
- `pooling`: average pools, adaptive pools, padding, mean/sum over position axes
"""
