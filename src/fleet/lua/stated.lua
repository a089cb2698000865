-- Policies a server states that the fleet was not told: a window of calls
-- other than W, or a window of tokens. The first process to read one
-- adopts it for the fleet: its key, named as a further window or a token
-- window so that common.lua and tokens.lua keep it, is seeded as
-- rate/policies.rs seeds a policy it adds (`add`, `add_tokens`), and is
-- listed in KEYS[4] `stated`. Every take checks that list (window.lua):
-- a process that does not pass a listed key is told to fetch the list
-- first, so no call is granted outside a policy the fleet adopted, and a
-- call granted before the adoption is in KEYS[1] and KEYS[5], whence the
-- seeding counts it. And a policy of any kind said to have nothing left
-- holds the fleet until it resets (`hold`; not a told bucket of tokens
-- that keeps it, heard.rs). What a server says is left of a token window
-- or a told bucket of tokens the fleet keeps corrects it for what was
-- spent elsewhere (`elsewhere`).

-- The keys KEYS[4] lists as adopted, in a table, and the list as stored.
local function stated_list()
  local names = redis.call('HGET', KEYS[4], 'stated') or ''
  local list = {}
  for n in string.gmatch(names, '%S+') do list[#list + 1] = n end
  return list, names
end

-- Whether KEYS[4] lists an adopted key this run was not given (a window
-- the fleet found to refill continuously is listed as its bucket, so a
-- run still passing the window is told of it too: `refill`).
local function stated_unknown()
  local given = {}
  for k = 6, #KEYS do given[KEYS[k]] = true end
  for _, n in ipairs(stated_list()) do
    if not given[n] then return true end
  end
  return false
end

-- The calls occupying KEYS[1] now: those in flight, as {id, estimated
-- tokens (weight_of)} (KEYS[5] keeps both, and only calls still in the window count,
-- so a crashed process's are not), and how many are answered.
local function occupying()
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  local flying, answered = {}, 0
  for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
    local v = redis.call('HGET', KEYS[5], id)
    if v then
      local _, w = sent_entry(v)
      flying[#flying + 1] = {id, w}
    else
      answered = answered + 1
    end
  end
  return flying, answered
end

-- Seeds window of calls f for its adoption: every call in flight (until
-- its hold, as a take adds it; its settle moves it) and, as answered, the
-- calls the server says it counts beyond those in flight, and at least the
-- answered calls occupying KEYS[1], each ending one window from now (as
-- in-process: errs on the slow side), at most f.L of them. The key may
-- hold calls already (a process told that limit keeps it): those count
-- towards what is seeded, so that nothing is counted twice. At most
-- MAX_PREFILL answered calls are seeded, as in-process
-- (rate::policies::MAX_PREFILL; a test holds the two equal): a quota of a
-- billion nearly used up would otherwise block Redis for minutes.
local MAX_PREFILL = 100000
local function seed_window(f, used)
  redis.call('ZREMRANGEBYSCORE', f.key, '-inf', now)
  local flying, here = occupying()
  for _, c in ipairs(flying) do
    redis.call('ZADD', f.key, 'NX', now + f.hold, c[1])
  end
  local known = math.max(0, redis.call('ZCARD', f.key) - #flying)
  local answered = math.min(math.max(used - #flying, here), f.L, MAX_PREFILL)
  for j = 1, answered - known do
    redis.call('ZADD', f.key, now + f.W + round, 'stated:' .. now .. ':' .. j)
  end
  keep(f.key, math.max(hold, f.hold) + 1000)
end

-- Seeds window of tokens t for its adoption: every call in flight with its
-- estimate, as a take puts it, since the server will count those; and
-- what the server says was used beyond what the key holds answered
-- already, ending one window from now.
local function seed_tokens(t, used)
  for _, c in ipairs(occupying()) do
    redis.call('HSETNX', t.key, 'c:' .. c[1], c[2][t.unit] .. ' ' .. (now + t.hold) .. ' 1')
  end
  local _, done = tally_used(t)
  local known = 0
  for _, d in ipairs(done) do known = known + d[2] end
  if used > known then
    local ends = now + t.W + round
    redis.call('HSET', t.key, 'c:stated:' .. now, string.format('%d %d 0', used - known, ends))
  end
  keep(t.key, t.hold + 1000)
end

-- At most this many policies are adopted for a fleet, as in-process.
local MAX_STATED = 8

-- adopt: ARGV[7] the index in KEYS of the key adopted, ARGV[8] what the
-- server says was used of its quota already (0 when it did not say).
-- Lists the key in KEYS[4] `stated` and seeds it (seed_window,
-- seed_tokens), unless it is listed already. Returns 1 when it listed it,
-- 0 when it was listed, -1 when the list is full, -2 when the fleet keeps
-- it as a bucket since (`refill`).
if op == 'adopt' then
  local key, used = KEYS[tonumber(ARGV[7])], tonumber(ARGV[8])
  if redis.call('HEXISTS', KEYS[4], 'refilled:' .. key) == 1 then return -2 end
  local list, names = stated_list()
  for _, n in ipairs(list) do
    if n == key then return 0 end
  end
  if #list >= MAX_STATED then return -1 end
  redis.call('HSET', KEYS[4], 'stated', names .. ' ' .. key)
  keep(KEYS[4], limit_ttl)
  for _, f in ipairs(further) do
    if f.key == key then seed_window(f, used) end
  end
  for _, t in ipairs(tallies) do
    if t.key == key then seed_tokens(t, used) end
  end
  return 1
end

-- elsewhere: ARGV[7] the index in KEYS of a token window (or bucket, or
-- a fixed window of calls told) the fleet keeps,
-- ARGV[8] what the server says was spent of its quota. What it says beyond
-- what the window holds (the fleet's calls, those in flight at their
-- estimates) was spent elsewhere: another client on the key, or calls
-- that cost more than estimated. It counts as spent now, ending one window
-- from now, as `spent_elsewhere` in rate/policies/tokens.rs counts it
-- in-process (counting some of the fleet's own again errs on the slow
-- side). ARGV[9] is 1 for a window the process was told: corrected even
-- under the name of an adopted one kept as a bucket since (the told
-- window is the process's own promise, kept beside the bucket). Returns
-- the tokens added, or -2 for an adopted window kept as a bucket since.
if op == 'elsewhere' then
  local key, spent = KEYS[tonumber(ARGV[7])], tonumber(ARGV[8])
  -- An adopted window kept as a bucket since (`refill`), by a process that
  -- does not know yet: not made again; it fetches the bucket.
  local told = ARGV[9] == '1'
  if not told and redis.call('HEXISTS', KEYS[4], 'refilled:' .. key) == 1 then return -2 end
  -- A fixed window of calls told: the calls it counts beyond those
  -- occupying it (in flight, or answered and not ended) count as answered
  -- now, as Kept::admit_answered, each ending where a call answered now
  -- would (fixed.lua); at most its limit.
  for _, f in ipairs(further) do
    if f.key == key and f.fixed then
      local ours = redis.call('ZCOUNT', key, '(' .. now, '+inf')
      if spent <= ours then return 0 end
      local n = math.min(spent - ours, f.L)
      local ends = occupied_until(f, now)
      for j = 1, n do
        redis.call('ZADD', key, ends, 'elsewhere:' .. now .. ':' .. ours .. ':' .. j)
      end
      keep(key, math.max(hold, f.hold) + 1000)
      return n
    end
  end
  for _, t in ipairs(tallies) do
    if t.key == key then
      local used = tally_used(t)
      if spent <= used then return 0 end
      -- Unique: a second correction in the same ms sees this one in `used`.
      local field = 'c:elsewhere:' .. now .. ':' .. used
      local entry = string.format('%d %d 0', spent - used, occupied_until(t, now))
      redis.call('HSET', t.key, field, entry)
      keep(t.key, t.hold + 1000)
      return spent - used
    end
  end
  -- A bucket of tokens a process was told, which keeps the stated quota
  -- (heard.rs): its level (level_of) is what the fleet counts; the rest
  -- moves the TAT on, as Gcra::spend.
  for _, b in ipairs(buckets) do
    if b.key == key and b.unit then
      local ahead = math.max(tat_rel(b) or 0, 0)
      local level = level_of(b, ahead)
      if spent <= level then return 0 end
      set_tat(b, ahead + (spent - level) * b.T)
      return spent - level
    end
  end
  return 0
end

-- hold: ARGV[7] ms until a policy a response said has nothing left resets,
-- ARGV[8] its name. No call of the fleet starts before then (a later hold
-- in force stays); a take meanwhile is told why (6) and the name is kept
-- for the process that halts on it. Returns the ms the fleet is held.
if op == 'hold' then
  if hold_until(now + tonumber(ARGV[7])) then
    redis.call('HSET', KEYS[4], 'held_by', ARGV[8])
  end
  keep(KEYS[4], limit_ttl)
  return tonumber(redis.call('HGET', KEYS[4], 'held_until')) - now
end

-- empty: ARGV[7] the index in KEYS of a told bucket of calls whose policy
-- a response said has nothing left, ARGV[8] ms until the bucket takes a
-- call again. As Gcra::empty_until in-process: the bucket holds its calls
-- until then (`held_until`, unix ms; a later hold stays), and is empty then,
-- its TAT at least the hold's end plus its tolerance less its allowance,
-- so no burst follows (whoever emptied the server's bucket). The rest of
-- the fleet's policies are not held. Returns 1 when it was a bucket.
if op == 'empty' then
  local key, ms = KEYS[tonumber(ARGV[7])], tonumber(ARGV[8])
  for _, b in ipairs(buckets) do
    if b.key == key and not b.unit then
      local was = tonumber(redis.call('HGET', b.key, 'held_until') or '0')
      redis.call('HSET', b.key, 'held_until', math.max(was, now + ms))
      local rel, d = tat_rel(b)
      local empty = ms * 1e6 + b.tau - d
      set_tat(b, math.max(rel or empty, empty))
      return 1
    end
  end
  return 0
end

-- Bucket `to` takes the place of `from` (listed at `at` in `list`) in
-- KEYS[4] `stated` (once), `refilled:FROM` names it, and so does every
-- `refilled:` that named `from` (a window whose bucket is retimed: a
-- process still passing the window, or adopting it later, is told the
-- bucket in force, not one gone), and `from` goes.
local function swap_refilled(list, at, from, to)
  list[at] = to
  for j, n in ipairs(list) do
    if n == to and j ~= at then
      table.remove(list, at)
      break
    end
  end
  local all = redis.call('HGETALL', KEYS[4])
  for j = 1, #all, 2 do
    if all[j + 1] == from and string.sub(all[j], 1, 9) == 'refilled:' then
      redis.call('HSET', KEYS[4], all[j], to)
    end
  end
  redis.call('HSET', KEYS[4], 'stated', ' ' .. table.concat(list, ' '), 'refilled:' .. from, to)
  keep(KEYS[4], limit_ttl)
  redis.call('DEL', from)
  return 1
end

-- Bucket `b` keeps from now what bucket `was` kept, at its own rate, as
-- Gcra::retime in-process: the level in units, at most b's room (its
-- burst and one), the calls in flight (their units, so their settles
-- correct b), and the wider of the two skew allowances.
local function retime(was, b)
  local rel, d = tat_rel(was)
  local all = redis.call('HGETALL', was.key)
  local level = level_of(was, rel)
  level = math.min(level, math.floor(b.tau / b.T + 0.5) + 1)
  redis.call('DEL', b.key)
  if level > 0 then set_tat(b, level * b.T) end
  if d > b.D then redis.call('HSET', b.key, 'd', d) end
  for j = 1, #all, 2 do
    if string.sub(all[j], 1, 2) == 'c:' then redis.call('HSET', b.key, all[j], all[j + 1]) end
  end
  keep_bucket(b, level * b.T)
end

-- refill: ARGV[7] the index in KEYS of an adopted token window whose
-- statements show a continuous refill (rate/refill.rs, read by the process
-- that found it), ARGV[8] the index of the bucket it becomes (a `gcra` key
-- of its unit with room for its whole quota), ARGV[9] what the server says
-- is used of the quota. As Kept::become_bucket in-process: the window's
-- answered calls are spent into the bucket from their answers (one window
-- before their ends) in order, the calls in flight at their estimates now
-- (kept as c:ID, so their settles correct them), then what the server
-- says is used beyond that level now. The bucket takes the window's place
-- in KEYS[4] `stated`, `refilled:WINDOW` names it (a process passing the
-- window is told to fetch; adopting the window again is refused), and the
-- window goes. A bucket kept already (listed again after Redis forgot the
-- fleet, and the window adopted again since) keeps what it holds. From a
-- bucket found so already (narrower statements show another period): the
-- bucket is retimed (`retime`) and swapped the same way. Returns 1 when
-- done, 0 when the old key is not listed (done by another process), -1
-- when the keys do not fit or are one.
if op == 'refill' then
  local from, to = KEYS[tonumber(ARGV[7])], KEYS[tonumber(ARGV[8])]
  local used = tonumber(ARGV[9]) or 0
  if from == to then return -1 end
  local list = stated_list()
  local at
  for j, n in ipairs(list) do
    if n == from then at = j end
  end
  if not at then return 0 end
  local t, b, was
  for _, x in ipairs(tallies) do
    if x.key == from then t = x end
  end
  for _, x in ipairs(buckets) do
    if x.key == to then b = x end
    if x.key == from then was = x end
  end
  if was and b and was.unit and was.unit == b.unit then
    retime(was, b)
    return swap_refilled(list, at, from, to)
  end
  if not (t and b and b.unit == t.unit) then return -1 end
  -- Kept already (relisted after Redis forgot the fleet, the window
  -- adopted again since): what it holds stays, the window's added.
  local rel = tat_rel(b)
  local _, done = tally_used(t)
  for _, d in ipairs(done) do
    local spent = (math.min(d[1] - t.W - round, now) - now) * 1e6
    rel = math.max(rel or spent, spent) + d[2] * b.T
  end
  for _, c in ipairs(tally_flying(t)) do
    rel = math.max(rel or 0, 0) + c[2] * b.T
    redis.call('HSET', b.key, 'c:' .. c[1], c[2])
  end
  local level = level_of(b, rel)
  if used > level then rel = math.max(rel or 0, 0) + (used - level) * b.T end
  if rel then set_tat(b, rel) end
  keep_bucket(b, rel)
  return swap_refilled(list, at, from, to)
end

-- align: ARGV[7] the index in KEYS of a fixed window (of calls, or of
-- tokens), ARGV[8] when the server says its window resets, on this
-- script's clock (unix ms, as late as it may be measured), ARGV[9] and
-- ARGV[10] how much earlier and later the true reset may lie (ms). As
-- FixedWindow::align (fixed.lua has the rule): aligns the window the
-- first time, when early + late is at most a tenth of W; the calls
-- answered since then take the aligned end from their answer (W before
-- their sliding end) where it is earlier, as do the tokens counted spent
-- elsewhere. Returns 1 when it aligned now, 0 when it was aligned
-- already, -3 when the reset is too uncertain, -1 when the key is no
-- fixed window.
if op == 'align' then
  local key = KEYS[tonumber(ARGV[7])]
  local f
  for _, x in ipairs(further) do
    if x.key == key and x.fixed then f = x end
  end
  for _, x in ipairs(tallies) do
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
  local aligned = function(ends) return occupied_until(f, ends - f.W - round) end
  if f.Q then
    -- A token window: its answered entries (a call in flight is aligned
    -- by its settle).
    local all = redis.call('HGETALL', key)
    for j = 1, #all, 2 do
      local w, ends, flying = tally_entry(all[j + 1])
      if w and not flying and ends > now then
        redis.call('HSET', key, all[j], string.format('%d %d 0', w, aligned(ends)))
      end
    end
    return 1
  end
  local all = redis.call('ZRANGEBYSCORE', key, '(' .. now, '+inf', 'WITHSCORES')
  for j = 1, #all, 2 do
    local id, ends = all[j], tonumber(all[j + 1])
    -- In flight (granted, not settled): its settle aligns it.
    if redis.call('HEXISTS', KEYS[5], id) == 0 then
      redis.call('ZADD', key, 'XX', aligned(ends), id)
    end
  end
  return 1
end
