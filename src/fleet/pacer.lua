-- batchrun fleet pacer: the exact sliding-window rule and the concurrency
-- ceiling of one API key, shared by every process through Redis.
--
-- Rule: a call occupies the window from its send until W after its
-- response arrived; a call may start only when fewer than L calls occupy
-- the window now, and fewer than C hold a concurrency lease.
--
-- Time is Redis's own clock (TIME), in unix milliseconds, never a client's:
-- only a test passes its own (ARGV[6]), to drive the rule on a fake clock.
--
-- KEYS[1] window  ZSET  member = permit id, score = ms at which the call
--                       stops occupying (provisional while in flight)
-- KEYS[2] leases  ZSET  member = permit id, score = ms at which the lease
--                       expires unless renewed (in flight only)
-- KEYS[3] pause   STRING ms at which a rate-limit pause ends
-- KEYS[4] limit   HASH  in_force = lowest limit the server reported;
--                       learnt = limit learnt from a 429 without limit
--                       headers, refused_at = the limit that 429 refused,
--                       learnt_at = start of the current clean window (ms),
--                       settled / pressed = 1 once a clean window passed /
--                       once the current one used the learnt limit in full,
--                       lowered_at = when it was last lowered (ms),
--                       stale_done = when a call granted before that last
--                       came back (ms), held_until = no call starts before
--                       (ms), after a response said remaining: 0,
--                       epoch = the fleet's epoch (a number): its absence
--                       or change tells a process Redis forgot the fleet
-- KEYS[5] sent    HASH  member = permit id, value = ms it was granted (in
--                       flight only)
--
-- ARGV[1] op: take | settle | beat | pause | inforce | full | probe
-- ARGV[2] W, the window, in ms
-- ARGV[3] hold: ms an in-flight call occupies past now (timeout + W + slack)
-- ARGV[4] lease: ms a concurrency lease lasts unless renewed
-- ARGV[5] grace: ms after a call from before the last lowering came back
--         that a 429 is still taken for its own (from the Rust rule)
-- ARGV[6] clock: '' to use Redis's TIME; a test's clock in unix ms
-- ARGV[7...] depend on the op; see each below.

if redis.replicate_commands then redis.replicate_commands() end

local op = ARGV[1]
local W = tonumber(ARGV[2])
local hold = tonumber(ARGV[3])
local lease = tonumber(ARGV[4])
local grace = tonumber(ARGV[5])
local now = tonumber(ARGV[6])
-- TIME truncates to the millisecond, so an occupancy is kept 1 ms longer
-- than W after its response; a test's clock is exact and needs no margin.
local round = 0
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  round = 1
end
local fake = round == 0
local limit_ttl = math.max(W * 10, 3600000)

-- Keys expire on Redis's own clock: under a test's clock, which runs
-- slower, they could go early, so there they stay (expiry only collects
-- garbage; every deadline is also a stored value compared with now).
local function keep(key, ms)
  if not fake then redis.call('PEXPIRE', key, ms) end
end

local function set_for(key, value, ms)
  if fake then
    redis.call('SET', key, value)
  else
    redis.call('SET', key, value, 'PX', ms)
  end
end

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
    local id, ago = ARGV[i], tonumber(ARGV[i + 1])
    i = i + 2
    local sent = tonumber(redis.call('HGET', KEYS[5], id) or '-1')
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
    if ago < 0 then
      redis.call('ZREM', KEYS[1], id)
    else
      redis.call('ZADD', KEYS[1], 'XX', back + W + round, id)
    end
    redis.call('ZREM', KEYS[2], id)
  end
  return i
end

-- After Redis lost its data (a restart), each process puts back what it
-- knows of its own calls: ARGV[i] = pause ms left (0: none), a count, then
-- triples (id, ms left occupying, 1 if still in flight). NX: never shortens
-- what is there.
local function restore(i)
  local paused = tonumber(ARGV[i])
  if paused > 0 then
    local p = tonumber(redis.call('GET', KEYS[3]) or '0')
    if p < now + paused then
      set_for(KEYS[3], now + paused, paused)
    end
  end
  local n = tonumber(ARGV[i + 1])
  i = i + 2
  for _ = 1, n do
    local id, left, flying = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
    i = i + 3
    redis.call('ZADD', KEYS[1], 'NX', now + left, id)
    if flying == '1' then
      redis.call('ZADD', KEYS[2], 'NX', now + lease, id)
    end
  end
  if n > 0 then
    keep(KEYS[1], hold + 1000)
    keep(KEYS[2], lease + 1000)
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
-- Holds new calls until t (ms), unless a later hold is in force already.
-- Returns whether it moved the hold.
local function hold_until(t)
  if t <= tonumber(redis.call('HGET', KEYS[4], 'held_until') or '0') then
    return false
  end
  redis.call('HSET', KEYS[4], 'held_until', t)
  return true
