"""Straightforward pandas versions of two query-library computations, for the benchmark and for tests.

What an analyst would write with pandas for the same results as the SQL views, on the default
`itertrace` mapping (domain `itertrace`; `step` ranges numbered by their int64 payload; `forward` as
the device interval of an iteration on a run without GPU work; host phases schedule, prepare,
forward, sample, detokenize, postprocess):

- `gap_parts(ranges)`: the `host_gaps_parts` view (global_tid, iteration, phase, dur_ns);
- `log_latency(events, requests)`: the `request_latency_log` view's request_id, ttft_ns, tpot_ns,
  output_tokens.

The input DataFrames come from DuckDB with `.df()` (`load_*`), so that loading can be timed apart
from computing. The algorithms are the views' (the same problem, the same definitions), written with
boolean masks, merge, merge_asof and groupby: no Python loop over rows, and no hand tuning.
"""
from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd

DOMAIN = "itertrace"
STEP = "step"
DEVICE = "forward"
PHASES = ("schedule", "prepare", "forward", "sample", "detokenize", "postprocess")
OPEN_END = np.iinfo(np.int64).max  # the end of a range still open when the capture stopped


# --------------------------------------------------------------------------------------------------
# Loading


def load_ranges(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """The NVTX ranges, with the columns gap attribution reads."""
    return con.sql("""SELECT range_id, parent_range_id, range_kind, domain_name, text, global_tid,
                             start_ns, end_ns, int64_value
                      FROM nvtx_ranges""").df()


def load_events(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """The run log's events."""
    return con.sql("SELECT request_id, iteration, ts_ns, kind FROM run_events").df()


def load_requests(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """The run log's requests."""
    return con.sql("SELECT request_id, arrival_ns FROM run_requests").df()


# --------------------------------------------------------------------------------------------------
# Gap attribution


def iterations(ranges: pd.DataFrame) -> pd.DataFrame:
    """Per step range: global_tid, iteration, and its device interval (device_start_ns, device_end_ns).

    A `forward` range belongs to the step on its thread that started last at or before it, if that
    step also encloses its end; the device interval is the span of a step's forward ranges.
    """
    ours = ranges[ranges["domain_name"] == DOMAIN]
    steps = ours.loc[ours["text"] == STEP, ["range_id", "global_tid", "start_ns", "end_ns", "int64_value"]]
    steps = steps.rename(columns={"range_id": "step_id", "start_ns": "step_start_ns", "end_ns": "step_end_ns",
                                  "int64_value": "iteration"})
    device = ours.loc[(ours["text"] == DEVICE) & ours["end_ns"].notna(), ["global_tid", "start_ns", "end_ns"]]
    owned = pd.merge_asof(device.sort_values("start_ns"), steps.sort_values("step_start_ns"),
                          left_on="start_ns", right_on="step_start_ns", by="global_tid", direction="backward")
    owned = owned[owned["step_id"].notna() & (owned["end_ns"] <= owned["step_end_ns"].fillna(OPEN_END))]
    spans = owned.groupby("step_id").agg(device_start_ns=("start_ns", "min"), device_end_ns=("end_ns", "max"))
    return steps.merge(spans, left_on="step_id", right_index=True, how="left")


def gaps(iters: pd.DataFrame) -> pd.DataFrame:
    """Per iteration after the first on its thread (by device start): the gap before its device work.

    The gap runs from the latest device end so far on the thread to the iteration's device start;
    0 when device work overlapped.
    """
    dev = iters[iters["device_start_ns"].notna()]
    dev = dev.astype({"device_start_ns": "int64", "device_end_ns": "int64", "iteration": "int64"})
    dev = dev.sort_values(["global_tid", "device_start_ns", "iteration"])
    busy = dev.groupby("global_tid")["device_end_ns"].cummax()
    dev = dev.assign(busy_until_ns=busy.groupby(dev["global_tid"]).shift())
    dev = dev[dev["busy_until_ns"].notna()].astype({"busy_until_ns": "int64"})
    return pd.DataFrame({
        "global_tid": dev["global_tid"],
        "iteration": dev["iteration"],
        "gap_start_ns": np.minimum(dev["busy_until_ns"], dev["device_start_ns"]),
        "gap_end_ns": dev["device_start_ns"],
        "gap_ns": (dev["device_start_ns"] - dev["busy_until_ns"]).clip(lower=0),
    })


def leaves(ranges: pd.DataFrame, tids) -> pd.DataFrame:
    """The host-phase push/pop ranges on the given threads that hold no other phase range.

    Push/pop ranges nest, so the phase range that comes next on the thread (by start, longest
    first) lies inside this one exactly when it starts before this one ends.
    """
    phase = ranges[(ranges["range_kind"] == "push_pop") & (ranges["domain_name"] == DOMAIN)
                   & ranges["text"].isin(PHASES) & ranges["global_tid"].isin(tids)]
    phase = pd.DataFrame({"global_tid": phase["global_tid"], "start_ns": phase["start_ns"],
                          "end_ns": phase["end_ns"].fillna(OPEN_END).astype("int64"), "phase": phase["text"],
                          "range_id": phase["range_id"]})
    phase = phase.sort_values(["global_tid", "start_ns", "end_ns", "range_id"], ascending=[True, True, False, True])
    next_start = phase.groupby("global_tid")["start_ns"].shift(-1)
    leaf = phase[next_start.isna() | (next_start >= phase["end_ns"])]
    return leaf.drop(columns="range_id")


def gap_parts(ranges: pd.DataFrame) -> pd.DataFrame:
    """`host_gaps_parts`: each gap split into host phases and an `unattributed` remainder.

    A leaf overlaps the gap that started last at or before its start (if the gap ends after it), and
    a gap starts inside the leaf that started last before the gap (if the leaf ends after the gap's
    start); gaps on a thread are disjoint, and so are leaves, so these two as-of merges find every
    overlapping (gap, leaf) pair once.
    """
    iters = iterations(ranges)
    g = gaps(iters)
    lv = leaves(ranges, iters["global_tid"].unique())
    open_gaps = g[g["gap_ns"] > 0].sort_values("gap_start_ns")
    lv = lv.sort_values("start_ns")
    leaf_in_gap = pd.merge_asof(lv, open_gaps, left_on="start_ns", right_on="gap_start_ns", by="global_tid",
                                direction="backward")
    leaf_in_gap = leaf_in_gap[leaf_in_gap["start_ns"] < leaf_in_gap["gap_end_ns"]]
    gap_in_leaf = pd.merge_asof(open_gaps, lv, left_on="gap_start_ns", right_on="start_ns", by="global_tid",
                                direction="backward", allow_exact_matches=False)
    gap_in_leaf = gap_in_leaf[gap_in_leaf["end_ns"] > gap_in_leaf["gap_start_ns"]]
    pairs = pd.concat([leaf_in_gap, gap_in_leaf], ignore_index=True)
    pairs["dur_ns"] = (np.minimum(pairs["end_ns"], pairs["gap_end_ns"])
                       - np.maximum(pairs["start_ns"], pairs["gap_start_ns"]))
    attributed = pairs.groupby(["global_tid", "iteration", "phase"], as_index=False)["dur_ns"].sum()
    covered = attributed.groupby(["global_tid", "iteration"], as_index=False)["dur_ns"].sum()
    rest = g.merge(covered, on=["global_tid", "iteration"], how="left")
    rest = pd.DataFrame({"global_tid": rest["global_tid"], "iteration": rest["iteration"], "phase": "unattributed",
                         "dur_ns": rest["gap_ns"] - rest["dur_ns"].fillna(0)})
    parts = pd.concat([attributed, rest], ignore_index=True)
    parts = parts.astype({"global_tid": "int64", "iteration": "int64", "dur_ns": "int64"})
    parts["last"] = parts["phase"] == "unattributed"
    parts = parts.sort_values(["global_tid", "iteration", "last", "phase"]).drop(columns="last")
    return parts.reset_index(drop=True)


# --------------------------------------------------------------------------------------------------
# TTFT reconstruction from the run log


def log_latency(events: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """`request_latency_log`'s request_id, ttft_ns, tpot_ns, output_tokens, from the run log.

    A request's tokens are its first_token and token events; TTFT = first token - arrival, TPOT =
    (last token - first token) / (tokens - 1), NULL (NaN) with fewer than 2 tokens.
    """
    tokens = events[events["kind"].isin(("first_token", "token"))]
    per = tokens.groupby("request_id")["ts_ns"].agg(n="count", first_ns="min", last_ns="max")
    out = requests.merge(per, left_on="request_id", right_index=True, how="left")
    n = out["n"].fillna(0).astype("int64")
    tpot = ((out["last_ns"] - out["first_ns"]).astype("float64") / (n - 1).astype("float64")).where(n > 1)
    return pd.DataFrame({
        "request_id": out["request_id"].astype("int64"),
        "ttft_ns": (out["first_ns"] - out["arrival_ns"]).astype("Int64"),
        "tpot_ns": tpot.astype("float64"),
        "output_tokens": n,
    }).sort_values("request_id").reset_index(drop=True)
