"""The names the command line offers (pairs, methods, precisions, fan-out strategies, backups), kept where reading
them imports nothing heavy, so that `python -m ssd --help` and every argument error answer before torch loads. The
modules that implement them take their names from here (`tests/test_cli.py` checks that they agree)."""

DEFAULT_PAIR = "qwen2.5-coder"
TINY_PAIR = "tiny"
PAIR_NAMES = (DEFAULT_PAIR,)  # the registered offline pairs (ssd.models.loading.PAIRS)
METHOD_NAMES = ("ar", "sd", "sd-1core", "ssd", "ssd-pipeline", "hf-ar", "hf-sd", "llamacpp-ar",
                "llamacpp-sd")  # ssd.bench.methods.METHODS, in order
# The methods of another engine than the kit's PyTorch one (ssd.llamacpp): a target of their own (llama.cpp runs the
# GGUF weights as they are), so their answers are checked against that engine's AR, named here.
ENGINE_AR = {"llamacpp-ar": "llamacpp-ar", "llamacpp-sd": "llamacpp-ar"}
PRECISIONS = ("float32", "bfloat16", "float16", "int8", "int4", "int8w")
PRECISION_CHOICES = PRECISIONS + ("auto",)
# A draft's only: int8 (torch.ao's dynamic quantization) rounds all the rows of a call on one activation scale, so a
# verify pass rounds each token on a grid the other tokens set and no method can reproduce the target's own AR
# (docs/precision.md, "int8 is a draft's precision")
DRAFT_ONLY_PRECISIONS = ("int8",)
FORWARDS = ("eager", "compiled")  # how a model's forward runs (ssd.models.forwards); eager is the exact reference
STRATEGIES = ("uniform", "geometric", "calibrated")
BACKUPS = ("jit", "fast", "auto")  # auto: the one predicted faster at the batch size (ssd.core.tuning)
AUTO = "auto"  # the value of k or budget that asks for the choice (ssd.core.tuning)
GPU_CHECK_OUT = "data/{machine}/gpu_check.json"  # {machine}: the GPU's folder (ssd.bench.machines)
GPU_CHECK_BUDGET_S = 480.0  # make gpu-check: the whole check, tests and benches together
REPORT_OUT = "runs/report.md"  # python -m ssd report --from / --measure: the user's page (its figures beside it)
REPORT_DIR = "runs/report"  # --measure's bench JSONs, in a folder per kind of machine
# --measure: the headline table in about 20 minutes on 2 cores. Timed on the AMD EPYC with avx512_bf16 (2026-12-06,
# the first 62 answers of a 16-prompt run): an answer of 48 tokens took 8.3 s on average over the six methods on
# HumanEval, about 50 s a HumanEval prompt (prose, not timed by that run, reckoned at 1.5 times). So 10 HumanEval
# prompts take about 8.5 minutes, 6 prose prompts about 7.5, the pipeline alone with uniform fan-out on the 10
# HumanEval prompts (its hit rate beside calibrated's) about 1.5; with three loads of the pair, about 20 minutes.
REPORT_METHODS = "ar,hf-ar,sd,hf-sd,sd-1core,ssd-pipeline"
REPORT_BENCHES = {"humaneval": ("humaneval:10", "calibrated", REPORT_METHODS),  # file name: prompts, fan-out, methods
                  "prose": ("prose:6", "calibrated", REPORT_METHODS),
                  "humaneval_uniform": ("humaneval:10", "uniform", "ssd-pipeline")}
REPORT_SIZES = "10 HumanEval and 6 prose prompts x 48 tokens, greedy, K 4, B 4"
