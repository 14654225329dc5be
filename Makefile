# torchmem: `make demo` and `make test` set everything up from a bare Python 3.11.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
export MAX_JOBS ?= 2

SOURCES := setup.py $(shell find csrc -name '*.cpp' -o -name '*.h' -o -name '*.cu')

.PHONY: help demo test test-fast test-cpu test-install test-fakegpu test-fakegpu-cu12 test-frameworks sanitize sanitize-quick \
  fakegpu fakegpu-cu12 fakegpu-ext wheel clean

# `make help`: every target, one line each, from the `## ` note on its rule.
help: ## list the targets
	@awk -F ':.*## ' '/^[a-z][a-z0-9-]*:.*## / { printf "  %-18s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

# The fake GPU (fakegpu/, docs/fakegpu.md): stand-ins for libcudart, cuBLAS and
# cuBLASLt and NCCL plus fake libcuda.so.1 and libnvidia-ml.so.1, one set per CUDA major
# from one set of sources. The CUDA 13 set (build/fakegpu) is built with the
# CUDA headers of CUDA_HOME (or those of the CUDA torch venv's nvidia wheel);
# the CUDA 12 set (build/fakegpu/cuda12) with CUDA12_HOME's, else the newest
# CUDA 12 headers that a CUDA 12 torch venv's nvidia wheels hold
# (`make .venv-cuda-2.6.0/.deps FAKEGPU_TORCH=2.6.0` installs one).
CUDA_HOME ?= /usr/local/cuda
FAKEGPU_DIR := build/fakegpu
FAKEGPU12_DIR := $(FAKEGPU_DIR)/cuda12
FAKEGPU_CUDA_INCLUDE ?= $(firstword $(dir $(wildcard $(CUDA_HOME)/include/cuda_runtime_api.h .venv-cuda/lib/python3*/site-packages/nvidia/cu13/include/cuda_runtime_api.h)))
ifndef FAKEGPU12_CUDA_INCLUDE
FAKEGPU12_CUDA_INCLUDE := $(shell for d in $(CUDA12_HOME)/include .venv-cuda-*/lib/python3*/site-packages/nvidia/cuda_runtime/include; do \
  v=$$(sed -n 's/^\#define CUDART_VERSION *\(12[0-9][0-9][0-9]\).*/\1/p' $$d/cuda_runtime_api.h 2>/dev/null); \
  [ -n "$$v" ] && echo "$$v $$d"; done | sort -n | tail -n 1 | cut -d' ' -f2)
