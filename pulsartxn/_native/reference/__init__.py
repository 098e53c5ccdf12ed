"""Pure-Python twins of the native modules: same names, same results, no compiler needed.

They are the executable specification the property tests compare the native core against,
and the baseline the benchmarks report the native speed-up over.
"""
