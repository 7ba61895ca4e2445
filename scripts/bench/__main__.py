"""The benchmarks, one subcommand each: `python -m scripts.bench BENCHMARK [flags]`, from the repository's
root.

Each writes one JSON report (scripts/bench/common.py: the same top-level keys for all) to --out, or to
stdout without it. `python -m scripts.bench BENCHMARK --help` prints what a benchmark measures and how.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from scripts.bench.common import add_report_arguments, command_line

# name: (module, what it measures). Only the chosen one is imported: each needs its own libraries.
BENCHMARKS = {
    "load": ("load", "closed-loop HTTP load on a running server, at one or several client counts"),
    "engine": ("engine", "the bare engines' real-time factor: torch against ONNX, same texts"),
    "threads": ("threads", "how each bare engine's speed scales with its threads"),
    "replicas": ("replicas", "threads per replica against replicas: every split of the cores"),
    "cpu": ("cpu", "the server's defaults against the kokoro library's own pipeline (the peer figure)"),
    "ttfb": ("ttfb", "time to first audio byte with a small first chunk and a large one"),
    "batching": ("batching", "the batched forward against batch size, and the server with batching off/on"),
    "encoders": ("encoders", "what each audio encoder costs per audio second, and how far its audio moves"),
    "frontend": ("frontend", "the CPU work per audio second with the GPU simulated"),
    "live": ("live", "live text: phrase to audio against the whole answer, and barge-in"),
    "wyoming": ("wyoming", "the Wyoming service's first audio against the HTTP stream's"),
    "books": ("books", "a book job beside interactive requests, and alone"),
    "books-replicas": ("books_replicas", "a book's wall time on two instances sharing PostgreSQL"),
    "ready": ("ready", "time from start to /ready, per phase, over starts sharing a compile cache"),
    "shared-engine": ("shared_engine", "the shared engine's loop against a simulated GPU"),
    "idle-unload": ("idle_unload", "the memory an idle unload gives back, and the reload's wait"),
    "keys": ("keys", "two API keys: one flooding at 4x its share, the other's first audio against alone"),
    "soak": ("soak", "many mixed requests against one server, its resources sampled; checks"),
    "gpu-server": ("gpu_server", "the real server on a GPU under load: throughput, first audio, utilization"),
    "gpu-engine": ("gpu_engine", "the bare engine on a GPU: batches from one thread and from lanes"),
}


def module_of(name: str) -> ModuleType:
    return importlib.import_module(f"scripts.bench.{BENCHMARKS[name][0]}")


def build_parser(chosen: str | None = None) -> argparse.ArgumentParser:
    """Every benchmark's subcommand; the `chosen` one with its flags (the others list their summary)."""
    parser = argparse.ArgumentParser(prog="python -m scripts.bench", description=__doc__)
    subcommands = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    for name, (_, summary) in BENCHMARKS.items():
        if name != chosen:
            subcommands.add_parser(name, help=summary)
            continue
        module = module_of(name)
        raw = argparse.RawDescriptionHelpFormatter
        sub = subcommands.add_parser(name, help=summary, description=module.__doc__, formatter_class=raw)
        module.add_arguments(sub)
        add_report_arguments(sub)
        sub.set_defaults(run=module.run, prepare=getattr(module, "prepare", None), parser=sub)
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The arguments of `argv` (BENCHMARK first), checked by the benchmark's `prepare` where it has one."""
    chosen = argv[0] if argv and argv[0] in BENCHMARKS else None
    args = build_parser(chosen).parse_args(argv)
    args.command_line = command_line(argv)
    prepare, parser = args.prepare, args.parser
    del args.prepare, args.parser
    if prepare is not None:
        prepare(parser, args)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else list(argv))
    result: int = args.run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
