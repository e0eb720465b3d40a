"""The ``hydratune`` command: compose the config with Hydra, check it, run the recipe.

hydratune [group=option ...] [group.key=value ...]     one run (run dir under outputs/)
hydratune -m group=a,b                                  a Hydra multirun sweep (under multirun/)
hydratune --cfg job [overrides]                         print the composed config, run nothing
hydratune mode=plan [overrides]                         compose + check everything (data too), load no model
hydratune replay <run dir> [overrides]                  re-run a run dir's exact resolved config
hydratune estimate [overrides]                          memory per GPU + every strategy, nothing loaded
hydratune report <multirun dir>                         table + overlay plot of a sweep's points
hydratune export <run dir> [out=<dir>] [dtype=…]        merged model + tokenizer + model card for serving
hydratune chat <run dir | model dir> [system=…]         talk to the model, tokens streamed
hydratune ls                                            recipes, groups and their options, experiments
hydratune matrix [--markdown]                           the support matrix (docs/matrix.md)
hydratune docs [--check]                                README.md, docs/, ARCHITECTURE.md: generated tables
hydratune cache ls | clear [key ...]                    the prepared-data cache: list it, free it
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from hydratune import recipes
from hydratune.components.commands.argv import (
    compose_error,
    replay_argv,
    resume_argv,
    resumed_run,
    startup_error,
)
from hydratune.components.config.errors import ConfigError, print_error
from hydratune.components.config.resolvers import register_resolvers
from hydratune.components.runtime.hydra_dirs import remove_unused_run_dir
from hydratune.components.runtime.startup import pause_gc, process_defaults, run_ends

process_defaults()  # TOKENIZERS_PARALLELISM=false, no FutureWarnings (components/runtime/startup.py)


def execute(cfg: DictConfig) -> Any:
    """Instantiate the groups, check them before any model is loaded, then run the recipe: here, or in
    the launcher's worker processes on the config frozen into the run dir."""
    from hydratune.components.auto import is_auto, maybe_resolve_auto
    from hydratune.components.config.ranges import check_values
    from hydratune.components.config.resolvers import check_resolves
    from hydratune.components.launcher import FROZEN
    from hydratune.components.runtime import multinode
    from hydratune.components.runtime.checks import check_before_load
    from hydratune.components.runtime.image_estimate import estimate_image_tokens
    from hydratune.components.runtime.run import Components, hydra_run_dir, run_recipe
    from hydratune.components.runtime.threads import apply_thread_policy
    from hydratune.components.strategy import stages_note

    multinode.save_hydra_files(cfg)  # a multi-node job's .hydra/: once, whole (Hydra was kept from it)
    apply_thread_policy(int(cfg.launcher.get("nproc_per_node") or 1))  # before torch is imported
    if cfg.mode == "plan":
        refuse_plan_under_an_optimizing_sweeper()
    check_resolves(cfg)
    check_values(cfg)  # before strategy=auto's estimate reads them (Components.from_config checks again)
    if is_auto(cfg):  # a VLM's image rows: the estimate counts the image tokens they hold
        cfg, measured = estimate_image_tokens(cfg)
        if measured:
            print(f"strategy=auto: {measured}")
    cfg = maybe_resolve_auto(cfg)  # strategy=auto: choose from the memory estimate, save the choice
    comps = Components.from_config(cfg)
    if comps.configured_strategy is not None:  # strategy.pp_size: the staged engine, this option's dp side
        print(stages_note(comps.configured_strategy, comps.strategy))
    multinode.refuse_sweep(comps.launcher)
    run_id = comps.launcher.rendezvous_id(multinode.pinned_run_dir())  # several nodes: one shared id
    device = check_before_load(cfg, comps, plan_device(cfg, comps))
    if cfg.mode == "plan":
        from hydratune.components.runtime.resume import hydra_sweep_point, resolve

        resolve(cfg, hydra_run_dir(), hydra_sweep_point())  # resume's checks: path, config, checksums, data
        print_plan(cfg, comps, device, run_id)
        remove_unused_run_dir()  # plan writes nothing: Hydra's .hydra/ and log go with the dir it made
        return None

    from hydratune.components.runtime.resume import hydra_sweep_point, pin

    comps.model.check_sources()  # a hub id neither cached nor reachable: one line, before anything
    run_dir = hydra_run_dir()
    check_not_under_outside_launcher(comps)
    comps.launcher.rank_env()  # a scheduler's ranks (SLURM) before anything writes as rank 0
    cfg = pin(cfg, run_dir, hydra_sweep_point())  # the checkpoint to continue, checked; workers get it too
    if comps.launcher.requeued():  # a SLURM job back after its pre-emption signal: its own last checkpoint
        from hydratune.components.runtime.resume import continue_in_place

        cfg = continue_in_place(cfg, run_dir)
    if comps.launcher.spawns_workers():
        from hydratune.components.launcher import WorkerFailed
        from hydratune.recipes.worker import run_worker

        if comps.launcher.writes_run_files():  # every rank reads it (once, whole: nodes share the run dir)
            multinode.write_atomically(run_dir / FROZEN, OmegaConf.to_yaml(cfg, resolve=True))
        try:  # each process: run_worker(run_dir)
            result = comps.launcher.launch(run_dir, run_worker, run_id, multinode.node_config(cfg))
        except WorkerFailed as err:
            print(f"hydratune: {err}{multinode.resume_note(run_dir, cfg.launcher)}", file=sys.stderr)
            sys.exit(err.exit_code)
    else:
        from hydratune.components.config.errors import Interrupted

        try:
            result = run_recipe(cfg, run_dir, comps=comps, device=device)
        except Interrupted as stop:
            stop.requeued = comps.launcher.after_interrupt(stop.signum)  # SLURM: requeue after pre-emption
            raise
    print(f"run dir: {run_dir}")
    return result


