"""ScoreMatrix: per-example attribution scores [N examples x E edges or nodes] with their context."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from circuitstat.core.errors import InputError
from circuitstat.core.results import Result

from .graph import ComponentGraph


@dataclass(repr=False)
class ScoreMatrix(Result):
    """Per-example scores of one method; never only the dataset mean.

    A Result: tables ``scores`` (one row per example, the scores as a fixed-size list of float32)
    and ``edges`` (or ``nodes``: the column index), provenance in their metadata; ``write(run_dir)``.
    """

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
        from .circuit.graph_ops import split_cfg

        return {"n_layers": g.n_layers, "n_heads": g.n_heads, "has_mlp": g.has_mlp, "parallel": g.parallel,
                **split_cfg(g)}

    # ---- Result protocol and persistence ------------------------------------------------------
    main_table = "scores"

    @property
    def index_name(self) -> str:
        """Return the name of the column-index table: ``edges`` or ``nodes``."""
        return "edges" if self.level == "edge" else "nodes"

    def _tables(self) -> dict:
        from circuitstat.core.tables import matrix_to_table

        table = matrix_to_table(self.scores, {"example": self.example_ids})
        return {"scores": {c: table.column(c).combine_chunks() for c in table.column_names},
                self.index_name: self.index_columns()}

    def table_names(self) -> list[str]:
        """Return ``["scores", "edges"]`` (``"nodes"`` for node-level scores)."""
        return ["scores", self.index_name]

    def tables(self, provenance: dict | None = None, name: str = "scores") -> dict:
        """{name: per-example table, "edges" or "nodes": index table}, provenance in their metadata."""
        from circuitstat.core.tables import matrix_to_table, to_arrow, with_provenance

        prov = {**self.provenance, **(provenance or {}), "scores": self.describe(), "graph": self.graph_config()}
        table = matrix_to_table(self.scores, {"example": self.example_ids})
        index = to_arrow(self.index_columns())
        return {name: with_provenance(table, prov), self.index_name: with_provenance(index, prov)}

    def to_table(self, name: str | None = None):
        """Return the ``scores`` table (default) or the index table, provenance in its metadata."""
        tables = self.tables()
        name = self.main_table if name is None else name
        if name not in tables:
            raise KeyError(f"unknown table {name!r}; this result has {sorted(tables)}")
        return tables[name]

    def _summary_items(self) -> list:
        return [("method", self.method), ("level", self.level), ("examples (N)", self.n_examples),
                ("columns", len(self.names)), ("metric", self.metric), ("ablation", self.ablation)]

    def index_columns(self) -> dict:
        """The edge (or node) table: index, name and structure of each column."""
        g = self.graph
        if self.level == "edge":
            return g.edge_table()
        return {"index": np.arange(g.n_senders), "name": g.senders, "layer": g.sender_layer,
                "kind": ["input" if s == "input" else ("mlp" if s.startswith("m") else "head") for s in g.senders]}

    @classmethod
    def read(cls, directory: str | Path, name: str = "scores") -> "ScoreMatrix":
        """A ScoreMatrix from a run directory written by ``write`` (or a run's ``scores_<method>``).

        A file that is not such a table (another Parquet file, a truncated one, forged provenance)
        is an InputError naming what is missing; nothing in it is trusted to size allocations.
        """
        from circuitstat.core.tables import read_provenance, read_table, table_to_matrix

        path, fix = _scores_path(directory, name)
        try:
            table = read_table(path)
            prov = read_provenance(table)
        except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError; bad JSON too
            raise InputError(f"{path} is not a readable Parquet table ({type(e).__name__}); {fix}") from None
        for column in ("example", "scores"):
            if column not in table.column_names:
                raise InputError(f"{path} is not a circuitstat scores table (missing column {column!r}); {fix}")
        try:
            matrix = table_to_matrix(table)
        except (TypeError, ValueError, KeyError) as e:
            raise InputError(f"{path} is not a circuitstat scores table ({_one_line(e)}); {fix}") from None
        return _built(cls, path, fix, prov, matrix, matrix.shape[1], table.column("example"))

    @classmethod
    def read_means(cls, directory: str | Path, name: str = "scores") -> "ScoreMeans":
        """The column means of a scores table as a :class:`ScoreMeans` (its ``mean()`` is the ScoreMatrix's, bit
        for bit; its ``describe()`` the same), read in blocks of columns and never whole
        (circuitstat.core.score_columns): what selecting a circuit needs, at any graph size."""
        from circuitstat.core.score_columns import ParquetColumns, column_means
        from circuitstat.core.tables import read_provenance, read_table

        import pyarrow.parquet as pq

        path, fix = _scores_path(directory, name)
        try:
            present = set(pq.read_schema(path).names)  # the footer only
        except (OSError, ValueError) as e:
            raise InputError(f"{path} is not a readable Parquet table ({type(e).__name__}); {fix}") from None
        for column in ("example", "scores"):  # as read() says it, before any block is read
            if column not in present:
                raise InputError(f"{path} is not a circuitstat scores table (missing column {column!r}); {fix}")
        try:
            prov = read_provenance(path)  # the footer only
            cols = ParquetColumns(path)
            example = read_table(path, ["example"]).column("example")
            means = column_means(cols)
        except (OSError, ValueError) as e:
            raise InputError(f"{path} is not a readable scores table ({type(e).__name__}: {_one_line(e)}); {fix}") from None
        except (KeyError, TypeError) as e:
            raise InputError(f"{path} is not a circuitstat scores table ({_one_line(e)}); {fix}") from None
        # ScoreMatrix.mean's float32 cast of the float64 mean: the same bits as the whole matrix's mean()
        return _built(ScoreMeans, path, fix, prov, means.astype(np.float32)[None], cols.shape[1], example,
                      n_rows=cols.shape[0])

    def __repr__(self) -> str:
        return (f"ScoreMatrix(method={self.method!r}, level={self.level!r}, N={self.n_examples}, "
                f"columns={len(self.names)}, metric={self.metric!r}, ablation={self.ablation!r})")



@dataclass(repr=False)
class ScoreMeans:
    """A scores table read as its column means only (:meth:`ScoreMatrix.read_means`): ``scores`` is the [1, E]
    float32 mean and ``n_rows`` the examples it averages. Circuits select from it as from the ScoreMatrix
    (circuitstat.circuits.circuit); it is not a Result: only the means were read, so there is nothing to write."""

    scores: np.ndarray  # [1, E] float32: ScoreMatrix.mean() of the whole table, bit for bit
    graph: ComponentGraph
    level: str
    method: str
    ablation: str
    metric: str
    example_ids: np.ndarray | None = None
    params: dict = field(default_factory=dict)
    provenance: dict = field(default_factory=dict)
    n_rows: int = 0

    names = property(ScoreMatrix.names.fget)
    describe = ScoreMatrix.describe

    @property
    def n_examples(self) -> int:
        """Number of examples the means average (the table's rows)."""
        return self.n_rows

    def mean(self) -> np.ndarray:
        """The dataset mean per column (float32), as ScoreMatrix.mean() of the whole table."""
        return self.scores[0]


def _scores_path(directory: str | Path, name: str) -> tuple[Path, str]:
    """(the scores table's path, the fix an error names); FileNotFoundError when it is absent."""
    path = Path(directory) / f"{name}.parquet"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found; run `circuitstat attribute ... --out {directory}` first")
    return path, "write it with `circuitstat attribute` or ScoreMatrix.write"


def _built(cls, path: Path, fix: str, prov: dict, matrix: np.ndarray, n_columns: int, example, **extra):
    """``cls`` from a scores table's provenance, matrix and example column (InputError when they do not fit)."""
    g = _graph_from_provenance(prov, n_columns, path, fix)
    desc = prov["scores"]
    params = {k[len("param."):]: v for k, v in desc.items() if k.startswith("param.")}
    try:
        return cls(scores=matrix, graph=g, level=desc["level"], method=str(desc["method"]),
                   ablation=str(desc["ablation"]), metric=str(desc["metric"]),
                   example_ids=np.asarray(example.to_numpy()), params=params,
                   provenance={k: v for k, v in prov.items() if k not in ("scores", "graph")}, **extra)
    except (KeyError, ValueError, TypeError) as e:
        raise InputError(f"{path} is not a circuitstat scores table ({_one_line(e)}); {fix}") from None


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:200]


def _graph_from_provenance(prov: dict, n_columns: int, path: Path, fix: str) -> ComponentGraph:
    """The ComponentGraph recorded with a scores table, checked before it is built.

    The shape comes from a file: it must be small positive integers whose sender count fits the
    matrix already read (every sender has at least one edge), so a forged shape cannot make the
    graph's name lists allocate more than the file itself holds.
    """
    graph, desc = prov.get("graph"), prov.get("scores")
    if not isinstance(graph, dict) or not isinstance(desc, dict):
        raise InputError(f"{path} is not a circuitstat scores table (missing provenance 'graph'/'scores'); {fix}")
    for key in ("level", "method", "ablation", "metric"):
        if key not in desc:
            raise InputError(f"{path} is not a circuitstat scores table (missing provenance scores.{key}); {fix}")
    if desc["level"] not in ("edge", "node"):
        raise InputError(f"{path} is not a circuitstat scores table (level is not 'edge' or 'node'); {fix}")
    shape = {k: graph.get(k) for k in ("n_layers", "n_heads")}
    if any(type(v) is not int or v < 1 for v in shape.values()) or set(graph) - {"n_layers", "n_heads", "has_mlp",
                                                                                  "parallel", "experts", "shared_expert"}:
        raise InputError(f"{path} is not a circuitstat scores table (its graph shape is not positive integers); {fix}")
    has_mlp, parallel = graph.get("has_mlp", True), graph.get("parallel", False)
    if type(has_mlp) is not bool or type(parallel) is not bool:
        raise InputError(f"{path} is not a circuitstat scores table (its graph flags are not booleans); {fix}")
    from .circuit.graph_ops import split_from

    split = split_from(graph, f"{path} is not a circuitstat scores table (its graph's split MoE layers)")
    if split and not has_mlp:
        raise InputError(f"{path} is not a circuitstat scores table (split MoE layers without MLPs); {fix}")
    n_senders = 1 + shape["n_layers"] * (shape["n_heads"] + int(has_mlp))
    n_senders += sum(x + int(split["shared_expert"]) - 1 for x in split.get("experts", ()) if x)
    if n_senders > n_columns:
        raise InputError(f"{path} is not a circuitstat scores table (its graph has more components than the "
                         f"matrix has columns, {n_columns}); {fix}")
    return ComponentGraph(shape["n_layers"], shape["n_heads"], has_mlp=has_mlp, parallel=parallel, **split)
