"""The names the command line offers (pairs, methods, precisions, fan-out strategies, backups), kept where reading
them imports nothing heavy, so that `python -m ssd --help` and every argument error answer before torch loads. The
modules that implement them take their names from here (`tests/test_cli.py` checks that they agree)."""

DEFAULT_PAIR = "qwen2.5-coder"
TINY_PAIR = "tiny"
PAIR_NAMES = (DEFAULT_PAIR,)  # the registered offline pairs (ssd.models.loading.PAIRS)
METHOD_NAMES = ("ar", "sd", "sd-1core", "ssd", "ssd-pipeline", "hf-ar", "hf-sd")  # ssd.bench.methods.METHODS, in order
PRECISIONS = ("float32", "bfloat16", "float16", "int8")
PRECISION_CHOICES = PRECISIONS + ("auto",)
STRATEGIES = ("uniform", "geometric", "calibrated")
BACKUPS = ("jit", "fast", "auto")  # auto: the one predicted faster at the batch size (ssd.core.tuning)
AUTO = "auto"  # the value of k or budget that asks for the choice (ssd.core.tuning)
GPU_CHECK_OUT = "data/{machine}/gpu_check.json"  # {machine}: the GPU's folder (ssd.bench.machines)
GPU_CHECK_BUDGET_S = 480.0  # make gpu-check: the whole check, tests and benches together
