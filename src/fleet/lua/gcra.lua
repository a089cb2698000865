-- The GCRA buckets (`--limit N/W,burst=B`), each kept beside the window
-- rule as rate/gcra.rs keeps it in-process: a call must fit in every
-- window and in every bucket. KEYS[6...] named `...:gcra:T:TAU:D` (ns,
-- from the client's Gcra: T = W/N rounded up, TAU = B·T, D the skew
-- allowance), each a HASH: tat_ms + tat_ns = the theoretical arrival time
-- (unix ms and the ns within it: a double holds unix ms exactly, not unix
-- ns), c:ID = 1 per call in flight (so that a call never sent gives its
-- unit back once). Only calls are counted: a bucket of tokens is not kept
-- here. A bucket forgotten with the fleet (FLUSHALL, DEL of the limit) is
-- a loss the epoch tells; one evicted alone starts again full.
local buckets = {}
for k = 6, #KEYS do
  local t, tau, d = string.match(KEYS[k], ':gcra:(%d+):(%d+):(%d+)$')
  if t then
    buckets[#buckets + 1] = {key = KEYS[k], T = tonumber(t), tau = tonumber(tau), D = tonumber(d)}
  end
end

-- The TAT in ns after now (negative: before), or nil for an idle bucket.
local function tat_rel(b)
  local h = redis.call('HMGET', b.key, 'tat_ms', 'tat_ns')
  if not h[1] then return nil end
  return (tonumber(h[1]) - now) * 1e6 + tonumber(h[2])
end

local function set_tat(b, rel)
  local ms = math.floor(rel / 1e6)
  redis.call('HSET', b.key, 'tat_ms', now + ms, 'tat_ns', rel - ms * 1e6)
end

-- ns until bucket b admits one call (0: now): it passes when
-- max(TAT + D, now) <= now + TAU.
local function bucket_due(b)
  local rel = tat_rel(b)
  if not rel then return 0 end
  local start = math.max(rel + b.D, 0)
  if start > b.tau then return start - b.tau end
  return 0
end

-- A take refused elsewhere: a bucket that would have admitted the call
-- is left as in-process, where it granted and gave the unit back, which
-- moves a TAT in the past up to now.
local function buckets_refused()
  for _, b in ipairs(buckets) do
    if bucket_due(b) == 0 then set_tat(b, math.max(tat_rel(b) or 0, 0)) end
  end
end

-- The wait (ms, 0: none) the buckets ask of a take.
local function buckets_wait()
  local wait = 0
  for _, b in ipairs(buckets) do
    local due = bucket_due(b)
    if due > 0 then wait = math.max(wait, math.ceil(due / 1e6)) end
  end
  return wait
end

-- Call id is granted: TAT = max(TAT, now) + T in each bucket.
local function buckets_grant(id)
  for _, b in ipairs(buckets) do
    set_tat(b, math.max(tat_rel(b) or 0, 0) + b.T)
    redis.call('HSET', b.key, 'c:' .. id, 1)
    keep(b.key, hold + 1000)
  end
end

-- Call id came back (sent: true) or was never sent: it leaves the
-- buckets; one never sent gives its unit back.
local function buckets_settle(id, sent)
  for _, b in ipairs(buckets) do
    if redis.call('HDEL', b.key, 'c:' .. id) == 1 and not sent then
      local rel = tat_rel(b)
      if rel then set_tat(b, rel - b.T) end
    end
  end
end

