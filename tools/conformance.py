"""onnx's backend node suite against nnrun: the count, the floor and the list of exclusions.

    python -m nnrun_tools.conformance            # run every node case, print the tally by reason
    python -m nnrun_tools.conformance --update   # rewrite tests/backend_excluded.txt and raise the floor

The exclusion file lists every node case nnrun does not pass, one a line with the
reason it fails; tests/test_onnx_backend.py runs all the others, and checks that
their number never falls below the floor in tests/backend_floor.txt.
"""

import argparse
import collections
import re
import sys
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXCLUDED = REPO / "tests" / "backend_excluded.txt"
FLOOR = REPO / "tests" / "backend_floor.txt"


def node_cases():
    """{case name: unittest method} of onnx's backend node suite, run through nnrun.backend."""
    import onnx.backend.test

    import nnrun.backend

    suite = onnx.backend.test.BackendTest(nnrun.backend, "nnrun_conformance")
    case_class = suite.test_cases["OnnxBackendNodeModelTest"]
    # Each case comes once per device; nnrun runs on the CPU.
    for name in [n for n in dir(case_class) if n.startswith("test_") and not n.endswith("_cpu")]:
        delattr(case_class, name)
    return case_class, sorted(n for n in dir(case_class) if n.startswith("test_"))


def read_excluded(path=EXCLUDED):
    """{case name: reason} from the exclusion file."""
    excluded = {}
    if path.exists():
        for line in path.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                name, _, reason = line.partition(" ")
                excluded[name] = reason.strip().lstrip("#").strip()
    return excluded


def read_floor(path=FLOOR):
    return int(path.read_text().split()[0]) if path.exists() else 0


def run_all():
    """{case name: None if it passes, else the reason}."""
    import warnings

    case_class, names = node_cases()
    results = {}
    for name in names:
        case = case_class(name)
        outcome = unittest.TestResult()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            case.run(outcome)
        problems = outcome.failures + outcome.errors
        if outcome.skipped:
            results[name] = "skipped by onnx: " + outcome.skipped[0][1][:100]
        elif problems:
            results[name] = _reason_from_traceback(problems[0][1])
        else:
            results[name] = None
    return results


def _reason_from_traceback(text):
    lines = [line for line in text.strip().splitlines() if line.strip()]
    last = lines[-1]
    found = re.search(r"unsupported operators: (.*)", last)
    if found:
        return "unsupported operator " + re.sub(r" \(opset \d+\)", "", found.group(1))
    if last.startswith("AssertionError") or "Mismatch" in text or "Not equal" in text:
        return "output differs from the expected values"
    last = re.sub(r"node \d+ '[^']*' ", "node ", last)
    last = re.sub(r"node \d+ ", "node ", last)
    last = re.sub(r"^[\w.]+\.(\w+Error)", r"\1", last)
    return last[:150]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m nnrun_tools.conformance", description=__doc__)
    parser.add_argument("--update", action="store_true",
                        help="rewrite the exclusion file and raise the floor to the passing count")
    args = parser.parse_args(argv)
    results = run_all()
    passing = sorted(n for n, r in results.items() if r is None)
    failing = {n: r for n, r in results.items() if r is not None}
    tally = collections.Counter(failing.values())
    for reason, count in tally.most_common():
        print(f"{count:5d}  {reason}")
    floor = read_floor()
    print(f"{len(passing)} of {len(results)} node cases pass (floor {floor})")
    if args.update:
        if len(passing) < floor:
            print(f"not updating: {len(passing)} passing is below the floor {floor}", file=sys.stderr)
            return 1
        lines = ["# onnx backend node cases nnrun does not pass, each with the reason.",
                 "# Regenerate with: python -m nnrun_tools.conformance --update"]
        lines += [f"{name} {reason}" for name, reason in sorted(failing.items())]
        EXCLUDED.write_text("\n".join(lines) + "\n")
        FLOOR.write_text(f"{len(passing)}\n")
        print(f"wrote {EXCLUDED.relative_to(REPO)} ({len(failing)} cases) and floor {len(passing)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
