"""This rank's part of a model cut into pipeline stages: :func:`cut_model` keeps the stages the plan gives
this rank (their layers split over its tensor-parallel ranks with ``strategy.tp_size`` > 1) and checks,
across every rank, that each holds exactly what was planned; the summary's pipeline section says who holds
what. A recipe cuts its model before building its trainer (``recipes/sft.py``), so the trainer only ever holds
this rank's part; the staged loop (``runtime/pipeline_loop.py``) trains it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hydratune.components.config.errors import ConfigError
from hydratune.components.distributed import pp_schedule as pp
from hydratune.components.distributed import stage_tp
from hydratune.components.distributed import stages as st


@dataclass
class Cut:
    """This rank's part of the model and where it sits in the mesh (kept by the Session)."""

    mesh: pp.PipelineGroups
    plan: st.StagePlan
    stage_ids: list[int]
    tied: bool
    held: list[dict[str, Any]]  # every rank's held(), in rank order
    local: list[int]  # every rank's parameters in its own memory (a tensor-parallel rank: its shards)


def cut_model(session: Any) -> Cut:
    """Keep this rank's stages of ``session.model`` (in place) and check that every rank holds exactly the
    stages planned for it (a collective call). The split is the one ``mode=plan`` printed: computed on the
    model's architecture, ``strategy.split`` if given, else balanced by parameter count."""
    ctx = session.ctx
    strategy, model = ctx.components.strategy, session.model
    tied = st.CausalLMParts.of(model).tied
    mesh = pp.PipelineGroups.build(strategy.pp_size, ctx.device, tied, tp=strategy.tp_size)
    plan = strategy.stage_plan(st.CausalLMParts.of(model).config)
    stage_ids = plan.stages_of(mesh.pp_rank)
    st.keep_stages(model, plan, stage_ids)
    if mesh.tp > 1:  # each kept layer split over the stage's tensor-parallel ranks
        stage_tp.split_layers(st.CausalLMParts.of(model).backbone.layers.values(), mesh.tp_mesh)
    held = pp.all_gather(st.held(model))
    local = pp.all_gather(sum(pp.local(p).numel() for p in model.parameters()))
    cut = Cut(mesh, plan, stage_ids, tied, held, local)
    verify(cut)
    session.report["pipeline"] = describe(cut, strategy)
    return cut


def verify(cut: Cut) -> None:
    """Refuse to train unless every rank holds what the plan gives its stages: the layers, the embedding
    on the first stage's rank only, norm and head on the last's only, and the planned parameter count."""
    wrong = []
    for rank, got in enumerate(cut.held):
        want = st.expected(cut.plan, cut.plan.stages_of(cut.mesh.pp_rank_of(rank)))
        if got != want:
            wrong.append(f"rank {rank} holds {got}, planned {want}")
    if wrong:
        raise ConfigError(
            "the pipeline stages are not what was planned: " + "; ".join(wrong),
            key="strategy",
            hint="a bug: please report it with this message",
        )


def describe(cut: Cut, strategy: Any) -> dict[str, Any]:
    """The summary's pipeline section: mesh, schedule, split, what each rank holds."""
    rows: dict[str, Any] = {
        "mesh": cut.mesh.label(),
        "schedule": f"{strategy.schedule}, {cut.plan.num_stages} stages, {strategy.stages_per_rank} per rank",
        "tied embeddings": "yes: the first and last stage each hold the matrix (trained: gradients summed "
        "between them, one update)"
        if cut.tied
        else "no",
    }
    for stage in range(cut.plan.num_stages):
        rows[f"stage {stage} (pipeline rank {cut.plan.rank_of(stage)})"] = cut.plan.describe(stage)
    for rank, got in enumerate(cut.held):
        parts = [f"layers {spans(got['layers'])}"] + [
            name for name in ("embed_tokens", "lm_head") if got[name]
        ]
        rows[f"rank {rank} holds"] = f"{', '.join(parts)}; {got['parameters']:,} parameters"
        if cut.mesh.tp > 1:  # the stage's projections split: this rank's own share
            rows[f"rank {rank} holds"] += (
                f", {cut.local[rank]:,} of them here (tensor-parallel rank {rank % cut.mesh.tp} of "
                f"{cut.mesh.tp}: each layer's projections split)"
            )
    return rows


def note_shards(rows: dict[str, Any], cut: Cut, model: Any, zero_stage: int) -> None:
    """The summary's ``rank r holds`` rows with each rank's share under FSDP2 (a collective call)."""
    local = pp.all_gather(sum(pp.local(p).numel() for p in model.parameters()))
    for rank, here in enumerate(local):
        rows[f"rank {rank} holds"] += (
            f", {here:,} of them here (FSDP2, ZeRO-{zero_stage}: a 1/{cut.mesh.dp} shard of each parameter "
            "over the data-parallel replicas)"
        )


def spans(indices: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2, 5``."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
