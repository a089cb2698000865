-- beat: ARGV[7] count, then ids of calls still in flight. Renews their
-- leases and keeps their occupancy at least hold ms ahead. A call whose
-- lease is gone (settled, or expired) is left alone. Returns how many were
-- renewed. After the ids, '1' for calls of a drip rule (drip.lua), which
-- occupy no window: only their leases are renewed.
if op == 'beat' then
  local n = tonumber(ARGV[7])
  local leases_only = ARGV[8 + n] == '1'
  local renewed = 0
  for k = 1, n do
    local id = ARGV[7 + k]
    if redis.call('ZSCORE', KEYS[2], id) then
      redis.call('ZADD', KEYS[2], 'XX', now + lease, id)
      local s = tonumber(redis.call('ZSCORE', KEYS[1], id) or '0')
      if not leases_only and s < now + hold then
        redis.call('ZADD', KEYS[1], now + hold, id)
      end
      for _, f in ipairs(further) do
        local sf = tonumber(redis.call('ZSCORE', f.key, id) or '0')
        if not leases_only and sf < now + f.hold then
          redis.call('ZADD', f.key, now + f.hold, id)
        end
      end
      if not leases_only then tallies_beat(id) end
      renewed = renewed + 1
    end
  end
  if renewed > 0 then
    if not leases_only then keep(KEYS[1], hold + 1000) end
    keep(KEYS[2], lease + 1000)
    -- A bucket's calls in flight stay known while they are out.
    for _, b in ipairs(buckets) do keep_bucket(b, tat_rel(b)) end
  end
  return renewed
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
