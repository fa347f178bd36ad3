"""The SQL of each track of the Perfetto export: one query per track, one JSON event per row.

Every query yields a single VARCHAR column, each row one Chrome-trace event, and reads the window's
time span from the parameters `$start` and `$end` (NULL for no limit). Events are built as text with
the macros in `EVENT_MACROS`, so that times keep every digit: ns become microseconds with three
decimals, exactly (a JSON number written through a DOUBLE would keep 16 significant digits, and a
Kineto timestamp in ns has 19).
"""
from __future__ import annotations

REQUESTS_PID = 16_000_001  # the request tracks' process: above any Linux pid (2^22), within 24 bits
ENGINE_PID = 16_000_000  # a run log's iterations, when the database has no trace
GAP_TID = 16_000_000  # a gap track's thread, plus its number: above any Linux tid

EVENT_MACROS = (
    """CREATE OR REPLACE TEMP MACRO _pf_us(ns) AS
         CASE WHEN ns < 0 THEN '-' ELSE '' END || (abs(ns) // 1000)::VARCHAR || '.' || lpad((abs(ns) % 1000)::VARCHAR, 3, '0')""",
    """CREATE OR REPLACE TEMP MACRO _pf_args(args) AS json_merge_patch('{}', args)::VARCHAR""",  # null values dropped
    """CREATE OR REPLACE TEMP MACRO _pf_span(cat, name, pid, tid, start_ns, dur_ns, args) AS
         '{"ph":"X","cat":"' || cat || '","name":' || to_json(coalesce(name, ''))::VARCHAR || ',"pid":' || pid::VARCHAR
         || ',"tid":' || tid::VARCHAR || ',"ts":' || _pf_us(start_ns) || ',"dur":' || _pf_us(dur_ns)
         || ',"args":' || _pf_args(args) || '}'""",
    """CREATE OR REPLACE TEMP MACRO _pf_instant(cat, name, pid, tid, ts_ns, args) AS
         '{"ph":"i","s":"t","cat":"' || cat || '","name":' || to_json(coalesce(name, ''))::VARCHAR || ',"pid":'
         || pid::VARCHAR || ',"tid":' || tid::VARCHAR || ',"ts":' || _pf_us(ts_ns) || ',"args":' || _pf_args(args) || '}'""",
    """CREATE OR REPLACE TEMP MACRO _pf_meta(name, pid, tid, value) AS
         '{"ph":"M","name":"' || name || '","pid":' || pid::VARCHAR || ',"tid":' || tid::VARCHAR || ',"args":'
         || CASE WHEN name LIKE '%sort_index' THEN json_object('sort_index', value) ELSE json_object('name', value) END::VARCHAR
         || '}'""",
    """CREATE OR REPLACE TEMP MACRO _pf_flow(ph, id, pid, tid, ts_ns) AS
         '{"ph":"' || ph || '","cat":"ac2g","name":"ac2g","id":' || id::VARCHAR || ',"pid":' || pid::VARCHAR
         || ',"tid":' || tid::VARCHAR || ',"ts":' || _pf_us(ts_ns) || CASE WHEN ph = 'f' THEN ',"bp":"e"' ELSE '' END || '}'""",
)


def overlaps(start: str, end: str) -> str:
    """SQL: the interval from `start` to `end` shares time with the window [$start, $end] (touching it is not
    enough), or, being an instant (or still open), lies in it."""
    lo, hi = "coalesce($start::BIGINT, -9223372036854775808)", "coalesce($end::BIGINT, 9223372036854775807)"
    return (f"(({start} < {hi} AND {end} > {lo}) "
            f"OR (coalesce({end}, {start}) = {start} AND {start} BETWEEN {lo} AND {hi}))")


def _payload(domain: str, value: str) -> str:
    """args that the ingest reads back: the domain, and the int64 payload as Kineto keeps a range's argument."""
    return f"json_object('domain', {domain}, 'Concrete Inputs', CASE WHEN {value} IS NOT NULL THEN [{value}::VARCHAR] END)"