def print_plan(cfg: DictConfig, comps: Any, device: str, run_id: str) -> None:
    """``mode=plan``'s report, what matters first: the data (rows, lengths, what is dropped), the model, the
    precision, what the strategy generates (batch, mesh, DeepSpeed's JSON), the memory estimate, the
    processes; the composed
    config only with ``plan.config=true`` (``hydratune --cfg job`` prints it unresolved); "checks passed"
    last."""
    from hydratune.components.data.prepare import eval_every, plan_data
    from hydratune.components.runtime.run import batch_plan

    print("\n".join(plan_data(comps, cfg.train.eval_generations, eval_every(comps, cfg.train))))
    print(f"# model weights: {comps.model.describe_weights()}")
    vision = comps.model.describe_vision()
    if vision:
        print(f"# vision: {vision}")
    for line in comps.recipe.plan_lines(cfg, comps):  # the recipe's own (distill: student, teacher, loss)
        print(line)
    plan = batch_plan(cfg, comps, device)
    print(f"# precision: {plan.dtype} ({plan.dtype_reason})")
    generated = comps.strategy.describe(plan, device)
    print("# generated by the strategy (written to the run dir when training):")
    print(OmegaConf.to_yaml(OmegaConf.create(generated)), end="")
    print(f"# memory: {plan_memory(cfg)}")
    print(f"# {comps.launcher.describe(run_id)}")
    print_job_script(comps)
    if OmegaConf.select(cfg, "plan.config", default=False):  # a run dir saved before plan.config: none
        print("# the composed config (resolved; saved as .hydra/config.yaml when training):")
        print(OmegaConf.to_yaml(cfg, resolve=True), end="")
    else:
        print("# the composed config: plan.config=true prints it here (`hydratune --cfg job` unresolved)")
    host = "" if device == comps.strategy.resolve_device() else " (planned for a GPU: this host has none)"
    print(f"# checks passed; device: {device}{host}; nothing was loaded (mode=plan)")


