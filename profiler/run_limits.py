"""What a workload asks of the machine and of the engine, checked before any request is made.

- Memory: every request is made before the run starts (its spec and its Request), so a count whose
  requests alone outgrow the memory this machine has available is refused.
- Lengths: a request whose prompt and output outgrow the KV pool, or whose prompt outgrows an
  iteration's prefill room with chunked prefill off, is rejected on arrival (`admission`). A workload
  none of whose requests could run is refused, naming the longest that fits; where some could not, a
  note counts them.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from itertrace.errors import UserError
from itertrace.profiler.scheduling.admission import outgrows_pool, outgrows_prefill
from itertrace.profiler.scheduling.budget import prefill_room
from itertrace.profiler.scheduling.kv_memory import available_memory_bytes, format_bytes

if TYPE_CHECKING:
    from itertrace.profiler.session import RunSpec
    from itertrace.profiler.workloads import RequestSpec

# Bytes a request takes before the run starts, at the least: its RequestSpec (145) and its Request (795)
# with a prompt and an output of one token, measured with tracemalloc over 5,000, 20,000 and 80,000
# requests (940.2 to 941.5 each). The run adds its log rows: RSS grew by 2.5 KB a request from 20,000 to
# 80,000 requests of one token each.
MIN_BYTES_PER_REQUEST = 940


def check_request_count(requests: int, flag: str) -> None:
    """UserError when `requests` requests cannot all be made in the memory this machine has available."""
    need = requests * MIN_BYTES_PER_REQUEST
    free = available_memory_bytes()
    if need > free:
        raise UserError(f"{flag} {requests}: the requests alone take at least {format_bytes(need)} of memory "
                        f"({MIN_BYTES_PER_REQUEST} bytes each, before the run starts), and this machine has "
                        f"{format_bytes(free)} available; at most {free // MIN_BYTES_PER_REQUEST:,} fit")


def check_lengths(specs: Sequence[RequestSpec], run: RunSpec, prompt_flag: str, output_flag: str) -> list[str]:
    """Notes counting the requests that would be rejected on arrival; UserError when all would be.

    `prompt_flag` and `output_flag` name what set the prompt and output lengths, for the error."""
    config = run.scheduler
    pool = run.num_blocks * run.block_size
    too_long = [s for s in specs if outgrows_pool(s.prompt_tokens + s.output_tokens, run.num_blocks, run.block_size)]
    no_room = [s for s in specs if outgrows_prefill(s.prompt_tokens, config)
               and not outgrows_pool(s.prompt_tokens + s.output_tokens, run.num_blocks, run.block_size)]
    sizes = f"(--num-blocks {run.num_blocks:,} x --block-size {run.block_size})"
    room = prefill_room(config)
    if len(too_long) + len(no_room) == len(specs):
        none = (f"none of the {len(specs):,} requests can ever run" if len(specs) > 1
                else "its one request can never run")
        if too_long:
            shortest = min(too_long, key=lambda s: s.prompt_tokens + s.output_tokens)
            prompt, need = shortest.prompt_tokens, shortest.prompt_tokens + shortest.output_tokens
            fits = (f"at most {pool - prompt:,} output tokens fit beside a {prompt:,}-token prompt" if prompt < pool
                    else f"its prompt of {prompt:,} tokens alone outgrows it")
            flag = output_flag if prompt < pool else prompt_flag
            raise UserError(f"{flag}: {none}: the KV pool holds {pool:,} tokens {sizes} and the shortest needs "
                            f"{need:,} (prompt + output); {fits}")
        shortest_prompt = min(s.prompt_tokens for s in no_room)
        raise UserError(f"{prompt_flag}: {none}: with --no-chunked-prefill a prompt must fit one iteration's "
                        f"prefill room of {room:,} tokens (--token-budget less --decode-reserve), and the shortest "
                        f"has {shortest_prompt:,}")
    notes = []
    if too_long:
        notes.append(f"{len(too_long):,} of {len(specs):,} requests are rejected on arrival: their prompt and output "
                     f"need more than the KV pool's {pool:,} tokens {sizes}")
    if no_room:
        notes.append(f"{len(no_room):,} of {len(specs):,} requests are rejected on arrival: with "
                     f"--no-chunked-prefill their prompt outgrows an iteration's prefill room of {room:,} tokens")
    return notes
