"""Each process's rank and world size, read from a capture's database.

A process counts when it ran GPU work or iterations. Its rank comes from, in order:
- `path`: --rank-from's match on the capture's path (given at `fleet ingest`), for every process of it;
- `distributed_info`: a PyTorch profiler trace's top-level distributedInfo (kineto_sources.rank, world_size),
  for every process of that trace;
- `nccl`: the process's NCCL communicator set-up range (ncclCommInitRank, ncclCommInitRankConfig,
  ncclCommInitRankScalable, ncclCommSplit) whose payload, as the export holds it in NVTX_EVENTS.jsonText,
  names its "Rank" and "No. of ranks" (NCCL's NVTX payload schema); of several communicators, the largest;
- `device`: the lowest CUDA device id the process ran GPU work on (world size unknown: device ids number
  a machine's GPUs, not a job's ranks);
and is NULL where none says.
"""
from __future__ import annotations

# NCCL's communicator set-up calls (nccl src/include/nvtx_payload_schemas.h: CommInitRank's schema, shared by
# the Config and Scalable forms, and CommSplit's; entry names "Rank" and "No. of ranks").
NCCL_INIT = r"^ncclComm(InitRank|InitRankConfig|InitRankScalable|Split)$"


def ranks_sql(tables: set[str], path_rank: int | None) -> str:
    """The query of (global_pid, rank, world_size, rank_source) over a database holding `tables`."""
    work = []
    if "gpu_ops" in tables:
        work.append("SELECT DISTINCT global_pid FROM gpu_ops")
    if "nvtx_ranges" in tables:
        work.append("SELECT DISTINCT global_pid FROM iterations")
    if not work:
        return ("SELECT NULL::BIGINT AS global_pid, NULL::BIGINT AS rank, NULL::BIGINT AS world_size, "
                "NULL::VARCHAR AS rank_source LIMIT 0")
    kineto = ("SELECT source_no::BIGINT AS source_no, rank, world_size FROM kineto_sources" if "kineto_sources" in tables
              else "SELECT NULL::BIGINT AS source_no, NULL::BIGINT AS rank, NULL::BIGINT AS world_size LIMIT 0")
    nccl = (f"""
        SELECT global_pid, first(rank ORDER BY world_size DESC, start_ns) AS rank, max(world_size) AS world_size
        FROM (SELECT global_pid, start_ns,
                     CASE WHEN json_valid(json_text) THEN try_cast(json_text ->> '$.Rank' AS BIGINT) END AS rank,
                     CASE WHEN json_valid(json_text) THEN try_cast(json_text ->> '$."No. of ranks"' AS BIGINT) END
                       AS world_size
              FROM nvtx_ranges WHERE regexp_matches(text, '{NCCL_INIT}') AND json_text IS NOT NULL)
        WHERE rank IS NOT NULL
        GROUP BY global_pid""" if "nvtx_ranges" in tables
            else "SELECT NULL::BIGINT AS global_pid, NULL::BIGINT AS rank, NULL::BIGINT AS world_size LIMIT 0")
    device = ("SELECT global_pid, min(device_id) AS device_id FROM gpu_ops GROUP BY ALL" if "gpu_ops" in tables
              else "SELECT NULL::BIGINT AS global_pid, NULL::BIGINT AS device_id LIMIT 0")
    given = "NULL::BIGINT" if path_rank is None else f"{int(path_rank)}::BIGINT"
    return f"""
    WITH
      processes AS ({" UNION ".join(work)}),
      kineto AS ({kineto}),
      nccl AS ({nccl}),
      device AS ({device})
    SELECT
      p.global_pid,
      coalesce({given}, k.rank, n.rank, d.device_id) AS rank,
      CASE WHEN {given} IS NOT NULL THEN NULL WHEN k.rank IS NOT NULL THEN k.world_size
           WHEN n.rank IS NOT NULL THEN n.world_size END AS world_size,
      CASE WHEN {given} IS NOT NULL THEN 'path' WHEN k.rank IS NOT NULL THEN 'distributed_info'
           WHEN n.rank IS NOT NULL THEN 'nccl' WHEN d.device_id IS NOT NULL THEN 'device' END AS rank_source
    FROM processes AS p
    LEFT JOIN kineto AS k ON k.source_no = p.global_pid >> 48
    LEFT JOIN nccl AS n USING (global_pid)
    LEFT JOIN device AS d USING (global_pid)
    WHERE p.global_pid IS NOT NULL
    ORDER BY p.global_pid"""
