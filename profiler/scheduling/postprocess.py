"""After the forward pass: cached and sampled tokens go into the requests, and stops end them.

Notes
-----
Every batch starts with the decode rows (`DecodeRows`), and each of them sampled a token: their
tokens are committed in one pass, and only the rows that may stop on theirs (a stop token, or
max_tokens reached: `DecodeRows.may_stop`) are looked at one by one. The work taken one by one
follows them; a prefill chunk samples a token only when it reaches the end of what it had to compute.
A request whose prefill just ended becomes a decode and joins the rows at the next `merge`.

Token events go out as TokenEvents blocks over runs of sampled rows, in batch order, each block
ending at a finish so that every FINISH event comes right after its request's token.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from itertrace.profiler.scheduling.batch_builder import DecodeRows
from itertrace.profiler.scheduling.decision import Decision, Event, EventKind, TokenEvents
from itertrace.profiler.scheduling.request import Phase, Reason, Request

Finish = Callable[[Request, Phase, Reason, int], None]


def check_tokens(decision: Decision, tokens: np.ndarray, iteration: int) -> None:
    """One token per sampled row, or an error."""
    if len(tokens) != len(decision.batch.sampled_ids):
        raise ValueError(f"iteration {iteration}: {len(tokens)} tokens for {len(decision.batch.sampled_ids)} "
                         "sampled sequences")


def commit_tokens(decision: Decision, tokens: np.ndarray, iteration: int, rows: DecodeRows | None, n_rows: int,
                  events: list[Event | TokenEvents], finish: Finish) -> list[Request]:
    """Commit the iteration's work and sampled tokens; returns the requests that finished.

    `tokens` holds one token per sampled row, in batch order (its length is checked by the caller);
    the first `n_rows` rows of the batch are `rows`. `finish` ends a request (the scheduler's bookkeeping);
    its FINISH event goes out here, after its token's.
    """
    batch = decision.batch
    ids = batch.sampled_ids
    first = batch.num_generated[batch.sample] == 0
    finished, emitted = [], 0
    if n_rows:  # the decode rows: every one sampled a token
        row_tokens = tokens[:n_rows]
        for req, token in zip(rows.reqs, row_tokens.tolist()):
            req.num_computed += 1
            req.output_ids.append(token)
        ended = []
        for i in rows.may_stop(row_tokens):
            req = rows.reqs[i]
            stop = stop_reason(req, req.output_ids[-1])
            if stop is not None:
                emitted = _token_events(events, ids, first, emitted, i + 1, iteration)
                _finish(req, *stop, iteration, finish, events)
                finished.append(req)
                ended.append(i)
        rows.advance(row_tokens)
        rows.leave(ended)
    sampled = n_rows
    for req, n in decision.work[n_rows:]:
        req.num_computed += n
        if req.num_computed < req.num_tokens:
            continue  # a prefill chunk that did not reach the end: nothing sampled
        req.output_ids.append(int(tokens[sampled]))
        sampled += 1
        stop = stop_reason(req, req.output_ids[-1])
        if stop is not None:
            emitted = _token_events(events, ids, first, emitted, sampled, iteration)
            _finish(req, *stop, iteration, finish, events)
            finished.append(req)
        elif req.phase is Phase.PREFILL:
            req.move(Phase.DECODE, Reason.PROMPT_DONE, iteration)
        if rows is not None and req.phase is Phase.DECODE:
            rows.join(req)
    _token_events(events, ids, first, emitted, len(ids), iteration)
    return finished


def commit_sampled(decision: Decision, tokens: np.ndarray, events: list[Event | TokenEvents],
                   finish: Finish) -> tuple[list[Request], np.ndarray]:
    """Overlap mode: the sampled tokens of an iteration committed ahead (commit_tokens with placeholders)
    go in at last, each into its place in its request's output (the row's num_generated). Returns the
    requests that finished and [sampled] bool: the rows whose token counts.

    A row drops its token (never emitted, never counted, its placeholder gone) when its request was
    canceled, or ended in an earlier iteration: it was scheduled here before that was known. A stop
    token finishes its request here (`finish`); one already finished on max_tokens, here or in the
    iteration committed ahead after this one, finished on the stop token instead (its last transition
    restated), and the placeholders after it go. A request finished on max_tokens in this iteration is
    announced (its FINISH event) after its last token. Token events go out as in commit_tokens.
    """
    batch, iteration = decision.batch, decision.iteration
    ids = batch.sampled_ids
    generated = batch.num_generated[batch.sample]
    first = generated == 0
    sampled = [r for (r, _), s in zip(decision.work, batch.sample.tolist()) if s]
    kept = np.ones(len(ids), dtype=bool)
    finished, emitted = [], 0
    for j, (req, token, g) in enumerate(zip(sampled, tokens.tolist(), generated.tolist())):
        ended = req.phase.terminal and (req.phase is Phase.CANCELED or req.transitions[-1].iteration < iteration)
        if ended:
            del req.output_ids[g:]
            kept[j] = False
            continue
        req.output_ids[g] = token
        if token in req.sampling.stop_token_ids and not req.sampling.ignore_eos:
            del req.output_ids[g + 1:]
            emitted = _kept_events(events, ids, first, kept, emitted, j + 1, iteration)
            if req.phase.terminal:  # finished on max_tokens ahead of this token: it finished on this one
                req.transitions[-1] = replace(req.transitions[-1], iteration=iteration, dst=Phase.FINISHED_STOP,
                                              reason=Reason.STOP_TOKEN)
                req.phase, req.stop_reason = Phase.FINISHED_STOP, Reason.STOP_TOKEN
                _announce(req, events)
            else:
                _finish(req, Phase.FINISHED_STOP, Reason.STOP_TOKEN, iteration, finish, events)
            finished.append(req)
        elif req.phase.terminal and req.transitions[-1].iteration == iteration:  # on max_tokens, here
            emitted = _kept_events(events, ids, first, kept, emitted, j + 1, iteration)
            _announce(req, events)
            finished.append(req)
    _kept_events(events, ids, first, kept, emitted, len(ids), iteration)
    return finished, kept


def _finish(req: Request, phase: Phase, reason: Reason, iteration: int, finish: Finish,
            events: list[Event | TokenEvents]) -> None:
    """End the request (`finish`: the scheduler's bookkeeping) and announce it."""
    finish(req, phase, reason, iteration)
    events.append(Event(req.request_id, iteration, EventKind.FINISH, reason))


def _announce(req: Request, events: list[Event | TokenEvents]) -> None:
    """The FINISH event of a request that reached its terminal state, at the iteration and for the reason it did."""
    events.append(Event(req.request_id, req.transitions[-1].iteration, EventKind.FINISH, req.stop_reason))


def _kept_events(events: list[Event | TokenEvents], ids: np.ndarray, first: np.ndarray, kept: np.ndarray, start: int,
                 stop: int, iteration: int) -> int:
    """Emit the token events of the kept rows among sampled rows [start, stop); returns stop."""
    if stop > start:
        keep = kept[start:stop]
        if keep.all():
            events.append(TokenEvents(iteration, ids[start:stop], first[start:stop]))
        elif keep.any():
            events.append(TokenEvents(iteration, ids[start:stop][keep], first[start:stop][keep]))
    return stop


def commit_decode_steps(rows: DecodeRows, tokens: np.ndarray) -> None:
    """Commit several iterations of the decode rows at once (`tokens`: [steps, D]), none of which ends a
    row: what `commit_tokens` does to the rows and their requests, iteration by iteration."""
    steps = len(tokens)
    for req, out in zip(rows.reqs, tokens.T.tolist()):
        req.num_computed += steps
        req.output_ids.extend(out)
    rows.advance(tokens[-1].copy(), steps)


def stop_reason(req: Request, token: int) -> tuple[Phase, Reason] | None:
    """Whether the token just sampled ends the request, and how."""
    sp = req.sampling
    if token in sp.stop_token_ids and not sp.ignore_eos:
        return Phase.FINISHED_STOP, Reason.STOP_TOKEN
    if len(req.output_ids) >= sp.max_tokens:
        return Phase.FINISHED_LENGTH, Reason.MAX_TOKENS
    return None


def _token_events(events: list[Event | TokenEvents], ids: np.ndarray, first: np.ndarray, start: int, stop: int,
                  iteration: int) -> int:
    """Emit the token events of sampled rows [start, stop); returns stop."""
    if stop > start:
        events.append(TokenEvents(iteration, ids[start:stop], first[start:stop]))
    return stop