end

local function stale()
  local lowered = tonumber(redis.call('HGET', KEYS[4], 'lowered_at') or '0')
  if lowered == 0 then return false end
  local back = tonumber(redis.call('HGET', KEYS[4], 'stale_done') or '0')
  if back > 0 and now - back < grace then return true end
  for _, v in ipairs(redis.call('HVALS', KEYS[5])) do
    if tonumber(v) <= lowered then return true end
  end
  return false
end

-- Whether Redis forgot the fleet while this process was not looking (a
-- FLUSHALL, a DEL, an eviction, with the connection up): ARGV[e] the epoch
-- the process last heard ('' for none, or while it puts its calls back),
-- ARGV[e+1] an epoch to start if there is none, ARGV[e+2] a call of its
-- own still in flight ('' for none), which must still be in the window.
-- Absent altogether (the rule's tests), nothing is checked. Returns
-- whether it forgot, and the epoch now in force. Whoever finds the loss
-- first starts a new epoch and holds the fleet for one window, so that
-- every process has put its calls back before the window fills again;
-- the others see the new epoch and put theirs back, without holding again.
local function forgotten(e)
  if ARGV[e] == nil then return false, nil end
  local heard, fresh, witness = ARGV[e], ARGV[e + 1], ARGV[e + 2]
  local epoch = redis.call('HGET', KEYS[4], 'epoch')
  local lost = false
  if epoch and heard ~= '' and epoch ~= heard then
    return true, tonumber(epoch)
  end
  if not epoch and heard ~= '' then lost = true end
  if witness ~= '' and not redis.call('ZSCORE', KEYS[1], witness) then lost = true end
  if lost or not epoch then
    epoch = fresh
    redis.call('HSET', KEYS[4], 'epoch', epoch)
  end
  if lost then hold_until(now + W) end
  keep(KEYS[4], limit_ttl)
  return lost, tonumber(epoch)
end

-- Where a take's arguments after its settle list and restore block begin.
local function after_blocks(i)
  i = i + 1 + 2 * tonumber(ARGV[i])
  return i + 2 + 3 * tonumber(ARGV[i + 1])
end

-- A take's answer, with the epoch appended when the process asked for it.
local function answer(t, epoch)
  if epoch then t[#t + 1] = epoch end
  return t
end

-- take: ARGV[7] id, ARGV[8] cap (0: no window limit), ARGV[9] headroom,
-- ARGV[10] concurrency ceiling (0: none), then a settle list, then a restore
-- block. Returns {1, limit, occupancy, learnt limit or 0, 1 if it settled}
-- when the call may start (its entry and lease are added), or {0, ms to
-- wait, why}: 1 paused, 2 window full (or held after remaining: 0),
-- 3 concurrency ceiling reached, 4 Redis forgot the fleet (put your calls
-- back). After the restore block, the loss check's three arguments (see
-- forgotten); with them, every answer ends with the fleet's epoch.
if op == 'take' then
  local id = ARGV[7]
  local cap, headroom, ceiling = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
  local lost, epoch = forgotten(after_blocks(11))
  if lost then return {0, 1, 4, epoch} end
  local i = settle(11)
  restore(i)
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  local lim, learning, learnt, settled = effective(cap, headroom)
  local occ = redis.call('ZCARD', KEYS[1])
  local s = 0
  if settled then s = 1 end
  -- A retried take whose first answer was lost: it was granted.
  if redis.call('ZSCORE', KEYS[1], id) then return answer({1, lim, occ, learnt, s}, epoch) end
  local p = tonumber(redis.call('GET', KEYS[3]) or '0')
  if p > now then return answer({0, p - now, 1}, epoch) end
  local held = tonumber(redis.call('HGET', KEYS[4], 'held_until') or '0')
  if held > now then return answer({0, held - now, 2}, epoch) end
  -- Only a take that may go counts towards a clean window used in full:
  -- one during a pause or hold is before that window began.
  if learning and lim > 0 and occ + 1 >= lim then
    redis.call('HSET', KEYS[4], 'pressed', 1)
  end
  if lim > 0 and occ >= lim then
    -- The occupancy whose end makes room. A call still in flight has only
    -- a provisional end, far off; it may come back at any moment and end W
    -- after, and no other process can wake this one then: look again by W.
    local e = redis.call('ZRANGE', KEYS[1], occ - lim, occ - lim, 'WITHSCORES')
    return answer({0, math.max(1, math.min(tonumber(e[2]) - now, W + round)), 2}, epoch)
  end
  if ceiling > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
    if redis.call('ZCARD', KEYS[2]) >= ceiling then
      local e = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
      return answer({0, math.max(1, tonumber(e[2]) - now), 3}, epoch)
    end
  end
  redis.call('ZADD', KEYS[1], now + hold, id)
  redis.call('ZADD', KEYS[2], now + lease, id)
  redis.call('HSET', KEYS[5], id, now)
  keep(KEYS[1], hold + 1000)
  keep(KEYS[2], lease + 1000)
  keep(KEYS[5], hold + 1000)
  return answer({1, lim, occ + 1, learnt, s}, epoch)
end

-- settle: ARGV[7...] a settle list. Returns the number settled.
if op == 'settle' then
  settle(7)
  return tonumber(ARGV[7])
end

-- beat: ARGV[7] count, then ids of calls still in flight. Renews their
-- leases and keeps their occupancy at least hold ms ahead. A call whose
-- lease is gone (settled, or expired) is left alone. Returns how many were
-- renewed.
if op == 'beat' then
  local n = tonumber(ARGV[7])
  local renewed = 0
  for k = 1, n do
    local id = ARGV[7 + k]
    if redis.call('ZSCORE', KEYS[2], id) then
      redis.call('ZADD', KEYS[2], 'XX', now + lease, id)
      local s = tonumber(redis.call('ZSCORE', KEYS[1], id) or '0')
      if s < now + hold then
        redis.call('ZADD', KEYS[1], now + hold, id)
      end
      renewed = renewed + 1
    end
  end
  if renewed > 0 then
    keep(KEYS[1], hold + 1000)
    keep(KEYS[2], lease + 1000)
  end
  return renewed
end

-- pause: ARGV[7] pause ms, ARGV[8] cap to learn under (0: the server
-- reports its limit, learn nothing), then a settle list. Every process waits until the pause
-- ends. Without limit headers, and unless a pause was already in force or
-- a call from before the last lowering is in flight or just back (the 429
-- may then be an older call's), the limit is lowered to the answered calls
-- occupying the window less the refused one (the server counted neither it
-- nor most calls still in flight), by at least one.
-- Returns {ms until the pause ends, learnt limit or 0}.
if op == 'pause' then
  local ms, cap = tonumber(ARGV[7]), tonumber(ARGV[8])
  -- The caller's completions first: the refused call is among them.
  settle(9)
  local ends = now + ms
  local p = tonumber(redis.call('GET', KEYS[3]) or '0')
  local learnt = 0
  -- The learning clock first, as at a take: a clean window that ended by
  -- now settles or probes before this 429 starts the next one.
  local lim = 0
  if cap > 0 then lim = effective(cap, 1) end
  if cap > 0 and p <= now and not stale() then
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
    local answered = redis.call('ZCARD', KEYS[1]) - redis.call('ZCARD', KEYS[2])
    if answered > 0 and lim > 1 then
      learnt = math.max(1, math.min(lim - 1, answered - 1))
      redis.call('HSET', KEYS[4], 'learnt', learnt, 'settled', 0,
        'pressed', 0, 'refused_at', lim, 'lowered_at', now, 'stale_done', 0)
    end
  end
  if p > ends then ends = p end
  set_for(KEYS[3], ends, math.max(1, ends - now))
  -- The clean window starts when calls may go again.
  if redis.call('HEXISTS', KEYS[4], 'learnt') == 1 then
    redis.call('HSET', KEYS[4], 'learnt_at', ends, 'pressed', 0)
    keep(KEYS[4], limit_ttl)
  end
  return {ends - now, learnt}
end

-- inforce: ARGV[7] the limit the server reports (x-rate-limit-limit).
-- The lowest report wins; a server that reports its limit needs no
-- learning. Returns 1 when it lowered the limit in force.
if op == 'inforce' then
  local l = tonumber(ARGV[7])
  local old = tonumber(redis.call('HGET', KEYS[4], 'in_force') or '0')
  redis.call('HDEL', KEYS[4], 'learnt', 'learnt_at', 'settled', 'pressed', 'refused_at',
    'lowered_at', 'stale_done')
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

-- probe: run once at join. A write that leaves nothing behind proves
-- that this user may run the script and that this Redis takes writes (a
-- read-only replica refuses it). Returns 1.
if op == 'probe' then
  redis.call('HSET', KEYS[5], '__probe', now)
  redis.call('HDEL', KEYS[5], '__probe')
  return 1
end

return redis.error_reply('batchrun fleet script: unknown op ' .. tostring(op))
