-- batchrun fleet pacer: the pacing rules and the concurrency ceiling of
-- one API key, shared by every process through Redis. One script, kept in
-- eight files joined in this order (src/fleet/script.rs): common.lua (the
-- arguments, the clock, putting calls back, the loss check), gcra.lua (the
-- GCRA buckets kept beside the window rule), fixed.lua (when a call of a
-- fixed window aligned to a reset stops occupying), tokens.lua (the
-- weighted token windows kept beside it), stated.lua (policies a server
-- states, adopted by the fleet, and the alignment of a fixed window), window.lua
-- (the exact sliding-window rule), drip.lua (the SpikeArrest mirror and
-- the token bucket), tail.lua (the heartbeat and the probe).
--
-- Window rule: a call occupies the window from its send until W after its
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
-- KEYS[4] limit   HASH  in_force = lowest limit the server reported
--                       (raise_to / raise_at: a higher one reported since,
--                       in force once reported for a window, window.lua);
--                       learnt = limit learnt from a 429 without limit
--                       headers, refused_at = the limit that 429 refused,
--                       learnt_at = start of the current clean window (ms),
--                       settled / pressed = 1 once a clean window passed /
--                       once the current one used the learnt limit in full,
--                       lowered_at = when it was last lowered (ms),
--                       stale_done = when a call granted before that last
--                       came back (ms), held_until = no call starts before
--                       (ms), after a response said remaining: 0,
--                       held_by = the name of the quota that reset then,
--                       when a response said so (stated.lua),
--                       epoch = the fleet's epoch (a number): its absence
--                       or change tells a process Redis forgot the fleet;
--                       s_* / b_* = the SpikeArrest mirror's / the token
--                       bucket's state (drip.lua), here so that losing it
--                       is losing the epoch too; stated = the keys of
--                       the policies adopted from what a server stated
--                       (stated.lua), space-separated; refilled:KEY =
--                       the bucket in force for adopted token window KEY
--                       (or for a bucket it was retimed from), stated.lua
--                       `refill`; align:KEY = the boundary, early and
--                       late (ms) fixed window KEY is aligned to
--                       (fixed.lua); started,
--                       start_ends, even, even_tat = a bare rate's start
--                       and even pace (window.lua)
-- KEYS[5] sent    HASH  member = permit id, value = ms it was granted, and
--                       after a space its estimated tokens when not 0, as
--                       'T,I,O' (weight_of; in flight only)
-- KEYS[6...] further windows (--limit given more than once), each a ZSET
--                       as KEYS[1], named `...:window:L:Wms` (or
--                       `...:fixed:L:Wms`, a fixed window: fixed.lua, its
--                       alignment in KEYS[4] `align:KEY`): the key says its
--                       own limit and window. The window rule only: a call
--                       must fit in each, and only KEYS[1] learns. Among
--                       them, GCRA buckets named `...:gcra:T:TAU:D[:U]` (gcra.lua)
--                       and token windows `...:U:Q:Wms` (tokens.lua), U
--                       what they count: tokens, input-tokens or output-tokens
--                       (`...:fixed:U:Q:Wms` a fixed one, aligned as the
--                       fixed windows of calls are)
--
-- ARGV[1] op: take | settle | beat | pause | inforce | full | adopt |
--         elsewhere | hold | empty | refill | align | start | probe, and
--         spike_* / bucket_* (take, settle, pause, inforce) for drip.lua
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

-- The further windows, from their keys' names. In each, an in-flight call
-- occupies for `hold` less W plus its own window. A fixed window told
-- (`...:fixed:L:Wms`, fixed.lua) is one of them, kept as a sliding one
-- until a reset aligns it.
local further = {}
for k = 6, #KEYS do
  local kind, l, w = string.match(KEYS[k], ':(%a+):(%d+):(%d+)$')
  if kind == 'window' or kind == 'fixed' then
    local fw = tonumber(w)
    further[#further + 1] = {key = KEYS[k], L = tonumber(l), W = fw, hold = hold - W + fw,
      fixed = kind == 'fixed'}
  end
end

-- What a bucket or a window of tokens may count, as its key names it.
local TOKEN_UNITS = {['tokens'] = true, ['input-tokens'] = true, ['output-tokens'] = true}

-- A call's tokens as each unit of tokens counts them, from 'T,I,O' (all
-- of them, its prompt's, its answer's) or a bare 'T' (a weight not split,
-- counted whole in each: never less than it counts). '' or nil: none;
-- anything else: nil (a usage not understood leaves the estimate).
local function weight_of(s)
  s = s or ''
  local t, i, o = string.match(s, '^(%d+),(%d+),(%d+)$')
  if not t then
    t = string.match(s, '^(%d+)$') or (s == '' and '0') or nil
    if not t then return nil end
    i, o = t, t
  end
  return {['tokens'] = tonumber(t), ['input-tokens'] = tonumber(i),
    ['output-tokens'] = tonumber(o)}
end

local function weighs(w)
  return w['tokens'] > 0 or w['input-tokens'] > 0 or w['output-tokens'] > 0
end

-- A call's value in KEYS[5]: when it was granted (nil: not in flight), and
-- its estimated tokens (weight_of).
local function sent_entry(v)
  if not v then return nil, weight_of(nil) end
  local ms, w = string.match(v, '^(%-?%d+) ([%d,]+)$')
  if ms then return tonumber(ms), weight_of(w) or weight_of(nil) end
  return tonumber(v), weight_of(nil)
