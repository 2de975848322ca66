#!/usr/bin/env bash
# Packaging check: build a wheel, install it (not editable) in a fresh virtual environment, and
# train a few steps from a directory outside the source tree, so that the configs and the C++
# sources come from the installed package and the kernel is compiled from there.
#   .ci/wheel_check.sh            (about 3 minutes: torch install, wheel, one kernel compile)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
unset PYTHONPATH
export TORCH_EXTENSIONS_DIR="$work/extensions"  # a fresh build from the installed csrc/
start=$SECONDS

python3 -m venv "$work/venv"
py="$work/venv/bin/python"
"$py" -m pip install -q torch==2.13.0
# Build from a copy of the tracked files, as an install from a git URL sees them (and so that
# setuptools' build/ and egg-info stay out of the checkout).
mkdir "$work/src"
git -C "$repo" ls-files -z | tar -C "$repo" --null -T - -cf - | tar -C "$work/src" -xf -
"$py" -m pip wheel -q --no-deps -w "$work/dist" "$work/src"
"$py" -m pip install -q "$work"/dist/imagegen-*.whl

cd "$work"
"$py" - "$work/venv" <<'PY'
import sys
import imagegen
from imagegen.commands.cli import CONF_DIR
from imagegen.ops.build import CSRC
for name, path in (("package", imagegen.__file__), ("conf", CONF_DIR), ("csrc", CSRC)):
    assert str(path).startswith(sys.argv[1]), f"{name} comes from {path}, not from the installed wheel"
    print(f"wheel_check: {name} at {path}")
PY
"$py" -c "import sys; sys.path.insert(0, sys.argv[1]); from fixtures import write_mnist; write_mnist(sys.argv[2])" \
  "$repo/tests" "$work/data/mnist"
"$work/venv/bin/imagegen-train" model=linear data.root="$work/data/mnist" run_dir="$work/run" train.max_steps=3 \
  model.n_layers=1 model.d_model=16 model.n_heads=2 model.d_ff=32 model.n_mixtures=2 train.batch_size=4 \
  train.val_every=3 train.val_images=4 train.log_every=1 train.warmup_steps=2 threads=1 train.progress=false \
  2> >(tee "$work/train.err" >&2)
grep -q "compiling the C++ kernel for cpu done" "$work/train.err" \
  || { echo "wheel_check: the C++ kernel was not compiled from the installed sources" >&2; exit 1; }
test -f "$work/run/last.pt" || { echo "wheel_check: no checkpoint written" >&2; exit 1; }
# the shipped model, by name, from the installed wheel: the Python API and imagegen-sample with no checkpoint
"$py" - "$work/venv" <<'PY'
import sys
import imagegen
from imagegen.store import shipped
assert str(shipped.SHIPPED).startswith(sys.argv[1]), f"shipped models come from {shipped.SHIPPED}, not the wheel"
model = imagegen.load("mnist-linear")
images = model.generate(labels=[3], n=2, seed=0)
assert images.shape == (2, 28, 28, 1), images.shape
print(f"wheel_check: mnist-linear loaded from {shipped.SHIPPED} and sampled")
PY
"$work/venv/bin/imagegen-sample" nrow=1 progress=false threads=1
test -s "$work/mnist-linear-grid.png" || { echo "wheel_check: imagegen-sample wrote no grid" >&2; exit 1; }
echo "wheel_check: OK, wheel installed in a fresh venv and trained 3 steps in $((SECONDS - start)) s"
