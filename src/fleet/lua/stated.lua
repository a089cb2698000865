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
-- holds the fleet until it resets (`hold`).

-- Whether KEYS[4] lists an adopted key this run was not given.
local function stated_unknown()
  local names = redis.call('HGET', KEYS[4], 'stated')
  if not names then return false end
  local given = {}
  for k = 6, #KEYS do given[KEYS[k]] = true end
  for n in string.gmatch(names, '%S+') do
    if not given[n] then return true end
  end
  return false
end

-- Seeds a new window of calls f: every call in flight (until its hold, as
-- a take adds it; its settle moves it) and, as answered, the calls the
-- server says it counts beyond those in flight, and at least the answered
-- calls occupying KEYS[1], each ending one window from now (as in-process:
-- errs on the slow side), at most f.L of them.
local function seed_window(f, used)
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  local all = redis.call('ZRANGE', KEYS[1], 0, -1)
  local flying, here = 0, 0
  for _, id in ipairs(all) do
    if redis.call('HEXISTS', KEYS[5], id) == 1 then
      redis.call('ZADD', f.key, now + f.hold, id)
      flying = flying + 1
    else
      here = here + 1
    end
  end
  local answered = math.min(math.max(used - flying, here), f.L)
  for j = 1, answered do
    redis.call('ZADD', f.key, now + f.W + round, 'stated:' .. j)
  end
  keep(f.key, math.max(hold, f.hold) + 1000)
end

-- Seeds a new window of tokens t: what the server says was used, ending
-- one window from now, and every call in flight with its estimate (KEYS[5]
-- keeps it), as a take puts it: the server will count those, and what it
-- said was used did not.
local function seed_tokens(t, used)
  if used > 0 then
    redis.call('HSET', t.key, 'c:stated', used .. ' ' .. (now + t.W + round) .. ' 0')
  end
  local all = redis.call('HGETALL', KEYS[5])
  for j = 1, #all, 2 do
    local _, w = sent_entry(all[j + 1])
    redis.call('HSET', t.key, 'c:' .. all[j], w .. ' ' .. (now + t.hold) .. ' 1')
  end
  keep(t.key, t.hold + 1000)
end

-- adopt: ARGV[7] the index in KEYS of the key adopted, ARGV[8] what the
-- server says was used of its quota already (0 when it did not say).
-- Lists the key in KEYS[4] `stated`, and seeds it when it is new
-- (seed_window, seed_tokens). Returns 1 when it seeded the key, 0 when it
-- was there already.
if op == 'adopt' then
  local key, used = KEYS[tonumber(ARGV[7])], tonumber(ARGV[8])
  local names = redis.call('HGET', KEYS[4], 'stated') or ''
  local listed = false
  for n in string.gmatch(names, '%S+') do
    if n == key then listed = true end
  end
  if not listed then
    redis.call('HSET', KEYS[4], 'stated', names .. ' ' .. key)
  end
  keep(KEYS[4], limit_ttl)
  if redis.call('EXISTS', key) == 1 then return 0 end
  for _, f in ipairs(further) do
    if f.key == key then seed_window(f, used) end
  end
  for _, t in ipairs(tallies) do
    if t.key == key then seed_tokens(t, used) end
  end
  return 1
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
