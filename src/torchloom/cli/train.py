"""`loom train CONFIG [overrides]` and `loom train --resume RUN_DIR`, in one process or in
several (`--nproc N`, `--gpu`, `--nnodes M`: torch.distributed's elastic launcher)."""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

from torchloom.analysis.build import build_hooks
from torchloom.engine.launch import (
    Failure,
    Handoff,
    LaunchOptions,
    WorkerFailed,
    check_launch,
    launch,
)
from torchloom.engine.reporting import LOG_FORMAT
from torchloom.engine.run_folder import (
    RunResult,
    check_run_tag,
    failure_reason,
    read_summary,
    write_summary,
)
from torchloom.engine.setup import prepare_training
from torchloom.engine.state import TrainOptions
from torchloom.errors import ConfigError, LoomError


def run(args: argparse.Namespace) -> int:
    if args.resume:
        given = [f"--{k}" for k in ("expdir", "tag") if getattr(args, k) is not None]
        if given:  # ignored before: the run continues in its own folder
            raise ConfigError.at(
                "command line",
                f"{given[0]} with --resume",
                "names a new run folder, and a resumed run continues in its own",
                f"leave out {' and '.join(given)}",
            )
    args.expdir = args.expdir if args.expdir is not None else "runs"
    args.tag = args.tag or ""
    check_run_tag(args.tag)  # before any data is read (create_run_folder checks it again)
    if args.resume and args.config and ("=" in args.config or args.config.startswith("~")):
        # argparse fills `config` positionally: with --resume, that is the first override (a
        # config file stays one, which --resume refuses, saying so).
        args.overrides = [args.config, *args.overrides]
        args.config = None
    request = {
        "config": args.config,
        "overrides": list(args.overrides),
        "resume": args.resume,
        "expdir": args.expdir,
        "tag": args.tag,
        "device": "cuda" if args.gpu else args.device,
        "quiet": args.quiet,
        "tensorboard": args.tensorboard,
        "disable": args.disable,
    }
    from torchloom.engine.distributed import started_by_a_launcher

    options, gpus = _launch_options(args)
    check_launch(options, gpus)  # every flag, also for one process (`--nproc 0` is no 1)
    if (options.several or args.gpu) and not started_by_a_launcher():
        return _launch(options, request, args.rdzv_endpoint)
    outcome = worker(request)  # this process alone, or one that torchrun started
    return _report(outcome) if outcome is not None else 0


def _launch_options(args: argparse.Namespace) -> tuple[LaunchOptions, int | None]:
    """The launch the flags ask for, and the GPUs visible when the processes train on GPUs
    (--gpu, or several processes whose device is a GPU; None on the CPU)."""
    gpus = None
    if args.gpu:
        import torch

        gpus = torch.cuda.device_count()
        if gpus == 0:
            raise ConfigError.at(
                "command line",
                "--gpu",
                "asks for one process per GPU, but torch sees no CUDA GPU on this machine",
                "train on the CPU without --gpu (--nproc N for N processes), or check "
                "CUDA_VISIBLE_DEVICES and the driver (nvidia-smi)",
            )
    elif args.nproc > 1:
        import torch

        from torchloom.engine.distributed import on_gpus

        # Each process takes the GPU of its local rank (a --device without GPUs is the
        # run's own error).
        if on_gpus(args.device) and torch.cuda.is_available():
            gpus = torch.cuda.device_count()
    options = LaunchOptions(
        nproc=gpus if args.gpu and gpus is not None and args.nproc == 1 else args.nproc,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        rdzv_endpoint=args.rdzv_endpoint,
        max_restarts=args.max_restarts,
        rdzv_timeout=args.rdzv_timeout,
    )
    return options, gpus


