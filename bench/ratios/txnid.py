"""TxnID allocation: native vs twin, in one run."""

from __future__ import annotations

from pulsartxn._native import load

from ._harness import Row, best_time


def measure(quick: bool = False) -> list[Row]:
    native, twin = load("native"), load("reference")
    n = 1_000_000
    twin_n = 20_000 if quick else 200_000
    rows = []
    na = native.TxnIdAllocator(1)
    ta = twin.TxnIdAllocator(1)
    native_s = best_time(lambda: na.allocate(n))
    twin_s = best_time(lambda: ta.allocate(twin_n), repeat=3) * (n / twin_n)
    rows.append(Row("TxnIdAllocator.allocate, 1M ids", n, "ids", native_s, twin_s, "twin", 20))
    k = 10_000
    native_s = best_time(lambda: [na.next() for _ in range(k)])
    twin_s = best_time(lambda: [ta.next() for _ in range(k)], repeat=3)
    rows.append(
        Row("TxnIdAllocator.next, one id per call", k, "ids", native_s, twin_s, "twin", None)
    )
    tn = [native.TxnID(3, i) for i in range(k)]
    tt = [twin.TxnID(3, i) for i in range(k)]
    native_s = best_time(lambda: [native.TxnID.unpack(t.pack()) for t in tn])
    twin_s = best_time(lambda: [twin.TxnID.unpack(t.pack()) for t in tt], repeat=3)
    rows.append(Row("TxnID pack + unpack", k, "ids", native_s, twin_s, "twin", None))
    return rows
