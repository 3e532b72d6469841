"""Command line: python -m ssd generate | bench | hit-rates | sweep | course | profile | models | llamacpp |
gpu-check | report."""
from __future__ import annotations

import argparse
import os
import sys

from . import checks
from .names import (AUTO, BACKUPS, DEFAULT_PAIR, DRAFT_ONLY_PRECISIONS, FORWARDS, GPU_CHECK_BUDGET_S, GPU_CHECK_OUT,
                    METHOD_NAMES, PAIR_NAMES, PRECISION_CHOICES, REPORT_DIR, REPORT_OUT, REPORT_SIZES, STRATEGIES)

# Only the names and checks above load with the parser: --help and every argument error answer before torch does.
# The commands (ssd.commands) import the kit when one runs.


def add_pair_args(p: argparse.ArgumentParser, device: str = "auto") -> None:
    p.add_argument("--pair", default=DEFAULT_PAIR,
                   help=f"a named offline pair ({', '.join(PAIR_NAMES)}) or two hub ids 'DRAFT,TARGET' "
                   f"(default {DEFAULT_PAIR})")
    p.add_argument("--device", default=device, help=f"device of both models: auto (CUDA, else MPS, else the CPU), "
                   f"cpu, cuda, cuda:N or mps (default {device}); on a GPU auto precisions are bfloat16 (MPS: float16)")
    target_choices = " | ".join(c for c in PRECISION_CHOICES if c not in DRAFT_ONLY_PRECISIONS)
    p.add_argument("--target-dtype", default="auto", help=f"{target_choices}: the target's precision; "
                   "auto (the default) measures the candidates once on this machine and keeps the pair of "
                   "precisions that makes SD fastest (float32 is the exact reference)")
    p.add_argument("--draft-dtype", default="auto", help=f"{' | '.join(PRECISION_CHOICES)}: the draft's precision "
                   "(int8: int8 linear layers; int4: 4-bit weights in groups of 32; int8w: int8 weights, a "
                   "scale a row; int4 and int8w take bfloat16 activations; all three CPU only); auto: chosen with the "
                   "target's, as a pair")
    p.add_argument("--forward", default="eager", help=f"{' | '.join(FORWARDS)}: how both models' forwards run; "
                   "compiled: torch.compile, the decoder compiled at its first decoding step (the offline pair: "
                   "about 2 minutes on 2 CPU cores the first time, 40 s in a later process, which reads the user "
                   "cache); eager (the default) is the exact reference")


