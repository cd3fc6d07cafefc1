#!/usr/bin/env bash
# The training app under torchrun, driven by environment variables; arguments are Hydra overrides.
#   NNODES (1) NPROC_PER_NODE (2) NODE_RANK (0) MASTER_ADDR (localhost) MASTER_PORT (29500)
#   RUN_DIR (the repository root): the job's working directory, where relative paths
#   (checkpoint.dir=checkpoints) and HOLD.json go.
#   bash scripts/train.sh backend=triton pipeline.staleness=1
# Without a GPU the Triton kernels run in Triton's interpreter (TRITON_INTERPRET=1 is set).
# Exit codes: 0 finished or pre-empted (saved), 3 held on a permanent error, 4 held waiting
# for data (HOLD.json says why; torchrun alone exits 1 for both holds).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
cd "${RUN_DIR:-$ROOT}"
if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  export TRITON_INTERPRET=1
fi
exec python3 -m pipelines.app.supervise --once -- torchrun --nnodes "${NNODES:-1}" --nproc_per_node "${NPROC_PER_NODE:-2}" \
  --node_rank "${NODE_RANK:-0}" --master_addr "${MASTER_ADDR:-localhost}" --master_port "${MASTER_PORT:-29500}" \
  -m pipelines.app.train "$@"
