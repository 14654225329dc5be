# torchmem: `make demo` and `make test` set everything up from a bare Python 3.11.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
export MAX_JOBS ?= 2

SOURCES := setup.py $(shell find csrc -name '*.cpp' -o -name '*.h' -o -name '*.cu')

.PHONY: demo test test-fast test-cpu test-fakegpu sanitize sanitize-quick clean fakegpu fakegpu-ext

# The fake GPU (fakegpu/, docs/fakegpu.md): a stand-in for libcudart.so.13
# plus fake libcuda.so.1 and libnvidia-ml.so.1, built with the CUDA headers of
# CUDA_HOME (or those of the CUDA torch venv's nvidia wheel).
CUDA_HOME ?= /usr/local/cuda
FAKEGPU_DIR := build/fakegpu
FAKEGPU_CUDA_INCLUDE ?= $(firstword $(dir $(wildcard $(CUDA_HOME)/include/cuda_runtime_api.h .venv-cuda/lib/python3*/site-packages/nvidia/cu13/include/cuda_runtime_api.h)))
FAKEGPU_CFLAGS := -O2 -g -fPIC -Wall -Wextra -Werror -std=gnu11 -I$(FAKEGPU_CUDA_INCLUDE)
FAKEGPU_SOURCES := $(wildcard fakegpu/src/*.c)
FAKEGPU_OBJECTS := $(patsubst fakegpu/src/%.c,$(FAKEGPU_DIR)/obj/%.o,$(FAKEGPU_SOURCES))
FAKEGPU_LIBS := $(FAKEGPU_DIR)/libtorchmem_fakecudart.so $(FAKEGPU_DIR)/libcuda.so.1 $(FAKEGPU_DIR)/libnvidia-ml.so.1 \
  $(FAKEGPU_DIR)/libcublas.so.13 $(FAKEGPU_DIR)/libcublasLt.so.13

fakegpu: $(FAKEGPU_LIBS)

$(FAKEGPU_DIR)/obj/%.o: fakegpu/src/%.c fakegpu/src/state.h fakegpu/include/fakegpu.h
	@test -n "$(FAKEGPU_CUDA_INCLUDE)" || { echo "fakegpu: no CUDA headers (cuda_runtime_api.h): set CUDA_HOME, or install a CUDA build of torch in .venv-cuda" >&2; exit 1; }
	@mkdir -p $(@D)
	$(CC) $(FAKEGPU_CFLAGS) -c $< -o $@

$(FAKEGPU_DIR)/libtorchmem_fakecudart.so: $(FAKEGPU_OBJECTS) fakegpu/gen_stubs.py fakegpu/cudart_symbols.txt
	$(PYTHON) fakegpu/gen_stubs.py fakegpu/cudart_symbols.txt $(FAKEGPU_DIR)/gen $(FAKEGPU_OBJECTS)
	$(CC) $(FAKEGPU_CFLAGS) -c $(FAKEGPU_DIR)/gen/stubs.c -o $(FAKEGPU_DIR)/obj/stubs.o
	$(CC) -shared -o $@ $(FAKEGPU_OBJECTS) $(FAKEGPU_DIR)/obj/stubs.o -Wl,--version-script=$(FAKEGPU_DIR)/gen/cudart.map -Wl,-soname,libtorchmem_fakecudart.so -lpthread

$(FAKEGPU_DIR)/libcuda.so.1: fakegpu/libcuda/libcuda.c
	@mkdir -p $(@D)
	$(CC) $(FAKEGPU_CFLAGS) -shared -o $@ $< -Wl,-soname,libcuda.so.1

$(FAKEGPU_DIR)/libnvidia-ml.so.1: fakegpu/nvml/nvml.c
	@mkdir -p $(@D)
	$(CC) $(FAKEGPU_CFLAGS) -shared -o $@ $< -Wl,-soname,libnvidia-ml.so.1

# cuBLAS and cuBLASLt stand-ins (fakegpu/cublas/, docs/preflight.md): the real
# libraries' sonames and version nodes; compute routines succeed without computing.
FAKEGPU_BLAS := $(FAKEGPU_DIR)/blas

$(FAKEGPU_BLAS)/%.o: fakegpu/cublas/%.c fakegpu/cublas/common.h
	@mkdir -p $(@D)
	$(CC) $(FAKEGPU_CFLAGS) -c $< -o $@

# $(call fakegpu_blas,NAME): libNAME.so.13 from fakegpu/cublas/NAME.c, common.c and the generated stubs.
fakegpu_blas = $(PYTHON) fakegpu/cublas/gen_stubs.py fakegpu/cublas/$(1)_symbols.txt lib$(1).so.13 $(FAKEGPU_BLAS)/gen-$(1) $(FAKEGPU_BLAS)/$(1).o && \
  $(CC) $(FAKEGPU_CFLAGS) -c $(FAKEGPU_BLAS)/gen-$(1)/stubs.c -o $(FAKEGPU_BLAS)/gen-$(1)/stubs.o && \
  $(CC) -shared -o $(FAKEGPU_DIR)/lib$(1).so.13 $(FAKEGPU_BLAS)/$(1).o $(FAKEGPU_BLAS)/common.o $(FAKEGPU_BLAS)/gen-$(1)/stubs.o \
    -Wl,--version-script=$(FAKEGPU_BLAS)/gen-$(1)/exports.map -Wl,-soname,lib$(1).so.13

$(FAKEGPU_DIR)/libcublas.so.13: $(FAKEGPU_BLAS)/cublas.o $(FAKEGPU_BLAS)/common.o fakegpu/cublas/gen_stubs.py fakegpu/cublas/cublas_symbols.txt
	$(call fakegpu_blas,cublas)

$(FAKEGPU_DIR)/libcublasLt.so.13: $(FAKEGPU_BLAS)/cublasLt.o $(FAKEGPU_BLAS)/common.o fakegpu/cublas/gen_stubs.py fakegpu/cublas/cublasLt_symbols.txt
	$(call fakegpu_blas,cublasLt)

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

# The fake-GPU tier (docs/fakegpu.md): a CUDA build of torch in its own venv,
# torchmem built against it into build/cuda-$(FAKEGPU_TORCH) (the in-tree
# extension stays the CPU tier's), and pytest run on the fake GPU. torch 2.14.1
# lies on this machine's disk; other releases (2.11.0, 2.13.0) come from the
# package index: `make test-fakegpu FAKEGPU_TORCH=2.11.0`.
FAKEGPU_TORCH ?= 2.14.1
CUDA_VENV ?= .venv-cuda$(if $(filter 2.14.1,$(FAKEGPU_TORCH)),,-$(FAKEGPU_TORCH))
CUDA_PY := $(CUDA_VENV)/bin/python
CUDA_BUILD := build/cuda-$(FAKEGPU_TORCH)
FAKEGPU_PIP := $(if $(filter 2.14.1,$(FAKEGPU_TORCH)),,--isolated --cert /etc/ssl/certs/ca-certificates.crt)
FAKEGPU_ENV = PYTHONPATH=$(CURDIR) TORCHMEM_EXT_DIR=$(abspath $(CUDA_BUILD))/lib/torchmem TORCHMEM_FAKEGPU_LIBS=$(abspath $(FAKEGPU_DIR)) \
  TORCHMEM_FAKEGPU_LOG=$(abspath $(CUDA_BUILD))/unimplemented.log TORCHMEM_FAKEGPU_REQUIRED=1

$(CUDA_VENV)/.deps: requirements-dev.txt requirements-fakegpu.txt
	test -x $(CUDA_PY) || $(PYTHON) -m venv $(CUDA_VENV)
	$(CUDA_PY) -c "import torch, sys; sys.exit(0 if torch.version.cuda and torch.__version__.startswith('$(FAKEGPU_TORCH)') else 1)" 2>/dev/null || \
	  $(CUDA_PY) -m pip install $(FAKEGPU_PIP) torch==$(FAKEGPU_TORCH) || \
	  { echo "FAKE-GPU TIER: no CUDA build of torch $(FAKEGPU_TORCH) could be installed; the tier cannot run" >&2; exit 1; }
	$(CUDA_PY) -c "import torch, sys; sys.exit(0 if torch.version.cuda else 'FAKE-GPU TIER: torch ' + torch.__version__ + ' in $(CUDA_VENV) is not a CUDA build')"
	$(CUDA_PY) -m pip install -q -r requirements-dev.txt
	$(CUDA_PY) -m pip install -q $(FAKEGPU_PIP) -r requirements-fakegpu.txt
	$(CUDA_PY) -c "import torch, sys; sys.exit(0 if torch.version.cuda else 'FAKE-GPU TIER: requirements-fakegpu.txt replaced the CUDA build of torch')"
	touch $@

$(CUDA_BUILD)/.built: $(CUDA_VENV)/.deps $(SOURCES)
	CUDA_HOME=$(CUDA_HOME) TORCH_CUDA_ARCH_LIST=9.0 $(CUDA_PY) setup.py -q build_ext \
	  --build-temp $(CUDA_BUILD)/temp --build-lib $(CUDA_BUILD)/lib
	$(CUDA_PY) -c "import glob, sys; sys.exit(0 if glob.glob('$(CUDA_BUILD)/lib/torchmem/_C*.so') else 'no extension built in $(CUDA_BUILD)')"
	touch $@

fakegpu-ext: $(CUDA_BUILD)/.built

demo: $(VENV)/.built
	$(PY) -m torchmem demo

# The two tiers' set-ups overlap: the CUDA torch's install (mostly disk) beside
# the CPU build, then the CUDA build beside the CPU tier's tests.
test:
	$(MAKE) -j2 $(VENV)/.built $(CUDA_VENV)/.deps $(FAKEGPU_LIBS)
	$(MAKE) -j2 test-cpu $(CUDA_BUILD)/.built
	$(MAKE) test-fakegpu

# pytest-xdist: one worker per core, each test file in one worker.
PYTEST_JOBS ?= 2
XDIST := -n $(PYTEST_JOBS) --dist loadfile

test-cpu: $(VENV)/.built
	$(PY) -m pytest -q $(XDIST) tests --ignore=tests/fakegpu --ignore=tests/cuda

test-fakegpu: $(FAKEGPU_LIBS) $(CUDA_BUILD)/.built
	rm -f $(CUDA_BUILD)/unimplemented.log
	$(FAKEGPU_ENV) $(CUDA_PY) -m torchmem.fakegpu -- $(CUDA_PY) -m pytest -q $(XDIST) tests/fakegpu tests/cuda $(PYTEST_ARGS)

test-fast: $(VENV)/.built $(FAKEGPU_LIBS) $(CUDA_BUILD)/.built
	$(PY) -m pytest -q -x $(XDIST) tests --ignore=tests/fakegpu --ignore=tests/cuda -m "not slow"
	$(FAKEGPU_ENV) $(CUDA_PY) -m torchmem.fakegpu -- $(CUDA_PY) -m pytest -q -x $(XDIST) tests/fakegpu tests/cuda -m "not slow"

# The C++ core's test driver under ASan+UBSan (leaks on) and, separately, TSan.
sanitize:
	scripts/sanitize.sh

sanitize-quick:
	TORCHMEM_QUICK=1 scripts/sanitize.sh

clean:
	rm -rf build *.egg-info torchmem/*.so $(VENV) .venv-cuda*
