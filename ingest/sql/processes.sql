-- Processes of the capture: every process in PROCESSES, and every process one of `threads` belongs to.
CREATE TABLE processes (
  -- nsys's global process id, bits <hw:8><vm:8><pid:24> and 24 zero bits; the process key of every other table.
  global_pid BIGINT,
  -- Operating-system process id: (global_pid >> 24) & 0xFFFFFF.
  pid BIGINT,
  -- Process name as nsys recorded it (PROCESSES.name); NULL when it recorded none.
  name VARCHAR,
  -- Number of this process's threads in `threads`.
  thread_count BIGINT
);

INSERT INTO processes
WITH
  listed AS (
    SELECT globalPid AS global_pid, arg_max(name, _row) AS name
    FROM _raw_processes
    WHERE globalPid IS NOT NULL
    GROUP BY globalPid
  ),
  thread_counts AS (
    SELECT global_pid, count(*) AS thread_count
    FROM threads
    GROUP BY global_pid
  ),
  seen AS (
    SELECT global_pid FROM listed
    UNION SELECT global_pid FROM thread_counts
  )
SELECT
  seen.global_pid,
  (seen.global_pid >> 24) & 16777215,
  listed.name,
  coalesce(thread_counts.thread_count, 0)
FROM seen
LEFT JOIN listed USING (global_pid)
LEFT JOIN thread_counts USING (global_pid)
ORDER BY seen.global_pid;
