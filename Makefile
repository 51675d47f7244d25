# xeforge — the two commands the README promises work on a fresh machine:
#   make port KERNEL=kernels/gemm_relu     (sets up, then ports on the CPU interpreter unless a GPU is present)
#   make test                              (sets up, then runs the test suite)
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.xeforge-setup
KERNEL ?= kernels/gemm_relu
DEVICE ?= auto
ARGS ?=
# CI and CPU machines: the CPU torch wheel (a looser requirement would download a multi-GB CUDA build)
# and Triton 3.8 (still has tl.make_block_ptr, has tensor descriptors).
TORCH_PIN ?= torch==2.13.0
TRITON_PIN ?= triton==3.8.0

.PHONY: setup port dry-run verify test bench kb-lint clean

$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_PIN)" "$(TRITON_PIN)"
	$(BIN)/pip install -q -e ".[test,llm]"
	touch $(STAMP)

setup: $(STAMP)

port: $(STAMP)
	$(BIN)/xeforge port $(KERNEL) --device $(DEVICE) $(ARGS)

dry-run: $(STAMP)
	$(BIN)/xeforge port $(KERNEL) --device $(DEVICE) --dry-run $(ARGS)

verify: $(STAMP)
	$(BIN)/xeforge verify $(KERNEL) --device $(DEVICE) $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q $(ARGS)

bench: $(STAMP)
	$(BIN)/xeforge bench kernels/ --device $(DEVICE) $(ARGS)

kb-lint: $(STAMP)
	$(BIN)/xeforge kb lint

clean:
	rm -rf $(VENV) runs .pytest_cache
