-- The exact sliding-window rule (see common.lua for the keys and the
-- arguments every op starts with).

-- Completed and cancelled permits, from ARGV[i]: a count, then pairs
-- (id, ago). ago >= 0: the response arrived ago ms before now, so the call
-- occupies until now - ago + W (+ the rounding margin). ago < 0: the call was
-- never sent and stops occupying at once. Either way its lease is released.
-- A call granted before the last lowering that comes back is noted: a 429
-- just after it may be its own, from the old pace, and teaches nothing.
local function settle(i)
  local n = tonumber(ARGV[i])
  i = i + 1
  local lowered = tonumber(redis.call('HGET', KEYS[4], 'lowered_at') or '0')
  for _ = 1, n do
    -- ago may carry the tokens the call used: 'ago/used' (weight_of).
    local id, ago, used = ARGV[i], tonumber(ARGV[i + 1]), nil
    if not ago then
      local a, u = string.match(ARGV[i + 1], '^(%-?%d+)/([%d,]+)$')
      ago, used = tonumber(a), weight_of(u)
    end
    i = i + 2
    local sent = sent_entry(redis.call('HGET', KEYS[5], id)) or -1
    redis.call('HDEL', KEYS[5], id)
    -- A response cannot precede its send; two threads of a client reading
    -- the clock in one order and settling in the other can make it look so.
    local back = math.max(now - ago, sent)
    -- <=: a lowering starts a pause, so nothing is granted in its
    -- millisecond after it.
    if ago >= 0 and sent >= 0 and sent <= lowered then
      if back > tonumber(redis.call('HGET', KEYS[4], 'stale_done') or '0') then
        redis.call('HSET', KEYS[4], 'stale_done', back)
      end
    end
    buckets_settle(id, ago >= 0, used)
    if ago >= 0 then tallies_settle(id, back, used) else tallies_settle(id, nil, nil) end
    if ago < 0 then
      redis.call('ZREM', KEYS[1], id)
    else
      redis.call('ZADD', KEYS[1], 'XX', back + W + round, id)
    end
    for _, f in ipairs(further) do
      if ago < 0 then
        redis.call('ZREM', f.key, id)
      else
        redis.call('ZADD', f.key, 'XX', occupied_until(f, back), id)
      end
    end
    redis.call('ZREM', KEYS[2], id)
  end
  return i
end

-- The limit in force now: the configured cap (0: none), below it the
-- server-reported limit scaled by the headroom, below that the learnt one.
-- Returns it, whether a learnt limit is in play, the learnt limit (0: none)
-- and whether it settled. As in-process, a
-- learnt limit is first settled by one clean window (no 429 since it was
-- learnt), then probes up by one per clean window that used it in full
-- ("pressed"), never up to the limit the server refused, never above the cap.
local function effective(cap, headroom)
  local lim = cap
  local h = redis.call('HMGET', KEYS[4], 'in_force', 'learnt', 'learnt_at',
    'settled', 'pressed', 'refused_at')
  local in_force = tonumber(h[1] or '0')
  if in_force > 0 then
    local scaled = math.max(1, math.floor(in_force * headroom + 1e-9))
    if lim == 0 or scaled < lim then lim = scaled end
  end
  local learnt = tonumber(h[2] or '0')
  if learnt == 0 or lim == 0 then return lim, false, 0, false end
  local settled = h[4] == '1'
  local paused = tonumber(redis.call('GET', KEYS[3]) or '0') > now
  if not paused and now - tonumber(h[3] or '0') >= W then
    local refused = tonumber(h[6] or '0')
    local ceiling = cap
    if refused > 0 and refused - 1 < ceiling then ceiling = refused - 1 end
    if not settled then
      redis.call('HSET', KEYS[4], 'settled', 1)
      settled = true
    elseif h[5] == '1' and learnt < ceiling then
      learnt = learnt + 1
      redis.call('HSET', KEYS[4], 'learnt', learnt)
    end
    redis.call('HSET', KEYS[4], 'learnt_at', now, 'pressed', 0)
    keep(KEYS[4], limit_ttl)
  end
  if learnt < lim then lim = learnt end
  return lim, true, learnt, settled
