# Two entry points that do all the set-up on a fresh machine with only python3:
#   make demo   build TFRecords from data/, train, eval, vis and export on them
#   make test   run the test suite, spread over every core (pytest-xdist)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test bench install clean

$(STAMP): setup.cfg setup.py pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	PATH="$(abspath $(VENV))/bin:$$PATH" bash scripts/demo.sh

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -n auto --dist worksteal --durations=25 $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) benchmarks/bench_input.py

clean:
	rm -rf $(VENV) work
