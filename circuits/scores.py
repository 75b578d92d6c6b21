"""ScoreMatrix: per-example attribution scores [N examples x E edges or nodes] with their context."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .graph import ComponentGraph


@dataclass
class ScoreMatrix:
    """Per-example scores of one method; never only the dataset mean."""

    scores: np.ndarray  # [N, E] float32
    graph: ComponentGraph
    level: str  # "edge" | "node"
    method: str
    ablation: str
    metric: str
    example_ids: np.ndarray | None = None
    params: dict = field(default_factory=dict)
    provenance: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.scores = np.ascontiguousarray(self.scores, dtype=np.float32)
        if self.scores.ndim != 2 or self.scores.shape[1] != len(self.names):
            raise ValueError(
                f"scores must be [N, {len(self.names)}] for level={self.level!r}, got {self.scores.shape}"
            )
        if self.example_ids is None:
            self.example_ids = np.arange(self.scores.shape[0], dtype=np.int64)

    @property
    def names(self) -> list[str]:
        """Edge names (level edge) or sender names (level node), one per column."""
        return self.graph.edge_names if self.level == "edge" else self.graph.senders

    @property
    def n_examples(self) -> int:
        """Number of examples (rows)."""
        return self.scores.shape[0]

    def mean(self) -> np.ndarray:
        """Dataset mean per column, accumulated in float64 and divided once by N."""
        return (self.scores.astype(np.float64).sum(0) / self.n_examples).astype(np.float32)

    def column(self, name: str) -> np.ndarray:
        """Per-example scores of one edge or node by name."""
        return self.scores[:, self.names.index(name)]

    def describe(self) -> dict:
        """Method, level, metric, ablation and parameters, for provenance."""
        return {"method": self.method, "level": self.level, "ablation": self.ablation,
                "metric": self.metric, "n_examples": self.n_examples, "n_columns": len(self.names),
                **{f"param.{k}": v for k, v in self.params.items()}}

    def graph_config(self) -> dict:
        """The graph's shape, enough to rebuild the edge index."""
        g = self.graph
        return {"n_layers": g.n_layers, "n_heads": g.n_heads, "has_mlp": g.has_mlp, "parallel": g.parallel}

    # ---- persistence -----------------------------------------------------------------------
    def tables(self, provenance: dict | None = None, name: str = "scores") -> dict:
        """{name: per-example table, "edges" or "nodes": index table}, provenance in their metadata."""
        from reports.tables import matrix_to_table, to_arrow, with_provenance

        prov = {**self.provenance, **(provenance or {}), "scores": self.describe(), "graph": self.graph_config()}
        table = matrix_to_table(self.scores, {"example": self.example_ids})
        index = to_arrow(self.index_columns())
        return {name: with_provenance(table, prov),
                ("edges" if self.level == "edge" else "nodes"): with_provenance(index, prov)}

    def write(self, directory: str | Path, provenance: dict | None = None) -> Path:
        """Write scores.parquet and edges.parquet (or nodes.parquet) into ``directory``."""
        from reports.tables import write_table

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        for name, table in self.tables(provenance).items():
            write_table(table, out / f"{name}.parquet")
        return out

    def index_columns(self) -> dict:
        """The edge (or node) table: index, name and structure of each column."""
        g = self.graph
        if self.level == "edge":
            return g.edge_table()
        return {"index": np.arange(g.n_senders), "name": g.senders, "layer": g.sender_layer,
                "kind": ["input" if s == "input" else ("mlp" if s.startswith("m") else "head") for s in g.senders]}

    @classmethod
    def read(cls, directory: str | Path, name: str = "scores") -> "ScoreMatrix":
        """A ScoreMatrix from a directory written by ``write`` (or a run's ``scores_<method>``)."""
        from reports.tables import read_provenance, read_table, table_to_matrix

        path = Path(directory) / f"{name}.parquet"
        if not path.exists():
            raise FileNotFoundError(f"{path} not found; run `circuitstat attribute ... --out {directory}` first")
        table = read_table(path)
        prov = read_provenance(path)
        g = ComponentGraph(**prov["graph"])
        desc = prov["scores"]
        params = {k[len("param."):]: v for k, v in desc.items() if k.startswith("param.")}
        return cls(
            scores=table_to_matrix(table), graph=g, level=desc["level"], method=desc["method"],
            ablation=desc["ablation"], metric=desc["metric"],
            example_ids=np.asarray(table.column("example").to_numpy()), params=params,
            provenance={k: v for k, v in prov.items() if k not in ("scores", "graph")},
        )

    def __repr__(self) -> str:
        return (f"ScoreMatrix(method={self.method!r}, level={self.level!r}, N={self.n_examples}, "
                f"columns={len(self.names)}, metric={self.metric!r}, ablation={self.ablation!r})")