end

-- Whether a 429 now may belong to a call from before the last lowering:
-- one still in flight, or one back within the grace. Counting it would
-- lower the limit again for the same overrun.
local function stale()
  local lowered = tonumber(redis.call('HGET', KEYS[4], 'lowered_at') or '0')
  if lowered == 0 then return false end
  local back = tonumber(redis.call('HGET', KEYS[4], 'stale_done') or '0')
  if back > 0 and now - back < grace then return true end
  for _, v in ipairs(redis.call('HVALS', KEYS[5])) do
    if sent_entry(v) <= lowered then return true end
  end
  return false
end

-- The even pace (a bare rate whose burst was refused, see pause): one
-- call per W/L times 1 + EVEN_SKEW at the limit in force L, with no burst,
-- from `even_tat` (the next slot, ms) in KEYS[4]. EVEN_SKEW is the
-- in-process even pace's allowance (rate::learn::SKEW; a test holds the
-- two equal): two calls sent one interval apart may arrive closer.
local EVEN_SKEW = 0.1
-- After a refused burst, the even pace starts at RAMP_FROM of its rate and
-- rises to all of it over a window from `ramp_since` (the in-process
-- ramp, rate::learn::RAMP_FROM): a rate far below the one paced is then
-- refused after a longer span than the burst was, and the two refusals
-- tell a bucket's rate from its burst (see pause).
local RAMP_FROM = 0.25
local function even_interval(lim, ramp_since, skew)
  local share = 1
  if ramp_since > 0 and now < ramp_since + W then
    share = RAMP_FROM + (1 - RAMP_FROM) * math.max(0, now - ramp_since) / W
  end
  return W * (1 + skew) / (lim * share)
end

-- The even pace as it stands now, read once per take: whether it holds,
-- its next slot (ms), whether it is still a bare rate's start (the op
-- `start`), when its ramp began (0: none) and its skew. A start that
-- reached its end with no 429 hands over (`handover`, unix ms, its end):
-- for a window more the pace goes on at the limit itself, no skew, from
-- the start's last slot, as in-process (rate::learn, `handover`): the
-- places the start's pace left unused (a tenth of the limit) then go one
-- by one, not at once, which a bucket with a smaller burst would refuse.
-- After it the fleet goes on as a window, bursts allowed.
local function even_now()
  local h = redis.call('HMGET', KEYS[4], 'even', 'even_tat', 'start_ends', 'ramp_since',
    'handover')
  local ends, handover = tonumber(h[3] or '0'), tonumber(h[5] or '0')
  if ends > 0 and now >= ends then
    redis.call('HDEL', KEYS[4], 'even', 'start_ends')
    redis.call('HSET', KEYS[4], 'handover', ends + W)
    h[1], ends, handover = nil, 0, ends + W
  end
  if h[1] ~= '1' and handover > 0 then
    if now < handover then
      return true, tonumber(h[2] or '0'), false, 0, 0
    end
    redis.call('HDEL', KEYS[4], 'even_tat', 'handover')
    return false, 0, false, 0, 0
  end
  return h[1] == '1', tonumber(h[2] or '0'), ends > 0, tonumber(h[4] or '0'), EVEN_SKEW
end

-- take: ARGV[7] id, ARGV[8] cap (0: no window limit), ARGV[9] headroom,
-- ARGV[10] concurrency ceiling (0: none), ARGV[11] the call's estimated
-- tokens (weight_of; tokens.lua, gcra.lua), then a settle list (an ago
-- may be 'ago/used', the tokens the response said the call used, as the
-- estimate), then a restore block. Returns {1, limit, occupancy, learnt
-- limit or 0, 1 if it settled, 1 if the fleet is paced evenly} when the
-- call may start (its entry and lease are added), or {0, ms to
-- wait, why}: 1 paused, 2 window full (or held after remaining: 0),
-- 3 concurrency ceiling reached, 4 Redis forgot the fleet (put your calls
-- back), 5 a policy was adopted whose key this take did not pass (fetch
-- KEYS[4] `stated`, stated.lua), 6 held until a used-up quota resets
-- (KEYS[4] `held_by` names it, stated.lua; then a fourth element: ms
-- until that reset, while the wait may be longer). After the restore block, the loss check's three arguments (see
-- forgotten); with them, every answer ends with the fleet's epoch.
-- How long until a window `key` holding n >= lim occupancies has room:
-- until the occupancy whose end makes room ends. A call still in flight has
-- only a provisional end, far off; it may come back at any moment and end w
-- after, and no other process can wake this one then: look again by w.
local function full_wait(key, n, lim, w)
  local e = redis.call('ZRANGE', key, n - lim, n - lim, 'WITHSCORES')
  return math.max(1, math.min(tonumber(e[2]) - now, w + round))
