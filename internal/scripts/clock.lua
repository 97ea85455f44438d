-- clock.lua: the check of now and the cutoff and the one read of Redis
-- TIME every EWMA script shares, written once and spliced into ewma.lua and
-- ewma1.lua at their include line for it (package scripts, include). It
-- reads the script's now, cutoff, EXACT and floor, sets cutoff to nil when
-- there is none, and assigns the script's local clock when it reads TIME.
if not (now % 1 == 0 and now < EXACT) then
  return redis.error_reply('ERR sluice ewma: want now in whole unix ms (0: Redis TIME)')
end
if not (cutoff % 1 == 0 and cutoff < EXACT) then
  return redis.error_reply('ERR sluice ewma: want a cutoff in whole unix ms (0: none)')
end
if cutoff <= 0 then cutoff = nil end
local clock -- Redis TIME in ms, read at most once
if cutoff or now <= 0 then
  -- Redis < 5 needs effect replication before a write that follows TIME;
  -- Redis >= 7 (which has REDIS_VERSION) always replicates effects, so the
  -- call is skipped there.
  if not redis.REDIS_VERSION and redis.replicate_commands then
    redis.replicate_commands()
  end
  local tm = redis.call('TIME')
  clock = tm[1] * 1000 + floor(tm[2] / 1000)
  if cutoff and clock > cutoff then
    return redis.error_reply('ERR sluice late: past the cutoff, nothing decided')
  end
end
