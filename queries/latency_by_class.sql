-- TTFT and TPOT by request class: prompt-length bucket, priority and tenant, from the run log.
--
-- A reserved share of the token budget for decode (--decode-reserve) trades long prompts' TTFT for
-- everyone's TPOT; these views keep that trade visible per class. Prompt-length buckets are powers
-- of two: [1, 2), [2, 4), ..., [512, 1024), ...
--
-- @uses request_latency

-- One row per request that got a token, with its classes and latencies.
CREATE VIEW latency_by_class_requests (
  -- The request.
  request_id,
  -- Prompt length in tokens.
  prompt_tokens,
  -- Prompt-length bucket, e.g. '[512, 1024)'; '0' for an empty prompt.
  prompt_bucket,
  -- Lower bound of prompt_bucket (0 for an empty prompt): sorts the buckets.
  prompt_bucket_lo,
  -- Priority class.
  priority,
  -- Tenant.
  tenant,
  -- Tokens generated.
  output_tokens,
  -- Time to first token (request_latency_log.ttft_ns).
  ttft_ns,
  -- Time per output token after the first; NULL with fewer than 2 tokens.
  tpot_ns,
  -- Queue time.
  queue_ns
) AS
WITH
  buckets AS (
    SELECT
      request_id,
      prompt_tokens,
      -- The highest power of two not above prompt_tokens: 1 shifted by the position of its top bit.
      CASE WHEN prompt_tokens > 0 THEN 1::BIGINT << (bit_length(prompt_tokens::BIGINT::BIT)
        - bit_position('1'::BIT, prompt_tokens::BIGINT::BIT)) END AS lo,
      priority,
      tenant
    FROM run_requests
  )
SELECT
  b.request_id,
  b.prompt_tokens,
  CASE WHEN b.lo IS NULL THEN '0' ELSE '[' || b.lo || ', ' || (2 * b.lo) || ')' END,
  coalesce(b.lo, 0),
  b.priority,
  b.tenant,
  l.output_tokens,
  l.ttft_ns,
  l.tpot_ns,
  l.queue_ns
FROM buckets AS b
JOIN request_latency_log AS l ON l.request_id = b.request_id
WHERE l.first_token_ns IS NOT NULL
ORDER BY b.request_id;

-- TTFT and TPOT percentiles per class: one row per prompt-length bucket, per priority and per tenant.
CREATE VIEW latency_by_class (
  -- 'prompt_bucket', 'priority' or 'tenant'.
  class_kind,
  -- The class: a bucket such as '[16, 32)', a priority, or a tenant name.
  class,
  -- Sorts classes within a kind: the bucket's lower bound, the priority, or 0 for tenants (then by name).
  class_order,
  -- Requests in the class that got a token.
  requests,
  -- Median TTFT.
  ttft_p50_ns,
  -- 90th percentile TTFT (nearest rank).
  ttft_p90_ns,
  -- 99th percentile TTFT (nearest rank).
  ttft_p99_ns,
  -- Longest TTFT.
  ttft_max_ns,
  -- Median TPOT, over requests with at least 2 tokens.
  tpot_p50_ns,
  -- 90th percentile TPOT (nearest rank).
  tpot_p90_ns,
  -- 99th percentile TPOT (nearest rank).
  tpot_p99_ns,
  -- Longest TPOT.
  tpot_max_ns
) AS
WITH
  classed AS (
    SELECT 'prompt_bucket' AS class_kind, prompt_bucket AS class, prompt_bucket_lo AS class_order, ttft_ns, tpot_ns
    FROM latency_by_class_requests
    UNION ALL
    SELECT 'priority', priority::VARCHAR, priority, ttft_ns, tpot_ns FROM latency_by_class_requests
    UNION ALL
    SELECT 'tenant', tenant, 0, ttft_ns, tpot_ns FROM latency_by_class_requests
  )
SELECT
  class_kind,
  class,
  class_order,
  count(*),
  quantile_disc(ttft_ns, 0.5),
  quantile_disc(ttft_ns, 0.9),
  quantile_disc(ttft_ns, 0.99),
  max(ttft_ns),
  quantile_disc(tpot_ns, 0.5),
  quantile_disc(tpot_ns, 0.9),
  quantile_disc(tpot_ns, 0.99),
  max(tpot_ns)
FROM classed
GROUP BY class_kind, class, class_order
ORDER BY class_kind, class_order, class;
