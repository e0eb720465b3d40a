"""The device mesh of a run: how its processes split into data (dp), tensor (tp), sequence (sp) and pipeline
(pp) parallel groups, ``dp x tp x sp x pp = world``. Pure arithmetic (no torch): the strategy says its sizes
(:meth:`hydratune.components.strategy.ModelSplit.mesh`), the batch plan, ``mode=plan`` and the memory estimate
read them.
"""

from __future__ import annotations

from dataclasses import dataclass

from hydratune.components.config.errors import ConfigError


@dataclass(frozen=True)
class Mesh:
    """``world`` processes as ``dp x tp x sp x pp``; ``dp`` is what is left: world / (tp x sp x pp)."""

    world: int
    tp: int = 1
    sp: int = 1
    pp: int = 1
    ep: int = 1  # expert parallel: a mixture's experts split over ep ranks of the data-parallel ones

    @property
    def model_parallel(self) -> int:
        """Processes that hold one copy of the model between them (tp x sp x pp)."""
        return self.tp * self.sp * self.pp

    @property
    def dp(self) -> int:
        """Data-parallel replicas: each sees its own micro-batches (the batch arithmetic's multiplier)."""
        return max(1, self.world // self.model_parallel)

    @property
    def is_data_parallel_only(self) -> bool:
        return self.model_parallel == 1

    def check(self) -> None:
        """tp x sp x pp must divide the world size (a ConfigError naming the knobs and the fix)."""
        for dim in ("tp", "sp", "pp"):
            if getattr(self, dim) < 1:
                raise ConfigError(f"{dim}_size must be >= 1", key=f"strategy.{dim}_size")
        if self.world % self.model_parallel:
            first = next(dim for dim in ("tp", "sp", "pp") if getattr(self, dim) > 1)
            raise ConfigError(
                f"tp x sp x pp = {self.tp} x {self.sp} x {self.pp} = {self.model_parallel} does not divide "
                f"the world size {self.world}",
                key=f"strategy.{first}_size",
                hint=f"launcher.nproc_per_node x launcher.nnodes must be a multiple of {self.model_parallel}",
            )
        if self.ep < 1 or (self.ep > 1 and self.dp % self.ep):
            raise ConfigError(
                f"ep_size={self.ep} must divide the {self.dp} data-parallel ranks: the experts split over ep "
                "of the ranks holding one copy of the rest of the model",
                key="strategy.ep_size",
                hint=f"strategy.ep_size dividing {self.dp} (launcher.nproc_per_node x launcher.nnodes)",
            )

    def describe(self) -> str:
        """``dp 1 x tp 2 x sp 1 x pp 1 = 2 processes`` (``; experts over ep 2`` with expert parallel)."""
        sizes = " x ".join(f"{dim} {getattr(self, dim)}" for dim in ("dp", "tp", "sp", "pp"))
        experts = f"; experts split over ep {self.ep} of them" if self.ep > 1 else ""
        return f"{sizes} = {self.world} process{'es' if self.world != 1 else ''}{experts}"

    def per_node(self, nnodes: int) -> str:
        """``1 node x 2 processes``: how the world sits on the nodes."""
        return f"{nnodes} node{'s' if nnodes != 1 else ''} x {self.world // max(1, nnodes)} processes"

    def coordinates(self, rank: int) -> dict[str, int]:
        """Where ``rank`` sits: pp outermost, then dp, sp, tp innermost (rank = ((pp x dp + dp) x sp + sp) x
        tp + tp), the order the engines make their groups in: DeepSpeed's AutoTP and Ulysses groups are runs
        of neighbouring ranks, the pipeline's (``pp_schedule.PipelineGroups``, checked live) a stage's tp
        ranks neighbours and its pipelines ``dp x tp`` apart; an expert-parallel group is ``ep`` neighbouring
        data-parallel ranks."""
        sizes = {"pp": self.pp, "dp": self.dp, "sp": self.sp, "tp": self.tp}
        out, rest = {}, rank
        for dim in ("tp", "sp", "dp", "pp"):
            out[dim], rest = rest % sizes[dim], rest // sizes[dim]
        return out

    def groups(self, dim: str) -> list[list[int]]:
        """The ranks of each ``dim`` group (``dp``, ``tp``, ``sp``, ``pp`` or ``ep``): the ranks that differ
        only in that coordinate, in rank order."""
        if dim == "ep":
            return [g[i : i + self.ep] for g in self.groups("dp") for i in range(0, len(g), self.ep)]
        others = {}
        for rank in range(self.world):
            key = tuple(v for d, v in self.coordinates(rank).items() if d != dim)
            others.setdefault(key, []).append(rank)
        return sorted(others.values())

    def layout(self, gpus_per_node: int) -> dict[str, str]:
        """Which ranks form each group of a dimension above 1, and which ranks sit on each node (``mode=plan``
        prints it): ``{"tp groups": "[0, 1] [2, 3]", "node 0": "ranks 0-3"}``."""
        rows = {
            f"{dim} groups": " ".join(str(g) for g in self.groups(dim))
            for dim in ("tp", "sp", "pp", "dp", "ep")
            if (self.ep if dim == "ep" else getattr(self, dim)) > 1
        }
        per = max(1, min(gpus_per_node, self.world))
        for node in range(-(-self.world // per)):
            first, last = node * per, min(self.world, (node + 1) * per) - 1
            rows[f"node {node}"] = f"rank {first}" if first == last else f"ranks {first}-{last}"
        return rows


@dataclass(frozen=True)
class ModelDims:
    """The numbers of a model that a mesh must divide (config.json's keys, read before any weight)."""

    heads: int
    kv_heads: int
    hidden: int
    intermediate: int
    layers: int
    experts: int = 0  # a mixture of experts' experts per layer (0: dense)

    @classmethod
    def from_config(cls, config: object) -> ModelDims:
        """From a transformers config (its text config for multimodal ones)."""
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        heads = int(text.num_attention_heads)
        return cls(
            heads=heads,
            kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
            hidden=int(text.hidden_size),
            intermediate=int(getattr(text, "intermediate_size", None) or 4 * int(text.hidden_size)),
            layers=int(text.num_hidden_layers),
            experts=int(getattr(text, "num_experts", None) or getattr(text, "num_local_experts", None) or 0),
        )


def check_model(mesh: Mesh, dims: ModelDims) -> None:
    """What each parallel dimension splits must divide evenly, before any weight is read.

    Tensor parallel (Megatron-style column/row splits, as DeepSpeed AutoTP and transformers' tp_plan do)
    splits the attention heads, the key/value heads and the MLP's hidden size over ``tp`` ranks. Sequence
    parallel (Ulysses) trades the sequence split for a head split inside attention: the heads over ``sp``
    ranks, and the key/value heads too (or, with fewer of them, each replicated to ``sp / kv_heads``
    ranks). The pipeline dimension's own checks (layers per stage) belong here as well."""
    tp, sp = mesh.tp, mesh.sp
    if mesh.ep > 1 and (not dims.experts or dims.experts % mesh.ep):
        if dims.experts:
            why, fix = (
                f"its {dims.experts} experts are not divisible by",
                f"strategy.ep_size dividing {dims.experts}",
            )
        else:
            why, fix = "it has no experts to split at", "strategy.ep_size=1 for a dense model"
        raise ConfigError(
            f"expert parallel cannot split this model: {why} ep_size={mesh.ep}",
            key="strategy.ep_size",
            hint=fix,
        )
    fits = {
        ("tp", "attention heads"): dims.heads % tp == 0,
        ("tp", "key/value heads"): dims.kv_heads % tp == 0,
        ("tp", "MLP hidden size (intermediate_size)"): dims.intermediate % tp == 0,
        ("sp", "attention heads"): dims.heads % sp == 0,
        ("sp", "key/value heads"): dims.kv_heads % sp == 0 or sp % dims.kv_heads == 0,
    }
    counts = {
        "attention heads": dims.heads,
        "key/value heads": dims.kv_heads,
        "MLP hidden size (intermediate_size)": dims.intermediate,
    }
    for (dim, what), ok in fits.items():
        if ok:
            continue
        size = getattr(mesh, dim)
        sizes = [d for d in range(2, 65) if _fits(dims, dim, d)]
        relation = "a multiple or divisor of" if (dim, what) == ("sp", "key/value heads") else "divisible by"
        fix = f"strategy.{dim}_size={sizes[0]} (sizes this model takes: {sizes[:8]})" if sizes else "none"
        raise ConfigError(
            f"the model's {counts[what]} {what} are not {relation} {dim}_size={size}: "
            f"{'tensor' if dim == 'tp' else 'sequence'} parallel splits them evenly over the {dim} ranks",
            key=f"strategy.{dim}_size",
            hint=fix if sizes else f"this model cannot be split that way: drop strategy.{dim}_size",
        )


def _fits(dims: ModelDims, dim: str, size: int) -> bool:
    if dim == "tp":
        return dims.heads % size == 0 and dims.kv_heads % size == 0 and dims.intermediate % size == 0
    return dims.heads % size == 0 and (dims.kv_heads % size == 0 or size % dims.kv_heads == 0)
