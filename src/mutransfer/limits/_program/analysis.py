"""The structure and needs passes. The structure pass is a `Run` with `compute=False` on one
example per side: it checks every op has an exact rule (else `NotExact` naming the op and the
graph node), and records what each node reads of its inputs. The needs pass goes backwards over
those records: which width tensors need their full spatial covariance (a global mean or an
average pool downstream) and which only its diagonal (everything else)."""

from __future__ import annotations

from torch import fx

__all__ = ["needs"]


def needs(gm: fx.GraphModule, requires: dict) -> dict:
    """Backwards: a node needs its full spatial kernel if some consumer needs it full."""
    full: dict = {}
    consumers: dict = {}
    for node, reqs in requires.items():
        for src, how in reqs:
            consumers.setdefault(src, []).append((node, how))
    for node in reversed(list(gm.graph.nodes)):
        need = False
        for cons, how in consumers.get(node, []):
            if how == "full" or (how == "pass" and full.get(cons, False)):
                need = True
        full[node] = need
    return full
