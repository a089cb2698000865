-- The token windows (`--limit Q/W,tokens`, `,input-tokens`,
-- `,output-tokens`): weighted sliding windows, each the rule of
-- rate/tally.rs as rate/kept.rs keeps a sliding policy of tokens. A call
-- occupies its weight from its send until W after its response; it may
-- start when nothing occupies, or when the weight occupying plus its own
-- fits in Q (a call heavier than Q goes alone, as in-process). Its weight
-- is the part of the take's estimate the window counts (weight_of) until
-- it is answered, then what the response said it used of that part (when
-- it said).
-- KEYS[6...] named `...:U:Q:Wms` (U: tokens, input-tokens or
-- output-tokens; Q after --headroom), or `...:fixed:U:Q:Wms` for a fixed
-- window told (`--limit Q/W,fixed,tokens`): kept as a sliding one until a
-- stated reset aligns it (fixed.lua), then an answered call's weight
-- occupies until the aligned end where that is earlier. Each a HASH:
-- c:ID = "weight end flying" (end: unix ms it stops occupying, provisional
-- while in flight, as in the window: hold less the primary W plus its own).
local tallies = {}
for k = 6, #KEYS do
  local unit, q, w = string.match(KEYS[k], ':([%a%-]+):(%d+):(%d+)$')
  if q and TOKEN_UNITS[unit] then
    local tw = tonumber(w)
    tallies[#tallies + 1] = {key = KEYS[k], Q = tonumber(q), W = tw, hold = hold - W + tw,
      unit = unit, fixed = string.find(KEYS[k], ':fixed:[%a%-]+:%d+:%d+$') ~= nil}
  end
end

local function tally_entry(v)
  local w, e, f = string.match(v, '^(%d+) (%-?%d+) ([01])$')
  return tonumber(w), tonumber(e), f == '1'
end

-- The weight occupying t at now, and its answered calls as {end, weight}
-- sorted by end; ended ones are dropped.
local function tally_used(t)
  local all = redis.call('HGETALL', t.key)
  local used, done = 0, {}
  for j = 1, #all, 2 do
    local w, e, flying = tally_entry(all[j + 1])
    if e <= now then
      redis.call('HDEL', t.key, all[j])
    else
      used = used + w
      if not flying then done[#done + 1] = {e, w} end
    end
  end
  table.sort(done, function(a, b) return a[1] < b[1] end)
  return used, done
end

-- The calls in flight in t, as {id, weight}.
local function tally_flying(t)
  local all = redis.call('HGETALL', t.key)
  local flying = {}
  for j = 1, #all, 2 do
    local w, e, f = tally_entry(all[j + 1])
    if f and e > now then flying[#flying + 1] = {string.sub(all[j], 3), w} end
  end
  return flying
end

-- The wait (ms, 0: none) the token windows ask of a take weighing `weight`
-- (weight_of):
-- until the answered calls whose ends free enough have ended; when only
-- calls in flight are in the way, look again in W (as Tally's fallback).
local function tallies_wait(weight)
  local wait = 0
  for _, t in ipairs(tallies) do
    local used, done = tally_used(t)
    local w = weight[t.unit]
    if used > 0 and used + w > t.Q then
      local free, ms = used + w - t.Q, nil
      for _, d in ipairs(done) do
        if d[2] >= free then ms = d[1] - now break end
        free = free - d[2]
      end
      wait = math.max(wait, ms or (t.W + round))
    end
  end
  return wait
end

local function tallies_grant(id, weight)
  for _, t in ipairs(tallies) do
    redis.call('HSET', t.key, 'c:' .. id, weight[t.unit] .. ' ' .. (now + t.hold) .. ' 1')
    keep(t.key, t.hold + 1000)
  end
end

-- Call id came back at back (ms; nil: never sent), having used `used`
-- (weight_of; nil: its estimate stands). Only a call still in flight
-- changes.
local function tallies_settle(id, back, used)
  for _, t in ipairs(tallies) do
    local v = redis.call('HGET', t.key, 'c:' .. id)
    if v then
      local w, _, flying = tally_entry(v)
      if flying and not back then
        redis.call('HDEL', t.key, 'c:' .. id)
      elseif flying then
        local u = used and used[t.unit] or w
        redis.call('HSET', t.key, 'c:' .. id, u .. ' ' .. occupied_until(t, back) .. ' 0')
      end
    end
  end
end

-- The heartbeat: a call still in flight keeps its provisional end ahead.
local function tallies_beat(id)
  for _, t in ipairs(tallies) do
    local v = redis.call('HGET', t.key, 'c:' .. id)
    if v then
      local w, e, flying = tally_entry(v)
      if flying and e < now + t.hold then
        redis.call('HSET', t.key, 'c:' .. id, w .. ' ' .. (now + t.hold) .. ' 1')
        keep(t.key, t.hold + 1000)
      end
    end
  end
end