end

-- How long (ms) the fleet is held once Redis forgot it, past the one
-- window every process has to put its calls back: the token windows and
-- buckets are not put back (no process keeps every call's weight), so
-- the fleet waits until what the server still counts of them has left
-- it, at most five minutes (a daily quota of tokens is the server's to
-- refuse; one would not hold the fleet for a day).
local function forgotten_span()
  local span = W
  -- A token window's calls are not put back: held until what the server
  -- counted of them has left it, and a skew allowance more (W/20, at most
  -- 200 ms, as the buckets' D): a call granted just before the loss
  -- reaches the server, and is counted, a little after it was found.
  for _, t in ipairs(tallies) do
    span = math.max(span, t.W + round + math.min(math.floor(t.W / 20), 200))
  end
  for _, b in ipairs(buckets) do span = math.max(span, math.ceil((b.tau + b.T + b.D) / 1e6)) end
  return math.min(span, 300000)
end

-- recall: after Redis forgot the fleet, what a process last heard of its
-- learning, put back in the same take that puts its calls back (so no
-- take is granted at the full cap meanwhile): l the learnt limit (0:
-- none), even true if paced evenly for a refused burst, from the block's
-- prefix (see `restore`). The lowest limit recalled wins, taken as settled
-- (it held before the loss; a limit heard before a later probe is lower,
-- which errs on the safe side); what probing had been refused is
-- forgotten with the rest. The fleet is past its start. Nothing is
-- recalled over a stated limit.
--
-- From a job's checkpoint ('c', only by a take that began the fleet, in
-- `epoch`), the same, marked `recalled` with that epoch; with a most
-- ('c@M'), not probed above M either (the run that learnt it had a limit
-- refused above it). A fleet began by a process may still have had others
-- running: Redis restarted under them, or its hash expired while they
-- waited. Their own learning, put back after the loss by a process that
-- last heard another epoch ('l@E'), then replaces the checkpoint's, once;
-- a process that heard the recalled fleet puts back as any other. A
-- lowering the fleet learns itself ends the mark too (`pause`).
local function recall(l, even, from, epoch)
  local h = redis.call('HMGET', KEYS[4], 'learnt', 'in_force', 'even', 'recalled')
  local kind, arg = string.match(from, '^(%a?)@?(%d*):?$')
  local heard = kind == 'l' and arg or ''
  if h[4] and heard ~= '' and heard ~= h[4] then
    redis.call('HDEL', KEYS[4], 'recalled', 'learnt', 'settled', 'learnt_at', 'pressed',
      'refused_at')
    if not even then redis.call('HDEL', KEYS[4], 'even', 'even_tat') end
    h = {nil, h[2], even and h[3] or nil, nil}
  end
  if l == 0 and not even then return end
  redis.call('HSET', KEYS[4], 'started', 1)
  keep(KEYS[4], limit_ttl)
  if h[2] then return end
  if l > 0 and (not h[1] or tonumber(h[1]) > l) then
    -- Its clean window starts when calls may go again, as after a pause:
    -- the hold a loss begins is no window of the limit used in full
    -- (counted as one, the limit was probed a window early).
    local from_t = math.max(now, tonumber(redis.call('HGET', KEYS[4], 'held_until') or '0'))
    redis.call('HSET', KEYS[4], 'learnt', l, 'settled', 1, 'learnt_at', from_t, 'pressed', 0)
    if kind == 'c' and arg ~= '' then
      redis.call('HSET', KEYS[4], 'refused_at', math.max(l, tonumber(arg)) + 1)
    end
  end
  if kind == 'c' then redis.call('HSET', KEYS[4], 'recalled', epoch or 1) end
  if even then
    -- A start begun since the loss (a process that joined) would end the
    -- even pace a window later: it is for good now.
    redis.call('HDEL', KEYS[4], 'start_ends', 'handover')
    if h[3] ~= '1' then redis.call('HSET', KEYS[4], 'even', 1, 'even_tat', now) end
  end
end

if op == 'take' then
  local id = ARGV[7]
  local cap, headroom, ceiling = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
  local weight = weight_of(ARGV[11]) or weight_of(nil)
  local lost, epoch, began = forgotten(after_blocks(12), KEYS[1], forgotten_span())
  if lost then return {0, 1, 4, epoch} end
  local i = settle(12)
  local _, learnt_heard, even_heard, from = restore(i)
  -- A checkpoint's learning only where no fleet runs (see recall).
  if began or string.sub(from, 1, 1) ~= 'c' then
    recall(learnt_heard, even_heard, from, epoch)
  end
  -- A policy adopted by another process (stated.lua) this take does not
  -- pass: the caller fetches the list and asks again.
  if stated_unknown() then return answer({0, 1, 5}, epoch) end
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  local lim, learning, learnt, settled = effective(cap, headroom)
  local occ = redis.call('ZCARD', KEYS[1])
  local s = 0
  if settled then s = 1 end
  -- A retried take whose first answer was lost: it was granted.
  local pacing, tat, starting, ramp_since, skew = even_now()
  pacing = pacing and lim > 0
  local even = 0
  if pacing and not starting and skew > 0 then even = 1 end
  if redis.call('ZSCORE', KEYS[1], id) then return answer({1, lim, occ, learnt, s, even}, epoch) end
  local p = tonumber(redis.call('GET', KEYS[3]) or '0')
  local held = tonumber(redis.call('HGET', KEYS[4], 'held_until') or '0')
  local wait, why, quota = 0, 0, false
  if p > now then
    wait, why = p - now, 1
  elseif held > now then
    wait, why = held - now, 2
    quota = redis.call('HEXISTS', KEYS[4], 'held_by') == 1
  else
    -- Only a take that may go counts towards a clean window used in full:
    -- one during a pause or hold is before that window began.
    if learning and lim > 0 and occ + 1 >= lim then
      redis.call('HSET', KEYS[4], 'pressed', 1)
    end
    if lim > 0 and occ >= lim then
      wait, why = full_wait(KEYS[1], occ, lim, W), 2
    end
  end
  -- Every further window must admit the call too: the latest answer wins.
  for _, f in ipairs(further) do
    redis.call('ZREMRANGEBYSCORE', f.key, '-inf', now)
    local n = redis.call('ZCARD', f.key)
    if n >= f.L then
      wait = math.max(wait, full_wait(f.key, n, f.L, f.W))
      if why == 0 then why = 2 end
    end
  end
  -- And the even pace (the start's, or once a burst was refused). A take
  -- it holds back (not one paused or held) used the limit in full, as
  -- in-process: the pace is what the limit allows, and a window paced
  -- evenly seldom holds the whole limit.
  if pacing and tat > now and why ~= 1 then
    wait = math.max(wait, math.ceil(tat - now))
    if why == 0 then why = 2 end
    if learning and held <= now then redis.call('HSET', KEYS[4], 'pressed', 1) end
  end
  -- And every bucket.
  local bw = buckets_wait(weight)
  if bw > 0 then
    wait = math.max(wait, bw)
    if why == 0 then why = 2 end
  end
  -- And every token window.
  local tw = tallies_wait(weight)
  if tw > 0 then
    wait = math.max(wait, tw)
    if why == 0 then why = 2 end
  end
  if why > 0 then
    buckets_refused(weight)
    -- A used-up quota's hold says how long it lasts itself: a process
    -- halts on the quota only when that is far off, not when a window of
    -- its own is full for longer.
    if quota then return answer({0, wait, 6, held - now}, epoch) end
    return answer({0, wait, why}, epoch)
  end
  if ceiling > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
    if redis.call('ZCARD', KEYS[2]) >= ceiling then
      local e = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
      buckets_refused(weight)
      return answer({0, math.max(1, tonumber(e[2]) - now), 3}, epoch)
    end
  end
  buckets_grant(id, weight)
  tallies_grant(id, weight)
  if pacing then
    local slot = math.max(now, tat) + even_interval(lim, ramp_since, skew)
    redis.call('HSET', KEYS[4], 'even_tat', string.format('%.3f', slot))
  end
  redis.call('ZADD', KEYS[1], now + hold, id)
  for _, f in ipairs(further) do
    redis.call('ZADD', f.key, now + f.hold, id)
    keep(f.key, f.hold + 1000)
  end
  redis.call('ZADD', KEYS[2], now + lease, id)
  -- The estimate goes with the call, for a token window adopted while it
  -- is out (stated.lua).
  if weighs(weight) then
    local w = weight['tokens'] .. ',' .. weight['input-tokens'] .. ',' .. weight['output-tokens']
    redis.call('HSET', KEYS[5], id, now .. ' ' .. w)
  else
    redis.call('HSET', KEYS[5], id, now)
  end
  keep(KEYS[1], hold + 1000)
  keep(KEYS[2], lease + 1000)
  keep(KEYS[5], hold + 1000)
  return answer({1, lim, occ + 1, learnt, s, even}, epoch)
end

-- settle: ARGV[7...] a settle list. Returns the number settled.
if op == 'settle' then
  settle(7)
  return tonumber(ARGV[7])
end

-- When the refused call was sent (unix ms), from the settle list at
-- ARGV[i]: the completion that arrived last (the 429 this pause is for),
-- read before settle forgets it; now when none is known.
local function refused_sent(i)
  local best, at = nil, now
  for k = 0, tonumber(ARGV[i]) - 1 do
    local ago = tonumber(string.match(ARGV[i + 2 + 2 * k], '^(%-?%d+)'))
    local s = sent_entry(redis.call('HGET', KEYS[5], ARGV[i + 1 + 2 * k]))
    -- Of two that arrived at once, the later sent.
    if s and ago and ago >= 0 and (not best or ago < best or (ago == best and s > at)) then
      best, at = ago, s
    end
  end
  return at
end

-- Calls in flight granted from `from` until before `before` (unix ms):
-- sent ahead of the refused call, so accepted (a bucket accepts whatever
-- reaches it before it refuses), though their answers may not be settled
-- yet (another process settles at its next take).
local function flying_between(from, before)
  local n = 0
  for _, v in ipairs(redis.call('HVALS', KEYS[5])) do
    local s = sent_entry(v)
    if s and s >= from and s < before then n = n + 1 end
  end
  return n
end

-- The rate (calls per ms) of the GCRA bucket that refuses the first
-- refusal's call and the ramp's as they came, paced to `lim`: the start
-- (or a burst, t1 = 0) accepted a1 calls before the one it refused, sent
-- t1 ms after it began at the even pace p1; the ramp's refused call went
-- t2 ms after the ramp began. A bucket of rate r and burst b, full at a
-- span's start, accepts calls until what was sent beyond r adds up to
-- b + 1 - r/p (p the pace then; the call that overflows counts in
-- part). So b = a1 - r·t1 - (1 - r/p1) (a burst at once: a1 - 1), and
-- the ramp, under r until t* (its pace reaching r) and over it after,
-- sends beyond r ∫[t*, t2] (p(t) - r) dt, which must equal b + 1 - r/p(t2).
-- Both sides fall as r grows: the root, by bisection, is the rate.
local function bucket_rate(lim, a1, t1, t2)
  local unit = lim / ((1 + EVEN_SKEW) * W)
  local p0, k = unit * RAMP_FROM, unit * (1 - RAMP_FROM) / W
  local p2 = p0 + k * t2
  local function over(r)
    local b = a1 - 1
    if t1 > 0 then b = a1 - r * t1 - (1 - r / unit) end
    local ts = math.min(t2, math.max(0, (r - p0) / k))
    local sent = (p0 - r) * (t2 - ts) + k / 2 * (t2 * t2 - ts * ts)
    return sent - (math.max(0, b) + 1 - r / p2)
  end
  local lo, hi = 0, p2
  for _ = 1, 40 do
    local mid = (lo + hi) / 2
    if over(mid) > 0 then lo = mid else hi = mid end
  end
  return lo
end

-- The rate a ramp's refusal tells, as the limit per ms to pace evenly
-- to, given what it accepted beyond the first refusal per ms since
-- (`simple`, (a2 - a1) / (t2 - t1)). Nothing probes above it: a pace
-- over a bucket's rate only drains its burst, into a 429 a few windows on
-- (a run of 600 calls probed into a fourth), and over a bucket with no
-- burst it is refused at once.
-- - When the first refusal shows a burst (b of a call or more, rounded:
--   one call's fraction of a span is unknown, and a burst of 1 at 30 a
--   second read 0.6), a bucket with a burst is refused once the excess
--   fills it: that rate, paced as the limit whose even pace is the rate
--   itself, as in-process (rate::learn::fitted, `per_window`): the burst
--   takes what two calls' arrival brings closer.
-- - Without one, the ramp is refused as soon as its pace passes the
--   rate, long before what it accepted on average tells it: the rate the
--   bucket's replay gives (bucket_rate) as the limit, paced a tenth under
--   it, as two calls one interval apart may reach such a bucket a little
--   closer, and it lets none through early. The replay reads the rate to
--   a step of the ramp (at 30 a second about 2 a second: 28.8 or 30.8),
--   and the tenth covers the step.
local function ramp_rate(lim, a1, t1, t2, simple)
  local b = a1 - 1
  if t1 > 0 then b = a1 - simple * t1 - (1 - simple * (1 + EVEN_SKEW) * W / lim) end
  if b >= 0.5 then return simple * (1 + EVEN_SKEW) end
  return bucket_rate(lim, a1, t1, t2)
end

-- What a 429 during the ramp (the first lowering after a refused burst)
-- tells of the limit paced evenly at `lim`, given the window's count of
-- what was accepted (`count`), the calls still in flight (`leases`) and
-- when the refused call was sent (`sent`): the limit, and the least
-- refused (probing stays under it); nil when no ramp is running. If the
-- ramp accepted clearly more than the first refusal had (a2 against a1,
-- each counting the calls sent before the refused one whose answers are
-- not settled yet, flying_between), a bucket: its rate (ramp_rate), a
-- window's worth, and nothing above it refused. A window
-- accepts as many in either span: its count, but no more than a start
-- accepted in its window (a ramp across a fixed window's reset counts
-- two windows' calls).
local function ramp_limit(lim, count, leases, sent)
  local r = redis.call('HMGET', KEYS[4], 'ramp_since', 'ramp_a1', 'ramp_t1')
  local since = tonumber(r[1] or '0')
  if since == 0 then return nil end
  -- A ramp that ended with no 429 tells nothing of a later one: its
  -- state goes, and the window's count rules.
  if sent > since + W then
    redis.call('HDEL', KEYS[4], 'ramp_since', 'ramp_a1', 'ramp_t1')
    return nil
  end
  -- Set with ramp_since and deleted with it; a hash edited by hand may not.
  local a1, t1 = tonumber(r[2] or '0') or 0, tonumber(r[3] or '0') or 0
  if sent > since and sent - since <= W then
    local a2 = redis.call('ZCOUNT', KEYS[1], since + W + round, '+inf') - leases - 1
      + flying_between(since, sent)
    local da, dt = a2 - a1, (sent - since) - t1
    if da >= 2 and dt > 0 then
      local share = RAMP_FROM + (1 - RAMP_FROM) * (sent - since) / W
      local rate = ramp_rate(lim, a1, t1, sent - since, da / dt)
      local refused = math.min(math.ceil(share * lim), math.floor(rate * W) + 1)
      return math.floor(rate * W), refused
    end
  end
  if t1 > 0 and a1 > 0 then return math.min(count, a1), lim end
  return count, lim
end

-- pause: ARGV[7] pause ms, ARGV[8] the cap (0: none), ARGV[9] 1 to learn
-- under it, 2 to learn under a bare rate (its shape unknown), 0 to learn
-- nothing (the server states its limits), then a settle list. Every
-- process waits until the pause ends. Learning, and unless a pause was
-- already in force or a call from before the last lowering is in flight
-- or just back (the 429 may then be an older call's), the limit is lowered
-- to the answered calls occupying the window less the refused one (the
-- server counted neither it nor most calls still in flight), by at least
-- one. But under a bare rate, the first such 429 lowers nothing: the burst
-- was refused, not the rate (a bucket, as nginx limit_req keeps it, refuses
-- a window's calls sent at once), so the fleet paces evenly from the
-- pause's end (`even`), ramping up over its first window, and only a 429
-- at the even pace lowers the limit, which then stays paced evenly: a
-- window of it accepts that as well. The first lowering, during the ramp,
-- takes what the ramp tells instead of the window's count (ramp_limit).
-- Returns {ms until the pause ends, learnt limit or 0, 1 if this 429 began
-- the even pace}.
if op == 'pause' then
  local ms, cap = tonumber(ARGV[7]), tonumber(ARGV[8])
  local learning, bare = ARGV[9] == '1' or ARGV[9] == '2', ARGV[9] == '2'
  -- The caller's completions first: the refused call is among them.
  local sent = refused_sent(10)
  settle(10)
  buckets_widen()
  local ends = now + ms
  local p = tonumber(redis.call('GET', KEYS[3]) or '0')
  local learnt, began = 0, 0
  -- The learning clock first, as at a take: a clean window that ended by
  -- now settles or probes before this 429 starts the next one.
  local lim = 0
  if cap > 0 then lim = effective(cap, 1) end
  if learning and cap > 0 and p <= now and not stale() then
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
    local leases = redis.call('ZCARD', KEYS[2])
    local answered = redis.call('ZCARD', KEYS[1]) - leases
    local h = redis.call('HMGET', KEYS[4], 'even', 'learnt', 'start_ends', 'in_force',
      'handover')
    if bare and (h[1] ~= '1' or h[3]) and not h[2] and not h[4] then
      -- Calls sent before now were the burst's: their 429s teach nothing.
      -- What the burst had accepted (less the refused call), and over what
      -- span: the start's since it began (the fleet's first window), the
      -- handover's calls over the window before the refused one (those
      -- occupying it), or a burst's at once.
      local span, began_at = 0, 0
      if h[3] then
        began_at = tonumber(h[3]) - W
      elseif h[5] then
        began_at = math.max(tonumber(h[5]) - 2 * W, sent - W)
      end
      if began_at > 0 then span = math.max(0, sent - began_at) end
      local a1 = math.max(0, answered - 1) + flying_between(began_at, sent)
      local from = math.max(ends, p)
      redis.call('HSET', KEYS[4], 'even', 1, 'even_tat', from, 'ramp_since', from,
        'ramp_a1', a1, 'ramp_t1', span,
        'lowered_at', now, 'stale_done', 0)
      redis.call('HDEL', KEYS[4], 'start_ends')
      began = 1
    elseif answered > 0 and lim > 1 then
      local told, refused = ramp_limit(lim, answered - 1, leases, sent)
      if not told then told, refused = answered - 1, lim end
      learnt = math.max(1, math.min(lim - 1, refused - 1, told))
      redis.call('HSET', KEYS[4], 'learnt', learnt, 'settled', 0,
        'pressed', 0, 'refused_at', refused, 'lowered_at', now, 'stale_done', 0)
      -- Learnt by the fleet itself: no checkpoint's any more (see recall).
      redis.call('HDEL', KEYS[4], 'recalled')
      -- The ramp tells once.
      redis.call('HDEL', KEYS[4], 'ramp_since', 'ramp_a1', 'ramp_t1')
    end
  end
  if p > ends then ends = p end
  set_for(KEYS[3], ends, math.max(1, ends - now))
  -- A pause ends the handover, as in-process: after it, the window rules
  -- (or the even pace this 429 began).
  redis.call('HDEL', KEYS[4], 'handover')
  if began == 1 then keep(KEYS[4], limit_ttl) end
  -- The clean window starts when calls may go again. A 429 that may
  -- teach (as in-process) also ends the window's use in full so far.
  if redis.call('HEXISTS', KEYS[4], 'learnt') == 1 then
    redis.call('HSET', KEYS[4], 'learnt_at', ends)
    if learning then redis.call('HSET', KEYS[4], 'pressed', 0) end
    keep(KEYS[4], limit_ttl)
  end
  return {ends - now, learnt, began}
end

-- start: a bare rate (ARGV[7] 1; 0: nothing to start) whose fleet has not
-- started yet (no start, even pace, learnt or stated limit so far) sends
-- its first window on the even pace, as in-process: a bucket (nginx
-- limit_req) accepts it where a window's calls at once would be refused
-- beyond its burst. With no 429, a window at the limit itself follows (the
-- handover), then the fleet goes on as a window (even_now); a 429
-- meanwhile keeps the even pace (pause).
-- Asked once by each process, before its first take. Returns 1 when it
-- began the start.
if op == 'start' then
  local h = redis.call('HMGET', KEYS[4], 'started', 'even', 'learnt', 'in_force')
  if ARGV[7] ~= '1' or h[1] or h[2] or h[3] or h[4] then return 0 end
  redis.call('HSET', KEYS[4], 'started', 1, 'even', 1, 'even_tat', now,
    'start_ends', now + W)
  keep(KEYS[4], limit_ttl)
  return 1
end

-- inforce: ARGV[7] the limit the server reports (x-rate-limit-limit), at
-- most the configured one (the caller's). A lower report wins at once; a
-- higher one once reported for a whole window with nothing at or below the
-- one in force between (`raise_to`, the least of them, since `raise_at`),
-- as in-process (ExactWindow::set_limit_in_force). A server that reports
-- its limit needs no learning. Returns 1 when it lowered the limit in
-- force, 2 while a raise waits for its window, 3 when it raised it.
if op == 'inforce' then
  local l = tonumber(ARGV[7])
  local h = redis.call('HMGET', KEYS[4], 'in_force', 'raise_to', 'raise_at')
  local old = tonumber(h[1] or '0')
  if old > 0 and l > old then
    local to, since = l, now
    if h[2] then to, since = math.min(tonumber(h[2]), l), tonumber(h[3]) end
    keep(KEYS[4], limit_ttl)
    if now - since >= W then
      redis.call('HSET', KEYS[4], 'in_force', to)
      redis.call('HDEL', KEYS[4], 'raise_to', 'raise_at')
      return 3
    end
    redis.call('HSET', KEYS[4], 'raise_to', to, 'raise_at', since)
    return 2
  end
  redis.call('HDEL', KEYS[4], 'raise_to', 'raise_at', 'learnt', 'learnt_at', 'settled', 'pressed', 'refused_at',
    'lowered_at', 'stale_done', 'even', 'even_tat', 'start_ends', 'ramp_since', 'ramp_a1',
    'ramp_t1', 'handover', 'recalled')
  if old > 0 and old <= l then
    keep(KEYS[4], limit_ttl)
    return 0
  end
  redis.call('HSET', KEYS[4], 'in_force', l)
  keep(KEYS[4], limit_ttl)
  return 1
end

-- full: a response said x-rate-limit-remaining: 0. The key's window is
-- full, perhaps with calls of clients outside the fleet: no call starts
-- until the earliest occupancy ends, and never later than W from now (the
-- call that carried the header arrived by now). Returns ms held.
if op == 'full' then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  local e = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  local untl = now + W
  if e[2] and tonumber(e[2]) < untl then untl = tonumber(e[2]) end
  if hold_until(untl) then keep(KEYS[4], limit_ttl) end
  return untl - now
end

