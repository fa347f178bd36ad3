-- Threads of the capture: every thread named in ThreadNames or seen in NVTX or CUDA API rows.
CREATE TABLE threads (
  -- nsys's global thread id, bits <hw:8><vm:8><pid:24><tid:24>; the thread key of every other table.
  global_tid BIGINT,
  -- Global id of the thread's process: global_tid with the tid bits cleared (processes.global_pid).
  global_pid BIGINT,
  -- Operating-system process id: (global_tid >> 24) & 0xFFFFFF.
  pid BIGINT,
  -- Operating-system thread id: global_tid & 0xFFFFFF.
  tid BIGINT,
  -- Thread name (ThreadNames; the highest-priority name where nsys recorded several); NULL when unnamed.
  name VARCHAR
);

INSERT INTO threads
WITH
  named AS (
    SELECT t.globalTid AS global_tid, arg_max(s.value, (coalesce(t.priority, -1), t._row)) AS name
    FROM _raw_thread_names AS t
    LEFT JOIN _raw_strings AS s ON s.id = t.nameId
    WHERE t.globalTid IS NOT NULL
    GROUP BY t.globalTid
  ),
  seen AS (
    SELECT global_tid FROM named
    UNION SELECT globalTid FROM _raw_nvtx WHERE globalTid IS NOT NULL
    UNION SELECT globalTid FROM _raw_runtime WHERE globalTid IS NOT NULL
  )
SELECT
  seen.global_tid,
  (seen.global_tid >> 24) << 24,
  (seen.global_tid >> 24) & 16777215,
  seen.global_tid & 16777215,
  named.name
FROM seen
LEFT JOIN named USING (global_tid)
ORDER BY seen.global_tid;
