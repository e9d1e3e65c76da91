# shellcheck shell=bash
# Sourced by benchmarks/gpu_session.sh and gpu_sort_of_clevr.sh (and by their test).
#
# session_folders ROOT: what both session scripts work with: OUT (made; absolute; ROOT/gpu_out
# when unset), PY (LOOM_PYTHON, else the GPU image's python3), CARRY (ROOT/.gpu_carry), WORK (a
# new temporary folder) with SITE and FASHION inside it.
session_folders() {
  OUT=${OUT:-$1/gpu_out}
  mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || return 1
  PY=${LOOM_PYTHON:-python3}
  CARRY=$1/.gpu_carry
  WORK=$(mktemp -d)
  SITE=$WORK/site
  FASHION=$WORK/fashion-mnist
  export OUT PYTHONUNBUFFERED=1
}

# install_offline: installs what
# benchmarks/gpu_prepare.sh carried, with no registry. Reads CPU (1 for a dry run), CARRY (the
# carried folder), SITE (the folder the wheels go to), PY (the Python) and FASHION (the folder
# Fashion-MNIST's files are decompressed into).
#
# The GPU machine reaches no registry and its python3 already holds torch; `make install`
# would fetch requirements-ci.txt (torch 2.14.1) from the network. So the carried wheels go
# into a folder of their own, and the tree's src/ comes first on the path.
install_offline() {
  [ -d "$CARRY/wheels" ] || { echo "no $CARRY: run benchmarks/gpu_prepare.sh first"; return 2; }
  local wheels=("$CARRY"/wheels/*.whl)
  local python
  python=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])') || return 1
  if [ "$CPU" = 1 ] && [ "$python" != "$(cat "$CARRY/python-version")" ]; then
    # The dependency wheels are for the GPU's Python (3.12); a dry run on another (the
    # project's venv) has those packages already and could not install them. A dry run on
    # a Python of their version (a venv emulating the GPU image) takes them all, as the GPU
    # machine does, so that the emulation tests them.
    wheels=("$CARRY"/wheels/torchloom-*.whl)
  fi
  "$PY" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir \
    --target "$SITE" "${wheels[@]}" || return 1
  # Fashion-MNIST as a data folder of its own, decompressed: the task checks decompressed
  # files by their content's md5, while Debian's re-compressed .gz files pass only from
  # Debian's own folder (a system path, left alone).
  mkdir -p "$FASHION" || return 1
  local file
  for file in "$CARRY"/fashion-mnist/*.gz; do
    gunzip -c "$file" >"$FASHION/$(basename "$file" .gz)" || return 1
  done
}
