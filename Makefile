# Two commands for a fresh machine with Python and nothing else:
#   make demo   set up, then run the node live against a replayed sample bag
#   make test   set up, then run the whole test suite (what CI runs)
# Set-up is a virtual environment in .venv with the package, the PyPI ROS 2
# wheels, the test tools and the extras the tests cover (dataset; fleet: Ray
# Serve, about 300 MB and half a minute more). torch is installed first from TORCH_SPEC (pip
# arguments; default: the CPU build this workplace keeps on disk); elsewhere
# pass your own, e.g.
#   make test TORCH_SPEC='torch --index-url https://download.pytorch.org/whl/cpu'
# (a version range needs its own quotes: TORCH_SPEC="'torch>=2.1' --index-url ...").
# When ROS_TOOLS exists (ros2 launch/param/lifecycle/topic and colcon as
# wheels), they are installed too, and the tests that need them run; a venv
# built without them gets them afterwards with `make ros-tools ROS_TOOLS=DIR`.
# `make test-isa` runs the numeric tests on the CPU's best kernels, then with
# oneDNN held to AVX512_CORE, then with oneDNN and ATen held to AVX2.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
ROS_TOOLS ?= ../shared/ros-tools
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
PYTEST_ARGS ?=
# pytest-xdist workers (files stay whole on one worker: module fixtures, one DDS domain per file); 0 runs in one
# process. Two on a 2-core machine halve the wall time: the DDS tests wait on processes more than they compute,
# and they are proven to hold under that load (make stress-test).
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadfile

.PHONY: setup ros-tools demo test test-isa test-avx2 stress-test bench clean

# A fresh venv gets a current pip first: the pip that Python 3.10 ships installs `-e .` through the
# legacy `setup.py develop`, which setuptools >= 80 no longer runs with this package's setup.cfg.
# The set-up ends with pip printing "launch-ros 0.28.0 requires ament_index_python, which is not installed".
# It is harmless: launch_ros's wheel names its dependency `ament_index_python`, which PyPI spells
# `ros-ament-index-python` (the same module, which the ros extra installs); pip cannot match the two
# names, so it warns when install.sh adds the ros-tools wheels. Nothing is missing (`ros2 launch` runs).
$(INSTALLED): setup.py package.xml
	test -x $(PY) || { $(PYTHON) -m venv $(VENV) && $(PY) -m pip install --disable-pip-version-check --upgrade pip; }
	$(PY) -m pip install --disable-pip-version-check $(TORCH_SPEC)
	$(PY) -m pip install --disable-pip-version-check -e '.[ros,test,dataset,fleet]'
	if [ -x $(ROS_TOOLS)/install.sh ]; then $(ROS_TOOLS)/install.sh $(VENV); \
	else echo "no $(ROS_TOOLS)/install.sh: the ros2 CLI / launch / colcon tests will skip"; fi
	touch $(INSTALLED)

setup: $(INSTALLED)

# ros2 launch/param/lifecycle/topic and colcon into an existing .venv (a clone set up without ROS_TOOLS).
ros-tools: setup
	@test -x $(ROS_TOOLS)/install.sh || { echo "no $(ROS_TOOLS)/install.sh: pass ROS_TOOLS=<folder with the ros-tools wheels and install.sh>"; exit 2; }
	$(ROS_TOOLS)/install.sh $(VENV)

demo: setup
	$(PY) -m vla_policy_node.demo

test: setup
	$(PY) -m pytest -q $(XDIST) $(PYTEST_ARGS)

# The test files whose assertions are numbers a CPU's kernels can move (bf16 and int8 matmuls, the parity
# with lerobot's and transformers' restatements, the fast path, the demo policy): they must pass whichever
# kernels the CPU has. oneDNN picks its bf16/int8 kernels by ISA (AMX, AVX512_BF16, AVX512_CORE, AVX2) and
# ATen its vectorised ones by ATEN_CPU_CAPABILITY; the caps below take them down from what the CPU offers
# (a cap above the CPU changes nothing). `slow` tests stay in `make test`.
NUMERIC_TESTS ?= test/test_model_parity.py test/test_quantization.py test/test_packed_linears.py \
	test/test_fused_projections.py test/test_checkpoint.py test/test_lerobot_pipeline.py \
	test/test_smolvla_family.py test/test_smolvla_pipeline.py test/test_rtc.py test/test_relative_actions.py \
	test/test_runtime.py test/test_prefix_cache.py test/test_fast_path.py test/test_images.py \
	test/test_replay_offline.py test/test_handover.py test/test_dataset.py \
	test/test_groot_family.py test/test_groot_pipeline.py test/test_train_demo.py
ISA_PYTEST := $(PY) -m pytest -q $(XDIST) -m 'not slow' $(PYTEST_ARGS) $(NUMERIC_TESTS)

test-isa: setup
	$(ISA_PYTEST)
	ONEDNN_MAX_CPU_ISA=AVX512_CORE $(ISA_PYTEST)
	$(MAKE) --no-print-directory test-avx2

test-avx2: setup
	ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 $(ISA_PYTEST)

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
