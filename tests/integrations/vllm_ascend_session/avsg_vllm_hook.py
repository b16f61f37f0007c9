"""pytest plugin for the vllm-ascend session (run in a subprocess by tests/integrations/
test_vllm_ascend.py): a torchvision stand-in, then, once vllm-ascend's own conftest has stubbed
torch_npu, vLLM's general plugins are loaded, which with AVSG_VLLM_ASCEND=1 installs AVSG."""
import enum
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


class _Stub(types.ModuleType):
    """Any attribute is a do-nothing class: vLLM and transformers only name torchvision's
    transforms at import time on this path (the image processors are never run)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name == "InterpolationMode":
            return InterpolationMode
        return type(name, (), {"__init__": lambda self, *a, **k: None})


class _TorchvisionStandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Stub(spec.name)
        module.__path__ = []
        module.__version__ = "0.28.0"
        return module

    def exec_module(self, module):
        pass


if importlib.util.find_spec("torchvision") is None:
    sys.meta_path.insert(0, _TorchvisionStandIn())


def pytest_collection_finish(session):
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    if os.environ.get("AVSG_VLLM_ASCEND") == "1":
        from vllm_ascend.distributed.kv_transfer.sparse_kv_offload import \
            sparse_kv_offload_manager as vam
        if not hasattr(vam.SparseKVOffloadManager, "begin_step"):
            raise RuntimeError("the avsg vllm.general_plugins entry point did not install")
