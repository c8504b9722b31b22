"""Builds microllm._microllm with CMake for `pip install .` (pyproject.toml has the package's metadata).

The library is built static (BUILD_SHARED_LIBS=OFF) and linked into the extension, so the wheel holds one
self-contained module. MICROLLM_CUDA=1 in the environment builds the CUDA backend too (nvcc must be on PATH or at
/usr/local/cuda/bin/nvcc); CMAKE_BUILD_PARALLEL_LEVEL sets the build's jobs.
"""
import os
import pathlib
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = pathlib.Path(self.build_temp).resolve() / "cmake"
        cuda = os.environ.get("MICROLLM_CUDA", "0") not in ("", "0", "OFF", "off")
        configure = ["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                     "-DBUILD_SHARED_LIBS=OFF", "-DMICROLLM_BUILD_TESTS=OFF", "-DMICROLLM_BUILD_BENCHMARKS=OFF",
                     "-DMICROLLM_BUILD_APPS=OFF", f"-DPython3_EXECUTABLE={sys.executable}",
                     f"-DMICROLLM_CUDA={'ON' if cuda else 'OFF'}"]
        if shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        if cuda and not shutil.which("nvcc") and pathlib.Path("/usr/local/cuda/bin/nvcc").exists():
            configure.append("-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc")
        subprocess.run(configure, check=True)
        subprocess.run(["cmake", "--build", str(build), "--target", "microllm_python"], check=True)
        built = next((build / "python" / "microllm").glob("_microllm*.so"))
        target = pathlib.Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, target)


setup(ext_modules=[Extension("microllm._microllm", sources=[])], cmdclass={"build_ext": CMakeBuild})
