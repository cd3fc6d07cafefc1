#!/usr/bin/env bash
# The training app under torchrun, driven by environment variables; arguments are Hydra overrides.
#   NNODES (1) NPROC_PER_NODE (2) NODE_RANK (0) MASTER_ADDR (localhost) MASTER_PORT (29500)
#   bash scripts/train.sh backend=triton pipeline.staleness=1
# Without a GPU the Triton kernels run in Triton's interpreter (TRITON_INTERPRET=1 is set).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  export TRITON_INTERPRET=1
fi
exec torchrun --nnodes "${NNODES:-1}" --nproc_per_node "${NPROC_PER_NODE:-2}" --node_rank "${NODE_RANK:-0}" \
  --master_addr "${MASTER_ADDR:-localhost}" --master_port "${MASTER_PORT:-29500}" -m pipelines.train "$@"
