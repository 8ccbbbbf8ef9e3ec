# Two set-up commands (see README): `make demo` runs the main job, `make test` runs the whole suite.
# Each creates .venv and installs what it needs. Where the system Python already has torch (a GPU
# cluster), the venv reuses it (--system-site-packages) and pip never replaces it; elsewhere torch
# 2.13.0 is installed (on this kind of machine: the CPU wheel from local disk).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0

.PHONY: demo test test-gpu test-gpu-one gpu-one-device wheels bench clean install slurm-up slurm-down

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py reshardctl/runtime/_rowsums.c
	@if $(PYTHON) -c "import torch" >/dev/null 2>&1; then \
		echo "system torch found: the venv reuses it"; \
		$(PYTHON) -m venv --system-site-packages $(VENV); \
	else \
		$(PYTHON) -m venv $(VENV); \
		$(PY) -c "import torch" >/dev/null 2>&1 || $(PY) -m pip install -q "torch==$(TORCH_VERSION)"; \
	fi
	$(PY) -m pip install -q -e ".[test]"
	@touch $@

demo: install
	$(VENV)/bin/reshardctl run

# the suite in TEST_WORKERS parallel worker processes (pytest-xdist; tests/conftest.py keeps the tests that
# share the Slurm cluster or a module's set-up in one worker each); TEST_WORKERS=0 runs it in this process
TEST_WORKERS ?= 3

test: install
	$(PY) -m pytest -q -n $(TEST_WORKERS)

# the GPU tests (marked gpu); those marked gpus(n) skip with "needs n GPUs, found k" on fewer devices;
# the CPU suite never runs them
test-gpu: install
	RESHARDCTL_TEST_GPU=1 $(PY) -m pytest -q -m gpu

# the GPU tests one device can run (the multi_gpu ones deselected): a lent single-GPU machine
test-gpu-one: install
	RESHARDCTL_TEST_GPU=1 $(PY) -m pytest -q -rs -m "gpu and not multi_gpu"

# one GPU's checks as one script (< 8 min; no install: it reuses the machine's CUDA torch); docs/gpu.md
GPU_OUT ?= gpu-one-device
gpu-one-device:
	bash benchmarks/gpu_one_device.sh "$(GPU_OUT)"

# the pure-Python dependencies as wheels, for a GPU machine without network (carry build/wheels there and
# run the script with RESHARDCTL_WHEELS=build/wheels); WHEELS_PYTHON: that machine's Python (e.g. 3.10)
WHEELS_PYTHON ?= $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
wheels:
	$(PYTHON) -m pip download -q -d build/wheels --only-binary=:all: --python-version "$(WHEELS_PYTHON)" \
		--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
		--platform any "numpy>=1.24" "typer>=0.12" "rich>=13" "pyyaml>=6" "safetensors>=0.4"

bench: install
	$(PY) benchmarks/refit_local.py
	$(PY) benchmarks/plan_scale.py

# a real Slurm cluster on this machine for the Slurm tests (root; Debian/Ubuntu): see tests/slurm/
slurm-up:
	tests/slurm/cluster-up.sh

slurm-down:
	tests/slurm/cluster-down.sh

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
