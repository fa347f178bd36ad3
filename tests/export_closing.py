"""The tables every nsys Arrow export holds, for tests that write small exports of their own."""
from __future__ import annotations

import pyarrow as pa


def closing_tables(pid: int = 4242) -> dict[str, pa.Table]:
    """EXPORT_META_DATA and PROCESSES (which nsys writes last): without them an Arrow export reads as cut short."""
    return {
        "EXPORT_META_DATA": pa.table({"name": pa.array([b"EXPORT_PRODUCT_VERSION"], pa.binary()),
                                      "value": pa.array([b"2022.4.2.1"], pa.binary())}),
        "PROCESSES": pa.table({"globalPid": pa.array([pid << 24], pa.uint64()), "pid": pa.array([pid], pa.uint64()),
                               "name": pa.array([b"python"], pa.binary())}),
    }
