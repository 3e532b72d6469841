"""Command line: python -m ssd generate | bench | models."""
from __future__ import annotations

import argparse
import sys

import torch

from . import bench
from .decoding import DecodeConfig
from .methods import METHODS, get_method, parse_methods
from .models import DEFAULT_PAIR, PAIRS, cache_dir, load_pair
from .prompts import Prompt, encode, load_prompts


def add_decoding_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pair", default=DEFAULT_PAIR,
                   help=f"a named offline pair ({', '.join(PAIRS)}) or two hub ids 'DRAFT,TARGET' (default {DEFAULT_PAIR})")
    p.add_argument("-k", type=int, default=4, help="draft length K (default 4)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default 0)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="default 64")
    p.add_argument("--seed", type=int, default=0, help="seed of the torch.Generator every draw uses (default 0)")
    p.add_argument("--device", default="cpu", help="torch device of both models (default cpu)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's own)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ssd", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="decode one prompt and print the text")
    add_decoding_args(gen)
    gen.add_argument("--method", default="sd", help=f"one of {', '.join(METHODS)} (default sd)")
    gen.add_argument("--prompt", required=True, help="the prompt text")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")

    b = sub.add_parser("bench", help="methods side by side on a prompt set; prints a table, writes JSON")
    add_decoding_args(b)
    b.add_argument("--methods", default="ar,sd", help=f"comma-separated, from {', '.join(METHODS)} (default ar,sd)")
    b.add_argument("--prompts", default="humaneval:8", help="humaneval[:N], prose[:N] or a Spec-Bench JSONL path")
    b.add_argument("--json", default=None, help="write rows, summary, machine and arguments here")

    sub.add_parser("models", help="list the named pairs and the weight cache folder")
    return parser


def setup(args) -> tuple[object, DecodeConfig]:
    config = DecodeConfig(k=args.k, temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    return load_pair(args.pair, device=args.device), config


def cmd_generate(args) -> None:
    method = get_method(args.method)
    pair, config = setup(args)
    ids = encode(pair.tokenizer, Prompt("cli", args.prompt, chat=args.chat))
    tokens, trace = method(pair, ids, config, torch.Generator().manual_seed(args.seed))
    print(pair.tokenizer.decode(tokens))
    stats = f"{len(tokens)} tokens in {trace.wall_s:.2f} s ({len(tokens) / trace.wall_s:.2f} tokens/s)"
    if trace.acceptance_rate is not None:
        stats += f", acceptance {trace.acceptance_rate:.2f}, {trace.tokens_per_round:.2f} tokens per round"
    print(f"[{args.method}] {stats}", file=sys.stderr)


def cmd_bench(args) -> None:
    methods = parse_methods(args.methods)
    prompts = load_prompts(args.prompts)
    pair, config = setup(args)
    result = bench.run_bench(pair, prompts, methods, config, seed=args.seed)
    result = {"args": vars(args) | {"pair": pair.name}, "environment": bench.environment(), **result}
    print(bench.summary_table(result["summary"]))
    if args.json:
        bench.write_json(args.json, result)
        print(f"wrote {args.json}", file=sys.stderr)


def cmd_models(args) -> None:
    for name in PAIRS:
        print(f"{name}{' (default)' if name == DEFAULT_PAIR else ''}")
    print("or any two hub ids with one tokenizer: --pair DRAFT,TARGET (e.g. distilgpt2,gpt2-medium; needs the hub)")
    print(f"weight cache: {cache_dir()}")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        {"generate": cmd_generate, "bench": cmd_bench, "models": cmd_models}[args.command](args)
    except ValueError as e:  # bad input: one clear line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
