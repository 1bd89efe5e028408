"""nnrun as an ONNX backend, so `onnx.backend.test.BackendTest` runs against it."""

import numpy as np
import onnx.backend.base as base

from .session import InferenceSession, SessionOptions


class NnrunRep(base.BackendRep):
    def __init__(self, session):
        self.session = session

    def run(self, inputs, **kwargs):
        names = [i.name for i in self.session.get_inputs()]
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            feeds = dict(zip(names, inputs))
        return self.session.run(None, feeds)


class NnrunBackend(base.Backend):
    @classmethod
    def is_compatible(cls, model, device="CPU", **kwargs):
        return device == "CPU"

    @classmethod
    def prepare(cls, model, device="CPU", **kwargs):
        super().prepare(model, device, **kwargs)
        options = SessionOptions()
        options.enable_mem_poll = False
        data = model if isinstance(model, (bytes, str)) else model.SerializeToString()
        return NnrunRep(InferenceSession(data, sess_options=options))

    @classmethod
    def run_model(cls, model, inputs, device="CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs, **kwargs)

    @classmethod
    def run_node(cls, node, inputs, device="CPU", outputs_info=None, **kwargs):
        raise NotImplementedError("nnrun runs whole models; use run_model")

    @classmethod
    def supports_device(cls, device):
        return device == "CPU"


prepare = NnrunBackend.prepare
run_model = NnrunBackend.run_model
run_node = NnrunBackend.run_node
supports_device = NnrunBackend.supports_device
