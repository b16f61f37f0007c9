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


SWITCH_OFF = {}      # what vLLM's plugin loading left in vllm-ascend with the switch off


def pytest_collection_finish(session):
    """Load vLLM's general plugins twice: first with AVSG_VLLM_ASCEND unset (nothing may
    change), then as asked (with =1 the plugin installs)."""
    import vllm.plugins as plugins
    from vllm_ascend.attention import sfa_kv_offload
    from vllm_ascend.distributed.kv_transfer.sparse_kv_offload import \
        sparse_kv_offload_manager as vam

    before = (vam.SparseKVOffloadManager, vam.update_sparse_kv_offload_metadata,
              sfa_kv_offload.AscendSFAKVOffloadImpl.__dict__["_resident_views"])
    asked = os.environ.pop("AVSG_VLLM_ASCEND", None)
    plugins.plugins_loaded = False
    plugins.load_general_plugins()
    after = (vam.SparseKVOffloadManager, vam.update_sparse_kv_offload_metadata,
             sfa_kv_offload.AscendSFAKVOffloadImpl.__dict__["_resident_views"])
    SWITCH_OFF.update(untouched=all(a is b for a, b in zip(before, after)),
                      entry_point_called="avsg.integrations.vllm_ascend_plugin" in sys.modules,
                      no_original_saved=not hasattr(vam, "_ORIGINAL_SPARSE_KV_OFFLOAD_MANAGER"))
    if asked is not None:
        os.environ["AVSG_VLLM_ASCEND"] = asked
    plugins.plugins_loaded = False
    plugins.load_general_plugins()
    if asked == "1" and not hasattr(vam.SparseKVOffloadManager, "begin_step"):
        raise RuntimeError("the avsg vllm.general_plugins entry point did not install")
