"""Write runtime/loader/onnx_schema_table.py: what MODEL_LOAD's checks need of ONNX's operator
schemas, as a plain table.

onnx's own registry (`onnx.defs.get_schema`) builds every schema of every domain on its first
use: about 10 ms and 7.5 MB of a process that only loads a model. The checks need four counts
and the attribute types of the ops of ai.onnx and ai.onnx.ml, which this writes from that
registry once, with the onnx release it came from. Run it again when the pinned onnx moves:

    python -m nnrun_tools.onnx_schema_table

tests/loader/test_onnx_checks.py checks the table against the installed onnx.
"""

import os
import pprint

import onnx
from onnx import defs

DOMAINS = ("", "ai.onnx.ml")
TARGET = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runtime", "loader",
                      "onnx_schema_table.py")


def table():
    """{(domain, op): ((since, min_in, max_in, min_out, max_out, ((attribute, type code), ...)), ...)},
    versions in ascending order; and {domain: newest opset}."""
    found = {}
    for s in defs.get_all_schemas_with_history():
        if s.domain not in DOMAINS:
            continue
        attributes = tuple(sorted((name, int(a.type)) for name, a in s.attributes.items()))
        found.setdefault((s.domain, s.name), []).append(
            (s.since_version, s.min_input, s.max_input, s.min_output, s.max_output, attributes))
    schemas = {key: tuple(sorted(versions)) for key, versions in sorted(found.items())}
    newest = {domain: max(v[0] for (d, _), versions in schemas.items() if d == domain for v in versions)
              for domain in DOMAINS}
    newest[""] = defs.onnx_opset_version()
    return schemas, newest


def source():
    schemas, newest = table()
    return (f'"""ONNX operator schemas as MODEL_LOAD checks them: written by\n'
            f'`python -m nnrun_tools.onnx_schema_table` from onnx {onnx.__version__}; do not edit.\n'
            f'(domain, op) -> versions, each (since, min inputs, max inputs, min outputs, max outputs,\n'
            f'((attribute, onnx.AttributeProto type), ...))."""\n\n'
            f"IR_VERSION = {onnx.IR_VERSION}\n\n"
            f"NEWEST_OPSET = {pprint.pformat(newest)}\n\n"
            f"SCHEMAS = {pprint.pformat(schemas, width=120, compact=True)}\n")


def main():
    with open(TARGET, "w") as f:
        f.write(source())
    print(f"wrote {TARGET}")


if __name__ == "__main__":
    main()
