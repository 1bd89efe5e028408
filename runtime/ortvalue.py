"""OrtValue and I/O binding, on the CPU: onnxruntime's way to hand a session arrays it keeps.

An `OrtValue` holds a numpy array without copying it (as onnxruntime does for CPU memory): the
caller's array is the value. An `IOBinding` names a session's feeds and where its outputs go; an
output bound to an OrtValue or to a caller's buffer is written there by the run, with no copy
when the plan writes that output straight from its kernel (the usual case), and copied into it
otherwise.
"""

import ctypes

import numpy as np

from .errors import InputError, UnsupportedFeatureError
from .onnx_types import element_type, numpy_dtype, type_name


def _check_cpu(device_type):
    if str(device_type).lower() != "cpu":
        raise UnsupportedFeatureError(f"nnrun runs on the CPU only; device {device_type!r} is not available")


def _from_address(address, element, shape):
    """The caller's memory at `address` as an array of `shape` (onnxruntime's raw buffer binding)."""
    dtype = numpy_dtype(element)
    count = int(np.prod(shape, dtype=np.int64))
    buffer = (ctypes.c_char * (count * dtype.itemsize)).from_address(address)
    return np.frombuffer(buffer, dtype, count).reshape(shape)


class OrtValue:
    """A tensor for a session: a numpy array, kept as it is (not copied)."""

    __slots__ = ("_array",)

    def __init__(self, array):
        self._array = array

    @classmethod
    def ortvalue_from_numpy(cls, numpy_obj, /, device_type="cpu", device_id=0, vendor_id=-1):
        _check_cpu(device_type)
        if not isinstance(numpy_obj, np.ndarray):
            raise InputError(f"an OrtValue is made from a numpy array, not {type(numpy_obj).__name__}")
        return cls(numpy_obj if numpy_obj.flags.c_contiguous else np.ascontiguousarray(numpy_obj))

    @classmethod
    def ortvalue_from_numpy_with_onnx_type(cls, data, /, onnx_element_type):
        dtype = numpy_dtype(onnx_element_type)
        if data.dtype.itemsize != dtype.itemsize:
            raise InputError(f"an array of {data.dtype} cannot be viewed as {type_name(dtype)}")
        return cls(np.ascontiguousarray(data).view(dtype))

    @classmethod
    def ortvalue_from_shape_and_type(cls, shape, element_type=np.float32, device_type="cpu", device_id=0,
                                     vendor_id=-1):
        _check_cpu(device_type)
        return cls(np.empty(tuple(shape), numpy_dtype(element_type)))

    def numpy(self):
        return self._array

    def shape(self):
        return list(self._array.shape)

    def data_type(self):
        return type_name(self._array.dtype)

    def element_type(self):
        return element_type(self._array.dtype)

    def device_name(self):
        return "cpu"

    def data_ptr(self):
        return self._array.ctypes.data

    def tensor_size_in_bytes(self):
        return self._array.nbytes

    def has_value(self):
        return True

    def is_tensor(self):
        return True

    def is_sparse_tensor(self):
        return False

    def is_tensor_sequence(self):
        return False

    def update_inplace(self, data):
        np.copyto(self._array, np.asarray(data).reshape(self._array.shape), casting="no")

    def __repr__(self):
        return f"OrtValue({self.data_type()}, shape={self.shape()})"


class IOBinding:
    """A session's feeds and output destinations for `run_with_iobinding`."""

    def __init__(self, session):
        self._session = session
        self._inputs = {}  # name -> array
        self._outputs = {}  # name -> array the run writes into, or None: a fresh array
        self._results = None  # OrtValues of the last run

    def bind_cpu_input(self, name, arr_on_cpu):
        self._inputs[name] = arr_on_cpu

    def bind_input(self, name, device_type, device_id, element_type, shape, buffer_ptr):
        _check_cpu(device_type)
        self._inputs[name] = _from_address(buffer_ptr, element_type, tuple(shape))

    def bind_ortvalue_input(self, name, ortvalue):
        self._inputs[name] = ortvalue.numpy()

    def bind_output(self, name, device_type="cpu", device_id=0, element_type=None, shape=None, buffer_ptr=None):
        _check_cpu(device_type)
        if buffer_ptr is None:
            self._outputs[name] = None
            return
        if element_type is None or shape is None:
            raise InputError("`element_type` and `shape` are to be provided if pre-allocated memory is provided")
        self._outputs[name] = _from_address(buffer_ptr, element_type, tuple(shape))

    def bind_ortvalue_output(self, name, ortvalue):
        self._outputs[name] = ortvalue.numpy()

    def synchronize_inputs(self):
        pass  # CPU memory: nothing to wait for

    def synchronize_outputs(self):
        pass

    def clear_binding_inputs(self):
        self._inputs.clear()

    def clear_binding_outputs(self):
        self._outputs.clear()

    def get_outputs(self):
        """The OrtValues of the last run's bound outputs, in the order they were bound."""
        if self._results is None:
            raise InputError("no run with this binding yet: call run_with_iobinding first")
        return self._results

    def copy_outputs_to_cpu(self):
        return [value.numpy().copy() for value in self.get_outputs()]

    def run(self, run_options=None):
        """Run the session on the bound inputs, writing the bound outputs (the session calls this)."""
        names = list(self._outputs)
        if not names:
            raise InputError("no output is bound: bind_output or bind_ortvalue_output first")
        into = {name: array for name, array in self._outputs.items() if array is not None}
        arrays = self._session._run(names, self._inputs, run_options, into)
        self._results = [OrtValue(a) for a in arrays]
