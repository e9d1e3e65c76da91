"""`loom search CONFIG --trials N`: a hyper-parameter search on Optuna; each trial a training
run of its own (torchloom/search/). `--resume DIR` continues a search folder's study."""

from __future__ import annotations

import argparse
from pathlib import Path

# Only what starts the worker processes loads here: the rest imports torch, which the workers
# import beside this process once started (search/processes.py, WorkerProcesses).
from torchloom.search.processes import WorkerProcesses


def run(args: argparse.Namespace) -> int:
    if args.worker:
        from torchloom.analysis.build import build_hooks
        from torchloom.search.processes import continue_worker

        return continue_worker(build_hooks, args.worker_index)
    if args.resume and args.config:
        args.overrides = [args.config, *args.overrides]
        args.config = None
    if args.workers < 1:
        from torchloom.errors import ConfigError

        raise ConfigError.at("command line", "--workers", "must be 1 or more")
    started = WorkerProcesses(args.workers - 1) if args.workers > 1 else None
    try:
        return _search(args, started)
    finally:
        if started is not None:
            started.stop()  # a search that failed to begin; else they have ended already


def _search(args: argparse.Namespace, started: WorkerProcesses | None) -> int:
    from torchloom.analysis.build import build_hooks
    from torchloom.search.page import write_page
    from torchloom.search.processes import run_workers
    from torchloom.search.record import check_importance, read_record
    from torchloom.search.results import (
        check_some_trial_completed,
        sampled_values,
        write_results,
    )
    from torchloom.search.runner import (
        SearchRequest,
        check_kept_on_resume,
        prepare_search,
        resume_search,
    )
    from torchloom.search.storage_urls import hide_password
    from torchloom.search.trial import DeviceUnusable

    check_importance(args.importance, "command line --importance")
    request = SearchRequest(
        config=args.config,
        overrides=list(args.overrides),
        space=args.space,
        trials=args.trials,
        sampler=args.sampler,
        pruner=args.pruner,
        monitor=args.monitor,
        mode=args.mode,
        storage=args.storage,
        study=args.study,
        workers=args.workers,
        timeout=args.timeout,
        seed=args.seed,
        expdir=args.expdir,
        device=args.device,
        resume=args.resume,
    )
    if args.resume:
        check_kept_on_resume(request)
        if not read_record(Path(args.resume).expanduser()).config:  # a code-first search's
            from torchloom.errors import ConfigError

            raise ConfigError.at(
                "command line",
                f"--resume {args.resume}",
                "is a code-first search (its trials' configs come from a Python function)",
                "continue it from the code that started it: torchloom.search(build, "
                "resume=SEARCH_DIR)",
            )
        search_dir, record = resume_search(request)
    else:
        search_dir, record = prepare_search(request)
    print(f"search folder: {search_dir}")
    storage = hide_password(record.storage)  # as every message shows a storage URL
    print(f"study '{record.study}' in {storage}; {record.mode} {record.monitor}")
    record.set_importance(args.importance, search_dir)
    stopped = None
    try:
        status = run_workers(search_dir, record, args.workers, build_hooks, print, started)
    except DeviceUnusable as error:  # after the results so far are written: raised below
        stopped, status = error, 2
    results = write_results(search_dir, record)
    page = write_page(search_dir, record, results)
    best = results.best
    if best is not None:
        values = sampled_values(best)
        print(f"best: trial {best.number}, {record.monitor} = {best.value:.4g}: {values}")
        print(f"best config: {search_dir / 'best.yml'}")
    else:
        print("no trial completed")
    print(f"report: {page}")
    if status == 130:
        print(f"interrupted; continue with `loom search --resume {search_dir}`")
    if stopped is not None:
        raise stopped
    if status == 0 and best is None:
        check_some_trial_completed(search_dir, results)
    return status
