"""Build and install AVSG: the Python package in python/avsg plus the op library built by CMake.

    pip install torch==2.13.0
    pip install --no-build-isolation -e .

The op library is compiled against the torch already installed (hence --no-build-isolation).
"""
import os
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        import torch

        out_path = os.path.abspath(self.get_ext_fullpath(ext.name))
        out_dir = os.path.dirname(out_path)
        os.makedirs(out_dir, exist_ok=True)
        build_dir = os.path.abspath(os.path.join(self.build_temp, "cmake"))
        os.makedirs(build_dir, exist_ok=True)
        source_dir = os.path.dirname(os.path.abspath(__file__))
        config = [
            "cmake", source_dir,
            f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}",
            f"-DAVSG_OUTPUT_NAME={os.path.basename(out_path)}",
            f"-DPython3_EXECUTABLE={sys.executable}",
            "-DCMAKE_BUILD_TYPE=Release",
        ]
        # the fast CPU emulation's -march (CMakeLists.txt), passed every time: the build tree's
        # cache must not keep an earlier build's choice
        config.append(f"-DAVSG_FAST_ARCH={os.environ.get('AVSG_FAST_ARCH') or 'auto'}")
        subprocess.check_call(config, cwd=build_dir)
        jobs = str(os.cpu_count() or 2)
        subprocess.check_call(["cmake", "--build", build_dir, "-j", jobs], cwd=build_dir)


setup(
    name="avsg",
    version="0.1.0",
    description="Miss-only KV-cache offload operators for DeepSeek Sparse Attention on Ascend NPUs",
    package_dir={"": "python"},
    packages=find_packages("python"),
    package_data={"avsg.lab.costmodel": ["profiles/*.json"],
                  "avsg.lab.traces": ["data/*.npz", "data/*.avtrace"]},
    ext_modules=[CMakeExtension("avsg._C")],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.9",
    install_requires=["numpy", "tqdm"],
    extras_require={
        "test": ["pytest", "hypothesis"],
        "plot": ["matplotlib"],
    },
    entry_points={
        "console_scripts": ["avsg = avsg.cli:main"],
        # active only with AVSG_VLLM_ASCEND=1 (docs/vllm-ascend.md)
        "vllm.general_plugins": [
            "avsg_sparse_kv_offload = avsg.integrations.vllm_ascend_plugin:register"],
    },
)