def plan_memory(cfg: DictConfig) -> str:
    """The memory estimate in one line; where it cannot be made (a model it has no numbers for), why: the
    plan's checks do not depend on it."""
    from hydratune.components.commands.estimate_tables import one_line

    try:
        return one_line(cfg)
    except Exception as err:  # named on the line: the estimate is advice, the checks passed
        return f"not estimated ({type(err).__name__}: {err})"


def print_job_script(comps: Any) -> None:
    """``mode=plan`` of ``launcher=slurm``: the job script a run would write (nothing is written)."""
    from hydratune.components.runtime.run import hydra_run_dir
    from hydratune.recipes.worker import run_worker

    launcher = comps.launcher
    script = launcher.job_script(hydra_run_dir(), run_worker) if launcher.spawns_workers() else None
    if script:
        print("# the SLURM job script a run writes into its run dir (slurm.sbatch) and tells you to sbatch:")
        print(script)


def refuse_plan_under_an_optimizing_sweeper() -> None:
    """``-m ... mode=plan`` under Optuna & co: plan mode returns no objective, so the sweeper would fail every
    trial and end in a traceback. Hydra's basic sweeper needs none: each point is planned."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return
    sweeper = str(HydraConfig.get().sweeper.get("_target_", ""))
    if sweeper and not sweeper.endswith(".BasicSweeper"):
        raise ConfigError(
            f"mode=plan returns no objective, and the sweeper ({sweeper.rsplit('.', 1)[-1]}) optimizes one",
            key="mode",
            hint="plan one point without -m (same overrides), or run the sweep",
        )


def plan_device(cfg: DictConfig, comps: Any) -> str | None:
    """``mode=plan`` of a GPU setup (bf16/fp16, DeepSpeed, FSDP) on a host without a GPU plans for CUDA,
    so a laptop can check a cluster config; None = use the detected device."""
    if cfg.mode != "plan" or comps.strategy.device != "auto" or comps.strategy.resolve_device() != "cpu":
        return None
    dtype = comps.precision.dtype
    gpu_only = (
        dtype == "fp16"  # no fp16 loss scaling on CPU
        or comps.strategy.device_refusal("cpu", dtype, comps.recipe.owns_loop) is not None
    )
    return "cuda" if gpu_only else None


def check_not_under_outside_launcher(comps: Any) -> None:
    """``torchrun … -m hydratune`` would have every rank compose its own config and timestamped run dir; the
    tasks of a SLURM job (submitit's ``tasks_per_node=N``) would each run the whole job into one run dir."""
    from hydratune.components.distributed.slurm import step_tasks

    world = max(int(os.environ.get("WORLD_SIZE", 1)), step_tasks())
    if world > 1 and not comps.launcher.started_per_rank:
        raise ConfigError(
            f"hydratune was started by an outside launcher ({world} processes): each rank would create "
            "its own run dir",
            key="launcher",
            hint="under SLURM (hydra/launcher=submitit_slurm) add launcher=slurm; else run hydratune once "
            "with launcher.nproc_per_node=N (it starts the workers), or point the outside launcher at "
            "`python -m hydratune.recipes.worker <run dir>`",
        )


@hydra.main(version_base=None, config_path="pkg://hydratune.conf", config_name="config")
def _hydra_app(cfg: DictConfig) -> Any:
    from hydratune.components.config.errors import (
        EXIT_INTERRUPTED,
        EXIT_SERVER_FAILED,
        Interrupted,
        ServerError,
        ServerFailed,
    )

    try:
        try:
            return execute(cfg)
        except ServerError as err:  # before anything worth keeping (a mid-run failure is ServerFailed)
            raise ConfigError(str(err), key=err.key, hint="fix the server, then run again") from None
    except ConfigError as err:
        print_error(err)
        if keep_refused_point(err):
            return None  # the basic sweeper goes on with the next point; the CLI exits 2 at the end
        remove_unused_run_dir()
        sys.exit(2)
    except KeyboardInterrupt:
        remove_unused_run_dir()
        raise
    except BrokenPipeError:  # stdout's reader went away (`| head`): inside the job, so Hydra adds no report
        remove_unused_run_dir()
        stdout_closed()
    except ServerFailed as failed:
        from hydratune.components.runtime.multinode import on_every_node
        from hydratune.components.runtime.run import hydra_run_dir

        advice = f"Resume with: hydratune resume={hydra_run_dir()}{on_every_node(cfg.launcher)}"
        print(f"hydratune: {failed}. {advice} once the server answers", file=sys.stderr)
        sys.exit(EXIT_SERVER_FAILED)
    except Interrupted as stop:
        from hydratune.components.distributed.slurm import under_submitit
        from hydratune.components.runtime.multinode import on_every_node
        from hydratune.components.runtime.run import hydra_run_dir

        requeued = bool(stop.requeued and stop.requeued.done)  # SLURM: the job continues by itself
        advice = f"Resume with: hydratune resume={hydra_run_dir()}{on_every_node(cfg.launcher)}"
        then = str(stop.requeued) if requeued else f"{stop.requeued}. {advice}" if stop.requeued else advice
        print(f"hydratune: {stop}. {then}", file=sys.stderr)
        if under_submitit() and not requeued:
            raise  # the sweep point's outcome: submitit hands it to the submitting hydratune, which names it
        sys.exit(EXIT_INTERRUPTED)


#: the sweep points refused with a ConfigError (a multirun goes on without them, then exits 2)
REFUSED: list[str] = []
#: the file a refused sweep point leaves in its run dir (``hydratune report`` lists the point as refused)
REFUSED_FILE = "refused.txt"


def keep_refused_point(err: ConfigError) -> bool:
    """In a multirun, a refused point keeps its run dir with ``refused.txt`` (the error), so the sweep's
    report lists it. True when the sweep can go on (Hydra's basic sweeper: every point is independent);
    an optimizing sweeper needs every point's objective, so the sweep stops there (exit 2)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return False
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / REFUSED_FILE).write_text(f"{err}\n")
    REFUSED.append(f"{HydraConfig.get().job.num}: {str(err).splitlines()[0]}")
    return str(HydraConfig.get().sweeper.get("_target_", "")).endswith(".BasicSweeper")


class StartupSignal(KeyboardInterrupt):
    """SIGTERM / SIGUSR1 before training set up its own handler: stop like Ctrl-C, leaving no run dir."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def stop_at_startup(signum: int, frame: Any) -> None:
    raise StartupSignal(signum)


def main(argv: list[str] | None = None) -> None:
    """Console entry point (``hydratune`` and ``python -m hydratune``). Its output read by a command that
    stops early (``hydratune ls | head -1``) ends it quietly (:func:`stdout_closed`)."""
    try:
        try:
            _run(argv)
        finally:
            sys.stdout.flush()  # here, not at interpreter exit, where a closed pipe is an "Exception ignored"
    except BrokenPipeError:
        stdout_closed()


def stdout_closed() -> None:
    """The reader of stdout went away (``| head``): exit as a command killed by SIGPIPE does (141), no
    traceback. stdout is pointed at /dev/null first, so nothing left in its buffer fails again at exit
    (Python's own advice: docs.python.org/3/library/signal.html, "Note on SIGPIPE")."""
    import signal

    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(128 + signal.SIGPIPE)


def _run(argv: list[str] | None) -> None:
    import signal

    from hydratune.components.runtime.created import MADE

    args = list(sys.argv[1:] if argv is None else argv)
    MADE.clear()  # what this command creates (main may run more than once in a process: tests)
    pause_gc()  # until training starts: see components/runtime/startup.py
    previous = {s: signal.signal(s, stop_at_startup) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        _main(args)
    except KeyboardInterrupt as stop:  # also when it lands in Hydra's own start-up, outside _hydra_app
        remove_unused_run_dir()
        if isinstance(stop, StartupSignal):
            name = signal.Signals(stop.signum).name
            print(f"hydratune: {name} before training started: stopped, nothing to resume", file=sys.stderr)
            sys.exit(128 + stop.signum)
        print("hydratune: interrupted (Ctrl-C)", file=sys.stderr)
        sys.exit(130)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        run_ends()


def _main(args: list[str]) -> None:
    register_resolvers()
    recipes.register_all()
    if "--cfg" in args or "-c" in args:  # prints the config, runs nothing: no callback, logging or env_set
        _commands(args)
        return
    from hydratune.components.config.redact import redacted_saves
    from hydratune.components.config.trust import grants, guarded_compositions

    # every composition below (the run, each sweep point, estimate's) is checked as Hydra composes it:
    # only this command line grants trust (components/config/trust.py); no config is saved with a secret
    with guarded_compositions(grants(args)), redacted_saves():
        _commands(args)


def _commands(args: list[str]) -> None:
    """The subcommand ``args`` name, or a Hydra run of them."""
    try:
        if args and args[0] in ("ls", "list"):
            from hydratune.components.commands.catalog import render

            print(render())
            return
        if "--help" in args or "-h" in args:
            from hydratune.components.commands.catalog import help_text

            print(help_text())
            return
        if args and args[0] == "report":
            from hydratune.components.commands.report import write_report

            if len(args) != 2:
                raise ConfigError(
                    "report takes one multirun dir",
                    key="report",
                    hint="hydratune report multirun/<date>/<time>",
                )
            markdown, _ = write_report(Path(args[1]))
            print(markdown + f"\nwrote {Path(args[1]) / 'report.md'}, report.csv, report.png")
            return
        if args and (args[0] == "estimate" or "mode=estimate" in args):
            from hydratune.components.commands.estimate_tables import cli

            sys.exit(cli(args[1:] if args[0] == "estimate" else args))
        if args and args[0] in ("export", "chat", "matrix", "docs", "cache"):
            from importlib import import_module

            sys.exit(import_module(f"hydratune.components.commands.{args[0]}").cli(args[1:]))
        if args and args[0] == "replay":
            args = replay_argv(args[1:])
        elif run := resumed_run(args):
            args = resume_argv(run, args)
        from hydratune.components.config.trust import check_command
        from hydratune.components.rewards import add_user_module_dirs

        check_command(args)  # a malformed experiment file is named with its line

        add_user_module_dirs(args)  # reward modules in the working dir / beside the experiment file
    except ConfigError as err:
        print_error(err)
        sys.exit(2)
    sys.argv = [sys.argv[0] or "hydratune", *args]
    run_hydra_app()


def run_hydra_app() -> None:
    """Hydra's app, its composition errors exiting 2 with one paragraph like every ConfigError.

    Hydra reports an exception and exits 1 unless ``HYDRA_FULL_ERROR`` is set, in which case it re-raises
    it: set here, so a composition error reaches this function (other exceptions propagate as usual)."""
    from hydra.errors import CompactHydraException, InstantiationException

    from hydratune.components.distributed.slurm_sweep import PointsFailed

    previous = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    REFUSED.clear()  # this command's points only (main may run more than once in a process: tests)
    try:
        _hydra_app()
        if REFUSED:
            points = "\n  ".join(REFUSED)
            print(f"hydratune: {len(REFUSED)} sweep point(s) refused:\n  {points}", file=sys.stderr)
            sys.exit(2)
    except ConfigError as err:  # refused as Hydra composed it (components/config/trust.py)
        print_error(err)
        sys.exit(2)
    except PointsFailed as err:  # SLURM sweep points that ended without a result, or with an error
        print(f"hydratune: {err}", file=sys.stderr)
        sys.exit(1)
    except CompactHydraException as err:
        if isinstance(err, InstantiationException) or previous == "1":
            raise
        print_error(compose_error(err))
        sys.exit(2)
    except Exception as err:  # raised by Hydra itself, outside the job: a YAML file, a full disk
        named = startup_error(err)
        if named is None:
            raise
        print_error(named)
        sys.exit(2)
    finally:
        if previous is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = previous


if __name__ == "__main__":
    main()
