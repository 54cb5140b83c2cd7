# Two commands: `make run` (set up + main job on the tiny profile) and `make test`.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup run test lint bench clean

$(STAMP): pyproject.toml
	# espeak-ng (+ sox) synthesise the tiny speech corpus; installed when missing.
	command -v espeak-ng >/dev/null || { apt-get update -qq && apt-get install -y -qq espeak-ng sox; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	# torch + torchvision first, pinned to the builds this machine's pip serves from local
	# files (torchaudio 2.11 from the registry runs beside them); pe-bench declares lower bounds.
	$(BIN)/pip install torch==2.14.1 torchvision==0.29.1 torchaudio==2.11.0
	# the tracking extra too, so that the TensorBoard, W&B and MLflow logger tests run, not skip
	$(BIN)/pip install -e '.[test,tracking]'
	# nuscenes-devkit for the nuscenes paper profile and the test that our centre-distance mAP
	# equals its evaluation: installed without its dependencies, because its metadata pins
	# numpy < 2 (its evaluation runs on numpy 2, the test checks), then the ones it imports.
	$(BIN)/pip install --no-deps nuscenes-devkit==1.2.0 pyquaternion==0.9.9 descartes==1.1.0
	$(BIN)/pip install opencv-python-headless "shapely~=2.0.3" scikit-learn
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/pe-bench run --tasks all --methods pape,rope,cape --jobs auto

# pytest-xdist: one worker per core, at most 4 (each holds up to ~3 GB). Most tests are too small
# to keep torch's 2 threads busy, so one process used one of CI's 2 cores: 18 min 17 s serial
# against 10 min 25 s with 2 workers (stop 60, the same 1,595 tests). TEST_WORKERS=0 runs serially.
TEST_WORKERS ?= auto

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/pytest -n $(TEST_WORKERS) --maxprocesses 4 --dist worksteal --durations=15

bench: $(STAMP)
	$(BIN)/pe-bench bench --model tiny

clean:
	rm -rf $(VENV) build *.egg-info
