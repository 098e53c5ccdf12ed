"""Build the Cython extensions of pulsartxn._native.

Release builds are optimised (-O3, or ``PULSARTXN_OPT``; NDEBUG, no Cython bounds checks where
the code turns them off) and their extensions stripped of symbol tables. ``PULSARTXN_DEBUG=1``
at build time turns on line tracing, C asserts and AddressSanitizer/UBSan (and keeps the
symbols) so that a crash in the native layer can be chased without editing code.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

DEBUG = os.environ.get("PULSARTXN_DEBUG") == "1"
# A release build's optimisation (default -O3); -O0 builds in a third of the time.
OPT = os.environ.get("PULSARTXN_OPT", "-O3")
if OPT not in ("-O0", "-O1", "-O2", "-O3", "-Os"):
    raise SystemExit(f"PULSARTXN_OPT must be one of -O0, -O1, -O2, -O3, -Os, not {OPT!r}")

# One shared list of C sources, compiled into every extension that needs them.
C_SOURCES = sorted(glob.glob("csrc/*.c"))

if sys.platform == "win32":
    compile_args = ["/O2"]
    link_args: list[str] = []
elif DEBUG:
    compile_args = [
        "-O1",
        "-g",
        "-UNDEBUG",
        "-fsanitize=address,undefined",
        "-fno-omit-frame-pointer",
    ]
    link_args = ["-fsanitize=address,undefined"]
else:
    compile_args = [OPT, "-DNDEBUG", "-fno-strict-aliasing"]
    link_args = ["-s"] if sys.platform.startswith("linux") else []

macros = [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")]
if DEBUG:
    macros.append(("CYTHON_TRACE_NOGIL", "1"))

extensions = []
for pyx in sorted(glob.glob("pulsartxn/_native/*.pyx")):
    name = pyx[:-4].replace("/", ".").replace(os.sep, ".")
    extensions.append(
        Extension(
            name,
            [pyx, *C_SOURCES],
            include_dirs=["csrc/include", numpy.get_include()],
            define_macros=macros,
            extra_compile_args=compile_args,
            extra_link_args=link_args,
        )
    )


class StrippedBuildExt(build_ext):
    """Release builds ship stripped extensions, even when an up-to-date one (linked before
    `-s`, or by another toolchain) is reused rather than linked again."""

    def initialize_options(self) -> None:
        super().initialize_options()
        self.parallel = os.cpu_count() or 1  # the extensions compile side by side

    def build_extension(self, ext: Extension) -> None:
        super().build_extension(ext)
        strip = shutil.which("strip")
        if DEBUG or strip is None or sys.platform == "win32":
            return
        flag = "-x" if sys.platform == "darwin" else "--strip-unneeded"
        subprocess.run([strip, flag, self.get_ext_fullpath(ext.name)], check=True)


directives = {
    "language_level": "3",
    "embedsignature": True,
    "cdivision": True,
    "initializedcheck": False,
}
if DEBUG:
    directives.update({"linetrace": True, "boundscheck": True, "wraparound": True})

setup(
    cmdclass={"build_ext": StrippedBuildExt},
    ext_modules=cythonize(
        extensions,
        compiler_directives=directives,
        include_path=["pulsartxn/_native"],
        annotate=DEBUG,
        nthreads=os.cpu_count() or 1,  # the modules are translated side by side too
    ),
)
