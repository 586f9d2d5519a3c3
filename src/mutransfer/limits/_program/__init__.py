"""The master theorem run on a PyTorch module: trace it into a program and propagate NNGP and NTK
kernels through it, one rule per op (see `.._layers` for each kernel operation's convention and
cost, `.._fields` for what is propagated).

- `trace`: torch.fx, or torch.export's ATen graph where fx cannot trace the module;
- `run`: one pass over the graph (`Run`): values, the kernels of width tensors, the node walk;
- `dispatch`: the tables op → rule; `rules/`: the rules, one module per family of ops;
- `analysis`: the structure pass (every op has a rule) and the needs pass (full spatial
  covariance or its diagonal);
- `propagate`: `program_kernels`, the kernel pass in chunks of x1 rows, float64.
"""

from .propagate import prepare_inputs, program_kernels
from .trace import NotExact, trace

__all__ = ["NotExact", "prepare_inputs", "program_kernels", "trace"]
