# Two commands for a fresh machine with Python and nothing else:
#   make demo   set up, then run the node live against a replayed sample bag
#   make test   set up, then run the whole test suite (what CI runs)
# Set-up is a virtual environment in .venv with the package, the PyPI ROS 2
# wheels and the test tools. torch is installed first from TORCH_SPEC (pip
# arguments; default: the CPU build this workplace keeps on disk); elsewhere
# pass your own, e.g.
#   make test TORCH_SPEC='torch --index-url https://download.pytorch.org/whl/cpu'
# (a version range needs its own quotes: TORCH_SPEC="'torch>=2.1' --index-url ...").
# When ROS_TOOLS exists (ros2 launch/param/lifecycle/topic and colcon as
# wheels), they are installed too, and the tests that need them run.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
ROS_TOOLS ?= ../shared/ros-tools
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup demo test bench clean stress-test

# A fresh venv gets a current pip first: the pip that Python 3.10 ships installs `-e .` through the
# legacy `setup.py develop`, which setuptools >= 80 no longer runs with this package's setup.cfg.
# The set-up ends with pip printing "launch-ros 0.28.0 requires ament_index_python, which is not installed".
# It is harmless: launch_ros's wheel names its dependency `ament_index_python`, which PyPI spells
# `ros-ament-index-python` (the same module, which the ros extra installs); pip cannot match the two
# names, so it warns when install.sh adds the ros-tools wheels. Nothing is missing (`ros2 launch` runs).
$(INSTALLED): setup.py package.xml
	test -x $(PY) || { $(PYTHON) -m venv $(VENV) && $(PY) -m pip install --disable-pip-version-check --upgrade pip; }
	$(PY) -m pip install --disable-pip-version-check $(TORCH_SPEC)
	$(PY) -m pip install --disable-pip-version-check -e '.[ros,test,dataset]'
	if [ -x $(ROS_TOOLS)/install.sh ]; then $(ROS_TOOLS)/install.sh $(VENV); \
	else echo "no $(ROS_TOOLS)/install.sh: the ros2 CLI / launch / colcon tests will skip"; fi
	touch $(INSTALLED)

setup: $(INSTALLED)

demo: setup
	$(PY) -m vla_policy_node.demo

test: setup
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: setup
	$(PY) bench/bench_runtime.py

# The DDS test files STRESS_RUNS times under two busy processes per core (a loaded CI machine); prints the
# runs each file passed and every failing test. Long: about an hour for 5 runs on 2 cores.
STRESS_RUNS ?= 5
STRESS_FILES ?=
stress-test: setup
	$(PY) .ci/stress_test.py --runs $(STRESS_RUNS) $(STRESS_FILES)

clean:
	rm -rf $(VENV) artifacts build *.egg-info
