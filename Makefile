# Rudder: `make demo` and `make test` on a fresh machine with Python 3.11 (see README).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.rudder-installed
# A prebuilt llama-cpp-python wheel beside the checkout saves a ~7 min source build; without it
# pip builds from source. GGML_NATIVE=OFF keeps a built wheel usable on every AVX2 node of a
# cluster sharing this venv; LLAVA_BUILD=OFF skips the multimodal parts we do not use.
WHEELS     ?= ../shared/wheels
FIND_LINKS := $(if $(wildcard $(WHEELS)/*.whl),--find-links $(WHEELS),)
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF
PIP_EXTRA ?=
DEMO_OUT  ?= runs/demo

.PHONY: venv demo test lint clean-venv

venv: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is required"' \
	  || { echo "make venv: $(PYTHON) is older than 3.11; run make PYTHON=/path/to/python3.11"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) \
	  || { echo "make venv: cannot create $(VENV) (on Debian/Ubuntu: apt install python3.11-venv)"; rm -rf $(VENV); exit 1; }
	@echo "make venv: installing into $(VENV) (about a minute; a source build of llama-cpp-python adds ~7)"
	$(PY) -m pip install -q --disable-pip-version-check $(FIND_LINKS) $(PIP_EXTRA) -e '.[mpich,test]'
	@touch $(STAMP)

demo: venv
	$(PY) drivers/demo.py --out $(DEMO_OUT)

test: venv
	bash tests/run_suite.sh

lint: venv
	$(VENV)/bin/ruff check .

clean-venv:
	rm -rf $(VENV)