def add_decoding_args(p: argparse.ArgumentParser) -> None:
    add_pair_args(p)
    p.add_argument("-k", "--k", type=int_or_auto, default=4, help="draft length K, or auto: chosen for this machine from "
                   "its latency profile and the run's acceptance rate, re-decided as the run goes (default 4)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default 0)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="default 64")
    p.add_argument("--batch-size", type=int, default=1, help="b: prompts decoded at once, each step one forward over "
                   "all of them (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the torch.Generator every draw uses (default 0)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's own)")
    s = p.add_argument_group("SSD (method ssd)")
    s.add_argument("--budget", type=int_or_auto, default=16, help="B, cached outcomes per round, or auto: chosen "
                   "with K from the profile and the calibrated a_p and miss rates (default 16)")
    s.add_argument("--fan-out", default="uniform",
                   help=f"the fan-out strategy: {' | '.join(STRATEGIES)} (default uniform)")
    s.add_argument("--saguaro-c", type=float, default=1.0, help="Saguaro's C in [0, 1]; 1 = off (default 1)")
    s.add_argument("--backup", default=AUTO, help=f"on a miss: {' | '.join(BACKUPS)}; jit: the draft model drafts, "
                   "fast: an n-gram lookup in the context, auto: the one the profile and the run's estimates predict "
                   "faster at this batch size, re-decided each round (default auto; the profile is the kit's stored "
                   "one of this kind of machine, else measured once and kept)")
    s.add_argument("--a-p", type=float, default=0.6, help="geometric: acceptance rate; calibrated and auto: its prior "
                   "(default 0.6)")
    s.add_argument("--r", type=float, default=0.5, help="geometric: miss-rate power-law exponent; calibrated: prior")
    t = p.add_argument_group("SSD on two ranks (method ssd-pipeline; see ssd.pipeline.launch)")
    t.add_argument("--verifier-cores", default="0", help="CPU cores of the verifier rank (target), e.g. 0 or 0-3 "
                   "(default 0); it runs one torch thread per core")
    t.add_argument("--drafter-cores", default="1", help="CPU cores of the drafter rank (draft) (default 1)")


def int_or_auto(value: str):
    """-k and --budget: an integer, or auto."""
    if value == AUTO:
        return AUTO
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer or {AUTO}, got {value!r}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ssd", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="decode prompts and print the text")
    add_decoding_args(gen)
    gen.add_argument("--method", default="sd", help=f"one of {', '.join(METHOD_NAMES)} (default sd)")
    gen.add_argument("--prompt", required=True, action="append", help="the prompt text; give it once per sequence "
                     "to decode several, --batch-size at a time")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")

    b = sub.add_parser("bench", help="methods side by side on a prompt set; prints a summary per method and one per "
                       "category (Spec-Bench's report), writes JSON")
    add_decoding_args(b)
    b.add_argument("--methods", default="ar,sd", help=f"comma-separated, from {', '.join(METHOD_NAMES)} (default "
                   "ar,sd); a variant sets its own k, budget, batch_size or backup, e.g. sd:k=2,sd:k=auto,"
                   "ar:batch_size=8,ssd-pipeline:k=4:budget=8,ssd-pipeline:backup=fast")
    b.add_argument("--prompts", default="humaneval:8", help="humaneval, prose or a Spec-Bench JSONL path, optionally "
                   "with :N (the first N), [a:b] (a slice) or @N (the first N of each category), e.g. question.jsonl@2 "
                   "(default humaneval:8)")
    b.add_argument("--first-turns", action="store_true", help="answer only each prompt's first turn (by default a "
                   "Spec-Bench row's later turns are answered too, each after the answer before it)")
    b.add_argument("--json", default=None, help="write rows, summary, categories, machine and arguments here "
                   "({machine} in the path: this kind of machine's folder name, e.g. data/{machine}/bench.json); "
                   "meanwhile JSON.partial keeps the prompts done, and a rerun of the same command resumes from it")
    b.add_argument("--csv", default=None, help="also write the rows (one per method and answer) here")

    h = sub.add_parser("hit-rates", help="SSD hit rate against the budget B for each fan-out strategy, with 95%% CIs")
    add_decoding_args(h)
    h.add_argument("--prompts", default="humaneval:32", help="prompt set (default humaneval:32)")
    h.add_argument("--budgets", default="0,1,2,4,8,16,32", help="comma-separated budgets; the run uses the largest")
    h.add_argument("--strategies", default=",".join(STRATEGIES), help="fan-out strategies to evaluate")
    h.add_argument("--out", default="data/hit_rates_cli",
                   help="writes OUT_rounds.csv and OUT.csv (default data/hit_rates_cli)")
    h.set_defaults(backup="jit")  # smaller budgets are read off one run exactly only when every miss drafts as SD

    co = sub.add_parser("course", help="execute every numbered notebook at its defaults with papermill")
    co.add_argument("--notebooks", default="notebooks", help="folder of the numbered notebooks (default notebooks)")
    co.add_argument("--out", default="runs/course", help="where the executed copies go, and under it every "
                    "file they write (default runs/course); the notebooks' own folder: the maintainers' stored run, "
                    "the notebooks rewritten in place and their figures in figures/")
    co.add_argument("--only", default=None, help="comma-separated name prefixes, e.g. 00,01 (default: all)")
    co.add_argument("--report", default=None, metavar="PAGE", help="then render what the notebooks measured (OUT/"
                    "results/<machine>) as this machine's page into PAGE, e.g. runs/report.md (python -m ssd report)")
    co.add_argument("--forward", default="eager", help=f"{' | '.join(FORWARDS)}: how the notebooks' models run "
                    "(their forward parameter; default eager); a user's run only, not the stored one")

    sw = sub.add_parser("sweep", help="run a notebook over a YAML parameter grid with papermill; resumable")
    sw.add_argument("grid", help="the grid file (YAML: name, notebook, parameters, grid; see ssd.course.sweep)")
    sw.add_argument("--jobs", type=int, default=1, help="points run at once, each in its own process (default 1)")
    sw.add_argument("--dry-run", action="store_true", help="list the points, marking those done; run nothing")
    sw.add_argument("--data-dir", default="data/{machine}", help="results go to DATA_DIR/NAME.csv (default "
                    "data/{machine}: this kind of machine's folder, e.g. data/amd-epyc-avx2)")
    sw.add_argument("--runs-dir", default="runs", help="executed notebooks go to RUNS_DIR/NAME/ (default runs)")

    pr = sub.add_parser("profile", help="latency curves of the pair at its precisions on the ranks' cores, with the "
                        "memory floor; JSON and a figure")
    add_pair_args(pr, device="cpu")  # the profile is of CPU cores (and their memory floor)
    pr.add_argument("--verifier-cores", default="0", help="cores the target is timed on (default 0)")
    pr.add_argument("--drafter-cores", default="1", help="cores the draft is timed on (default 1)")
    pr.add_argument("--reps", type=int, default=5, help="timed forwards per point, after a warm-up (median; default 5)")
    pr.add_argument("--batch-size", type=int, default=1, help="b: time every pass over b rows at once, as a batched "
                    "run makes it (the target over b x n tokens, the draft's tree over b x B rows; default 1)")
    pr.add_argument("--random-weights", action="store_true", help="time the named pair's architecture with random "
                    "weights, where its weights are not installed (a pass's time depends on the shapes, not the "
                    "values; ssd.models.shapes); auto precisions are then the GPU's own, float32 on a CPU")
    pr.add_argument("--json", default=None, help="write the profile here")
    pr.add_argument("--store", default=None, help="also keep it with the kit's stored results: in STORE/<machine>/"
                    "profiles (--store data), named by the pair, its precisions and the kind of machine; notebooks "
                    "read it there")
    pr.add_argument("--figure", default=None, help="draw the curves into this PNG")
    pr.add_argument("--engine", default="torch", choices=("torch", "llama.cpp"), help="whose kernels: torch, the "
                    "kit's models at their precisions (default), or llama.cpp on the pair's GGUF files as they are "
                    "(built into the user cache on first use, about 4 minutes on 2 cores)")
    pr.add_argument("--llama-threads", type=int, default=1, help="with --engine llama.cpp: threads per model (1: "
                    "a pipeline rank's one core; 2 on 2 cores: SD and AR as llama.cpp's tools run them; default 1)")

    ll = sub.add_parser("llamacpp", help="build llama.cpp (pinned, into the user cache) where it is not built, and "
                        "say where it is; with --drift, measure how far its verify pass moves its greedy margins")
    ll.add_argument("--drift", default=None, metavar="PROMPTS", help="a prompt set (as bench's --prompts): the top-2 "
                    "margin of llama.cpp's target in a one-token step against inside a pass over K + 1 tokens, at "
                    "every position of its AR answers (what makes a difference a near-tie)")
    ll.add_argument("--pair", default=DEFAULT_PAIR, help=f"the pair whose GGUF files (default {DEFAULT_PAIR})")
    ll.add_argument("--draft-length", type=int, default=4, help="K: passes over K + 1 tokens (default 4)")
    ll.add_argument("--answer-tokens", type=int, default=48, help="AR's answer length (default 48)")
    ll.add_argument("--json", default=None, help="with --drift: write it here ({machine}: this kind of machine's "
                    "folder name, e.g. 'data/{machine}/llamacpp_drift.json')")

    sub.add_parser("models", help="list the named pairs and the weight cache folder")

    g = sub.add_parser("gpu-check", help="on a CUDA (or MPS) machine: the gpu tests, a short bench in float32 and "
                       "bfloat16 and the pair's profile in its shapes, within 8 minutes, into "
                       "data/<the GPU>/gpu_check.json; "
                       "without a GPU it stops at once")
    g.add_argument("--json", default=GPU_CHECK_OUT, help="where the result goes (default data/<machine>/gpu_check.json,"
                   " the GPU's folder, e.g. data/nvidia-h200/gpu_check.json)")
    g.add_argument("--budget-s", type=float, default=GPU_CHECK_BUDGET_S, help="the whole check's time limit in "
                   f"seconds (default {GPU_CHECK_BUDGET_S:.0f}); a step that would not fit is skipped and said")

    r = sub.add_parser("report", help="one page per machine from data/: with no option, regenerate docs/results.md, "
                       "docs/results/*.png and README.md's results table; --from or --measure: your page beside the "
                       "nearest stored machine's")
    r.add_argument("--from", dest="from_dir", metavar="DIR", default=None, help="a folder of one machine's bench "
                   "JSONs (e.g. runs/course/results/<machine>): render its page beside the nearest stored machine's")
    r.add_argument("--measure", action="store_true", help="measure the headline table on this machine (about 20 "
                   f"minutes on 2 cores: {REPORT_SIZES}; resumable) into {REPORT_DIR}/<machine>/, then render it as "
                   "--from does")
    r.add_argument("--out", metavar="FILE", default=None, help="with --from or --measure: the page (default "
                   f"{REPORT_OUT}; its figures beside it)")
    r.add_argument("--pair", default=DEFAULT_PAIR, help=f"with --measure: the pair (default {DEFAULT_PAIR}; tiny for "
                   "a quick check of the wiring)")
    r.add_argument("--forward", default="eager", help=f"with --measure: {' | '.join(FORWARDS)}, how the benches' "
                   f"models run (default eager; compiled writes into {REPORT_DIR}/compiled/<machine>/)")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_arguments(args)
    except ValueError as e:
        return bad_input(e)
    from . import commands  # the kit (torch, transformers) loads only now, for a command that runs
    from .models.pair import ModelLoadError
    from .pipeline.transport import PipelineError

    try:
        return getattr(commands, f"cmd_{args.command.replace('-', '_')}")(args) or 0
    except (ValueError, ModelLoadError) as e:  # bad input, or a model that cannot be had: one clear line
        return bad_input(e)
    except PipelineError as e:  # the other rank died, hung or raised: the message already names the cause
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 1


def check_arguments(args) -> None:
    """The kit's own checks of the values given (ssd.checks, which the configs run too), before the kit loads."""
    if hasattr(args, "max_new_tokens"):  # generate, bench, hit-rates: the fields of the config they build
        checks.check_decoding(args.k, args.a_p, args.temperature, args.max_new_tokens)
        checks.check_at_least(args.batch_size, "batch_size")
        checks.check_ssd(args.budget, args.fan_out, args.saguaro_c, args.backup, args.r)
        if args.threads is not None:
            checks.check_at_least(args.threads, "threads")
    if hasattr(args, "target_dtype"):
        checks.check_target_precision(checks.check_precision_name(args.target_dtype, "target_dtype"))
        checks.check_precision_name(args.draft_dtype, "draft_dtype")
    if hasattr(args, "forward"):
        checks.check_choice(args.forward, "forward", FORWARDS)
    if hasattr(args, "prompts"):  # bench, hit-rates; ssd.bench.prompts is free of torch
        from .bench.prompts import load_prompts

        load_prompts(args.prompts)
    if args.command == "generate":
        checks.check_method(args.method)
    elif args.command == "bench":
        methods = checks.parse_methods(args.methods)  # every variant's values too: ar:batch_size=0 fails here
        checks.check_engine_methods(methods, args.pair, args.temperature, args.batch_size)
    elif args.command == "hit-rates":
        check_hit_rates(args)
    elif args.command == "sweep":
        checks.check_at_least(args.jobs, "jobs")
    elif args.command == "profile":
        checks.check_at_least(args.reps, "reps")
        checks.check_at_least(args.batch_size, "batch_size")
        checks.check_at_least(args.llama_threads, "llama_threads")
        if args.engine == "llama.cpp":
            checks.check_gguf_pair(args.pair, "profile --engine llama.cpp")
    elif args.command == "report":
        check_report(args)
    elif args.command == "llamacpp":
        check_llamacpp(args)


def check_llamacpp(args) -> None:
    """llamacpp --drift: a registered pair, K and the answer's length at least 1, the prompts readable."""
    if args.drift is None:
        return
    checks.check_gguf_pair(args.pair, "llamacpp --drift")
    checks.check_at_least(args.draft_length, "draft_length")
    checks.check_at_least(args.answer_tokens, "answer_tokens")
    from .bench.prompts import load_prompts

    load_prompts(args.drift)


def check_report(args) -> None:
    """report: --from and --measure exclude each other; --out names their page; --from names an existing folder."""
    if args.from_dir is not None and args.measure:
        raise ValueError("--from and --measure exclude each other: --from renders results already measured")
    if args.out is not None and args.from_dir is None and not args.measure:
        raise ValueError("--out is the page of --from or --measure; with neither, report regenerates docs/results.md")
    if args.forward != "eager" and not args.measure:
        raise ValueError("--forward is how --measure's benches run; --from renders benches already run, whose forward "
                         "each records")
    if args.from_dir is not None and not os.path.isdir(args.from_dir):
        raise ValueError(f"--from must be a folder of one machine's bench JSONs, got {args.from_dir!r} (no such "
                         "folder)")
    if args.from_dir is not None and not any(name.endswith((".json", ".csv")) for name in os.listdir(args.from_dir)):
        raise ValueError(f"--from must be a folder of one machine's bench JSONs (python -m ssd bench --json), got "
                         f"{args.from_dir!r} with none")


def check_hit_rates(args) -> None:
    """hit-rates reads every smaller budget off one run at the largest: exact only at a fixed K, with every miss
    drafted as SD would (see ssd.analysis.experiments.counterfactual_hits)."""
    checks.parse_budgets(args.budgets)
    checks.parse_strategies(args.strategies)
    if checks.is_auto(args.k):
        raise ValueError("k='auto' changes K as the run goes; hit-rates reads every budget off one run at a fixed K: "
                         "give an integer k")
    if args.backup != "jit" or args.saguaro_c != 1.0:
        raise ValueError("hit-rates reads smaller budgets off one run, which is exact only with --backup jit and "
                         "--saguaro-c 1 (see ssd.analysis.experiments.counterfactual_hits)")


def bad_input(error) -> int:
    print(f"error: {error}", file=sys.stderr)
    return 2


def one_line(error) -> str:
    """A pipeline fault's message without the drafter's traceback: rank 0's cause, then the traceback's last line
    (the drafter's exception) where it sent one."""
    first, *rest = str(error).splitlines()
    raised = [line.strip() for line in rest if line.strip()]
    return f"{first} {raised[-1]}" if raised else first


def torchrun_main(argv=None) -> int:
    """torchrun's entry (`python -m ssd.torchrun ARGS`): rank 0 runs `python -m ssd ARGS` (use the method ssd-pipeline
    there); rank 1 loads the draft of --pair on --drafter-cores (or its GPU) and serves drafts until rank 0 is done."""
    import torch

    from .models.devices import resolve_device
    from .pipeline.launch import close_pipelines, serve_torchrun, stop_unused_torchrun_drafter
    from .pipeline.transport import env_rank

    rank = env_rank()
    if rank is None:
        print("ssd.torchrun runs as a torchrun job: torchrun --nproc-per-node 2 -m ssd.torchrun bench --methods "
              "ar,ssd-pipeline ... (see docs/pipeline.md). On one machine, `python -m ssd ... --methods ssd-pipeline` starts "
              "the drafter itself.", file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    if not hasattr(args, "drafter_cores"):  # a command that decodes nothing (models): rank 1 has nothing to serve
        return main(argv) if rank == 0 else 0
    try:
        device = resolve_device(args.device)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    if rank == 1:
        return serve_torchrun(args.pair, drafter_cores=args.drafter_cores, device=device, precision=args.draft_dtype,
                              forward=args.forward)
    try:
        return main(argv)
    finally:
        close_pipelines()
        stop_unused_torchrun_drafter(device)


def execute_main(argv=None) -> int:
    """A sweep point's process (`python -m ssd.execute`, ssd.course.sweep): one notebook with its parameters, through
    papermill on a kernel over Unix sockets (ssd.course.kernel). Apart from `python -m ssd`, whose commands load the kit
    (torch) before they run: a point's own process needs only papermill, and its kernel loads the kit itself."""
    import yaml

    parser = argparse.ArgumentParser(prog="python -m ssd.execute", description="execute one notebook with papermill "
                                     "on this environment's python3 kernel, over Unix sockets")
    parser.add_argument("notebook")
    parser.add_argument("out", help="the executed copy")
    parser.add_argument("--parameters", default="{}", help="the parameters as YAML (a mapping)")
    parser.add_argument("--cwd", help="the kernel's folder (default: the notebook's)")
    args = parser.parse_args(argv)
    parameters = yaml.safe_load(args.parameters)
    if not isinstance(parameters, dict):
        parser.error(f"--parameters must be a YAML mapping, got {type(parameters).__name__}")
    from .course.kernel import execute_notebook

    execute_notebook(args.notebook, args.out, parameters, args.cwd)
    return 0
