"""`loom train CONFIG [overrides]` and `loom train --resume RUN_DIR`, in one process or in
several (`--nproc N`, `--gpu`, `--nnodes M`: torch.distributed's elastic launcher)."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from torchloom.analysis.build import build_hooks
from torchloom.engine.run_folder import RunResult, check_run_tag
from torchloom.engine.setup import prepare_training
from torchloom.engine.state import TrainOptions
from torchloom.errors import LoomError


def run(args: argparse.Namespace) -> int:
    check_run_tag(args.tag)  # before any data is read (create_run_folder checks it again)
    if args.resume and args.config:
        # argparse fills `config` positionally; with --resume it must be empty.
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

    if (args.nproc > 1 or args.nnodes > 1 or args.gpu) and not started_by_a_launcher():
        return _launch(args, request)
    outcome = worker(request)  # this process alone, or one that torchrun started
    return _report(outcome) if outcome is not None else 0


def worker(request: dict[str, Any]) -> dict[str, Any] | None:
    """One training process: joins the process group when launched, trains, and returns
    rank 0's outcome (None on the other ranks). Module-level: the launcher spawns it."""
    from torchloom.engine.distributed import join, leave

    dist = join(request["device"])
    handoff = Path(request["handoff"]) if request.get("handoff") else None
    config, overrides, resume = request["config"], request["overrides"], request["resume"]
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    if restarted and handoff is not None and (handoff / "run_dir").is_file():
        # An elastic restart after a worker died: continue the run the first attempt made.
        run_dir = Path((handoff / "run_dir").read_text(encoding="utf-8"))
        if (run_dir / "checkpoints" / "last.pt").is_file():
            config, overrides, resume = None, [], str(run_dir)
    options = TrainOptions(
        expdir=request["expdir"],
        tag=request["tag"],
        device=request["device"],
        quiet=request["quiet"],
        tensorboard=request["tensorboard"],
        disable=request["disable"],
        hook_factory=build_hooks,  # the config's analysis section
    )
    try:
        prepared = prepare_training(config, overrides, options, resume=resume)
        if isinstance(prepared, RunResult):
            return _outcome(prepared, finished=True) if dist.main else None
        if dist.main and handoff is not None:
            (handoff / "run_dir").write_text(str(prepared.setup.run_dir), encoding="utf-8")
        result = prepared.run()
        return _outcome(result) if dist.main else None
    except LoomError as error:
        if handoff is None:
            raise
        # For the launcher, which prints it as one process would; the agent then stops the
        # other workers. Exit without a traceback: a user error is no crash.
        (handoff / f"error-{dist.rank:04d}.txt").write_text(error.format(), encoding="utf-8")
        sys.stderr.flush()
        os._exit(2)
    finally:
        leave()


def _outcome(result: RunResult, finished: bool = False) -> dict[str, Any]:
    return {"run_dir": str(result.run_dir), "summary": result.summary, "finished": finished}


def _launch(args: argparse.Namespace, request: dict[str, Any]) -> int:
    import torch

    from torchloom.engine.distributed import LaunchOptions, WorkerFailed, check_launch, launch

    nproc = torch.cuda.device_count() if args.gpu and args.nproc == 1 else args.nproc
    options = LaunchOptions(
        nproc=nproc,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        rdzv_endpoint=args.rdzv_endpoint,
        max_restarts=args.max_restarts,
        rdzv_timeout=args.rdzv_timeout,
    )
    check_launch(options, gpus=args.gpu)
    handoff = tempfile.mkdtemp(prefix="torchloom-launch-")
    try:
        run_id = f"torchloom-{args.rdzv_endpoint or Path(handoff).name}"
        try:
            results = launch(options, worker, [{**request, "handoff": handoff}], run_id)
        except WorkerFailed:
            errors = sorted(Path(handoff).glob("error-*.txt"))
            if errors:  # a user error: the first rank's message, as one process would say it
                print(errors[0].read_text(encoding="utf-8"), file=sys.stderr)
                return 2
            raise
    finally:
        shutil.rmtree(handoff, ignore_errors=True)
    outcome = next((value for value in results.values() if value is not None), None)
    return _report(outcome) if outcome is not None else 0


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


def finished_message(result: RunResult) -> str:
    summary = result.summary
    return "\n".join(
        [
            f"run already finished: {summary.get('status')} ({summary.get('reason')}); "
            "nothing to do",
            "to continue it, raise the condition that ended it, e.g. "
            f"loom train --resume {result.run_dir} training.terminal_conditions.epoch_limit=N",
            f"run folder: {result.run_dir}",
        ]
    )
