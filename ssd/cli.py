"""Command line: python -m ssd generate | bench | hit-rates | sweep | course | profile | models | gpu-check."""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import pandas as pd
import torch

from . import bench, course, experiments, gpu_check, profile, sweep
from .cores import check_cores
from .devices import drafter_device, resolve_device
from .methods import METHODS, get_method, parse_methods, parse_variant
from .files import cache_dir, write_csv, write_json
from .models import DEFAULT_PAIR, PAIRS, ModelLoadError, load_pair
from .precision import CHOICES, capability_line, check_precision
from .outcomes import STRATEGIES, check_strategy
from .pipeline import PipelineConfig, close_pipelines, serve_torchrun, stop_unused_torchrun_drafter
from .prompts import Prompt, encode, first_turns, load_prompts
from .ssd import BACKUPS, SSDConfig
from .transport import PipelineError, env_rank
from .tuning import AUTO, is_auto, on_auto


def add_pair_args(p: argparse.ArgumentParser, device: str = "auto") -> None:
    p.add_argument("--pair", default=DEFAULT_PAIR,
                   help=f"a named offline pair ({', '.join(PAIRS)}) or two hub ids 'DRAFT,TARGET' (default {DEFAULT_PAIR})")
    p.add_argument("--device", default=device, help=f"device of both models: auto (CUDA, else MPS, else the CPU), "
                   f"cpu, cuda, cuda:N or mps (default {device}); on a GPU auto precisions are bfloat16 (MPS: float16)")
    p.add_argument("--target-dtype", default="auto", help=f"{' | '.join(CHOICES)}: the target's precision; auto (the "
                   "default) times the candidates once on this machine and keeps the faster verify pass (float32 is "
                   "the exact reference)")
    p.add_argument("--draft-dtype", default="auto", help=f"{' | '.join(CHOICES)}: the draft's precision (int8: int8 "
                   "linear layers, CPU only); auto keeps the fastest one-token step")


