"""What each command of ``python -m ssd`` does (``ssd.cli`` parses the arguments and calls one of these): load the
pair, run, print and write. Imported only once a command runs, so that the parser answers at once."""
from __future__ import annotations

import os
import sys

import pandas as pd
import torch

from .analysis import experiments
from .bench import gpu_check, machines, profile, records, stats, summaries
from .bench import run as bench
from .bench.frames import profile_frame
from .bench.methods import get_method, tunes
from .bench.prompts import Prompt, encode, first_turns, load_prompts
from .checks import parse_budgets, parse_methods, parse_strategies, parse_variant
from .core.decoding import DecodeConfig
from .core.speculation import SSDConfig
from .core.tuning import Autotune
from .course import notebooks as course
from .files import cache_dir, write_csv, write_json
from .models.capability import capability, capability_line
from .models.cores import check_cores
from .models.devices import drafter_device, resolve_device
from .models.kernels import library_line
from .models.loading import PAIRS, load_pair
from .models.shapes import random_pair
from .names import DEFAULT_PAIR, REPORT_BENCHES, REPORT_DIR, REPORT_OUT
from .pipeline.launch import PipelineConfig
from .pipeline.transport import env_rank


def setup(args) -> tuple[object, SSDConfig]:
    # A PipelineConfig is an SSDConfig that also carries the pipeline's cores; every other method ignores them.
    config = PipelineConfig(k=args.k, temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                            budget=args.budget, fan_out_strategy=args.fan_out, saguaro_c=args.saguaro_c,
                            backup=args.backup, a_p=args.a_p, r=args.r, verifier_cores=args.verifier_cores,
                            drafter_cores=args.drafter_cores)
    if args.threads is not None:  # checked with the other arguments (cli.check_arguments)
        torch.set_num_threads(args.threads)
    return load(args), config


def load(args):
    """The pair the arguments name, at the precisions they ask for (auto: decided on this machine, and said)."""
    pair = load_pair(args.pair, target_dtype=args.target_dtype, draft_dtype=args.draft_dtype, device=args.device,
                     forward=args.forward)
    print(f"[ssd] {pair.precisions.label}, {pair.forward} forwards: {pair.precisions.reason}", file=sys.stderr)
    print(f"[ssd] float32 layers multiply in {library_line(pair)}", file=sys.stderr)
    return pair


def cmd_generate(args) -> None:
    pair, config = setup(args)
    prompts = [encode(pair.tokenizer, Prompt(f"cli{i}", text, chat=args.chat)) for i, text in enumerate(args.prompt)]
    generator = torch.Generator().manual_seed(args.seed)
    b = args.batch_size
    if len(prompts) % b and len(prompts) > b:
        print(f"[ssd] {len(prompts)} prompts in batches of {b}: the last holds {len(prompts) % b}", file=sys.stderr)
    batches = [prompts[first : first + b] for first in range(0, len(prompts), b)]  # the prompts, b at a time
    method = get_method(args.method, _autotune(args, pair, config, {len(batch) for batch in batches}))
    for batch in batches:
        answers, traces = method(pair, batch, config, generator)
        for tokens, trace in zip(answers, traces):
            print(pair.tokenizer.decode(tokens))
            print(f"[{args.method}] {_stats(tokens, trace)}", file=sys.stderr)
        if len(batch) > 1:
            total = sum(len(t) for t in answers)
            print(f"[{args.method}] batch of {len(batch)}: {total} tokens in {traces[0].wall_s:.2f} s "
                  f"({total / traces[0].wall_s:.2f} tokens/s in all)", file=sys.stderr)


def _stats(tokens: list[int], trace) -> str:
    stats = f"{len(tokens)} tokens in {trace.wall_s:.2f} s ({len(tokens) / trace.wall_s:.2f} tokens/s)"
    if trace.acceptance_rate is not None:
        stats += f", acceptance {trace.acceptance_rate:.2f}, {trace.tokens_per_round:.2f} tokens per round"
    if trace.hit_rate is not None:
        stats += f", hit rate {trace.hit_rate:.2f}"
    return stats


def _autotune(args, pair, config, sizes: set[int]) -> Autotune | None:
    """generate's method on auto: the profiles at the batch sizes it decodes at (the user cache's, else the kit's
    stored one of this kind of machine, else measured now and kept), fetched before any call; one Autotune for the
    command, so each batch starts from the estimates the last one left. None for a method that tunes nothing."""
    if not tunes(args.method, config):
        return None
    return Autotune({b: profile.cached_profile(pair, verifier_cores=args.verifier_cores,
                                               drafter_cores=args.drafter_cores, batch_size=b,
                                               stored=profile.KIT_PROFILES) for b in sorted(sizes)})


