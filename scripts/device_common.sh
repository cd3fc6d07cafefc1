# Sourced by the device scripts: the GPU stack on the path, $OUT, the commit the caller sent
# (the device's copy of the tree has no .git) and device.txt (GPU, versions, commit, $1).
set -uo pipefail
export PYTHONPATH=/tmp/gpu-site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-bench-out}
mkdir -p "$OUT"
: "${TBE_PLUGIN_COMMIT:?set TBE_PLUGIN_COMMIT (and TBE_PLUGIN_DIRTY) from the checkout that was sent}"
export TBE_PLUGIN_COMMIT TBE_PLUGIN_DIRTY=${TBE_PLUGIN_DIRTY:-}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  echo "commit $TBE_PLUGIN_COMMIT dirty ${TBE_PLUGIN_DIRTY:-unknown} ${1:-}"; } | tee "$OUT/device.txt"
