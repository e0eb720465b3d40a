"""One rank of a multi-process run: load the run dir's frozen config and run the recipe.

Started by the ``local`` launcher (torch elastic), by ``deepspeed --module hydratune.recipes.worker <run
dir>``, by a SLURM job script's ``srun`` (one task per rank), or by hand under any launcher that sets RANK /
LOCAL_RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from hydratune.components.launcher import FROZEN, RANK_DONE, RANK_STOPPED, RELAYS


def run_worker(run_dir: str) -> Any:
    """Run this rank's share of the job; returns the objective (rank 0) and records completion."""
    from hydratune import recipes
    from hydratune.components.config.errors import (
        EXIT_INTERRUPTED,
        EXIT_NODE_LOST,
        EXIT_SERVER_FAILED,
        ConfigError,
        Interrupted,
        ServerError,
        ServerFailed,
        print_error,
    )
    from hydratune.components.config.resolvers import register_resolvers
    from hydratune.components.runtime.startup import pause_gc, process_defaults, run_ends
    from hydratune.components.runtime.threads import apply_thread_policy

    process_defaults()  # as the CLI sets them (TOKENIZERS_PARALLELISM, no FutureWarnings)
    pause_gc()  # until training starts: see components/runtime/startup.py
    apply_thread_policy(int(os.environ.get("LOCAL_WORLD_SIZE", 1)))  # before torch is imported
    from hydratune.components.distributed.interrupt import defer  # imports transformers, and so torch
    from hydratune.components.runtime.resume import continue_in_place
    from hydratune.components.runtime.run import Components, run_recipe

    register_resolvers()
    recipes.register_all()
    path = Path(run_dir)
    if os.environ.get(RELAYS):
        from hydratune.components.distributed.interrupt import accept_relays

        accept_relays(path)  # first: the launcher may relay a signal at any time
    cfg = OmegaConf.load(path / FROZEN)
    comps = None
    ended = lost = False
    try:
        comps = Components.from_config(cfg)
        comps.launcher.rank_env()  # a scheduler's ranks (SLURM's srun tasks)
        defer(comps.launcher.preemption_signals())  # pre-empted while loading: checkpoint after step 1
        if comps.launcher.started_per_rank:  # the job script's run dir: continue from its own checkpoint
            cfg = continue_in_place(cfg, path)
        result = run_recipe(cfg, path, comps=comps)
        ended = True
    except ConfigError as err:
        print_error(err)
        sys.exit(2)
    except ServerError as err:  # a reward server, before anything worth keeping
        print_error(ConfigError(str(err), key=err.key, hint="fix the server, then run again"))
        sys.exit(2)
    except ServerFailed as failed:  # mid-run, checkpointed
        print(f"hydratune: rank {os.environ.get('RANK', 0)}: {failed}", file=sys.stderr)
        sys.exit(EXIT_SERVER_FAILED)
    except Interrupted as stop:
        ended = True  # every rank stopped after the same step
        rank = int(os.environ.get("RANK", 0))
        record = {"signum": stop.signum, "step": stop.step, "checkpoint": stop.checkpoint}
        # first: once a rank exits, torch elastic ends the others; the launcher reads every rank's record
        (path / RANK_STOPPED.format(rank=rank)).write_text(json.dumps(record))
        _teardown(together=True)  # every rank out of the process group before the job may be requeued
        stop.requeued = comps.launcher.after_interrupt(stop.signum) if comps else None  # SLURM pre-emption
        print(
            f"hydratune: rank {rank}: {stop}{f'; {stop.requeued}' if stop.requeued else ''}", file=sys.stderr
        )
        sys.exit(EXIT_INTERRUPTED)
    except Exception as err:
        from hydratune.components.distributed.rendezvous import lost_peer

        reason = lost_peer(err)
        if reason is None:
            raise
        # another rank went away: one line here, the launcher names the node (no gloo traceback per rank)
        rank = int(os.environ.get("RANK", 0))
        print(f"hydratune: rank {rank}: a collective lost its peer: {reason}", file=sys.stderr, flush=True)
        lost = True
    finally:
        run_ends()
        _teardown(together=ended)
    if lost:  # at once: the process group's C++ teardown waits seconds on its dead connections
        sys.stdout.flush()
        os._exit(EXIT_NODE_LOST)
    rank = int(os.environ.get("RANK", 0))
    done = path / RANK_DONE.format(rank=rank)
    done.write_text(json.dumps({"rank": rank, "result": result if _plain(result) else None}))
    return result


def _plain(value: Any) -> bool:
    return isinstance(value, (int, float, str, type(None)))


def _teardown(together: bool) -> None:
    """Leave the process group cleanly (a gloo group left to interpreter teardown can abort): after a barrier
    when every rank ended the run together; at once after an error (the other ranks are elsewhere: a
    barrier would wait for them until the process group's timeout)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            if together:
                dist.barrier()
        finally:
            dist.destroy_process_group()


if __name__ == "__main__":
    run_worker(sys.argv[-1])