def host_tracks(missing: dict[str, str]) -> list[str]:
    """Process and thread names, NVTX ranges (steps with their run-log row), marks, API calls, GPU work, flows."""
    if "nvtx_ranges" in missing:
        return []
    if "run_iterations" not in missing:
        step_info = """
          SELECT i.step_range_id AS range_id, json_object(
            'iteration', i.iteration, 'members', r.member_ids, 'scheduled', r.scheduled_ids,
            'finished_members', r.finished_member_ids, 'prefill_tokens', r.prefill_tokens,
            'decode_tokens', r.decode_tokens, 'num_seqs', r.num_seqs, 'limit', r."limit",
            'num_waiting', r.num_waiting, 'num_preempted', r.num_preempted, 'kv_in_use', r.kv_in_use) AS info
          FROM iterations AS i JOIN run_iterations AS r USING (iteration)"""
    else:
        step_info = "SELECT step_range_id AS range_id, json_object('iteration', iteration) AS info FROM iterations"
    tracks = [
        """SELECT _pf_meta('process_name', pid, 0, coalesce(name, 'process ' || pid)) FROM processes
           UNION ALL SELECT _pf_meta('thread_name', pid, tid, coalesce(name, 'thread ' || tid)) FROM threads""",
        f"""WITH steps AS ({step_info}),
             capture_end AS (SELECT max(coalesce(end_ns, start_ns)) AS ts FROM nvtx_ranges)
           SELECT _pf_span(CASE WHEN r.range_kind = 'python_frame' THEN 'python_function' ELSE 'user_annotation' END,
                           r.text, r.pid, r.tid, r.start_ns,
                           coalesce(r.end_ns, (SELECT ts FROM capture_end)) - r.start_ns,
                           json_merge_patch({_payload('r.domain_name', 'r.int64_value')}, coalesce(s.info, '{{}}')))
           FROM nvtx_ranges AS r LEFT JOIN steps AS s USING (range_id)
           WHERE {overlaps('r.start_ns', 'r.end_ns')}
           ORDER BY r.range_id""",
    ]
    if "nvtx_marks" not in missing:
        tracks.append(f"""SELECT _pf_instant('user_annotation', text, pid, tid, ts_ns, {_payload('domain_name', 'int64_value')})
                          FROM nvtx_marks WHERE {overlaps('ts_ns', 'ts_ns')} ORDER BY mark_id""")
    if "cuda_api" not in missing:
        tracks.append(f"""SELECT _pf_span(CASE event_class WHEN 1 THEN 'cuda_driver' ELSE 'cuda_runtime' END, name, pid, tid,
                                          start_ns, dur_ns, json_object('correlation', correlation_id))
                          FROM cuda_api WHERE {overlaps('start_ns', 'end_ns')} ORDER BY api_id""")
    if "gpu_ops" not in missing:
        tracks += [
            """WITH streams AS (SELECT DISTINCT device_id, stream_id FROM gpu_ops)
               SELECT _pf_meta('process_name', device_id, 0, 'GPU ' || device_id) FROM (SELECT DISTINCT device_id FROM streams)
               UNION ALL SELECT _pf_meta('process_sort_index', device_id, 0, 16777216 + device_id)
                         FROM (SELECT DISTINCT device_id FROM streams)
               UNION ALL SELECT _pf_meta('thread_name', device_id, stream_id, 'stream ' || stream_id) FROM streams""",
            f"""SELECT _pf_span(CASE kind WHEN 'kernel' THEN 'kernel' WHEN 'memcpy' THEN 'gpu_memcpy' ELSE 'gpu_memset' END,
                                name, device_id, stream_id, start_ns, dur_ns,
                                json_object('device', device_id, 'stream', stream_id, 'context', context_id,
                                            'correlation', correlation_id, 'bytes', bytes))
                FROM gpu_ops WHERE {overlaps('start_ns', 'end_ns')} ORDER BY gpu_op_id""",
        ]
        if "cuda_api" not in missing:
            tracks.append(f"""
                WITH linked AS (
                  SELECT g.gpu_op_id, g.device_id, g.stream_id, g.start_ns, a.pid, a.tid, a.start_ns AS api_ns
                  FROM gpu_ops AS g JOIN cuda_api AS a ON a.correlation_id = g.correlation_id AND a.global_pid = g.global_pid
                  WHERE {overlaps('g.start_ns', 'g.end_ns')})
                SELECT _pf_flow('s', gpu_op_id, pid, tid, api_ns) FROM linked
                UNION ALL SELECT _pf_flow('f', gpu_op_id, device_id, stream_id, start_ns) FROM linked""")
    return tracks