def worker(request: dict[str, Any]) -> dict[str, Any] | None:
    """One training process: joins the process group when launched, trains, and returns
    rank 0's outcome (None on the other ranks). Module-level: the launcher spawns it."""
    from torchloom.engine.distributed import leave

    handoff = Handoff(Path(request["handoff"])) if request.get("handoff") else None
    rank = int(os.environ.get("RANK", "0"))
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    if handoff is not None:
        handoff.start_worker(rank, int(request["launcher"]))
        if restarted and handoff.user_error() is not None:
            # A user error ended an earlier attempt, and would end this one: a restart is
            # for a worker that died, not for a config the run cannot train.
            os._exit(2)
    config, overrides, resume = request["config"], request["overrides"], request["resume"]
    run_dir = handoff.run_dir() if restarted and handoff is not None else None
    if run_dir is not None and (run_dir / "checkpoints" / "last.pt").is_file():
        # An elastic restart after a worker died: continue the run the first attempt made.
        config, overrides, resume = None, [], str(run_dir)
    options = TrainOptions(
        expdir=request["expdir"],
        tag=request["tag"],
        device=request["device"],
        # The launcher says which rank failed and why, once: the others keep quiet.
        quiet=request["quiet"] or (handoff is not None and rank != 0),
        tensorboard=request["tensorboard"],
        disable=request["disable"],
        hook_factory=build_hooks,  # the config's analysis section
    )
    try:
        outcome = _trained(request["device"], config, overrides, options, resume, handoff)
    except BaseException as error:
        if handoff is None:
            raise
        # For the launcher, which says which rank failed first, and why, once.
        handoff.record_failure(rank, error, failure_reason(error))
        if not isinstance(error, LoomError):
            raise  # an internal error: the agent sees the worker fail
        # The agent then stops the other workers. Exit without a traceback: a user error
        # is no crash.
        sys.stderr.flush()
        os._exit(2)
    finally:
        leave()
        if handoff is not None and os.getppid() != int(request["launcher"]):
            # The launcher was killed and this run stopped (last.pt saved): nobody to hand
            # the outcome to, and torch's spawn would wait for one forever.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(130)
    if handoff is not None and _picklable(outcome):  # else torch's wrapper fails: exit 1
        atexit.register(_exit_at_once)
    return outcome


def _trained(
    device: str | None,
    config: str | None,
    overrides: list[str],
    options: TrainOptions,
    resume: str | None,
    handoff: Handoff | None,
) -> dict[str, Any] | None:
    """A launched worker's run: what it hands the launcher (rank 0's outcome; where the run
    folder is from the first process of another machine; None from the others)."""
    from torchloom.engine.distributed import join

    dist = join(device)
    # Which machine holds rank 0 is the rendezvous's choice, not --node-rank's: the other
    # machines say where its run folder is.
    rank_0_host = dist.broadcast(socket.gethostname())
    prepared = prepare_training(config, overrides, options, resume=resume)
    if isinstance(prepared, RunResult):
        return _outcome(prepared, finished=True) if dist.main else None
    if dist.main and handoff is not None:
        handoff.set_run_dir(prepared.setup.run_dir)
    result = prepared.run()
    if dist.main:
        return _outcome(result)
    if dist.local_rank == 0:  # this machine's first process
        return {"run_dir": str(result.run_dir), "host": rank_0_host, "elsewhere": True}
    return None


def _exit_at_once() -> None:
    """The exit of a launched worker whose run ended and whose outcome the launcher has read
    (torch's spawn wrapper waits for that before the process exits): the interpreter's own
    ending, tearing down torch, matplotlib and the rest module by module, took 2 s of every
    launch on two cores. Registered last, this handler runs first: it runs the other exit
    handlers (a plugin's, coverage's, logging's: 24 ms after a toy run; torch's, which stops
    torch.compile's pool of compiling processes when a run compiled: about 1.3 s here, as
    an ordinary exit would), then ends the process. What the run writes is closed before it
    returns (the trainer closes its reporters, TensorBoard included). The exit status is 0:
    the wrapper failing after the return is what `_picklable` rules out (an atexit handler
    cannot see the status it would have had)."""
    atexit.unregister(_exit_at_once)
    atexit._run_exitfuncs()  # the others, last registered first, as the interpreter would
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _picklable(outcome: Any) -> bool:
    """Whether torch's wrapper can hand `outcome` over: it puts it on a queue, which pickles
    with multiprocessing's ForkingPickler (torch's tensor reductions registered)."""
    from multiprocessing.reduction import ForkingPickler

    try:
        ForkingPickler.dumps(outcome)
        return True
    except Exception:
        return False


