-- Intervals: table macros over sets of [start_ns, end_ns) intervals per key (a thread, a process).
--
-- Notes. Each macro takes its intervals as a table, view or CTE named by its argument (read through
-- query_table): columns `key`, `start_ns`, `end_ns`, and what a macro names besides; the caller
-- renames its own columns to these (`global_tid AS key`). A macro that keeps its rows' other columns
-- says so. An interval is [start_ns, end_ns): two that touch do not overlap. None of them compares
-- intervals pairwise: each is a window in time order or an ASOF join, which DuckDB runs as sorts on
-- all cores, so a key with millions of intervals costs a sort, never a product.

-- The leaves of nested ranges (push/pop ranges, stack frames) per key: the rows of `ranges` that hold
-- no other row of their key, with all their columns. `ranges` has `id` too, to order ranges that start
-- at one instant (longest first, then by id); end_ns NULL is a range still open, which holds every
-- range that starts after it. A range of no length holds nothing and is no leaf. Ranges nest, so the
-- range that comes next on the key (by start, longest first) lies inside a range exactly when it starts
-- before that range ends: a range is a leaf when the next one does not.
CREATE MACRO intervals_leaves(ranges) AS TABLE
SELECT * EXCLUDE (intervals_next_start_ns)
FROM (
  SELECT *, lead(start_ns) OVER (PARTITION BY key ORDER BY start_ns, end_ns DESC NULLS FIRST, id)
              AS intervals_next_start_ns
  FROM query_table(ranges)
  WHERE end_ns IS NULL OR end_ns > start_ns
)
WHERE intervals_next_start_ns IS NULL OR intervals_next_start_ns >= end_ns;

-- The union of the intervals of `spans` per key, as disjoint islands (key, start_ns, end_ns), in no
-- particular order; intervals that touch join one island, empty ones take no part. An interval starts
-- an island when it starts after every earlier one (by start) has ended.
CREATE MACRO intervals_union(spans) AS TABLE
WITH
  ordered AS (
    SELECT
      key, start_ns, end_ns,
      max(end_ns) OVER (PARTITION BY key ORDER BY start_ns, end_ns
                        ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS covered_until_ns
    FROM query_table(spans)
    WHERE end_ns > start_ns
  ),
  islands AS (
    -- a running sum, not count(*) FILTER (...) OVER: DuckDB counts a filtered window anew for every row
    SELECT *, sum((covered_until_ns IS NULL OR start_ns > covered_until_ns)::INTEGER)
                OVER (PARTITION BY key ORDER BY start_ns, end_ns ROWS UNBOUNDED PRECEDING) AS island
    FROM ordered
  )
SELECT key, min(start_ns) AS start_ns, max(end_ns) AS end_ns
FROM islands
GROUP BY key, island;

-- Per key of `spans`, the time in [lo_ns, hi_ns) that no interval of it covers, as disjoint intervals
-- (key, start_ns, end_ns) in no particular order: before the union's first island, between two, after
-- its last. A key without intervals in `spans` has none here (the caller knows its keys).
CREATE MACRO intervals_complement(spans, lo_ns, hi_ns) AS TABLE
WITH
  islands AS (SELECT * FROM intervals_union(spans)),
  uncovered AS (
    SELECT key, coalesce(lag(end_ns) OVER (PARTITION BY key ORDER BY start_ns), lo_ns) AS start_ns, start_ns AS end_ns
    FROM islands
    UNION ALL
    SELECT key, max(end_ns), hi_ns FROM islands GROUP BY key
  )
SELECT key, greatest(start_ns, lo_ns) AS start_ns, least(end_ns, hi_ns) AS end_ns
FROM uncovered
WHERE least(end_ns, hi_ns) > greatest(start_ns, lo_ns);

-- Every overlap of an interval of `a` with one of `b`, on the same key, where each is disjoint per key:
-- key, a's other columns, b's other columns (their names must differ), and the overlap's start_ns and
-- end_ns. Of two disjoint sets, an interval of a and one of b overlap exactly when the one of a starts
-- inside the one of b (then that is the latest of b to start at or before it) or the one of b starts
-- inside the one of a (the latest of a to start before it): one ASOF join each. An empty interval of a
-- inside one of b gives an empty overlap.
CREATE MACRO intervals_intersect(a, b) AS TABLE
SELECT x.key, x.* EXCLUDE (key, start_ns, end_ns), y.* EXCLUDE (key, start_ns, end_ns),
       x.start_ns, least(x.end_ns, y.end_ns) AS end_ns
FROM query_table(a) AS x
ASOF JOIN query_table(b) AS y ON y.key = x.key AND y.start_ns <= x.start_ns
WHERE x.start_ns < y.end_ns
UNION ALL
SELECT x.key, x.* EXCLUDE (key, start_ns, end_ns), y.* EXCLUDE (key, start_ns, end_ns),
       y.start_ns, least(x.end_ns, y.end_ns)
FROM query_table(b) AS y
ASOF JOIN query_table(a) AS x ON x.key = y.key AND x.start_ns < y.start_ns
WHERE y.start_ns < x.end_ns;

-- The intervals of `spans` cut at every start and end of any of them, per key: the pieces between two
-- consecutive such instants (key, start_ns, end_ns), covered or not, in no particular order.
CREATE MACRO intervals_cuts(spans) AS TABLE
WITH
  instants AS (SELECT key, start_ns AS ts FROM query_table(spans) UNION SELECT key, end_ns FROM query_table(spans)),
  cuts AS (SELECT key, ts AS start_ns, lead(ts) OVER (PARTITION BY key ORDER BY ts) AS end_ns FROM instants)
SELECT key, start_ns, end_ns
FROM cuts
WHERE end_ns IS NOT NULL;