end

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

-- Holds new calls until t (ms), unless a later hold is in force already.
-- Returns whether it moved the hold; a hold moved forgets the quota that
-- made the last one (`held_by`, stated.lua).
local function hold_until(t)
  if t <= tonumber(redis.call('HGET', KEYS[4], 'held_until') or '0') then
    return false
  end
  redis.call('HSET', KEYS[4], 'held_until', t)
  redis.call('HDEL', KEYS[4], 'held_by')
  return true
end

-- After Redis lost its data (a restart), each process puts back what it
-- knows of its own calls: ARGV[i] = pause ms left (0: none), ARGV[i+1] and
-- ARGV[i+2] what it last heard of the fleet's learning (the learnt limit,
-- 0 for none; 1 if paced evenly: `recall`, window.lua; the drip rules learn
-- nothing and pass 0 0), a count, then triples (id, ms left occupying, 1 if
-- still in flight). NX: never shortens what is there. leases_only: the
-- drip rules keep no window, only leases. The even flag ('0', '1') may
-- say where the learning comes from by a prefix ending in ':' (`recall`,
-- window.lua): 'l@E' put back after a loss by a process that last heard
-- epoch E ('l@E:0': it had heard nothing learnt); 'c', or 'c@M' with no
-- probing above M,
-- what a process's job checkpoint says an earlier run learnt, passed with
-- its first take and put back only if that take begins the fleet
-- (`forgotten`'s began). With no prefix, as after a loss. Returns where
-- the block ends, the learnt limit, whether paced evenly and the prefix.
local function restore(i, leases_only)
  local paused = tonumber(ARGV[i])
  if paused > 0 then
    local p = tonumber(redis.call('GET', KEYS[3]) or '0')
    if p < now + paused then
      set_for(KEYS[3], now + paused, paused)
    end
  end
  local flag = ARGV[i + 2]
  local learnt, even = tonumber(ARGV[i + 1]), string.sub(flag, -1) == '1'
  local from = string.sub(flag, 1, -2)
  local n = tonumber(ARGV[i + 3])
  i = i + 4
  for _ = 1, n do
    local id, left, flying = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
    i = i + 3
    if not leases_only then
      redis.call('ZADD', KEYS[1], 'NX', now + left, id)
      for _, f in ipairs(further) do
        if left - W + f.W > 0 then redis.call('ZADD', f.key, 'NX', now + left - W + f.W, id) end
      end
    end
    if flying == '1' then
      redis.call('ZADD', KEYS[2], 'NX', now + lease, id)
    end
  end
  if n > 0 then
    keep(KEYS[1], hold + 1000)
    keep(KEYS[2], lease + 1000)
    for _, f in ipairs(further) do keep(f.key, math.max(hold, f.hold) + 1000) end
  end
  return i, learnt, even, from
end

-- Whether Redis forgot the fleet while this process was not looking (a
-- FLUSHALL, a DEL, an eviction, with the connection up): ARGV[e] the epoch
-- the process last heard ('' for none, or while it puts its calls back),
-- ARGV[e+1] an epoch to start if there is none, ARGV[e+2] a call of its
-- own still in flight ('' for none), which must still be in `set` (the
-- window, or for the drip rules the leases).
-- Absent altogether (the rule's tests), nothing is checked. Returns
-- whether it forgot, the epoch now in force, and whether this take began
-- the fleet (no epoch, none heard: no process is running on what Redis
-- holds, so a checkpoint's learning may be put back). Whoever finds the loss
-- first starts a new epoch and holds the fleet for `span` ms (one window
-- when nil), so that every process has put its calls back before the
-- window fills again; the others see the new epoch and put theirs back,
-- without holding again.
local function forgotten(e, set, span)
  if ARGV[e] == nil then return false, nil end
  local heard, fresh, witness = ARGV[e], ARGV[e + 1], ARGV[e + 2]
  -- 'r': none heard yet, but the process's job sent calls within the
  -- hour the epoch outlives the last take: no epoch means Redis forgot
  -- it, and processes still running may have filled the window. It
  -- begins the fleet (a checkpoint's learning is put back) and holds it.
  local lately = heard == 'r'
  if lately then heard = '' end
  local epoch = redis.call('HGET', KEYS[4], 'epoch')
  local lost = false
  if epoch and heard ~= '' and epoch ~= heard then
    return true, tonumber(epoch), false
  end
  local began = not epoch and heard == ''
  if not epoch and heard ~= '' then lost = true end
  if witness ~= '' and not redis.call('ZSCORE', set, witness) then lost = true end
  if lost or not epoch then
    epoch = fresh
    redis.call('HSET', KEYS[4], 'epoch', epoch)
  end
  if lost or (began and lately) then hold_until(now + (span or W)) end
  keep(KEYS[4], limit_ttl)
  return lost, tonumber(epoch), began
end

-- Where a take's arguments after its settle list and restore block begin.
local function after_blocks(i)
  i = i + 1 + 2 * tonumber(ARGV[i])
  return i + 4 + 3 * tonumber(ARGV[i + 3])
end

-- A take's answer, with the epoch appended when the process asked for it.
local function answer(t, epoch)
  if epoch then t[#t + 1] = epoch end
  return t
end