def _outcome(result: RunResult, finished: bool = False) -> dict[str, Any]:
    return {"run_dir": str(result.run_dir), "summary": result.summary, "finished": finished}


def _launch(options: LaunchOptions, request: dict[str, Any], endpoint: str | None) -> int:
    handoff = Handoff(Path(tempfile.mkdtemp(prefix="torchloom-launch-")))
    try:
        run_id = f"torchloom-{endpoint or handoff.folder.name}"
        try:
            results = launch(
                options,
                worker,
                [{**request, "handoff": str(handoff.folder), "launcher": os.getpid()}],
                run_id,
                handoff,
            )
        except WorkerFailed as failed:
            failures = failed.first_failures(handoff.failures())
            if not failures:
                raise
            first = failures[0]
            _tell_the_run_folder(handoff.run_dir(), failures)
            if first.user_error:  # as one process would say it
                print(first.text, file=sys.stderr)
                return 2
            print(f"rank {first.rank} failed first:\n{first.text}", file=sys.stderr)
            return 1
    finally:
        shutil.rmtree(handoff.folder, ignore_errors=True)
    outcomes = [value for value in results.values() if value is not None]
    own = next((outcome for outcome in outcomes if not outcome.get("elsewhere")), None)
    if own is not None:
        return _report(own)
    for outcome in outcomes[:1]:  # rank 0 trained on another machine, which wrote the run
        print(
            f"run folder: {outcome['run_dir']} on {outcome['host']}, the machine of rank 0 "
            "(the rendezvous numbers the machines, not --node-rank), which printed the summary"
        )
    return 0


def _tell_the_run_folder(run_dir: Path | None, failures: list[Failure]) -> None:
    """Rank 0's run.log and summary.json name the failure that ended the run when another
    rank failed first, of which rank 0 saw only its connection to it close (unless rank 0
    stopped for a user error of its own, which it has said)."""
    first, own = failures[0], next((f for f in failures if f.rank == 0), None)
    if first.rank == 0 or (own is not None and own.user_error):
        return
    if run_dir is None or not (summary := read_summary(run_dir)):
        return
    reason = f"rank {first.rank}: {first.reason}"
    handler = logging.FileHandler(run_dir / "run.log", encoding="utf-8")
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    message = f"failed first on {reason}" + ("" if first.user_error else f"\n{first.text}")
    handler.emit(logging.makeLogRecord({"levelname": "ERROR", "msg": message.rstrip()}))
    handler.close()
    write_summary(run_dir, {**summary, "reason": reason})


def _report(outcome: dict[str, Any]) -> int:
    result = RunResult(Path(outcome["run_dir"]), outcome["summary"], outcome["finished"])
    if result.already_finished:
        print(finished_message(result))
        return 0
    summary = result.summary
    final = summary.get("final", {})
    lines = [
        f"status: {summary['status']} ({summary['reason']})",
        f"epochs: {summary['epochs']}, episodes: {summary['episodes']}, "
        f"wall time: {summary['wall_time_seconds']:.1f} s",
    ]
    for section in ("validation", "test"):
        if "accuracy" in final.get(section, {}):
            lines.append(f"{section} accuracy: {final[section]['accuracy']:.4f}")
    lines.append(f"run folder: {result.run_dir}")
    print("\n".join(lines))
    return 130 if result.status == "interrupted" else 0


# The override that raises the condition a finished run ended on.
RAISED = {
    "episode_limit": "training.terminal_conditions.episode_limit=N",
    "early_stopped": "training.terminal_conditions.early_stopping.patience=N",
}


def finished_message(result: RunResult) -> str:
    summary = result.summary
    status = str(summary.get("status"))
    raised = RAISED.get(status, "training.terminal_conditions.epoch_limit=N")
    lines = [f"run already finished: {status} ({summary.get('reason')}); nothing to do"]
    if status in ("diverged", "converged"):
        lines.append("it cannot be continued as it is: start a new run (loom train CONFIG)")
    else:
        lines.append(
            "to continue it, raise the condition that ended it: "
            f"loom train --resume {result.run_dir} {raised}"
        )
    return "\n".join([*lines, f"run folder: {result.run_dir}"])