endif
FAKEGPU_INPUTS := fakegpu/build.py $(wildcard fakegpu/cudart/* fakegpu/include/*.h \
  fakegpu/libcuda/*.c fakegpu/nvml/*.c fakegpu/nccl/*.c fakegpu/cublas/*)
fakegpu_libs = $(1)/libtorchmem_fakecudart.so $(1)/libcuda.so.1 $(1)/libcuda.so $(1)/libnvidia-ml.so.1 $(1)/libcublas.so.$(2) \
  $(1)/libcublasLt.so.$(2) $(1)/libnccl.so.2
FAKEGPU_LIBS := $(call fakegpu_libs,$(FAKEGPU_DIR),13)
FAKEGPU12_LIBS := $(call fakegpu_libs,$(FAKEGPU12_DIR),12)

# One set per CUDA major, built by fakegpu/build.py (setup.py builds the installed package's set with it too).
$(FAKEGPU_LIBS) &: $(FAKEGPU_INPUTS)
	@test -n "$(FAKEGPU_CUDA_INCLUDE)" || { echo "fakegpu: no CUDA 13 headers (cuda_runtime_api.h): set CUDA_HOME or install a CUDA build of torch in .venv-cuda" >&2; exit 1; }
	$(PYTHON) fakegpu/build.py --major 13 --include $(FAKEGPU_CUDA_INCLUDE) --out $(FAKEGPU_DIR)

$(FAKEGPU12_LIBS) &: $(FAKEGPU_INPUTS)
	@test -n "$(FAKEGPU12_CUDA_INCLUDE)" || { echo "fakegpu: no CUDA 12 headers (cuda_runtime_api.h): set CUDA12_HOME or run make .venv-cuda-2.6.0/.deps FAKEGPU_TORCH=2.6.0" >&2; exit 1; }
	$(PYTHON) fakegpu/build.py --major 12 --include $(FAKEGPU12_CUDA_INCLUDE) --out $(FAKEGPU12_DIR)

# Both sets; the CUDA 12 one only where CUDA 12 headers are found.
fakegpu: $(FAKEGPU_LIBS) $(if $(FAKEGPU12_CUDA_INCLUDE),$(FAKEGPU12_LIBS)) ## build the fake GPU's libraries (CUDA 13, and 12 where headers are found)
	@$(if $(FAKEGPU12_CUDA_INCLUDE),:,echo "fakegpu: CUDA 12 set skipped: no CUDA 12 headers (set CUDA12_HOME, or run make .venv-cuda-2.6.0/.deps FAKEGPU_TORCH=2.6.0)")

fakegpu-cu12: $(FAKEGPU12_LIBS) ## build the fake GPU's CUDA 12 set alone

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
# is the default; another release comes from the public package index:
# `make test-fakegpu FAKEGPU_TORCH=2.11.0`.
FAKEGPU_TORCH ?= 2.14.1
CUDA_VENV ?= .venv-cuda$(if $(filter 2.14.1,$(FAKEGPU_TORCH)),,-$(FAKEGPU_TORCH))
CUDA_PY := $(CUDA_VENV)/bin/python
CUDA_BUILD := build/cuda-$(FAKEGPU_TORCH)
# Another release: the public index, not a pip configuration's local one (--isolated).
FAKEGPU_PIP := $(if $(filter 2.14.1,$(FAKEGPU_TORCH)),,--isolated)
# How many of the oracle's random workloads tests/fakegpu/test_native_oracle.py runs: 200 by default
# (CI's 2.11.0 tier), 100 in `make test` (each of the 16 settings still several times).
ORACLE_CASES ?= 200
FAKEGPU_ENV = PYTHONPATH=$(CURDIR) TORCHMEM_EXT_DIR=$(abspath $(CUDA_BUILD))/lib/torchmem TORCHMEM_FAKEGPU_LIBS=$(abspath $(FAKEGPU_DIR)) \
  TORCHMEM_FAKEGPU_LOG=$(abspath $(CUDA_BUILD))/unimplemented.log TORCHMEM_FAKEGPU_REQUIRED=1 TORCHMEM_ORACLE_CASES=$(ORACLE_CASES) \
  TORCHMEM_FAKEGPU_DATA=1

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

# torchmem's CUDA glue needs torch 2.8 or newer (csrc/torch/cuda_allocator.h): against older releases the
# build has the core and the CPU glue only, which is what the oracle and preflight need.
FAKEGPU_NO_GLUE := $(if $(filter 2.0.% 2.1.% 2.2.% 2.3.% 2.4.% 2.5.% 2.6.% 2.7.%,$(FAKEGPU_TORCH)),TORCHMEM_NO_CUDA=1)

$(CUDA_BUILD)/.built: $(CUDA_VENV)/.deps $(SOURCES)
	$(FAKEGPU_NO_GLUE) CUDA_HOME=$(CUDA_HOME) TORCH_CUDA_ARCH_LIST=9.0 $(CUDA_PY) setup.py -q build_ext \
	  --build-temp $(CUDA_BUILD)/temp --build-lib $(CUDA_BUILD)/lib
	$(CUDA_PY) -c "import glob, sys; sys.exit(0 if all(glob.glob('$(CUDA_BUILD)/lib/torchmem/' + n + '*.so') for n in ('_C', '_core')) else 'no extensions built in $(CUDA_BUILD)')"
	touch $@

fakegpu-ext: $(CUDA_BUILD)/.built ## build torchmem against the CUDA torch (build/cuda-RELEASE)

# A wheel built against the torch of WHEEL_PYTHON (default: the python3 on PATH,
# so an active environment's) and requiring that very torch, into WHEEL_DIR.
# Objects are kept per torch in build/<cpu|cuda>-<release>/temp (setup.py), so
# a wheel after `make test` only links.
WHEEL_PYTHON ?= $(PYTHON)
WHEEL_DIR ?= dist

wheel: ## build a wheel for WHEEL_PYTHON's torch into WHEEL_DIR
	$(WHEEL_PYTHON) -m pip wheel -q --no-build-isolation --no-deps -w $(WHEEL_DIR) .

demo: $(VENV)/.built ## set up .venv and run the demo
	$(PY) -m torchmem demo

# Both tiers run on one torch (the CUDA build, 2.14.1) and one build of torchmem
# (build/cuda-2.14.1): a second torch and a second build of the core cost a
# fresh clone about five minutes of the two cores. The CPU tier runs without the
# fake GPU, the fake-GPU tier on it. `make test-cpu CPU_TIER_TORCH=cpu` runs the CPU tier on the CPU
# build of torch $(TORCH_VERSION) in .venv with CPU_TIER_TORCH=cpu (CI runs it too). The fake GPU's CUDA 12 set is built too
# wherever a CUDA 12 torch venv (.venv-cuda-2.6.0) is here.
test: ## both tiers on torch 2.14.1 (the README's test command)
	$(MAKE) -j2 $(CUDA_VENV)/.deps $(FAKEGPU_LIBS)
	$(MAKE) fakegpu
	$(MAKE) $(CUDA_BUILD)/.built
	$(MAKE) test-cpu
	$(MAKE) test-fakegpu ORACLE_CASES=100

# pytest-xdist: one worker per core, each test file in one worker.
PYTEST_JOBS ?= 2
XDIST := -n $(PYTEST_JOBS) --dist loadfile

# The CPU tier, no fake GPU loaded: on the CUDA build of torch and torchmem (CPU_TIER_TORCH=cuda, the default),
# or on the CPU build of torch $(TORCH_VERSION) in .venv with the in-tree build (CPU_TIER_TORCH=cpu).
CPU_TIER_TORCH ?= cuda
CPU_TIER_ENV = PYTHONPATH=$(CURDIR) TORCHMEM_EXT_DIR=$(abspath $(CUDA_BUILD))/lib/torchmem

test-cpu: $(if $(filter cpu,$(CPU_TIER_TORCH)),$(VENV)/.built,$(CUDA_BUILD)/.built) ## the CPU tier (CPU_TIER_TORCH=cuda|cpu)
	$(if $(filter cpu,$(CPU_TIER_TORCH)),,$(CPU_TIER_ENV)) $(if $(filter cpu,$(CPU_TIER_TORCH)),$(PY),$(CUDA_PY)) \
	  -m pytest -q $(XDIST) tests --ignore=tests/fakegpu --ignore=tests/cuda $(PYTEST_ARGS)

# torchmem's wheels (make wheel) installed into fresh venvs, with the torches of .venv-cuda (2.14.1, CUDA 13),
# .venv-cuda-$(FAKEGPU12_TORCH) (CUDA 12) and .venv (CPU): each wheel carries the fake GPU's set for its torch,
# and preflight runs from it with no TORCHMEM_* variable. Several minutes, mostly pip unpacking the CUDA torches;
# CI runs it.
# pytest itself runs on the checkout's fake GPU (the tier's conftest asks for it); the venvs' commands get none
# of its variables. INSTALL_FLAVOURS picks some of the three: CI runs `cuda cpu`, then, with .venv-cuda gone,
# `make test-install FAKEGPU_TORCH=2.6.0 INSTALL_FLAVOURS=cuda12`, so that one CUDA torch is on disk at a time.
INSTALL_FLAVOURS ?= cuda cuda12 cpu

test-install: $(FAKEGPU_LIBS) $(CUDA_BUILD)/.built $(if $(filter cpu,$(INSTALL_FLAVOURS)),$(VENV)/.built) ## wheels in fresh venvs
	$(if $(filter cuda12,$(INSTALL_FLAVOURS)),$(MAKE) .venv-cuda-$(FAKEGPU12_TORCH)/.deps FAKEGPU_TORCH=$(FAKEGPU12_TORCH))
	$(FAKEGPU_ENV) TORCHMEM_INSTALL_TESTS=1 TORCHMEM_INSTALL_FLAVOURS="$(INSTALL_FLAVOURS)" \
	  $(CUDA_PY) -m torchmem.fakegpu -- $(CUDA_PY) -m pytest -q tests/fakegpu/test_install_wheel.py

# The fake-GPU tier on FAKEGPU_TORCH, with the fake GPU's set for its CUDA major (the launcher picks it).
FAKEGPU_MAJOR := $(if $(filter 2.6.% 2.7.% 2.8.% 2.9.% 2.10.%,$(FAKEGPU_TORCH)),12,13)
FAKEGPU_TESTS ?= tests/fakegpu tests/cuda

test-fakegpu: $(if $(filter 12,$(FAKEGPU_MAJOR)),$(FAKEGPU12_LIBS),$(FAKEGPU_LIBS)) $(CUDA_BUILD)/.built ## the fake-GPU tier
	@$(CUDA_PY) -c "import torch, sys; sys.exit(0 if (torch.version.cuda or '').startswith('$(FAKEGPU_MAJOR).') else 'FAKE-GPU TIER: torch ' + torch.__version__ + ' in $(CUDA_VENV) is not a CUDA $(FAKEGPU_MAJOR) build')"
	rm -f $(CUDA_BUILD)/unimplemented.log
	$(FAKEGPU_ENV) $(CUDA_PY) -m torchmem.fakegpu -- $(CUDA_PY) -m pytest -q $(XDIST) $(FAKEGPU_TESTS) $(PYTEST_ARGS)

# The framework tests (tests/fakegpu/test_frameworks.py): PEFT, TRL, liger-kernel, Accelerate's FSDP and
# DeepSpeed on the fake GPU. Their packages go into .venv-frameworks, which sees the CUDA venv's torch through
# a .pth file, so no second torch is installed. CI runs it; `make test` skips these tests.
FRAMEWORKS_VENV := .venv-frameworks
FRAMEWORKS_PY := $(FRAMEWORKS_VENV)/bin/python

$(FRAMEWORKS_VENV)/.deps: requirements-frameworks.txt $(CUDA_VENV)/.deps
	test -x $(FRAMEWORKS_PY) || $(PYTHON) -m venv $(FRAMEWORKS_VENV)
	$(CUDA_PY) -c "import site; print(site.getsitepackages()[0])" > \
	  "$$($(FRAMEWORKS_PY) -c 'import site; print(site.getsitepackages()[0])')/torchmem_cuda_venv.pth"
	DS_BUILD_OPS=0 $(FRAMEWORKS_PY) -m pip install -q --no-build-isolation -r requirements-frameworks.txt
	touch $@

test-frameworks: $(FRAMEWORKS_VENV)/.deps $(FAKEGPU_LIBS) $(CUDA_BUILD)/.built ## PEFT, TRL, DeepSpeed... on the fake GPU
	$(FAKEGPU_ENV) $(FRAMEWORKS_PY) -m torchmem.fakegpu -- $(FRAMEWORKS_PY) -m pytest -q tests/fakegpu/test_frameworks.py $(PYTEST_ARGS)

# The CUDA 12 tier (docs/fakegpu.md): torch $(FAKEGPU12_TORCH), a CUDA 12 build from the package index,
# on the CUDA 12 stand-ins (build/fakegpu/cuda12, picked by the launcher from the venv's torch): the fake
# GPU's own checks, the oracle's first $(FAKEGPU12_ORACLE_CASES) workloads, the preflight workloads, torch.compile
# and --world-size on the NCCL stand-in. A second make reads the headers the venv's nvidia wheels bring.
FAKEGPU12_TORCH ?= 2.6.0
FAKEGPU12_ORACLE_CASES ?= 100
FAKEGPU12_TESTS ?= tests/fakegpu/test_cuda_majors.py tests/fakegpu/test_runtime.py tests/fakegpu/test_cublas_standin.py \
  tests/fakegpu/test_native_oracle.py tests/fakegpu/test_preflight.py tests/fakegpu/test_preflight_workloads.py tests/fakegpu/test_compile.py \
  tests/fakegpu/test_preflight_world.py

test-fakegpu-cu12: ## the CUDA 12 tier (torch FAKEGPU12_TORCH, default 2.6.0)
	$(MAKE) .venv-cuda-$(FAKEGPU12_TORCH)/.deps FAKEGPU_TORCH=$(FAKEGPU12_TORCH)
	$(MAKE) test-fakegpu FAKEGPU_TORCH=$(FAKEGPU12_TORCH) ORACLE_CASES=$(FAKEGPU12_ORACLE_CASES) FAKEGPU_TESTS="$(FAKEGPU12_TESTS)"

test-fast: $(FAKEGPU_LIBS) $(CUDA_BUILD)/.built ## both tiers without the slow tests, stopping at the first failure
	$(CPU_TIER_ENV) $(CUDA_PY) -m pytest -q -x $(XDIST) tests --ignore=tests/fakegpu --ignore=tests/cuda -m "not slow"
	$(FAKEGPU_ENV) $(CUDA_PY) -m torchmem.fakegpu -- $(CUDA_PY) -m pytest -q -x $(XDIST) tests/fakegpu tests/cuda -m "not slow"

# The C++ core's test driver under ASan+UBSan (leaks on) and, separately, TSan.
sanitize: ## the C++ core's drivers under ASan+UBSan, then TSan
	scripts/sanitize.sh

# The quick pass also runs the drivers' pytest checks (tests/package/test_sanitizers.py),
# which make test leaves out: a third build of the core.
sanitize-quick: $(VENV)/.built ## a quick sanitizer pass and its pytest checks
	TORCHMEM_QUICK=1 scripts/sanitize.sh
	TORCHMEM_CPP_DRIVERS=1 $(PY) -m pytest -q tests/package/test_sanitizers.py

clean: ## remove builds and venvs
	rm -rf build dist *.egg-info torchmem/*.so $(VENV) .venv-cuda*