def _auto_batch_sizes(methods: list[str], config, batch_size: int = 1) -> set[int]:
    """The batch sizes the variants that tune as they go decode at: SD's with K on auto, SSD's with K, B or the
    backup on auto."""
    return {bench.batch_size_of(m, batch_size) for m in methods if tunes(m, config)}


def _pipeline_batch_sizes(methods: list[str], batch_size: int = 1) -> set[int]:
    """The batch sizes the two-rank pipeline's variants decode at (the plain method's and each variant's)."""
    return {bench.batch_size_of(m, batch_size) for m in methods if parse_variant(m)[0] == "ssd-pipeline"}


def cmd_bench(args) -> None:
    methods = parse_methods(args.methods)
    if any(parse_variant(m)[0] == "ssd-pipeline" for m in methods) and env_rank() is None:
        drafter_device(resolve_device(args.device), spawned=True)  # one GPU: say so before minutes of loading
    prompts = load_prompts(args.prompts)
    if args.first_turns:
        prompts = first_turns(prompts)
    pair, config = setup(args)
    args.json, args.csv = (_for_this_machine(p, pair.target.device) for p in (args.json, args.csv))
    # Theorem 7 fed by the ranks' latency curves: the pipeline priced at each b it decodes at (on a CPU, whose cores
    # the profile times), and the b = 1 curves, and each tuned b's, for the variants on auto (their tuner reads them)
    priced = _pipeline_batch_sizes(methods, args.batch_size) if pair.target.device.type == "cpu" else set()
    tuned = _auto_batch_sizes(methods, config, args.batch_size)
    sizes = priced | tuned | ({1} if tuned else set())
    # every batch size measured now (once, then read from the user cache), never inside a timed call
    profiles = {b: profile.cached_profile(pair, verifier_cores=args.verifier_cores, drafter_cores=args.drafter_cores,
                                          batch_size=b) for b in sorted(sizes)}
    latencies = profiles.get(1)
    checkpoint = f"{args.json}.partial" if args.json else None
    # one Autotune for the whole bench: an answer on auto starts from the estimates the last on its settings left
    result = bench.run_bench(pair, prompts, methods, config, seed=args.seed, profile=profiles or None,
                             checkpoint=checkpoint, batch_size=args.batch_size,
                             autotune=Autotune(profiles) if tuned else None)
    # a JSON keeps the rows and their summaries, not the timeline's spans
    result = records.bench_record(result, pair, vars(args) | {"pair": pair.name}, latencies, batch_profiles=profiles)
    print(summaries.summary_table(result["summary"]))
    print()
    print(summaries.category_table(result["categories"]))
    if result["peers"]:
        print()
        print(summaries.peers_table(result["peers"]))
    print()
    print("where the time went, per answer:")
    print(pd.DataFrame(result["breakdown"]).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    if args.csv:
        write_csv(machines.stamp(pd.DataFrame(result["rows"]), pair), args.csv)
        print(f"wrote {args.csv}", file=sys.stderr)
    if args.json:
        write_json(args.json, result)
        if os.path.exists(checkpoint):
            os.remove(checkpoint)  # the result is safe: a rerun measures afresh
        print(f"wrote {args.json}", file=sys.stderr)


def cmd_hit_rates(args) -> None:
    """One SSD run at the largest budget (jit backup, C = 1), every smaller budget and strategy counterfactually."""
    # the arguments are checked (cli.check_hit_rates); parsed again here
    budgets, strategies = parse_budgets(args.budgets), parse_strategies(args.strategies)
    args.budget = max(budgets)
    prompts = load_prompts(args.prompts)
    pair, config = setup(args)
    rounds = experiments.ssd_rounds(pair, prompts, config, seed=args.seed)
    curves = experiments.hit_rate_curves(rounds, budgets, config.k, strategies, a_p=config.a_p, r=config.r)
    table = stats.mean_ci(curves, ["strategy", "budget"], "hit_rate")
    write_csv(machines.stamp(rounds, pair), f"{args.out}_rounds.csv")
    write_csv(machines.stamp(curves, pair), f"{args.out}.csv")
    print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(f"acceptance rate {rounds.accepted.sum() / rounds.draft_len.sum():.3f}, {len(rounds)} rounds; "
          f"wrote {args.out}.csv and {args.out}_rounds.csv", file=sys.stderr)


def cmd_course(args) -> int:
    only = [p.strip() for p in args.only.split(",") if p.strip()] if args.only else None
    if args.report and course.in_place(args.notebooks, args.out):
        raise ValueError(f"report needs a user's run: --out {args.out} is the notebooks' own folder (the stored run, "
                         f"which writes no results); give another --out, e.g. runs/course")
    parameters = {"forward": args.forward} if args.forward != "eager" else None  # eager: the notebooks' default
    seconds = course.run_course(args.notebooks, args.out, only, parameters=parameters)
    print("\n".join(f"{name:32s} {s:6.0f} s" for name, s in seconds.items()))
    return _render_page(args.out, args.report) if args.report else 0


def _render_page(out: str, page: str) -> int:
    """This machine's page of what the course measured, by `python -m ssd report` in its own process (its interface,
    --from DIR --out FILE, is the contract between the two); says where the page is."""
    import subprocess

    from .bench.machines import this_machine

    machine = this_machine()
    results = course.results_dir(out, machine)
    if not os.path.isdir(results):
        raise ValueError(f"report: the notebooks run wrote no results into {results} (notebook 05 does); no page")
    print(f"python -m ssd report --from {results} --out {page}", file=sys.stderr)
    if subprocess.run(course.report_command(out, page, machine), check=False).returncode:
        return 1
    print(f"your machine's page: {page}")
    return 0


def _for_this_machine(path: str | None, device="cpu") -> str | None:
    """A results path with {machine} filled in: the folder of this kind of machine in data/ (ssd.bench.machines)."""
    if not path or "{machine}" not in path:
        return path
    return path.replace("{machine}", machines.this_machine(device))


def cmd_sweep(args) -> int:
    from .course import sweep  # it imports nbformat: the other commands run where only the kit's core packages are

    grid = sweep.load_grid(args.grid)
    try:
        failed = sweep.run_sweep(grid, jobs=args.jobs, data_dir=_for_this_machine(args.data_dir),
                                 runs_dir=args.runs_dir, dry_run=args.dry_run)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the children are stopped, the points done are kept
        print("sweep interrupted; the points finished so far are recorded, a rerun runs the rest", file=sys.stderr)
        return 130
    if failed:
        print(f"error: {len(failed)} point(s) failed and were not recorded (a rerun retries them): "
              f"{', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def cmd_llamacpp(args) -> None:
    from .llamacpp import build, rounding

    found = build.ensure()
    print(f"llama.cpp (llama-cpp-python {build.VERSION}) built for this CPU in {found.folder}")
    print(f"tools: {', '.join(str(found.tool(t)) for t in build.TOOLS)}")
    if not args.drift:
        return
    pair = load_pair(args.pair)  # its tokenizer and end tokens; llama.cpp runs the GGUF files themselves
    prompts = [encode(pair.tokenizer, p) for p in load_prompts(args.drift)]
    config = DecodeConfig(k=args.draft_length, max_new_tokens=args.answer_tokens)
    result = rounding.measure(pair, prompts, config, torch.get_num_threads())
    print(f"{result['positions']} positions: the top-2 margin moves by at most {result['max_drift']:.4f} (99th "
          f"percentile {result['p99_drift']:.4f}) between a one-token step and a pass over K + 1 tokens; near-tie "
          f"bound {result['near_tie_bound']:.4f}")
    if args.json:
        path = args.json.format(machine=machines.this_machine())
        record = machines.provenance()
        write_json(path, {"args": {"command": "llamacpp", "drift": args.drift, "draft_length": args.draft_length,
                                   "answer_tokens": args.answer_tokens, "pair": args.pair},
                          "kind": record["machine"], "commit": record["commit"], "date": record["date"],
                          "capability": capability(), **result})
        print(f"wrote {path}", file=sys.stderr)


def cmd_profile(args) -> None:
    if args.engine == "llama.cpp":
        from .bench import profile_llamacpp

        result = profile_llamacpp.measure(args.pair, threads=args.llama_threads, reps=args.reps,
                                          batch_size=args.batch_size)
        label = (f"{result.precisions['target']}/{result.precisions['draft']} on llama.cpp, {args.llama_threads} "
                 f"thread{'s' if args.llama_threads > 1 else ''}")
        return _show_profile(args, result, label)
    check_cores(args.verifier_cores, "verifier_cores")
    check_cores(args.drafter_cores, "drafter_cores")
    pair = random_pair(args.pair, target_dtype=args.target_dtype, draft_dtype=args.draft_dtype,
                       device=resolve_device(args.device), forward=args.forward) if args.random_weights else load(args)
    result = profile.measure(pair, verifier_cores=args.verifier_cores, drafter_cores=args.drafter_cores, reps=args.reps,
                             batch_size=args.batch_size)
    _show_profile(args, result, pair.precisions.label)


def _show_profile(args, result, label: str) -> None:
    """Print a profile's curves and floors; keep it where asked (--json, --store) and draw it (--figure)."""
    frame = profile_frame(result)
    print(f"{result.pair}, {label}; {capability_line(result.capability)}")
    where = (f"{len(result.verifier_cores)} thread(s) per model" if result.engine != "torch" else
             f"target on cores {result.verifier_cores}, draft on cores {result.drafter_cores}")
    print(f"{where}, context {result.context}, batch size {result.batch_size} (every pass over that many rows)")
    print(frame.to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    for role in ("target", "draft"):
        print(f"{role}: memory {result.bandwidth_gbs[role]:.1f} GB/s, a step reads {result.step_bytes[role] / 1e9:.2f} "
              f"GB: floor {result.floor_ms(role):.0f} ms, measured {frame[frame.role == role].ms.iloc[0]:.0f} ms")
    if args.json:
        profile.save(result, args.json)
        print(f"wrote {args.json}", file=sys.stderr)
    if args.store:
        folder = os.path.join(args.store, machines.this_machine(), "profiles")  # data/<machine>/profiles
        path = os.path.join(folder, profile.stored_name(result))
        os.makedirs(folder, exist_ok=True)
        profile.save(result, path)
        print(f"wrote {path}", file=sys.stderr)
    if args.figure:
        import matplotlib.pyplot as plt  # matplotlib only when a figure is asked for

        from .analysis import plots, style

        fig = plots.latency_profile(frame.assign(label=label), capability_line(result.capability))
        print(f"wrote {style.save(fig, args.figure)}", file=sys.stderr)
        plt.close(fig)  # a command draws one figure; leave pyplot as it was


def cmd_models(args) -> None:
    for name in PAIRS:
        print(f"{name}{' (default)' if name == DEFAULT_PAIR else ''}")
    print("or any two hub ids with one tokenizer: --pair DRAFT,TARGET (e.g. distilgpt2,gpt2-medium; needs the hub)")
    print(f"weight cache: {cache_dir()}")


def cmd_gpu_check(args) -> int:
    return gpu_check.run(args.json, budget_s=args.budget_s)



def cmd_report(args) -> int:
    """Regenerate the stored machines' pages (docs/results.md, docs/results/*.png, README.md's block); with --from a
    folder's page beside the nearest stored machine's; with --measure this machine's, measured first."""
    from .analysis import report_files
    from .bench.machines import DATA
    from .files import KIT_ROOT

    if args.from_dir is None and not args.measure:
        for path in report_files.regenerate(DATA, str(KIT_ROOT / "docs"), str(KIT_ROOT / "README.md")):
            print(f"wrote {path}")
        return 0
    folder = args.from_dir if args.from_dir is not None else measure_headline(args.pair, args.forward)
    print(f"wrote {report_files.beside(folder, DATA, args.out or REPORT_OUT)}")
    return 0


def measure_headline(pair: str, forward: str = "eager") -> str:
    """The headline table's benches on this machine (names.REPORT_BENCHES), each a `python -m ssd bench` of its own
    with its progress bar, into REPORT_DIR/<machine>/headline_<name>.json (compiled forwards: under
    REPORT_DIR/compiled/, so neither run's benches are taken for the other's); a bench already written is kept, and one
    cut short resumes from its .partial file. Returns the folder. A process per bench: each loads the pair afresh, as
    the stored benches did, and a failure stops with the bench's own message."""
    import subprocess

    from .bench.machines import this_machine

    folder = os.path.join(REPORT_DIR, *(["compiled"] if forward == "compiled" else []), this_machine())
    for name, (prompts, fan_out, methods) in REPORT_BENCHES.items():
        path = os.path.join(folder, f"headline_{name}.json")
        if os.path.exists(path):
            print(f"kept {path}", file=sys.stderr)
            continue
        command = [sys.executable, "-m", "ssd", "bench", "--pair", pair, "--methods", methods, "--prompts", prompts,
                   "--max-new-tokens", "48", "--temperature", "0", "-k", "4", "--budget", "4", "--fan-out", fan_out,
                   "--forward", forward, "--json", path]
        if subprocess.run(command).returncode != 0:
            raise ValueError(f"pair {pair!r}: the bench for {path} failed (its message is above); a rerun resumes")
    return folder
