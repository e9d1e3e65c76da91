#!/usr/bin/env bash
# Issue 18's Sort-of-CLEVR reproduction on a lent GPU: one clean run of the paper's CNN+RN
# (configs/vqa/sort_of_clevr_cnn_rn.yml, no warm restart, the cosine schedule over the whole
# run, the test set read once, at the end, with best.pt), in one session. 40 epochs at the
# 40 s an epoch an H200 gave eagerly (2026-11-27) do not fit a session's 15 minutes of device
# time, and what a session leaves on disk here is lost to the next one (git-ignored files do
# not reach a new checkout: the first piece of an earlier 40-epoch run was lost so). So the
# run is fitted to the session: `--fit TOTAL` probes the step's speed eagerly and compiled with
# CUDA graphs (benchmarks/sort_of_clevr.py --fit-seconds, --try-compile reduce-overhead),
# trains the fastest way, and takes as many epochs, 40 at most, as end inside TOTAL seconds
# from the probe's start, across two device calls on the machine still held:
#
#   benchmarks/gpu_sort_of_clevr.sh LIMIT --fit TOTAL   # first call: probe, start, train
#                                                       # (510 --fit 620: docs/benchmarks.md)
#   benchmarks/gpu_sort_of_clevr.sh LIMIT               # next call: continue the run
#   benchmarks/gpu_sort_of_clevr.sh LIMIT [--fit TOTAL] --cpu   # here: the reduced variant
#
# LIMIT: the seconds this call may train (SIGINT then: the run saves last.pt at the end of its
# step and ends `interrupted`), at most the call's limit less about 60 s. The run folder lives
# in .gpu_runs/ (git-ignored), which stays on the device machine between two calls while it
# is held (it goes back after 30 s idle), so the next call resumes it exactly (the same
# batches, the optimizer's and the schedule's states). A run carried from an earlier session
# (.gpu_carry/sort_of_clevr/run.tar.gz, put there by benchmarks/gpu_prepare.sh from
# .gpu_state/) is continued the same way. Without --fit and without a run to continue, the
# script starts nothing.
#
# Files back: sort_of_clevr_run.tar.gz (the run folder, without last.prev.pt: to
# .gpu_state/ here, should a later session have to continue it), sort_of_clevr.txt (the
# probe, validation per epoch; test at the end) and sort_of_clevr.log (everything).
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
LIMIT=${1:?give the seconds this call may train}
shift
CPU=0
FIT=
while [ $# -gt 0 ]; do
  case $1 in
    --cpu) CPU=1 ;;
    --fit) FIT=${2:?--fit needs the seconds the whole run must end in}; shift ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done
source "$ROOT/benchmarks/gpu_install.sh"
session_folders "$ROOT" || exit 1
LOG=$OUT/sort_of_clevr.log
REPORT=$OUT/sort_of_clevr.txt
: >"$LOG"
RUNS=$ROOT/.gpu_runs/sort_of_clevr
# A fixed folder: the run's config.yaml names it, and each call generates the same splits
# there again from their seed when they are missing (about 5 s; the task checks the answers
# it generates).
DATA=${SOC_DATA:-/tmp/torchloom-sort-of-clevr}
install_offline >>"$LOG" 2>&1 || { echo "install failed: see $LOG" | tee -a "$LOG"; exit 1; }
export PYTHONPATH=$ROOT/src:$SITE:$CARRY/site

saved_run() { find "$RUNS" -path '*/checkpoints/last.pt' 2>/dev/null | head -1; }
STATE=$CARRY/sort_of_clevr/run.tar.gz
if [ -z "$(saved_run)" ] && [ -f "$STATE" ]; then
  mkdir -p "$RUNS" && tar xzf "$STATE" -C "$RUNS" || exit 1
  echo "continuing the run carried in $STATE" | tee -a "$LOG"
fi
if [ -n "$(saved_run)" ]; then
  RUN=$(dirname "$(dirname "$(saved_run)")")
  if [ "$CPU" = 0 ] && ! grep -q "image_size: 75" "$RUN/config.yaml"; then
    echo "$RUN holds a reduced (--cpu) run, not the full one: remove it" | tee -a "$LOG"
    exit 2
  fi
  echo "resuming $(basename "$RUN")" | tee -a "$LOG"
  ARGS=(--resume "$RUN")
elif [ -n "$FIT" ]; then
  rm -rf "$RUNS" && mkdir -p "$RUNS"
  ARGS=(--only rn --epochs 40 --expdir "$RUNS" --data "$DATA" --fit-seconds "$FIT"
    --try-compile reduce-overhead)
  # Every pass's batches gathered on the GPU (dataloader.on_device: the same batches), not
  # built on the host, pinned and copied: 4 MiB of images a training step that the host,
  # which bounds this small model's step, no longer converts.
  for section in training validation test; do
    ARGS+=(--both-override "++$section.dataloader.on_device=true")
  done
  [ "$CPU" = 1 ] && ARGS+=(--reduced)
else
  echo "no run in $RUNS to continue, and no --fit TOTAL to start one" | tee -a "$LOG"
  exit 2
fi
# SIGINT at the limit: the run saves last.pt at the end of its step and ends `interrupted`.
timeout --signal=INT --kill-after=60 "$LIMIT" "$PY" benchmarks/sort_of_clevr.py "${ARGS[@]}" \
  2>>"$LOG" | tee "$REPORT"
status=${PIPESTATUS[0]}
echo "sort_of_clevr.py: exit $status (124: stopped at the limit, as planned)" | tee -a "$LOG"
if [ -z "$(saved_run)" ]; then
  echo "no last.pt: nothing for the next call to continue" | tee -a "$LOG"
  exit 1
fi
RUN=$(dirname "$(dirname "$(saved_run)")")
tar czf "$OUT/sort_of_clevr_run.tar.gz" -C "$RUNS" --exclude=last.prev.pt . || exit 1
"$PY" - "$RUN" <<'EOF' | tee -a "$REPORT"
import json, sys
from pathlib import Path
summary = json.loads((Path(sys.argv[1]) / "summary.json").read_text())
test = summary["final"].get("test")
print(f"after this piece: {summary['epochs']} epochs, {summary['episodes']} episodes, "
      f"status {summary['status']}, {summary['wall_time_seconds']:.0f} s of training in all")
if test:
    print(f"test (best.pt, epoch {summary['monitor']['best_epoch']}): non-relational "
          f"{test['accuracy_non_relational']:.4f}, relational {test['accuracy_relational']:.4f}")
EOF
ls -l "$OUT" | tee -a "$LOG"
rm -rf "$WORK"  # the installed wheels; the run folder stays in .gpu_runs/ for the next call