def add_decoding_args(p: argparse.ArgumentParser) -> None:
    add_pair_args(p)
    p.add_argument("-k", "--k", type=int_or_auto, default=4, help="draft length K, or auto: chosen for this machine from "
                   "its latency profile and the run's acceptance rate, re-decided as the run goes (default 4)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default 0)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="default 64")
    p.add_argument("--seed", type=int, default=0, help="seed of the torch.Generator every draw uses (default 0)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's own)")
    s = p.add_argument_group("SSD (method ssd)")
    s.add_argument("--budget", type=int_or_auto, default=16, help="B, cached outcomes per round, or auto: chosen "
                   "with K from the profile and the calibrated a_p and miss rates (default 16)")
    s.add_argument("--fan-out", default="uniform",
                   help=f"the fan-out strategy: {' | '.join(STRATEGIES)} (default uniform)")
    s.add_argument("--saguaro-c", type=float, default=1.0, help="Saguaro's C in [0, 1]; 1 = off (default 1)")
    s.add_argument("--backup", default="jit", help=f"on a miss: {' | '.join(BACKUPS)} (default jit)")
    s.add_argument("--a-p", type=float, default=0.6, help="geometric: acceptance rate; calibrated and auto: its prior "
                   "(default 0.6)")
    s.add_argument("--r", type=float, default=0.5, help="geometric: miss-rate power-law exponent; calibrated: prior")
    t = p.add_argument_group("SSD on two ranks (method ssd-pipeline; see ssd.pipeline)")
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

    gen = sub.add_parser("generate", help="decode one prompt and print the text")
    add_decoding_args(gen)
    gen.add_argument("--method", default="sd", help=f"one of {', '.join(METHODS)} (default sd)")
    gen.add_argument("--prompt", required=True, help="the prompt text")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")

    b = sub.add_parser("bench", help="methods side by side on a prompt set; prints a summary per method and one per "
                       "category (Spec-Bench's report), writes JSON")
    add_decoding_args(b)
    b.add_argument("--methods", default="ar,sd", help=f"comma-separated, from {', '.join(METHODS)} (default ar,sd); a "
                   "variant sets its own k or budget, e.g. sd:k=2,sd:k=auto,ssd-pipeline:k=4:budget=8")
    b.add_argument("--prompts", default="humaneval:8", help="humaneval, prose or a Spec-Bench JSONL path, optionally "
                   "with :N (the first N), [a:b] (a slice) or @N (the first N of each category), e.g. question.jsonl@2 "
                   "(default humaneval:8)")
    b.add_argument("--first-turns", action="store_true", help="answer only each prompt's first turn (by default a "
                   "Spec-Bench row's later turns are answered too, each after the answer before it)")
    b.add_argument("--json", default=None, help="write rows, summary, categories, machine and arguments here; "
                   "meanwhile JSON.partial keeps the prompts done, and a rerun of the same command resumes from it")
    b.add_argument("--csv", default=None, help="also write the rows (one per method and answer) here")

    h = sub.add_parser("hit-rates", help="SSD hit rate against the budget B for each fan-out strategy, with 95%% CIs")
    add_decoding_args(h)
    h.add_argument("--prompts", default="humaneval:32", help="prompt set (default humaneval:32)")
    h.add_argument("--budgets", default="0,1,2,4,8,16,32", help="comma-separated budgets; the run uses the largest")
    h.add_argument("--strategies", default=",".join(STRATEGIES), help="fan-out strategies to evaluate")
    h.add_argument("--out", default="data/hit_rates_cli",
                   help="writes OUT_rounds.csv and OUT.csv (default data/hit_rates_cli)")

    co = sub.add_parser("course", help="execute every numbered notebook at its defaults with papermill")
    co.add_argument("--notebooks", default="notebooks", help="folder of the numbered notebooks (default notebooks)")
    co.add_argument("--out", default="runs/course", help="where the executed copies go (default runs/course)")
    co.add_argument("--only", default=None, help="comma-separated name prefixes, e.g. 00,01 (default: all)")

    sw = sub.add_parser("sweep", help="run a notebook over a YAML parameter grid with papermill; resumable")
    sw.add_argument("grid", help="the grid file (YAML: name, notebook, parameters, grid; see ssd.sweep)")
    sw.add_argument("--jobs", type=int, default=1, help="points run at once, each in its own process (default 1)")
    sw.add_argument("--dry-run", action="store_true", help="list the points, marking those done; run nothing")
    sw.add_argument("--data-dir", default="data", help="results go to DATA_DIR/NAME.csv (default data)")
    sw.add_argument("--runs-dir", default="runs", help="executed notebooks go to RUNS_DIR/NAME/ (default runs)")

    pr = sub.add_parser("profile", help="latency curves of the pair at its precisions on the ranks' cores, with the "
                        "memory floor; JSON and a figure")
    add_pair_args(pr, device="cpu")  # the profile is of CPU cores (and their memory floor)
    pr.add_argument("--verifier-cores", default="0", help="cores the target is timed on (default 0)")
    pr.add_argument("--drafter-cores", default="1", help="cores the draft is timed on (default 1)")
    pr.add_argument("--reps", type=int, default=5, help="timed forwards per point, after a warm-up (median; default 5)")
    pr.add_argument("--json", default=None, help="write the profile here")
    pr.add_argument("--store", default=None, help="also keep it in this folder of stored profiles (data/profiles), "
                    "named by the pair, its precisions and the kind of machine; notebooks read it there")
    pr.add_argument("--figure", default=None, help="draw the curves into this PNG")

    sub.add_parser("models", help="list the named pairs and the weight cache folder")

    g = sub.add_parser("gpu-check", help="on a CUDA (or MPS) machine: the gpu tests and a short bench in float32 and "
                       "bfloat16, within 8 minutes, into data/gpu_check.json; without a GPU it stops at once")
    g.add_argument("--json", default=gpu_check.OUT, help=f"where the result goes (default {gpu_check.OUT})")
    g.add_argument("--budget-s", type=float, default=gpu_check.BUDGET_S, help="the whole check's time limit in "
                   f"seconds (default {gpu_check.BUDGET_S:.0f}); a step that would not fit is skipped and said")
    return parser


def setup(args) -> tuple[object, SSDConfig]:
    # A PipelineConfig is an SSDConfig that also carries the pipeline's cores; every other method ignores them.
    config = PipelineConfig(k=args.k, temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                            budget=args.budget, fan_out_strategy=args.fan_out, saguaro_c=args.saguaro_c,
                            backup=args.backup, a_p=args.a_p, r=args.r, verifier_cores=args.verifier_cores,
                            drafter_cores=args.drafter_cores)
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    return load(args), config


def load(args):
    """The pair the arguments name, at the precisions they ask for (auto: decided on this machine, and said)."""
    check_precision(args.target_dtype, "target_dtype")  # bad input fails before minutes of loading
    check_precision(args.draft_dtype, "draft_dtype")
    pair = load_pair(args.pair, target_dtype=args.target_dtype, draft_dtype=args.draft_dtype, device=args.device)
    print(f"[ssd] {pair.precisions.label}: {pair.precisions.reason}", file=sys.stderr)
    return pair


def cmd_generate(args) -> None:
    method = get_method(args.method)
    pair, config = setup(args)
    ids = encode(pair.tokenizer, Prompt("cli", args.prompt, chat=args.chat))
    tokens, trace = method(pair, ids, config, torch.Generator().manual_seed(args.seed))
    print(pair.tokenizer.decode(tokens))
    stats = f"{len(tokens)} tokens in {trace.wall_s:.2f} s ({len(tokens) / trace.wall_s:.2f} tokens/s)"
    if trace.acceptance_rate is not None:
        stats += f", acceptance {trace.acceptance_rate:.2f}, {trace.tokens_per_round:.2f} tokens per round"
    if trace.hit_rate is not None:
        stats += f", hit rate {trace.hit_rate:.2f}"
    print(f"[{args.method}] {stats}", file=sys.stderr)


def cmd_bench(args) -> None:
    methods = parse_methods(args.methods)
    if "ssd-pipeline" in methods and env_rank() is None:  # one GPU: say so before minutes of loading
        drafter_device(resolve_device(args.device), spawned=True)
    prompts = load_prompts(args.prompts)
    if args.first_turns:
        prompts = first_turns(prompts)
    pair, config = setup(args)
    latencies = None
    if "ssd-pipeline" in methods and pair.target.device.type == "cpu":  # Theorem 7 fed by the ranks' latency curves
        latencies = profile.cached_profile(pair, verifier_cores=args.verifier_cores, drafter_cores=args.drafter_cores)
    if on_auto(config) or any(is_auto(v) for m in methods for v in parse_variant(m)[1].values()):
        # auto K or B: priced on the profile of the ranks' cores (measured once, then read from the user cache)
        latencies = latencies or profile.cached_profile(pair, verifier_cores=args.verifier_cores,
                                                        drafter_cores=args.drafter_cores)
        config = dataclasses.replace(config, latencies=latencies)
    checkpoint = f"{args.json}.partial" if args.json else None
    result = bench.run_bench(pair, prompts, methods, config, seed=args.seed, profile=latencies, checkpoint=checkpoint)
    result = {"args": vars(args) | {"pair": pair.name}, "environment": bench.environment(pair.target.device),
              "precision": pair.precisions.as_dict(), "profile": latencies.to_dict() if latencies else None, **result}
    print(bench.summary_table(result["summary"]))
    print()
    print(bench.category_table(result["categories"]))
    if args.csv:
        write_csv(pd.DataFrame(result["rows"]), args.csv)
        print(f"wrote {args.csv}", file=sys.stderr)
    if args.json:
        write_json(args.json, result)
        if os.path.exists(checkpoint):
            os.remove(checkpoint)  # the result is safe: a rerun measures afresh
        print(f"wrote {args.json}", file=sys.stderr)


def cmd_hit_rates(args) -> None:
    """One SSD run at the largest budget (jit backup, C = 1), every smaller budget and strategy counterfactually."""
    budgets = sorted({int(b) for b in args.budgets.split(",")})
    strategies = [s.strip() for s in args.strategies.split(",")]
    for s in strategies:
        check_strategy(s)
    if is_auto(args.k):
        raise ValueError("k='auto' changes K as the run goes; hit-rates reads every budget off one run at a fixed K: "
                         "give an integer k")
    if args.backup != "jit" or args.saguaro_c != 1.0:
        raise ValueError("hit-rates reads smaller budgets off one run, which is exact only with --backup jit and "
                         "--saguaro-c 1 (see ssd.ssd.counterfactual_hits)")
    args.budget = max(budgets)
    prompts = load_prompts(args.prompts)
    pair, config = setup(args)
    rounds = experiments.ssd_rounds(pair, prompts, config, seed=args.seed)
    curves = experiments.hit_rate_curves(rounds, budgets, config.k, strategies, a_p=config.a_p, r=config.r)
    table = experiments.mean_ci(curves, ["strategy", "budget"], "hit_rate")
    write_csv(rounds, f"{args.out}_rounds.csv")
    write_csv(curves, f"{args.out}.csv")
    print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(f"acceptance rate {rounds.accepted.sum() / rounds.draft_len.sum():.3f}, {len(rounds)} rounds; "
          f"wrote {args.out}.csv and {args.out}_rounds.csv", file=sys.stderr)


def cmd_course(args) -> int:
    only = [p.strip() for p in args.only.split(",") if p.strip()] if args.only else None
    seconds = course.run_course(args.notebooks, args.out, only)
    print("\n".join(f"{name:32s} {s:6.0f} s" for name, s in seconds.items()))
    return 0


def cmd_sweep(args) -> int:
    grid = sweep.load_grid(args.grid)
    try:
        failed = sweep.run_sweep(grid, jobs=args.jobs, data_dir=args.data_dir, runs_dir=args.runs_dir,
                                 dry_run=args.dry_run)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the children are stopped, the points done are kept
        print("sweep interrupted; the points finished so far are recorded, a rerun runs the rest", file=sys.stderr)
        return 130
    if failed:
        print(f"error: {len(failed)} point(s) failed and were not recorded (a rerun retries them): "
              f"{', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def cmd_profile(args) -> None:
    if args.reps < 1:
        raise ValueError(f"reps must be >= 1, got {args.reps}")
    check_cores(args.verifier_cores, "verifier_cores")
    check_cores(args.drafter_cores, "drafter_cores")
    pair = load(args)
    result = profile.measure(pair, verifier_cores=args.verifier_cores, drafter_cores=args.drafter_cores, reps=args.reps)
    frame = result.to_frame()
    print(f"{pair.name}, {pair.precisions.label}; {capability_line(result.capability)}")
    print(f"target on cores {result.verifier_cores}, draft on cores {result.drafter_cores}, context {result.context}")
    print(frame.to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    for role in ("target", "draft"):
        print(f"{role}: memory {result.bandwidth_gbs[role]:.1f} GB/s, a step reads {result.step_bytes[role] / 1e9:.2f} "
              f"GB: floor {result.floor_ms(role):.0f} ms, measured {frame[frame.role == role].ms.iloc[0]:.0f} ms")
    if args.json:
        profile.save(result, args.json)
        print(f"wrote {args.json}", file=sys.stderr)
    if args.store:
        path = os.path.join(args.store, profile.stored_name(result))
        os.makedirs(args.store, exist_ok=True)
        profile.save(result, path)
        print(f"wrote {path}", file=sys.stderr)
    if args.figure:
        from . import plots  # matplotlib only when a figure is asked for

        fig = plots.latency_profile(frame.assign(label=pair.precisions.label), capability_line(result.capability))
        print(f"wrote {plots.save(fig, args.figure)}", file=sys.stderr)
        plots.plt.close(fig)  # a command draws one figure; leave pyplot as it was


def cmd_models(args) -> None:
    for name in PAIRS:
        print(f"{name}{' (default)' if name == DEFAULT_PAIR else ''}")
    print("or any two hub ids with one tokenizer: --pair DRAFT,TARGET (e.g. distilgpt2,gpt2-medium; needs the hub)")
    print(f"weight cache: {cache_dir()}")


def cmd_gpu_check(args) -> int:
    return gpu_check.run(args.json, budget_s=args.budget_s)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        commands = {"generate": cmd_generate, "bench": cmd_bench, "hit-rates": cmd_hit_rates, "sweep": cmd_sweep,
                    "course": cmd_course, "profile": cmd_profile, "models": cmd_models, "gpu-check": cmd_gpu_check}
        return commands[args.command](args) or 0
    except (ValueError, ModelLoadError) as e:  # bad input, or a model that cannot be had: one clear line
        print(f"error: {e}", file=sys.stderr)
        return 2
    except PipelineError as e:  # the other rank died, hung or raised: the message already names the cause
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 1


def one_line(error: PipelineError) -> str:
    """A pipeline fault's message without the drafter's traceback: rank 0's cause, then the traceback's last line
    (the drafter's exception) where it sent one."""
    first, *rest = str(error).splitlines()
    raised = [line.strip() for line in rest if line.strip()]
    return f"{first} {raised[-1]}" if raised else first


def torchrun_main(argv=None) -> int:
    """torchrun's entry (`python -m ssd.torchrun ARGS`): rank 0 runs `python -m ssd ARGS` (use the method ssd-pipeline
    there); rank 1 loads the draft of --pair on --drafter-cores (or its GPU) and serves drafts until rank 0 is done."""
    rank = env_rank()
    if rank is None:
        print("ssd.torchrun runs as a torchrun job: torchrun --nproc-per-node 2 -m ssd.torchrun bench --methods "
              "ar,ssd-pipeline ... (see README). On one machine, `python -m ssd ... --methods ssd-pipeline` starts "
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
        return serve_torchrun(args.pair, drafter_cores=args.drafter_cores, device=device, precision=args.draft_dtype)
    try:
        return main(argv)
    finally:
        close_pipelines()
        stop_unused_torchrun_drafter(device)
