-- Fixed windows told (`--limit N/W,fixed`): further windows named
-- `...:fixed:L:Wms`, kept as sliding ones (every server window is a span
-- of W, so at most L in any span never overruns one) until a response says
-- when the server's window resets; then aligned to that reset, as
-- in-process (rate/fixed.rs has the argument): the boundaries are
-- origin + k*W, known to lie within [origin - early, origin + late], and
-- an answered call occupies until the first boundary after its answer
-- plus early, plus late. The alignment is the fleet's, in KEYS[4]
-- `align:KEY` ('origin early late', ms), set once (`align`); lost with the
-- fleet's data, the window is a sliding one again until the next reset.

-- Fixed window f's alignment, read once per run of the script: nil while
-- it is kept as a sliding one.
local function alignment(f)
  if not f.fixed then return nil end
  if f.align == nil then
    local s = redis.call('HGET', KEYS[4], 'align:' .. f.key) or ''
    local o, e, l = string.match(s, '^(%-?%d+) (%d+) (%d+)$')
    f.align = false
    if o then f.align = {origin = tonumber(o), early = tonumber(e), late = tonumber(l)} end
  end
  return f.align or nil
end

-- The first boundary origin + k*w (k any integer) after t, as
-- rate::fixed::boundary_after (whole ms here, exact in a double).
local function boundary_after(origin, w, t)
  return origin + (math.floor((t - origin) / w) + 1) * w
end

-- When a call of window f answered at `back` stops occupying: W after its
-- answer, or in an aligned fixed window the aligned end when that is
-- earlier (either reaches the end of the server window the call arrived
-- in; the clock's rounding margin either way). Never past the sliding
-- end, so no end outlives the expiry the takes keep.
local function occupied_until(f, back)
  local sliding = back + f.W + round
  local a = alignment(f)
  if not a then return sliding end
  return math.min(sliding, boundary_after(a.origin, f.W, back + a.early) + a.late + round)
end

-- align: ARGV[7] the index in KEYS of a fixed window, ARGV[8] when the
-- server says its window resets, on this script's clock (unix ms, as late
-- as it may be measured), ARGV[9] and ARGV[10] how much earlier and later
-- the true reset may lie (ms). As FixedWindow::align: aligns the window the first
-- time, when early + late is at most a tenth of W; the calls answered
-- since then take the aligned end from their answer (W before their
-- sliding end) where it is earlier. Returns 1 when it aligned now, 0 when
-- it was aligned already, -3 when the reset is too uncertain, -1 when the
-- key is no fixed window.
if op == 'align' then
  local key = KEYS[tonumber(ARGV[7])]
  local f
  for _, x in ipairs(further) do
    if x.key == key and x.fixed then f = x end
  end
  if not f then return -1 end
  local origin = tonumber(ARGV[8])
  local early, late = tonumber(ARGV[9]), tonumber(ARGV[10])
  if alignment(f) then return 0 end
  if (early + late) * 10 > f.W then return -3 end
  redis.call('HSET', KEYS[4], 'align:' .. key, string.format('%d %d %d', origin, early, late))
  keep(KEYS[4], limit_ttl)
  f.align = {origin = origin, early = early, late = late}
  local all = redis.call('ZRANGEBYSCORE', key, '(' .. now, '+inf', 'WITHSCORES')
  for j = 1, #all, 2 do
    local id, ends = all[j], tonumber(all[j + 1])
    -- In flight (granted, not settled): its settle aligns it.
    if redis.call('HEXISTS', KEYS[5], id) == 0 then
      redis.call('ZADD', key, 'XX', occupied_until(f, ends - f.W - round), id)
    end
  end
  return 1
end
