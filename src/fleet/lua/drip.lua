-- The drip rules: the SpikeArrest mirror (src/rate/spike_pace.rs) and the
-- token bucket (src/rate/bucket.rs), each the in-process rule step for step
-- on one clock in whole ms; tests/it/fleet/rule.rs runs both stores through
-- the same scenarios (src/rate/scenario/drip.rs) and fails on any answer
-- that differs.
--
-- A call of a drip rule holds a concurrency lease (KEYS[2]) while in flight
-- and no window entry. Its state lives in the limit hash (KEYS[4]) beside
-- the epoch, so a Redis that forgets the state forgets the epoch as well
-- and the loss check sees it; the state then starts again empty, the fleet
-- is held one window (W, the rule's period), and every process puts its
-- calls in flight back as leases. The pause (KEYS[3]) is the fleet's.
--
-- SpikeArrest (s_*): messagesPerPeriod s_count per W ms. In the gateway's
-- own integer units (a token is W units, the drip pays back s_count units
-- a ms): s_debt, calls sent and not dripped back as of s_last (ms). Calls in
-- flight are the live leases: the drip never pays them back.
-- Token bucket (b_*): b_cap tokens dripping in at b_rate a second (the Rust
-- rule's sizing, passed as text that reads back to the same double),
-- b_tokens as of b_last, and b_created / b_released for a shrink soon after
-- the start (TokenBucket::shrink_to).
--
-- spike_take / bucket_take: ARGV[7] id, ARGV[8] and ARGV[9] the rule (spike:
-- messagesPerPeriod, unused; bucket: capacity, rate a second), ARGV[10] the
-- concurrency ceiling (0: none), then a settle list (pairs id, ago; ago < 0:
-- never sent), a restore block (only calls in flight count) and the loss
-- check's three arguments, as for take (window.lua). Returns {1, rate's
-- count or capacity, calls in flight, 0, 0} or {0, ms, why} (why as for
-- take), with the epoch appended when the loss check was asked for.
-- spike_settle / bucket_settle: ARGV[7...] a settle list.
-- spike_pause / bucket_pause: ARGV[7] pause ms, ARGV[8..9] the rule, then a
-- settle list. Returns {ms until the pause ends, 0}: these rules learn
-- nothing from a 429.
-- spike_inforce: ARGV[7] the reported count, ARGV[8..9] the rule.
-- bucket_inforce: ARGV[7] the reported count, ARGV[8..9] the rule, ARGV[10]
-- and ARGV[11] the bucket sized for the reported count, ARGV[12] the span
-- (W plus the skew allowance) in microseconds. Return 1 when the rule slowed.

local function fmt(x) return string.format('%.17g', x) end

local function live_leases()
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  return redis.call('ZCARD', KEYS[2])
end

local function spike_bucket(count) return math.max(1, math.floor(count / 10)) end

local save

-- A rule's state, made (and kept) on first use: full, as the gateway's
-- bucket is for an identifier it has not seen lately, or empty (`empty`)
-- after Redis forgot the fleet, when the API may have had calls the fleet
-- no longer knows of. `a` nil: none is made (nil when there is none).
local function load(kind, a, b, empty)
  if kind == 'spike' then
    local h = redis.call('HMGET', KEYS[4], 's_count', 's_debt', 's_last')
    if h[1] then
      return {count = tonumber(h[1]), debt = tonumber(h[2]), last = tonumber(h[3])}
    end
    if not a then return nil end
    local count = math.max(1, a)
    local st = {count = count, debt = 0, last = now}
    if empty then st.debt = spike_bucket(count) * W end
    save(kind, st)
    return st
  end
  local h = redis.call('HMGET', KEYS[4], 'b_cap', 'b_rate', 'b_tokens', 'b_last',
    'b_created', 'b_released')
  if h[1] then
    return {cap = tonumber(h[1]), rate = tonumber(h[2]), tokens = tonumber(h[3]),
      last = tonumber(h[4]), created = tonumber(h[5]), released = tonumber(h[6])}
  end
  if not a then return nil end
  local st = {cap = a, rate = b, tokens = a, last = now, created = now, released = 0}
  if empty then st.tokens = 0 end
  save(kind, st)
  return st
end

save = function(kind, st)
  if kind == 'spike' then
    redis.call('HSET', KEYS[4], 's_count', fmt(st.count), 's_debt', fmt(st.debt),
      's_last', fmt(st.last))
  else
    redis.call('HSET', KEYS[4], 'b_cap', fmt(st.cap), 'b_rate', fmt(st.rate),
      'b_tokens', fmt(st.tokens), 'b_last', fmt(st.last), 'b_created', fmt(st.created),
      'b_released', fmt(st.released))
  end
  keep(KEYS[4], limit_ttl)
end

-- SpikePace::advance: the drip pays back what it can up to t, never the
-- calls in flight.
local function spike_advance(st, t, flying)
  if t <= st.last then return end
  st.debt = math.max(st.debt - (t - st.last) * st.count, 0, flying * W)
  st.last = t
end

-- TokenBucket::refill, with its seconds computed as Duration::as_secs_f64
-- computes them, so both stores add the same double.
local function bucket_refill(st, t)
  if t <= st.last then return end
  local ms = t - st.last
  local secs = math.floor(ms / 1000)
  local dt = secs + ((ms - secs * 1000) * 1000000) / 1e9
  st.tokens = math.min(st.tokens + dt * st.rate, st.cap)
  st.last = t
end

-- Completions and cancellations: a completion lets the spike drip resume
-- from its response; a call never sent gives its token back. Either way
-- its lease goes. A permit without a lease (expired) changes nothing more.
local function drip_settle(i, kind, st)
  local n = tonumber(ARGV[i])
  i = i + 1
  for _ = 1, n do
    local id, ago = ARGV[i], tonumber(ARGV[i + 1])
    i = i + 2
    if st and redis.call('ZSCORE', KEYS[2], id) then
      if kind == 'spike' and ago >= 0 then
        spike_advance(st, now - ago, live_leases())
      elseif kind == 'spike' then
        st.debt = math.max(0, st.debt - W)
      elseif ago < 0 then
        st.tokens = math.min(st.tokens + 1, st.cap)
        st.released = math.max(0, st.released - 1)
      end
    end
    redis.call('ZREM', KEYS[2], id)
  end
  return i
end

-- Whole ms until a bucket with st.tokens has one, rounded up from the
-- nanoseconds Duration::from_secs_f64 makes of the Rust rule's wait.
local function bucket_wait(st)
  local secs = (1 - st.tokens) / st.rate
  if secs ~= secs or secs > 3e9 then return 3e12 end
  local ns = math.max(1000, math.floor(secs * 1e9 + 0.5))
  return math.max(1, math.ceil(ns / 1e6))
end

-- Whether the rule lets a call go now; else the ms to wait.
local function drip_rule(kind, st, flying)
  if kind == 'spike' then
    spike_advance(st, now, flying)
    local room = (spike_bucket(st.count) - 1) * W
    if st.debt <= room then return true end
    return false, math.max(1, math.ceil((st.debt - room) / st.count))
  end
  bucket_refill(st, now)
  if st.tokens >= 1 - 1e-9 then return true end
  return false, bucket_wait(st)
end

local function drip_take(kind)
  local id, a, b, ceiling = ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
  local lost, epoch = forgotten(after_blocks(11), KEYS[2])
  if lost then
    load(kind, a, b, true)
    return {0, 1, 4, epoch}
  end
  local st = load(kind, a, b, false)
  local i = drip_settle(11, kind, st)
  restore(i, true)
  local flying = live_leases()
  local size = st.cap or st.count
  -- A retried take whose first answer was lost: it was granted.
  if redis.call('ZSCORE', KEYS[2], id) then
    return answer({1, size, flying, 0, 0}, epoch)
  end
  if kind == 'spike' then spike_advance(st, now, flying) end
  local p = tonumber(redis.call('GET', KEYS[3]) or '0')
  local held = tonumber(redis.call('HGET', KEYS[4], 'held_until') or '0')
  local wait, why = 0, 0
  if p > now then
    wait, why = p - now, 1
  elseif held > now then
    wait, why = held - now, 2
  else
    local ok, ms = drip_rule(kind, st, flying)
    if not ok then
      wait, why = ms, 2
    elseif ceiling > 0 and flying >= ceiling then
      local e = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
      wait, why = math.max(1, tonumber(e[2]) - now), 3
    end
  end
  if why > 0 then
    save(kind, st)
    return answer({0, wait, why}, epoch)
  end
  if kind == 'spike' then
    st.debt = st.debt + W
  else
    st.tokens = math.max(st.tokens - 1, 0)
    st.released = st.released + 1
  end
  save(kind, st)
  redis.call('ZADD', KEYS[2], now + lease, id)
  keep(KEYS[2], lease + 1000)
  return answer({1, size, flying + 1, 0, 0}, epoch)
end

local kind = nil
if op:sub(1, 6) == 'spike_' then kind = 'spike' end
if op:sub(1, 7) == 'bucket_' then kind = 'bucket' end
local verb = kind and op:sub(#kind + 2)

if verb == 'take' then return drip_take(kind) end

if verb == 'settle' then
  local st = load(kind, nil, nil, false)
  drip_settle(7, kind, st)
  if st then save(kind, st) end
  return tonumber(ARGV[7])
end

if verb == 'pause' then
  local ms, a, b = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
  local st = load(kind, a, b, false)
  -- The caller's completions first: the refused call is among them.
  drip_settle(10, kind, st)
  local p = tonumber(redis.call('GET', KEYS[3]) or '0')
  local ends = math.max(p, now + ms)
  if kind == 'spike' then
    spike_advance(st, now, live_leases())
    st.debt = math.max(st.debt, spike_bucket(st.count) * W + (ends - now) * st.count)
  else
    -- Emptied, and refilling only from the pause's end: nobody bursts then.
    bucket_refill(st, now)
    st.tokens = 0
    st.last = math.max(st.last, ends)
  end
  set_for(KEYS[3], ends, math.max(1, ends - now))
  save(kind, st)
  return {ends - now, 0}
end

if verb == 'inforce' then
  local l, a, b = math.max(1, tonumber(ARGV[7])), tonumber(ARGV[8]), tonumber(ARGV[9])
  local st = load(kind, a, b, false)
  if kind == 'spike' then
    if l >= st.count then return 0 end
    spike_advance(st, now, live_leases())
    st.count = l
  else
    local cap, rate, span = tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
    if rate >= st.rate then return 0 end
    bucket_refill(st, now)
    st.cap = math.min(cap, st.cap)
    st.rate = rate
    st.tokens = math.min(st.tokens, st.cap)
    -- Everything released so far may still be in the server's window: it
    -- is owed out of the smaller budget (negative tokens are a debt).
    if (now - st.created) * 1000 < span then st.tokens = st.tokens - st.released end
  end
  save(kind, st)
  return 1
end
