-- Fixed windows told (`--limit N/W,fixed`, of calls: further windows
-- named `...:fixed:L:Wms`; `--limit Q/W,fixed,tokens` and the like: token
-- windows named `...:fixed:U:Q:Wms`, tokens.lua), kept as sliding ones
-- (every server window is a span of W, so at most L in any span never
-- overruns one) until a response says when the server's window resets;
-- then aligned to that reset, as in-process (rate/fixed.rs has the
-- argument): the boundaries are origin + k*W, known to lie within
-- [origin - early, origin + late], and an answered call occupies until the
-- first boundary after its answer plus early, plus late. The alignment is
-- the fleet's, in KEYS[4] `align:KEY` ('origin early late', ms), set once
-- (the `align` op, at the end of stated.lua: it needs the token windows
-- these helpers come before); lost with the fleet's data, the window is a
-- sliding one again until the next reset.

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
