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

.PHONY: setup port dry-run verify test test-slow bench kb-lint clean

$(STAMP): pyproject.toml Makefile
	@# the OS sandbox for workers (Debian's bubblewrap); without it workers are plain processes, and say so
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get update -qq && apt-get install -y -qq bubblewrap) >/dev/null 2>&1; } || true
	@command -v bwrap >/dev/null || echo "note: bubblewrap is not installed and could not be (apt-get install bubblewrap as root):" \
	  "workers run without the OS sandbox; 'xeforge env' and every verdict say so" >&2
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_PIN)" "$(TRITON_PIN)"
	$(BIN)/pip install -q -e ".[test,llm,ray]"
	touch $(STAMP)

setup: $(STAMP)

port: $(STAMP)
	$(BIN)/xeforge port $(KERNEL) --device $(DEVICE) $(ARGS)

dry-run: $(STAMP)
	$(BIN)/xeforge port $(KERNEL) --device $(DEVICE) --dry-run $(ARGS)

verify: $(STAMP)
	$(BIN)/xeforge verify $(KERNEL) --device $(DEVICE) $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not slow" $(ARGS)

# the tests marked slow: the style corpus's chained ports, its starts that need their own verifier, the real-world
# corpus's plans and verifications, the Ray cluster tests, and the few single tests of about 10-30 s (19:51 for 239
# tests on 2 cores, 2026-12-05); CI runs them after `make test`
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m slow $(ARGS)

bench: $(STAMP)
	$(BIN)/xeforge bench kernels/ --device $(DEVICE) $(ARGS)

kb-lint: $(STAMP)
	$(BIN)/xeforge kb lint

clean:
	rm -rf $(VENV) runs .pytest_cache
