#!/usr/bin/env bash
# Issue 18's Sort-of-CLEVR reproduction on lent GPUs, in pieces: one clean run of the paper's
# CNN+RN (configs/vqa/sort_of_clevr_cnn_rn.yml, 40 epochs, cosine over the 40, no warm
# restart; the test set read once, at the end, with best.pt) that no session's 15 minutes of
# device time can hold, so each session trains it for the seconds it has left and takes the
# run folder home, and the next one resumes it exactly (`loom train --resume`'s checkpoint:
# the same batches, the optimizer's and scheduler's states).
#
#   benchmarks/gpu_sort_of_clevr.sh SECONDS          # on the GPU machine
#   benchmarks/gpu_sort_of_clevr.sh SECONDS --cpu    # here: the reduced variant, to check it
#
# Before the device call, here: benchmarks/gpu_prepare.sh, which also puts the run folder the
# last session brought back (.gpu_state/sort_of_clevr_run.tar.gz) into .gpu_carry/. Then
#   run(command="benchmarks/gpu_sort_of_clevr.sh 480", carry=[".gpu_carry"], timeout_s=600)
# with SECONDS at most the call's limit less about 90 s (the data, start-up, the last save).
# After it, copy the run folder that came back to .gpu_state/ for the next session:
#   cp <files_at>/sort_of_clevr_run.tar.gz .gpu_state/
# Files back: sort_of_clevr_run.tar.gz (the run folder, without last.prev.pt),
# sort_of_clevr.txt (the script's report: validation per epoch; test at the end) and
# sort_of_clevr.log (everything).
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
LIMIT=${1:?give the seconds this piece may train}
CPU=0
[ "${2:-}" = "--cpu" ] && CPU=1
source "$ROOT/benchmarks/gpu_install.sh"
session_folders "$ROOT" || exit 1
LOG=$OUT/sort_of_clevr.log
REPORT=$OUT/sort_of_clevr.txt
: >"$LOG"
RUNS=$WORK/runs
# A fixed folder: the run's config.yaml names it, and each session generates the same splits
# there again from their seed (about 5 s; the task checks the answers it generates).
DATA=${SOC_DATA:-/tmp/torchloom-sort-of-clevr}
install_offline >>"$LOG" 2>&1 || { echo "install failed: see $LOG" | tee -a "$LOG"; exit 1; }
export PYTHONPATH=$ROOT/src:$SITE:$CARRY/site

mkdir -p "$RUNS"
STATE=$CARRY/sort_of_clevr/run.tar.gz
if [ -f "$STATE" ]; then
  tar xzf "$STATE" -C "$RUNS" || exit 1
  RUN=$(dirname "$(find "$RUNS" -name config.yaml | head -1)")
  if [ "$CPU" = 0 ] && ! grep -q "image_size: 75" "$RUN/config.yaml"; then
    echo "$STATE holds a reduced (--cpu) run, not the full one: remove it" | tee -a "$LOG"
    exit 2
  fi
  echo "resuming $(basename "$RUN"), carried in $STATE" | tee -a "$LOG"
  ARGS=(--resume "$RUN")
elif [ "$CPU" = 1 ]; then
  ARGS=(--only rn --reduced --epochs 40 --expdir "$RUNS" --data "$DATA")
else
  ARGS=(--only rn --epochs 40 --expdir "$RUNS" --data "$DATA")
fi
# SIGINT at the limit: the run saves last.pt at the end of its step and ends `interrupted`.
timeout --signal=INT --kill-after=60 "$LIMIT" "$PY" benchmarks/sort_of_clevr.py "${ARGS[@]}" \
  2>>"$LOG" | tee "$REPORT"
status=${PIPESTATUS[0]}
echo "sort_of_clevr.py: exit $status (124: stopped at the limit, as planned)" | tee -a "$LOG"
RUN=$(dirname "$(find "$RUNS" -name config.yaml | head -1)")
if [ ! -f "$RUN/checkpoints/last.pt" ]; then
  echo "no last.pt: nothing to carry to the next session" | tee -a "$LOG"
  exit 1
fi
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
rm -rf "$WORK"
