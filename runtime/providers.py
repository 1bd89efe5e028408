"""Execution providers, as onnxruntime's callers name them: nnrun has one, the CPU.

A caller written for onnxruntime asks for providers by name, often a GPU first
(`["CUDAExecutionProvider", "CPUExecutionProvider"]`), as strings or (name, options) tuples.
onnxruntime warns about a provider it does not have and runs on the CPU; nnrun does the same.
"""

import collections.abc
import warnings

from .errors import InputError

CPU = "CPUExecutionProvider"
AVAILABLE = (CPU,)
# Every provider name onnxruntime knows, so a caller that checks a name against it finds it.
ALL = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "MIGraphXExecutionProvider",
       "OpenVINOExecutionProvider", "DnnlExecutionProvider", "VitisAIExecutionProvider", "QNNExecutionProvider",
       "NnapiExecutionProvider", "VSINPUExecutionProvider", "JsExecutionProvider", "CoreMLExecutionProvider",
       "DmlExecutionProvider", "RknpuExecutionProvider", "WebNNExecutionProvider", "WebGpuExecutionProvider",
       "XnnpackExecutionProvider", "CANNExecutionProvider", "AzureExecutionProvider", CPU)


def requested(providers, provider_options=None):
    """The provider names asked for, checked as onnxruntime checks them; a warning for each one nnrun
    does not have (the run uses the CPU). Malformed arguments are an InputError."""
    if providers is None:
        return []
    if isinstance(providers, str) or not isinstance(providers, collections.abc.Sequence):
        raise InputError("'providers' should be a sequence of names or (name, options dict) tuples")
    if provider_options is not None:
        if not isinstance(provider_options, collections.abc.Sequence) or len(provider_options) != len(providers):
            raise InputError("'providers' and 'provider_options' should be sequences of the same length")
        if not all(isinstance(p, str) for p in providers) or \
                not all(isinstance(o, dict) for o in provider_options):
            raise InputError("with 'provider_options', 'providers' are names and the options dicts")
    names = []
    for provider in providers:
        if isinstance(provider, tuple) and len(provider) == 2 and isinstance(provider[0], str) \
                and isinstance(provider[1], dict):
            provider = provider[0]
        elif not isinstance(provider, str):
            raise InputError("'providers' values must be either strings or (string, dict) tuples")
        if provider not in AVAILABLE:
            warnings.warn(f"Specified provider '{provider}' is not in available provider names. "
                          f"Available providers: '{', '.join(AVAILABLE)}'", stacklevel=3)
        names.append(provider)
    return names
