# Two commands on a fresh clone: `make demo` and `make test`. Both build .venv first, with every extra.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup demo test bench samples captures protos fuzz golden clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[tf,dev,ray]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/tpuprof memory sample_profiles/dumps/conv18_f32_v5e
	@# Last: one self-contained page over every sample (dumps, captures, OOM texts); its path is the final line. The
	@# page is the demo's own: a second `make demo` replaces it.
	@$(BIN)/tpuprof report sample_profiles/dumps/* $(wildcard sample_profiles/captures/*) sample_profiles/oom/*.txt \
		--title "tpuprof demo: the sample profiles" -o $(CURDIR)/out/report.html --force >/dev/null
	@echo "Report: $(CURDIR)/out/report.html"

# Every test on WORKERS processes (xdist), then the 25 slowest. libtpu compiles on one thread, so a second worker
# uses the second core; tests that share a session or module fixture run on one worker (tests/helpers/workers.py).
# `pytest -m "not compile and not jobs"` leaves out libtpu compiles and training jobs (markers: pyproject.toml).
WORKERS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(WORKERS) --dist loadgroup --no-loadscope-reorder --durations=25

bench: $(STAMP)
	$(BIN)/python bench/bench_memory.py
	$(BIN)/python bench/bench_analyze.py

# Fuzzes every parser for MINUTES minutes in all (one worker process, niced: the machine is shared); crashing,
# hanging and memory-hungry inputs are saved under out/fuzz/. `make test` runs 60 seeded inputs per parser.
MINUTES ?= 10
fuzz: $(STAMP)
	nice $(BIN)/python tests/fuzz/run.py --minutes $(MINUTES)

# Rewrites tests/golden/ (every sample's --json document) from the current code: review `git diff tests/golden`.
golden: $(STAMP)
	TPUPROF_UPDATE_GOLDEN=1 $(BIN)/python -m pytest -q tests/test_golden.py

# Regenerates the committed sample dumps with libtpu (compile-only, no TPU needed).
samples: $(STAMP)
	$(BIN)/python sample_profiles/generate.py

# Recaptures the committed sample profiles from the bottleneck jobs in sample_profiles/jobs (loopback).
captures: $(STAMP)
	$(BIN)/python sample_profiles/make_captures.py

# Rewrites tpuprof/_protos/ (XLA's and TSL's protos that tpuprof ships) from the TensorFlow wheel in .venv: run it
# after upgrading TensorFlow, then review `git diff tpuprof/_protos`.
protos: $(STAMP)
	$(BIN)/python tools/generate_protos.py

clean:
	rm -rf $(VENV) .pytest_cache
