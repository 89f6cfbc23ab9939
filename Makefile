# Two commands matter: `make demo` (the main job) and `make test` (the suite, which
# also builds the docs site); `make docs` builds the site alone into site/.
# `make check` is the edit loop's fast tier (no slow, no multi-process tests);
# `make lint` runs ruff and the type checker (mypy). CI (.ci/run) runs lint, then test.
# Both create and use a project-local virtual environment in .venv.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
EXTRAS ?= lms,ddl,cpu,mpi,dev,hub-deps
PYTEST_ARGS ?=

export TF_CPP_MIN_LOG_LEVEL ?= 3

.PHONY: install test check demo bench docs lint clean

install: $(STAMP)

$(PY):
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "Python >= 3.10 is required, found " + sys.version' \
	  || { echo "error: set PYTHON=/path/to/python3.10+ (make install PYTHON=python3.11)"; exit 2; }
	$(PYTHON) -m venv $(VENV)

# Reinstall only when the packaging metadata changes; the install is editable,
# so source edits need no reinstall. With 'hub-deps' in EXTRAS, KerasHub itself follows
# without its requirement tensorflow-text, which would pull the full tensorflow wheel over
# tensorflow-cpu (setup.cfg, 'hub'); its pin there and here: tests/tflms/test_kerashub.py.
$(STAMP): $(PY) setup.cfg setup.py pyproject.toml ddl_tf/core/numerics/halfkernels.c \
	  tflms/simulation/kernels.c
	$(PY) -m pip install --disable-pip-version-check -q -e '.[$(EXTRAS)]'
	$(if $(findstring hub-deps,$(EXTRAS)),$(PY) -m pip install --disable-pip-version-check -q \
	  --no-deps 'keras-hub==0.32.*; python_version >= "3.11"')
	@touch $@

# The suite: everything not marked bench. Its target is about 20 minutes on 2 cores: a
# test that would push it past that is made cheaper, or marked bench when another test
# here walks the same path (docs/contributing.md, "What make test leaves to make bench").
# Two pytest-xdist workers (TEST_WORKERS; 0 runs in this process): each file's tests in one
# worker, the tests that start MPI jobs one after another in one (tests/harness.py); then
# the tests that measure TensorFlow's real allocator or wall-clock time, alone.
TEST_WORKERS ?= 2
test: install
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not bench and not measures" \
	  --durations=40 $(PYTEST_ARGS)
	$(PY) -m pytest -m "measures and not bench" --durations=10 $(PYTEST_ARGS)

# The fast tier: single-process, not slow (under 3 minutes on 2 cores). Property tests
# draw 100 examples here (the hypothesis profile "quick"), 300 under `make test` ("ci",
# derandomized, under CI; "test" otherwise) and 2,000 under `make bench` (the tests
# marked bench take the profile "bench"; tests/harness.py).
check: install
	HYPOTHESIS_PROFILE=quick $(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup \
	  -m "not slow and not parallel and not bench" $(PYTEST_ARGS)

# The demo and the benchmarks run TensorFlow's oneDNN kernels on every x86-64 CPU:
# TensorFlow turns them on by itself only on AVX-512-class CPUs, and without them
# the demo's training step runs 5x slower on an AVX2-only CPU
# (benchmarks/bench_cpu_kernels.py, results/cpu_kernels.json). TF_ENABLE_ONEDNN_OPTS=0 make demo keeps
# TensorFlow's own choice. The test suite runs with whatever the machine gives.
demo bench: export TF_ENABLE_ONEDNN_OPTS ?= 1

# The main job: a 3D U-Net with tflms.LMSCallback + ddl_tf on 2 MPI ranks.
# Pass flags with DEMO_ARGS, e.g. make demo DEMO_ARGS="--epochs 5 --size 32".
DEMO_ARGS ?=
demo: install
	$(VENV)/bin/ddlrun -np 2 examples/unet3d_demo.py --out out/demo $(DEMO_ARGS)

# The Horovod peer (benchmarks/peers/horovod/build.sh: Horovod 0.28.1 built against
# this TensorFlow in benchmarks/peers/.venv-horovod, ~12 minutes once, then skipped)
# is only for bench_horovod.py's side-by-side figures; it is never a dependency.
# After the scripts, the tests marked bench: the longer runs (property tests at 2,000
# examples, 10,000 collectives per forced algorithm) and the repeats `make test` leaves out.
bench: install
	@mkdir -p benchmarks/results
	benchmarks/peers/horovod/build.sh $(PY)
	@set -e; for script in benchmarks/bench_*.py; do \
	  [ -e "$$script" ] || continue; \
	  echo "== $$script"; $(PY) "$$script"; \
	done
	$(PY) -m pytest -m bench -p no:cacheprovider $(PYTEST_ARGS)

# The documentation site (mkdocs.yml, docs/): strict, so a broken link, a missing
# reference or a results file a page asks for that does not exist fails the build.
docs: install
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

lint: install
	$(VENV)/bin/ruff check tflms ddl_tf tests benchmarks examples docs/_hooks
	$(VENV)/bin/ruff format --check tflms ddl_tf tests benchmarks examples docs/_hooks
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) build dist site *.egg-info .pytest_cache .ruff_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
