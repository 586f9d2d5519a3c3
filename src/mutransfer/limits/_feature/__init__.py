"""The µP feature-learning limit of a traced module (`FeatureLimit`), run by the master theorem on
particles: `trace` (the graph, the entrywise probe), `ops` (what each node is), `scaling` (the µP constants observed on the
parametrized model), `family` (the Gaussian families of one hidden matrix), `program` (the forward
and backward passes on particles), `limit` (the public class)."""

from .limit import FeatureLimit

__all__ = ["FeatureLimit"]
