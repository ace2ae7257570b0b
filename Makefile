# biasaudit: two commands.
#   make demo   set up .venv, then run the whole pipeline (offline profile) → reports/index.html
#   make test   set up .venv, then run the test suite but the tests marked slow (make test-slow runs those)
#   make lab    JupyterLab with the stage notebooks opening as notebooks
#   make referee  the papers' design with every model PLANTED at the published values; checks the replication table
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export PATH := $(CURDIR)/$(BIN):$(PATH)
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_HUB_DISABLE_TELEMETRY := 1
export DO_NOT_TRACK := 1
export MPLBACKEND := Agg
export PYTHONHASHSEED := 0

.PHONY: setup setup-gpu gpu-wheels demo test test-slow lint bench lock paper offline clean-outputs lab referee

$(VENV)/.installed: requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first: the 2.14.1 pair is the one whose torchvision imports (CPU here, CUDA on a GPU box)
	$(BIN)/python -m pip install --quiet torch==2.14.1 torchvision==0.29.1
	# the lock is a complete freeze: --no-deps keeps it exact (insightface would pull opencv-python 5, which lacks CascadeClassifier)
	$(BIN)/python -m pip install --quiet --no-deps -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps -e .
	# MediaPipe's BlazeFace + face-mesh .tflite files (for the instruments stage), out of its wheel; never at run time
	$(BIN)/python -m biasaudit.faces.mediapipe_lite models/mediapipe
	touch $@

setup: $(VENV)/.installed

# A CUDA machine: the same venv with onnxruntime-gpu (same version) in place of onnxruntime, so that
# InsightFace runs on the GPU (requirements-gpu.lock; `biasaudit check` warns when a GPU has the CPU build)
setup-gpu: $(VENV)/.installed
	$(BIN)/python -m pip uninstall --quiet --yes onnxruntime
	$(BIN)/python -m pip install --quiet --no-deps -r requirements-gpu.lock

# The wheels benchmarks/gpu_check.sh installs on a GPU machine without network (Python 3.12 manylinux,
# pinned with sha256 in benchmarks/gpu_wheels.txt, < 60 MiB) into .gpu-wheels/ (git-ignored)
gpu-wheels:
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  --require-hashes -r benchmarks/gpu_wheels.txt -d .gpu-wheels
	$(PYTHON) benchmarks/gpu_wheels.py check

# The demo's torch work (the random-weight stand-ins: tiny CLIP embeddings, the tiny VLM) and its numpy/scipy BLAS
# work on kernels that every x86-64 CPU runs alike (ATen's default kernels, oneDNN up to SSE4.1, MKL's
# conditional-reproducibility mode, OpenBLAS's SSE3 kernels: an optimiser's residue, such as a bound of 6e-12 or a
# Bradley–Terry coefficient of 7e-8 where the answer is 0, follows the BLAS kernel and no rounding absorbs it), so a
# fresh clone's dvc.lock is the committed one on another CPU too (docs/running.md); real models (make paper) are not
# pinned. tests/test_stable_bytes.py reads this line.
# (OpenBLAS pinned on x86-64 only: on aarch64 an x86 core name selects its slowest generic kernels)
PINNED_KERNELS := ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 DNNL_MAX_CPU_ISA=SSE41 MKL_CBWR=COMPATIBLE \
                  $(if $(filter x86_64,$(shell uname -m)),OPENBLAS_CORETYPE=Prescott)

# `biasaudit check` first: it validates params.yaml and refreshes the fingerprints of the input folders it
# names (data/check/), so `dvc repro` re-runs the stages whose folder changed; with nothing changed it runs none
demo: setup
	$(BIN)/python -m biasaudit check
	$(PINNED_KERNELS) $(BIN)/dvc repro --quiet    # one line per stage start and end (scripts/run-notebook)
	@echo "Report: reports/index.html (images: reports/images.html, FOCUS edits: reports/focus.html)"

# JupyterLab on the project: a notebooks/*.py opens as a notebook (jupytext; .jupyter/ sets the viewer), and its
# kernel, although started in notebooks/, reads params.yaml and writes data/ at the root (stage_params)
lab: setup
	JUPYTER_CONFIG_PATH=$(CURDIR)/.jupyter $(BIN)/jupyter lab --ServerApp.root_dir=$(CURDIR) $(if $(filter 0,$(shell id -u)),--allow-root)

# the suite without the tests marked slow (the end-to-end pipeline, the quick starts, Ray, calibration, …), then those
# alone; CI (.ci/run) runs both (docs/testing.md: what each takes)
test: setup
	$(BIN)/python -m pytest -m "not slow"

test-slow: setup
	$(BIN)/python -m pytest -m slow

lint: setup
	$(BIN)/ruff check .    # rules and their reasons: [tool.ruff] in pyproject.toml

bench: setup
	$(BIN)/python -m pip install --quiet --no-deps skin-tone-classifier==1.2.6
	@for script in benchmarks/bench_*.py; do echo "== $$script"; $(BIN)/python $$script || exit 1; done

lock:
	$(BIN)/python -m pip freeze --exclude-editable | grep -vE "^(opencv-python==|skin-tone-classifier==)" > requirements.lock.new
	mv requirements.lock.new requirements.lock

# switching profiles stashes the outputs of the profile left and restores those of the one switched to
# (biasaudit/pipeline/profile_stash.py), so `make offline` after `make paper` gives the demo's outputs back, up to date
paper: setup
	$(BIN)/python -m biasaudit profile paper
	$(BIN)/python -m biasaudit check

offline:
	$(BIN)/python -m biasaudit profile offline

# The referee run (docs/referee.md): the referee profile (the papers' design, every model PLANTED with the published
# values as its truth), its prompts through DVC, the planted tables (biasaudit.referee write: no pixels), the analyze
# and reflect_analysis stages' notebooks, then the replication table, which must recover every row (biasaudit.referee verify); back to
# the offline profile whatever happened (its outputs restored from the profile stash)
referee: setup
	$(BIN)/python -m biasaudit profile referee
	@status=0; \
	  { $(BIN)/python -m biasaudit check && \
	    $(BIN)/dvc repro --quiet prompts && \
	    $(BIN)/python -m biasaudit.referee write && \
	    scripts/run-notebook notebooks/t2i_analyze.py t2i_analyze && \
	    scripts/run-notebook notebooks/vlm_reflect_analysis.py vlm_reflect_analysis && \
	    $(BIN)/python -m biasaudit.referee verify; } || status=$$?; \
	  $(BIN)/python -m biasaudit profile offline || status=1; \
	  exit $$status
