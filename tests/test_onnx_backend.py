"""onnx's backend node suite through nnrun.backend.

Every node case runs except those listed, each with its reason, in
backend_excluded.txt; their number never falls below backend_floor.txt.
Regenerate both with `python -m nnrun_tools.conformance --update`.
"""

from nnrun_tools.conformance import node_cases, read_excluded, read_floor

_case_class, _names = node_cases()
_excluded = read_excluded()
for _name in _names:
    if _name in _excluded:
        delattr(_case_class, _name)

OnnxBackendNodeModelTest = _case_class
del _case_class  # a TestCase under a second name would be collected twice


def test_the_passing_cases_never_fall_below_the_floor():
    running = [n for n in _names if n not in _excluded]
    assert len(running) >= read_floor(), (len(running), read_floor())
    assert all(reason for reason in _excluded.values()), "every exclusion needs a reason"
