"""schemathesis over a real server, from the server's own OpenAPI document: every phase (examples, coverage,
fuzzing, and the stateful one, whose chains follow the document's links: create a job or a voice, then
read, fetch and delete that one) and every check but positive_data_acceptance (tests/integration/test_fuzz.py
says why). Longer than that test, which the suite runs. Its JSON report holds the cases, the failures, the
time, schemathesis's version, the checks run and the links followed; it exits 1 on any failure, and when
fewer than --min-cases cases ran.

    python -m scripts.tools.fuzz_api --out bench-results/<machine>/fuzz-api.json
    python -m scripts.tools.fuzz_api --url http://127.0.0.1:8880 -- -H "Authorization: Bearer KEY"

Without --url it starts the tone server (`python -m tests.tone_server`: the real routes, middleware, text
pipeline, G2P and encoders over the fake tone engine) on random weights, with book jobs and voice uploads
on, and inputs held to --max-input-chars so that each case stays cheap (the limit is in the document too).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import schemathesis.specs.openapi.checks  # noqa: F401 - registers the OpenAPI checks, which CHECKS lists
from schemathesis.checks import CHECKS

from scripts.bench.common import Report, add_report_arguments, non_negative_int, positive_int
from scripts.harness import running_server
from scripts.tools.random_weights import write_random_weights

PHASES = ("examples", "coverage", "fuzzing", "stateful")
# A request can fit the schema and still be refused for what no JSON schema says (a voice that does not
# exist): a documented 400 in the error shape, which the other checks verify.
EXCLUDED_CHECKS = ("positive_data_acceptance",)
SERVER_LOG = Path(tempfile.gettempdir()) / "fuzz-api-server.log"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="a running server (default: start the tone server)")
    parser.add_argument(
        "--max-examples", type=positive_int, default=200, help="cases per operation and phase"
    )
    parser.add_argument(
        "--max-input-chars", type=positive_int, default=300, help="the started server's limit"
    )
    parser.add_argument("--workers", type=positive_int, default=1, help="schemathesis's concurrent workers")
    parser.add_argument("--seed", type=int, default=0, help="schemathesis's random seed")
    parser.add_argument("--min-cases", type=non_negative_int, default=5000, help="fail below this many cases")
    add_report_arguments(parser)
    parser.add_argument("extra", nargs="*", help="after --: more `schemathesis run` options")
    parser.set_defaults(benchmark="fuzz_api")
    args = parser.parse_args(argv)
    # What follows `--` may hold a key (-H "Authorization: ..."): neither the command nor the args keep it.
    shown = list(argv)[: list(argv).index("--")] if "--" in argv else list(argv)
    args.command_line = shlex.join(["python", "-m", "scripts.tools.fuzz_api", *shown])
    return args


def checks() -> list[str]:
    """The checks `--checks all` runs but the excluded ones, by name."""
    return [check.__name__ for check in CHECKS.get_all() if check.__name__ not in EXCLUDED_CHECKS]


@contextmanager
def tone_server(max_input_chars: int) -> Iterator[str]:
    """The tone server's URL while it runs, its weights, jobs and voices in a folder of its own."""
    with tempfile.TemporaryDirectory(prefix="fuzz-api-") as folder:
        root = Path(folder)
        settings = {
            "KOKORO_DATA_DIR": str(root / "data"),
            "KOKORO_CUSTOM_VOICES_DIR": str(root / "voices"),
            "KOKORO_MAX_INPUT_CHARS": str(max_input_chars),
        }
        weights = write_random_weights(root / "weights")
        with running_server(weights, SERVER_LOG, module="tests.tone_server", **settings) as server:
            yield server.url


def schemathesis_command(url: str, args: argparse.Namespace, report_dir: Path) -> list[str]:
    return [
        sys.executable, "-m", "schemathesis.cli", "run", f"{url}/openapi.json", "--url", url,
        "--phases", ",".join(PHASES), "--checks", "all", "--exclude-checks", ",".join(EXCLUDED_CHECKS),
        "--max-examples", str(args.max_examples), "--seed", str(args.seed), "--workers", str(args.workers),
        "--report", "json,ndjson", "--report-dir", str(report_dir), "--no-color", *args.extra,
    ]  # fmt: skip


def declared_links(document: dict[str, Any]) -> list[str]:
    """Each link in the document as schemathesis names the transition: `SOURCE -> [STATUS] NAME -> TARGET`."""
    targets = {
        operation["operationId"]: f"{method.upper()} {path}"
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
    }
    return sorted(
        f"{method.upper()} {path} -> [{status}] {name} -> {targets[link['operationId']]}"
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
        for status, response in operation.get("responses", {}).items()
        for name, link in response.get("links", {}).items()
    )


def followed_links(events: Path) -> tuple[set[str], set[str]]:
    """The transitions the stateful phase took, from the document's links and from those it inferred."""
    declared: set[str] = set()
    inferred: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            transition = node.get("transition")
            if isinstance(transition, dict) and "id" in transition:
                (inferred if transition.get("is_inferred") else declared).add(transition["id"])
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    for line in events.read_text(encoding="utf-8").splitlines():
        visit(json.loads(line))
    return declared, inferred


def fuzz(url: str, args: argparse.Namespace) -> dict[str, Any]:
    document = httpx.get(f"{url}/openapi.json", timeout=30).json()
    with tempfile.TemporaryDirectory(prefix="fuzz-api-report-") as folder:
        report_dir = Path(folder)
        # schemathesis's own output goes to stderr: stdout may carry this script's report.
        returncode = subprocess.call(schemathesis_command(url, args, report_dir), stdout=sys.stderr)
        run = json.loads(next(report_dir.glob("json-*.json")).read_text(encoding="utf-8"))
        declared, inferred = followed_links(next(report_dir.glob("ndjson-*.ndjson")))
    return summary(run, returncode, declared_links(document), declared, inferred, args.min_cases)


def summary(
    run: dict[str, Any],
    returncode: int,
    links: list[str],
    declared: set[str],
    inferred: set[str],
    min_cases: int,
) -> dict[str, Any]:
    cases = run["test_cases"]
    passed = returncode == 0 and not run["failures"] and not run["errors"] and cases["generated"] >= min_cases
    return {
        "passed": passed,
        "cases": cases["generated"],
        "cases_with_failures": cases["with_failures"],
        "failures": run["failures"],
        "errors": run["errors"],
        "seconds": round(run["running_time"], 1),
        "schemathesis_version": run["schemathesis_version"],
        "checks": checks(),
        "excluded_checks": list(EXCLUDED_CHECKS),
        "phases": {name: phase["status"] for name, phase in run["phases"].items()},
        "operations": {key: run["operations"][key] for key in ("total", "tested", "errored", "skipped")},
        "links": {
            "declared": len(links),
            "followed": sorted(declared),
            "not_followed": sorted(set(links) - declared),
            "inferred_followed": len(inferred),
        },
        "warnings": {name: found for name, found in run["warnings"].items() if found},
        "seed": run["seed"],
        "exit_code": returncode,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    report = Report(args, leave_out={"extra"})
    if args.url:
        results = fuzz(args.url.rstrip("/"), args)
    else:
        with tone_server(args.max_input_chars) as url:
            results = fuzz(url, args)
    report.write({"server": args.url or "tests.tone_server", **results})
    return 0 if results["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
