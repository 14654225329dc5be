# torchmem: `make demo` and `make test` set everything up from a bare Python 3.11.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
export MAX_JOBS ?= 2

SOURCES := setup.py $(shell find csrc -name '*.cpp' -o -name '*.h' -o -name '*.cu')

.PHONY: demo test test-fast sanitize sanitize-quick clean

# A venv that also sees system packages, so a CUDA build of torch already
# installed is used as it is; otherwise the CPU build of torch $(TORCH_VERSION).
$(VENV)/.deps: requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -c "import torch, sys; sys.exit(0 if torch.version.cuda else 1)" 2>/dev/null || \
	  $(PY) -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('$(TORCH_VERSION)') else 1)" 2>/dev/null || \
	  $(PY) -m pip install torch==$(TORCH_VERSION)
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

$(VENV)/.built: $(VENV)/.deps $(SOURCES)
	$(PY) -m pip install -q --no-build-isolation -e .
	touch $@

demo: $(VENV)/.built
	$(PY) -m torchmem demo

test: $(VENV)/.built
	$(PY) -m pytest -q tests

test-fast: $(VENV)/.built
	$(PY) -m pytest -q -x tests -m "not slow"

# The C++ core's test driver under ASan+UBSan (leaks on) and, separately, TSan.
sanitize:
	scripts/sanitize.sh

sanitize-quick:
	TORCHMEM_QUICK=1 scripts/sanitize.sh

clean:
	rm -rf build *.egg-info torchmem/*.so $(VENV)
