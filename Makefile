# Thin targets over `python -m` entry points. Every variable has a default; override on the
# command line: `make small-pipeline HOSTS=hostfiles/2node DRY_RUN=1`.

PYTHON      ?= $(VENV)/bin/python
VENV        ?= .venv
HOSTS       ?= hostfiles/localhost
LOGS        ?= logs
# Non-empty: print the exact commands and configs, start nothing.
DRY_RUN     ?=
# Launcher mode: local | pdsh | openmpi | slurm | no_ssh (default: from the hostfile).
LAUNCHER    ?=
# cpu | cuda (default: cuda when torch sees a GPU). DEVICE=cuda DRY_RUN=1 shows a GPU cluster's
# launcher from a machine without one.
DEVICE      ?=
# Run inside an emulated cluster of LAB_NODES network namespaces with links shaped to NET
# (e.g. 100mbit, 1gbit, none). Needs root and iproute2. Overrides HOSTS.
NET         ?=
LAB_NODES   ?= 2
# Ranks per emulated node, and cores per emulated node (default: this machine's cores / 4, the
# same whatever LAB_NODES; 0: no budget, the nodes share the cores).
LAB_SLOTS   ?= 1
NODE_CPUS   ?=
DELAY_MS    ?=
LOSS_PCT    ?=
# Lab faults: one node with fewer cores (SLOW_NODE=node2:cpu=0.25), one node's link slower
# (SLOW_LINK=node3:10mbit); comma lists for several nodes. Recorded in run.json network.faults.
SLOW_NODE   ?=
SLOW_LINK   ?=
# Non-empty: the doctor also measures every node pair's link and names the slow ones (make
# doctor LINKS=1; with a run or matrix, its doctor check refuses to start on a slow link).
LINKS       ?=
# Interleaved rounds of a run or matrix (round 1 runs every strategy, then round 2, ...); each
# repeat is its own run directory and the report's intervals include the run-to-run spread.
REPEAT      ?=
# Extra spec overrides, space separated: SET="train_iters=20 precision=bf16".
SET         ?=
# Non-empty: rerun runs already completed with an identical spec.
FORCE       ?=
# Seconds: a run is stopped and recorded as failed (hang) after this long without progress.
STALL       ?=
# Seconds: hard limit on a whole run.
TIMEOUT     ?=
# Memory cgroup for each run's local processes (local and no_ssh launchers), e.g. 8G: a kernel
# OOM kill inside it is recorded as kind oom.
MEM_LIMIT   ?=
# Non-empty: start multi-node runs and matrices without the doctor's check of every node.
SKIP_DOCTOR ?=
# Non-empty: record one steady-state logging window of every rank with upstream's PyTorch
# profiler (--profile pt); Chrome traces in the run's tensorboard/ (docs/profiling.md).
PROFILE     ?=
# Megatron's --timing-log-option: minmax (default), max, or all (every rank's timers, the
# schedule's forward-compute and backward-compute switched on; the report then names straggler
# ranks and their nodes).
TIMERS      ?=
# TORCH=system: `make setup` builds the venv on SYSTEM_PYTHON's own PyTorch (see setup below).
TORCH       ?=
SYSTEM_PYTHON ?= python3
# A wheelhouse to install from with no network: its manifest is checked first (sha256, the target
# Python, every pin), then pip gets that folder alone (--no-index --find-links, the manifest's
# versions as constraints, none of pip's configured indexes) and upstream comes from its bundle.
WHEELS      ?=
# make wheelhouse: the target Python and platform, and the folder (default outside the checkout:
# <cache>/wheelhouse/py$(PY)-$(PLATFORM)).
PY          ?= $(shell $(SYSTEM_PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
PLATFORM    ?= manylinux_2_28_$(shell uname -m)
WHEELHOUSE  ?=
# make wheelhouse TORCH=system leaves out torch, torchvision and what only they require; HAVE=file
# (the node's `pip freeze`) leaves out what the node has, and what only that requires.
HAVE        ?=
# Tests: extra pytest arguments (e.g. PYTEST_ARGS="-x -k parse"); a -m here replaces the marker
# selection of `make test`.
PYTEST_ARGS ?=

MODELS      := tiny small large
STRATEGIES  := baseline pipeline tensor zero1 zero2 zero3 hybrid zero2-offload zero3-offload
CORE        := baseline,pipeline,tensor,zero1,zero2,zero3

RUN_FLAGS = --hosts $(HOSTS) --logs $(LOGS) \
	$(if $(DRY_RUN),--dry-run) $(if $(LAUNCHER),--launcher $(LAUNCHER)) \
	$(if $(DEVICE),--device $(DEVICE)) \
	$(if $(NET),--net $(NET) --lab-nodes $(LAB_NODES) --lab-slots $(LAB_SLOTS)) \
	$(if $(NODE_CPUS),--node-cpus $(NODE_CPUS)) \
	$(if $(DELAY_MS),--delay-ms $(DELAY_MS)) $(if $(LOSS_PCT),--loss-pct $(LOSS_PCT)) \
	$(if $(SLOW_NODE),--slow-node $(SLOW_NODE)) $(if $(SLOW_LINK),--slow-link $(SLOW_LINK)) \
	$(if $(LINKS),--doctor-links) $(foreach kv,$(SET),--set $(kv)) $(if $(FORCE),--force) $(if $(REPEAT),--repeat $(REPEAT)) \
	$(if $(STALL),--stall $(STALL)) $(if $(TIMEOUT),--timeout $(TIMEOUT)) \
	$(if $(MEM_LIMIT),--mem-limit $(MEM_LIMIT)) $(if $(SKIP_DOCTOR),--skip-doctor) \
	$(if $(PROFILE),--profile) $(if $(TIMERS),--timers $(TIMERS))

RUN_TARGETS := $(foreach m,$(MODELS),$(foreach s,$(STRATEGIES),$(m)-$(s)))
ALL_TARGETS := $(foreach m,$(MODELS),all-$(m))

.PHONY: sweep help setup setup-gpu gpu-check doctor test test-all lint fmt demo report predict bench netbench list clean-lab $(RUN_TARGETS) $(ALL_TARGETS)

help:
	@echo "make setup            create .venv, install pinned deps, fetch upstream, build data"
	@echo "make setup DEVICE=cuda   also build NVIDIA apex (or say which CUDA toolkit is missing)"
	@echo "make setup TORCH=system  the venv on SYSTEM_PYTHON's PyTorch (--system-site-packages)"
	@echo "make wheelhouse [PY=3.11] [PLATFORM=..] [WHEELHOUSE=dir]  every pinned wheel and upstream"
	@echo "                      in one folder; then make setup WHEELS=dir installs with no network"
	@echo "make wheelhouse TORCH=system [HAVE=node-freeze.txt]  only what a node with its own PyTorch"
	@echo "                      (and those packages) lacks; then make setup TORCH=system WHEELS=dir"
	@echo "make doctor HOSTS=..  check every node of a hostfile before a run"
	@echo "make gpu-check        on a GPU machine: its PyTorch, apex for its sm, small/large x"
	@echo "                      baseline/ZeRO-1/2/3 in bf16 for real, the report with MFU (9 min);"
	@echo "                      stops at once without a GPU; DRY_RUN=1 DEVICE=cuda prints the plan;"
	@echo "                      GPU_BUDGET=seconds for another budget than nine minutes;"
	@echo "                      GPU_RESUME=1 skips the runs an earlier call completed"
	@echo "make test             the fast suite: unit, parse, report, one real upstream run"
	@echo "make test-all         everything: adds the lab, Slurm, Open MPI and fault suites (CI)"
	@echo "make demo             tiny model, every core strategy, emulated 2-node lab, report"
	@echo "make <model>-<strategy> [HOSTS=..] [NET=100mbit] [DRY_RUN=1]   one run"
	@echo "make all-<model>      the six core strategies for a model ($(MODELS))"
	@echo "make report           python -m analysis.report $(LOGS)"
	@echo "make list             models, strategies, hostfiles"

$(VENV)/.requirements.stamp: requirements.txt
	@test -x $(PYTHON) || python3 -m venv $(VENV)
	@echo "setup: installing pinned requirements into $(VENV)$(if $(WHEELS), from $(WHEELS))"
	$(if $(WHEELS),$(PYTHON) -m launchers.config.wheelhouse check $(WHEELS) $(APEX_CHECK) --constraints $(WHEELS_CONSTRAINTS))
	DS_BUILD_OPS=0 $(WHEELS_PIP) $(PYTHON) -m pip install --quiet $(WHEELS_FROM) --upgrade pip
	DS_BUILD_OPS=0 $(WHEELS_PIP) $(PYTHON) -m pip install --quiet $(WHEELS_FROM) -r requirements.txt
	@cp requirements.txt $@

# WHEELS=dir: pip sees that folder alone, at the manifest's versions (launchers/config/wheelhouse.py).
WHEELS_CONSTRAINTS = $(VENV)/wheelhouse-constraints.txt
WHEELS_PIP  = $(if $(WHEELS),env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null)
WHEELS_FROM = $(if $(WHEELS),--no-index --find-links $(WHEELS) -c $(WHEELS_CONSTRAINTS))
# DEVICE=cuda: the wheelhouse holds NVIDIA apex too (apex.bundle, or apex.tar.gz of the pinned tree),
# and setup builds it from there.
APEX_CHECK  = $(if $(filter cuda,$(DEVICE)),--apex)

# TORCH=system: the venv on top of SYSTEM_PYTHON, the interpreter that already has the site's
# PyTorch (--system-site-packages); the pins but torch/torchvision that it lacks (one it has at
# another version is used and warned of); then what was found, against the tested range
# (launchers/config/torch_check.py).
$(VENV)/.requirements-system.stamp: requirements.txt
	@test -x $(PYTHON) || $(SYSTEM_PYTHON) -m venv --system-site-packages $(VENV)
	$(SYSTEM_PYTHON) -m launchers.config.torch_check chain $(VENV)
	@grep -qi "include-system-site-packages *= *true" $(VENV)/pyvenv.cfg || { echo "setup TORCH=system: $(VENV) exists without --system-site-packages: remove it or name another VENV=..."; exit 1; }
	@echo "setup: installing the pins but torch/torchvision into $(VENV) (on $(SYSTEM_PYTHON)'s PyTorch)"
	$(SYSTEM_PYTHON) -m launchers.config.torch_check requirements requirements.txt $(VENV)/requirements-system.txt
	$(if $(WHEELS),$(PYTHON) -m launchers.config.wheelhouse check $(WHEELS) $(APEX_CHECK) --system --constraints $(WHEELS_CONSTRAINTS))
	DS_BUILD_OPS=0 $(WHEELS_PIP) $(PYTHON) -m pip install --quiet $(WHEELS_FROM) -r $(VENV)/requirements-system.txt
	@cp requirements.txt $@

setup: $(if $(filter system,$(TORCH)),$(VENV)/.requirements-system.stamp,$(VENV)/.requirements.stamp)
	@echo "setup: $(VENV) is up to date with requirements.txt"
	$(if $(filter system,$(TORCH)),$(PYTHON) -m launchers.config.torch_check check)
	$(if $(WHEELS),MEGATRON_DEEPSPEED_REPO=$(abspath $(WHEELS))/megatron-deepspeed.bundle) $(PYTHON) -m launchers.config.upstream setup $(if $(ALLOW_NO_UPSTREAM),|| echo "setup: continuing without upstream (ALLOW_NO_UPSTREAM set): upstream tests will be skipped")
	$(if $(filter cuda,$(DEVICE)),$(if $(WHEELS),APEX_REPO=$(firstword $(wildcard $(abspath $(WHEELS))/apex.tar.gz) $(abspath $(WHEELS))/apex.bundle)) $(PYTHON) -m launchers.config.gpu setup)

# Every pinned wheel (with its dependencies) for Python PY on PLATFORM, a wheel built from each
# sdist-only pin (deepspeed, DS_BUILD_OPS=0), upstream at the pinned commit as a git bundle (from
# MEGATRON_DEEPSPEED_REPO, as setup clones), and manifest.json (names, versions, sha256): several
# GB (torch's NVIDIA wheels), into WHEELHOUSE, outside the checkout by default. Needs the network.
# DEVICE=cuda: NVIDIA apex at its pinned commit too (from APEX_REPO), for make setup DEVICE=cuda.
.PHONY: wheelhouse
wheelhouse:
	$(if $(wildcard $(PYTHON)),$(PYTHON),$(SYSTEM_PYTHON)) -m launchers.config.wheelhouse build \
		--python $(PY) --platform $(PLATFORM) $(if $(WHEELHOUSE),--dir $(WHEELHOUSE)) $(APEX_CHECK) \
		$(if $(filter system,$(TORCH)),--torch-system) $(if $(HAVE),--have $(HAVE))

# GPU prerequisites only: NVIDIA apex with its C++/CUDA extensions from APEX_REPO (a URL, local
# path or mirror) at the pinned commit, when a CUDA toolkit of torch's CUDA version is present.
setup-gpu: $(VENV)/.requirements.stamp
	$(PYTHON) -m launchers.config.gpu setup

# One call on a machine with a GPU (launchers/config/gpu_check.py): `make setup TORCH=system` into
# GPU_VENV on GPU_PYTHON's PyTorch (WHEELS=dir: make setup's checked, offline install from it),
# apex's needed extensions for the device's sm, small and large x baseline/zero1/2/3 in bf16 at
# world size 1, then the report. Without a GPU it stops at once and says so.
GPU_PYTHON  ?= $(SYSTEM_PYTHON)
GPU_VENV    ?= .venv-gpu
gpu-check:
	$(GPU_PYTHON) -m launchers.config.gpu_check --venv $(GPU_VENV) \
		$(if $(DRY_RUN),--dry-run) $(if $(filter cuda,$(DEVICE)),--device cuda) \
		$(if $(WHEELS),--wheels $(WHEELS)) $(if $(GPU_BUDGET),--budget-s $(GPU_BUDGET)) \
		$(if $(GPU_RESUME),--resume)

# Every node of HOSTS, through the path the run will use (pdsh/ssh, or the lab's namespaces);
# LINKS=1: also every pair's link (launchers/doctor/links.py).
doctor:
	$(PYTHON) -m launchers doctor --hosts $(HOSTS) --logs $(LOGS) \
		$(if $(DEVICE),--device $(DEVICE)) $(if $(LAUNCHER),--launcher $(LAUNCHER)) \
		$(if $(NET),--net $(NET) --lab-nodes $(LAB_NODES)) $(foreach kv,$(SET),--set $(kv)) \
		$(if $(NODE_CPUS),--node-cpus $(NODE_CPUS)) $(if $(SLOW_NODE),--slow-node $(SLOW_NODE)) \
		$(if $(SLOW_LINK),--slow-link $(SLOW_LINK)) $(if $(LINKS),--links)

# The fast suite leaves out the tests marked `full` (tests/conftest.py says which); test-all runs
# every test. pytest exits 5 when no test was collected: not a failure of the suite.
test:
	$(PYTHON) -m pytest -m "not full" $(PYTEST_ARGS) || test $$? -eq 5

test-all:
	$(PYTHON) -m pytest $(PYTEST_ARGS) || test $$? -eq 5

lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .

fmt:
	$(PYTHON) -m ruff format .
	$(PYTHON) -m ruff check --fix .

list:
	$(PYTHON) -m launchers list

$(RUN_TARGETS):
	$(PYTHON) -m launchers run --model $(firstword $(subst -, ,$@)) \
		--strategy $(patsubst $(firstword $(subst -, ,$@))-%,%,$@) $(RUN_FLAGS)

$(ALL_TARGETS):
	$(PYTHON) -m launchers matrix --model $(patsubst all-%,%,$@) --strategies $(CORE) $(RUN_FLAGS)

# The fastest TP x PP x DP, ZeRO, micro-batch (recompute on GPU) of MODEL on HOSTS: anchors, then
# the best predicted, until BUDGET (30m, 1h, 6runs, all) is spent. Narrow an axis: TP=1,2 PP=
# ZERO= MBS=; DEVICE_MEM=24G: one device's memory for the memory filter (docs/sweep.md).
MODEL       ?= tiny
BUDGET      ?= 30m
sweep:
	$(PYTHON) -m launchers sweep --model $(MODEL) --budget $(BUDGET) $(RUN_FLAGS) \
		$(if $(TP),--tp $(TP)) $(if $(PP),--pp $(PP)) $(if $(ZERO),--zero $(ZERO)) \
		$(if $(MBS),--mbs $(MBS)) $(if $(DEVICE_MEM),--device-mem $(DEVICE_MEM))

# Up to REPEAT (default 2) interleaved rounds, each started only when it fits in DEMO_MIN minutes.
DEMO_MIN    ?= 10
demo:
	$(PYTHON) -m launchers demo --logs $(LOGS) $(if $(NET),--net $(NET)) \
		$(if $(REPEAT),--repeat $(REPEAT)) --budget-min $(DEMO_MIN)

report:
	$(PYTHON) -m analysis.report $(LOGS) $(if $(OUT),--out $(OUT)) $(if $(BASELINE),--baseline $(BASELINE))

predict:
	$(PYTHON) -m analysis.predict $(LOGS) $(if $(NET),--link $(NET))

# Parser throughput on a generated multi-node log of BENCH_MB megabytes.
BENCH_MB ?= 1024
bench:
	$(PYTHON) benchmarks/parse_bench.py --size-mb $(BENCH_MB)

# Collective bandwidth (all-reduce, all-gather, reduce-scatter, send/recv) on an emulated lab.
netbench:
	$(PYTHON) -m launchers.lab.netbench --lab $(LAB_NODES) --link $(or $(NET),100mbit)

clean-lab:
	$(PYTHON) -m launchers.lab down --all
