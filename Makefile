# One command per job on a fresh CPU machine:
#   make test    create .venv, install the pinned CPU stack and the project, run the tests
#   make train   the main job: DLRM on synthetic data, 2 processes, backend=triton (ARGS= overrides)
#   make ab      the A/B report of the training app, fbgemm vs triton (ARGS= overrides)
#   make bench   the A/B forward benchmark in its tiny CPU smoke mode
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed-cpu-stack

.PHONY: install test test-fast bench train ab clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch 2.13.0 (CPU build) first, so nothing below pulls a CUDA wheel.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q fbgemm-gpu-cpu==1.8.0 triton==3.6.0 "numpy<2.3"
	# torchrec's metadata demands the CUDA fbgemm-gpu: install it without deps,
	# then its real dependencies.
	$(PIP) install -q --no-deps torchrec==1.8.0
	$(PIP) install -q tensordict "torchmetrics==1.0.3" tqdm pyre-extensions iopath
	# The training app's configuration and launcher (the device stack has the same versions).
	$(PIP) install -q hydra-core==1.3.2 omegaconf==2.3.0 torchx==0.7.0
	# The app's TensorBoard events and the A/B report's plots.
	$(PIP) install -q tensorboard==2.21.0 matplotlib==3.10.8
	# Shared input generation (pipelines/inputs): Parquet/Arrow and the store's filesystems.
	$(PIP) install -q pyarrow==26.0.1 fsspec==2026.9.0
	$(PIP) install -q -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

# Two workers (CI has 2 cores), a test file per worker at a time: module fixtures stay shared.
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile tests

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" tests

# The main job: DLRM on the embedded synthetic click log, 2 CPU processes (gloo), backend=triton
# (Triton's interpreter on CPU), 200 steps, AUC / log loss, checkpoints in ./checkpoints. Overrides: ARGS=...
train: $(STAMP)
	TRITON_INTERPRET=1 $(VENV)/bin/torchrun --standalone --nproc_per_node 2 -m pipelines.app.train backend=triton checkpoint=periodic $(ARGS)

# The A/B report (backend=fbgemm vs backend=triton, each twice, interleaved) on the tiny default,
# one process per run (Triton's interpreter is slow): ab-report/report.md.
ab: $(STAMP)
	$(PY) scripts/ab.py --out ab-report --nproc 1 -- steps=30 eval_every_steps=10 $(ARGS)

bench: $(STAMP)
	TRITON_INTERPRET=1 $(PY) -m tbe_plugin.benchmarks.forward --smoke --out bench-out

clean:
	rm -rf $(VENV)
