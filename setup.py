"""Build the Cython extensions of pulsartxn._native.

Release builds are optimised (-O3, NDEBUG, no Cython bounds checks where the code turns them
off). ``PULSARTXN_DEBUG=1`` at build time turns on line tracing, C asserts and
AddressSanitizer/UBSan so that a crash in the native layer can be chased without editing code.
"""

from __future__ import annotations

import glob
import os
import sys

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("PULSARTXN_DEBUG") == "1"

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
    compile_args = ["-O3", "-DNDEBUG", "-fno-strict-aliasing"]
    link_args = []

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

directives = {
    "language_level": "3",
    "embedsignature": True,
    "cdivision": True,
    "initializedcheck": False,
}
if DEBUG:
    directives.update({"linetrace": True, "boundscheck": True, "wraparound": True})

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives=directives,
        include_path=["pulsartxn/_native"],
        annotate=DEBUG,
    ),
)
