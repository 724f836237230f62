"""Builds the native suffix-array extension `dpsynth._native` (sources in native/)."""
import glob

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

ext_modules = [
    Pybind11Extension(
        "dpsynth._native",
        sorted(glob.glob("native/*.cc")),
        include_dirs=["native"],
        cxx_std=17,
        extra_compile_args=["-O3", "-pthread"],
        extra_link_args=["-pthread"],
    ),
]

setup(ext_modules=ext_modules, cmdclass={"build_ext": build_ext})
