# Two commands for a fresh machine with Python and nothing else:
#   make demo   set up, then run the node live against a replayed sample bag
#   make test   set up, then run the whole test suite (what CI runs)
# Set-up is a virtual environment in .venv with the package, the PyPI ROS 2
# wheels and the test tools. torch is installed first from TORCH_SPEC (the
# CPU build this workplace keeps on disk); elsewhere pass your own, e.g.
#   make test TORCH_SPEC='torch --index-url https://download.pytorch.org/whl/cpu'

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup demo test bench clean

$(INSTALLED): setup.py package.xml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check '$(TORCH_SPEC)'
	$(PY) -m pip install --disable-pip-version-check -e '.[ros,test]'
	touch $(INSTALLED)

setup: $(INSTALLED)

demo: setup
	$(PY) -m vla_policy_node.demo

test: setup
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: setup
	$(PY) bench/bench_runtime.py

clean:
	rm -rf $(VENV) artifacts build *.egg-info
