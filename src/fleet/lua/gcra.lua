-- The GCRA buckets (`--limit N/W,burst=B`, of calls or of tokens), each
-- kept beside the window rule as rate/gcra.rs keeps it in-process: a call
-- must fit in every window and in every bucket. KEYS[6...] named
-- `...:gcra:T:TAU:D` (ns, from the client's Gcra: T = W/N rounded up, TAU
-- = B·T, D the skew allowance), or `...:gcra:T:TAU:D:U` for a bucket of
-- tokens, U what it counts (tokens, input-tokens, output-tokens), where T
-- is one token's share and a call weighs its estimate of that part
-- (weight_of) until its response says what it used. Each is a HASH:
-- tat_ms + tat_ns = the theoretical arrival time (unix ms and the ns within
-- it: a double holds unix ms exactly, not unix ns), c:ID = the units of
-- each call in flight (so that a call never sent gives them back once),
-- held_until = no call before then (unix ms; stated.lua `empty`). A
-- bucket forgotten with the fleet (FLUSHALL, DEL of the limit) is a loss
-- the epoch tells; one evicted alone starts again full.
local buckets = {}
for k = 6, #KEYS do
  local t, tau, d, unit = string.match(KEYS[k], ':gcra:(%d+):(%d+):(%d+):?([%a%-]*)$')
  if t and (unit == '' or TOKEN_UNITS[unit]) then
    buckets[#buckets + 1] = {
      key = KEYS[k], T = tonumber(t), tau = tonumber(tau), D = tonumber(d),
      unit = TOKEN_UNITS[unit] and unit or nil,
    }
  end
end

-- The units a call of `weight` (weight_of) takes of bucket b.
local function units(b, weight)
  if b.unit then return weight[b.unit] end
  return 1
end

-- The TAT in ns after now (negative: before), or nil for an idle bucket;
-- the skew allowance D in ns: the name's, or the wider one a 429 left in
-- the hash (`d`, buckets_widen); and ns until its hold ends (0: none; a
-- told bucket of calls said empty, stated.lua `empty`). One read of the
-- hash: a take asks it of every bucket.
local function tat_rel(b)
  local h = redis.call('HMGET', b.key, 'tat_ms', 'tat_ns', 'd', 'held_until')
  local d = math.max(b.D, tonumber(h[3] or '0') or 0)
  local held = math.max((tonumber(h[4] or '0') - now) * 1e6, 0)
  if not h[1] then return nil, d, held end
  return (tonumber(h[1]) - now) * 1e6 + tonumber(h[2]), d, held
end

-- The units bucket b holds, its TAT `rel` ns from now (nil: idle), as
-- Gcra::level: the intervals the TAT runs ahead, rounded up.
local function level_of(b, rel)
  return math.ceil(math.max(rel or 0, 0) / b.T)
end

-- Keeps bucket b for the hold and until its TAT (`rel` ns from now) has
-- passed: expired sooner, it would start again full, and a bucket of
-- tokens runs its TAT far ahead (a day's budget, a call that used more
-- than it was estimated at).
local function keep_bucket(b, rel)
  keep(b.key, math.max(hold, math.ceil((rel or 0) / 1e6)) + 1000)
end

local function set_tat(b, rel)
  local ms = math.floor(rel / 1e6)
  redis.call('HSET', b.key, 'tat_ms', now + ms, 'tat_ns', rel - ms * 1e6)
  keep_bucket(b, rel)
end

-- ns until bucket b admits a call of w units (0: now): it passes when
-- max(TAT + D, now) + (w-1)·T <= now + TAU; one heavier than the whole
-- bucket goes alone, once the bucket is empty. A bucket held (`held`, by
-- `empty`) admits nothing before its hold ends, and then as it would then.
local function bucket_due(b, w)
  local rel, d, at = tat_rel(b)
  if not rel then return at end
  local start = math.max(rel + d, at)
  local extra = math.max(w - 1, 0) * b.T
  if start + extra <= at + b.tau then return at end
  if extra > b.tau then return start end
  return math.max(start + extra - b.tau, at)
end

-- A take refused elsewhere: a bucket that would have admitted the call
-- is left as in-process, where it granted and gave the units back, which
-- moves a TAT in the past up to now.
local function buckets_refused(weight)
  for _, b in ipairs(buckets) do
    if bucket_due(b, units(b, weight)) == 0 then set_tat(b, math.max(tat_rel(b) or 0, 0)) end
  end
end

-- The wait (ms, 0: none) the buckets ask of a take estimated at `weight`.
local function buckets_wait(weight)
  local wait = 0
  for _, b in ipairs(buckets) do
    local due = bucket_due(b, units(b, weight))
    if due > 0 then wait = math.max(wait, math.ceil(due / 1e6)) end
  end
  return wait
end

-- Call id is granted: TAT = max(TAT, now) + w·T in each bucket.
local function buckets_grant(id, weight)
  for _, b in ipairs(buckets) do
    local w = units(b, weight)
    set_tat(b, math.max(tat_rel(b) or 0, 0) + w * b.T)
    redis.call('HSET', b.key, 'c:' .. id, w)
  end
end

-- A rate-limit 429 came: every bucket's allowance doubles, up to the
-- larger of T and its tolerance, for as long as the bucket is kept, as
-- in-process (rate::gcra::Gcra::widen): the spread between sends and
-- arrivals is wider than allowed for, and a 429 costs a pause.
local function buckets_widen()
  for _, b in ipairs(buckets) do
    local rel, d = tat_rel(b)
    local wider = math.min(math.max(b.T, b.tau), math.max(1, 2 * d))
    if wider > d then
      redis.call('HSET', b.key, 'd', wider)
      keep_bucket(b, rel)
    end
  end
end

-- Call id came back (sent: true, having used `used` (weight_of) when its
-- response said) or was never sent: it leaves the buckets. One never sent
-- gives its units back; a bucket of tokens moves by what it used of its
-- part beyond (or short of) its estimate.
local function buckets_settle(id, sent, used)
  for _, b in ipairs(buckets) do
    local w = tonumber(redis.call('HGET', b.key, 'c:' .. id) or '-1')
    if w >= 0 then
      redis.call('HDEL', b.key, 'c:' .. id)
      local rel = tat_rel(b)
      if rel and not sent then
        set_tat(b, rel - w * b.T)
      elseif rel and b.unit and used then
        set_tat(b, rel + (used[b.unit] - w) * b.T)
      end
    end
  end
end