def part_track(spans: str, parts: str, *, span_name: str, track_label: str, tid_base: int) -> str:
    """Tracks of spans, each span a slice named `span_name` with its parts laid end to end inside it.

    `spans` yields (track, pid, track_name, key, start_ns, dur_ns, args), a track per thread named
    `track_label: track_name`, and `parts` yields (track, key, name, dur_ns, ord): a span's parts add up
    to it, as host_gaps_parts' do (gap_tracks). GPU idle time split by host activity (gpu_idle_parts) fits
    the same shape: a track per GPU, a span per idle interval.
    """
    return f"""
        WITH spans AS ({spans}),
          parts AS (
            SELECT *, sum(dur_ns) OVER (PARTITION BY track, key ORDER BY ord ROWS UNBOUNDED PRECEDING) - dur_ns AS offset_ns
            FROM ({parts}) WHERE dur_ns > 0),
          tracks AS (SELECT DISTINCT track, pid, track_name FROM spans)
        SELECT _pf_meta('thread_name', pid, {tid_base} + track, '{track_label}: ' || track_name) FROM tracks
        UNION ALL
        SELECT _pf_span('itertrace_gap', '{span_name}', pid, {tid_base} + track, start_ns, dur_ns, args)
        FROM spans
        UNION ALL
        SELECT _pf_span('itertrace_gap', p.name, s.pid, {tid_base} + s.track, s.start_ns + p.offset_ns, p.dur_ns,
                        json_object('dur_ns', p.dur_ns, 'share', round(p.dur_ns / s.dur_ns, 4)))
        FROM parts AS p JOIN spans AS s USING (track, key)"""


def gap_tracks(missing: dict[str, str]) -> list[str]:
    """The host gaps of each step thread, split by host phase (host_gaps, host_gaps_parts)."""
    if "nvtx_ranges" in missing:
        return []
    spans = f"""
        SELECT dense_rank() OVER (ORDER BY g.global_tid) AS track, t.pid, coalesce(t.name, 'thread ' || t.tid) AS track_name,
               g.iteration AS key, g.gap_start_ns AS start_ns, g.gap_ns AS dur_ns,
               json_object('iteration', g.iteration, 'after_iteration', g.prev_iteration, 'gap_ns', g.gap_ns) AS args
        FROM host_gaps AS g JOIN threads AS t USING (global_tid)
        WHERE g.gap_ns > 0 AND g.iteration IS NOT NULL AND {overlaps('g.gap_start_ns', 'g.gap_end_ns')}"""
    parts = """
        SELECT dense_rank() OVER (ORDER BY global_tid) AS track, iteration AS key, phase AS name, dur_ns,
               row_number() OVER (PARTITION BY global_tid, iteration ORDER BY phase = 'unattributed', phase) AS ord
        FROM host_gaps_parts"""
    return [part_track(spans, parts, span_name="host gap", track_label="host gaps", tid_base=GAP_TID)]


