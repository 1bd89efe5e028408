"""Execution providers, as onnxruntime's callers name them: nnrun has one, the CPU.

A caller written for onnxruntime asks for providers by name, often a GPU first
(`["CUDAExecutionProvider", "CPUExecutionProvider"]`), as strings or (name, options) tuples.
onnxruntime warns about a provider it does not have and runs on the CPU; nnrun does the same.
"""

import collections.abc
import warnings

CPU = "CPUExecutionProvider"
AVAILABLE = (CPU,)
# Every provider name onnxruntime knows, so a caller that checks a name against it finds it.
ALL = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "MIGraphXExecutionProvider",
       "OpenVINOExecutionProvider", "DnnlExecutionProvider", "VitisAIExecutionProvider", "QNNExecutionProvider",
       "NnapiExecutionProvider", "VSINPUExecutionProvider", "JsExecutionProvider", "CoreMLExecutionProvider",
       "DmlExecutionProvider", "RknpuExecutionProvider", "WebNNExecutionProvider", "WebGpuExecutionProvider",
       "XnnpackExecutionProvider", "CANNExecutionProvider", "AzureExecutionProvider", CPU)


def requested(providers, provider_options=None):
    """The provider names asked for. As onnxruntime: a warning for each one nnrun does not have, and
    for malformed arguments (onnxruntime prints its error and falls back); the run uses the CPU."""
    if providers is None:
        return []
    problem = _malformed(providers, provider_options)
    if problem:
        warnings.warn(f"{problem}; falling back to {AVAILABLE}", stacklevel=3)
        return [CPU]
    names = [p[0] if isinstance(p, tuple) else p for p in providers]
    for name in names:
        if name not in AVAILABLE:
            warnings.warn(f"Specified provider '{name}' is not in available provider names. "
                          f"Available providers: '{', '.join(AVAILABLE)}'", stacklevel=3)
    return names


def _malformed(providers, provider_options):
    """What is wrong with the arguments, as onnxruntime words it, or None."""
    if isinstance(providers, str) or not isinstance(providers, collections.abc.Sequence):
        return "'providers' should be a sequence"
    if provider_options is not None:
        if not isinstance(provider_options, collections.abc.Sequence) or len(provider_options) != len(providers):
            return "'providers' and 'provider_options' should be the same length if both are given"
        if not all(isinstance(p, str) for p in providers) or \
                not all(isinstance(o, dict) for o in provider_options):
            return "with 'provider_options', 'providers' are names and the options dicts"
        return None
    for p in providers:
        if not (isinstance(p, str) or (isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str)
                                       and isinstance(p[1], dict))):
            return "'providers' values must be either strings or (string, dict) tuples"
    return None