def request_tracks(missing: dict[str, str]) -> list[str]:
    """One track per request of the run log: queued, prefill chunks, decode runs, preempted, and how it ended.

    Iterations are placed by the trace's step ranges where the database has a trace (joined on iteration
    numbers, never on clocks), else by the run log's own times.
    """
    if "run_events" in missing or "run_iterations" in missing:
        return []
    traced = "nvtx_ranges" not in missing
    slots = ("SELECT iteration, min(host_start_ns) AS s, max(coalesce(host_end_ns, host_start_ns)) AS e "
             "FROM iterations GROUP BY iteration") if traced else \
        "SELECT iteration, start_ns AS s, end_ns AS e FROM run_iterations"
    arrivals = ("SELECT int64_value AS request_id, min(ts_ns) AS ts FROM nvtx_marks "
                "WHERE text = 'arrive' AND domain_name = 'itertrace' GROUP BY 1") if traced and "nvtx_marks" not in missing \
        else ("SELECT request_id, min(ts_ns) AS ts FROM run_events WHERE kind = 'arrive' GROUP BY 1" if not traced
              else "SELECT NULL::BIGINT AS request_id, NULL::BIGINT AS ts WHERE false")
    engine = [] if traced else [f"""
        SELECT _pf_meta('process_name', {ENGINE_PID}, 0, 'engine (run log)')
        UNION ALL SELECT _pf_meta('thread_name', {ENGINE_PID}, 1, 'iterations')
        UNION ALL
        SELECT _pf_span('itertrace_iteration', 'iteration ' || iteration, {ENGINE_PID}, 1, start_ns, dur_ns, json_object(
                 'iteration', iteration, 'members', member_ids, 'scheduled', scheduled_ids,
                 'finished_members', finished_member_ids, 'prefill_tokens', prefill_tokens, 'decode_tokens', decode_tokens,
                 'num_seqs', num_seqs, 'limit', "limit", 'num_waiting', num_waiting, 'num_preempted', num_preempted))
        FROM run_iterations WHERE {overlaps('start_ns', 'end_ns')}"""]
    return engine + [f"""
        WITH slots AS ({slots}),
          arrivals AS ({arrivals}),
          events AS (SELECT e.*, s.s, s.e FROM run_events AS e LEFT JOIN slots AS s USING (iteration)),
          firsts AS (
            SELECT request_id,
                   min(CASE WHEN kind = 'arrive' THEN s END) AS arrive_slot,
                   min(CASE WHEN kind = 'admit' THEN s END) AS admitted,
                   min(CASE WHEN kind IN ('finish', 'cancel', 'reject') THEN s END) AS ended
            FROM events GROUP BY request_id),
          queued AS (
            SELECT f.request_id, coalesce(a.ts, f.arrive_slot) AS start_ns, coalesce(f.admitted, f.ended) AS end_ns
            FROM firsts AS f LEFT JOIN arrivals AS a USING (request_id)),
          decodes AS (
            SELECT request_id, iteration, s, e, iteration - row_number() OVER (PARTITION BY request_id ORDER BY iteration) AS run
            FROM events WHERE kind = 'token'),
          preempted AS (
            SELECT p.request_id, p.e AS start_ns, min(r.s) AS end_ns, any_value(p.reason) AS reason
            FROM events AS p LEFT JOIN events AS r ON r.request_id = p.request_id AND r.kind = 'resume' AND r.iteration > p.iteration
            WHERE p.kind = 'preempt' GROUP BY p.request_id, p.iteration, p.e),
          slices AS (
            SELECT request_id, 'queued' AS name, start_ns, end_ns - start_ns AS dur_ns, json_object() AS args
            FROM queued WHERE end_ns IS NOT NULL
            UNION ALL
            SELECT request_id, 'prefill', s, e - s, json_object('iteration', iteration, 'tokens', tokens)
            FROM events WHERE kind = 'prefill_chunk'
            UNION ALL
            SELECT request_id, 'decode', min(s), max(e) - min(s),
                   json_object('tokens', count(*), 'first_iteration', min(iteration), 'last_iteration', max(iteration))
            FROM decodes GROUP BY request_id, run
            UNION ALL
            SELECT request_id, 'preempted', start_ns, end_ns - start_ns, json_object('reason', reason)
            FROM preempted WHERE end_ns IS NOT NULL),
          shown AS (
            SELECT * FROM slices WHERE start_ns IS NOT NULL AND {overlaps('start_ns', 'start_ns + dur_ns')}),
          ends AS (
            SELECT request_id, e AS ts_ns,
                   CASE kind WHEN 'finish' THEN 'finished' WHEN 'cancel' THEN 'canceled' ELSE 'rejected' END
                     || coalesce(' (' || reason || ')', '') AS name
            FROM events WHERE kind IN ('finish', 'cancel', 'reject') AND e IS NOT NULL AND {overlaps('e', 'e')}),
          requests AS (SELECT request_id FROM shown UNION SELECT request_id FROM ends)
        SELECT _pf_meta('process_name', {REQUESTS_PID}, 0, 'requests (run log)')
        UNION ALL SELECT _pf_meta('thread_name', {REQUESTS_PID}, request_id + 1, 'request ' || request_id) FROM requests
        UNION ALL SELECT _pf_meta('thread_sort_index', {REQUESTS_PID}, request_id + 1, request_id) FROM requests
        UNION ALL SELECT _pf_span('itertrace_request', name, {REQUESTS_PID}, request_id + 1, start_ns, dur_ns, args) FROM shown
        UNION ALL SELECT _pf_instant('itertrace_request', name, {REQUESTS_PID}, request_id + 1, ts_ns, json_object()) FROM ends"""]
