-- guard.lua: what every gate instance on one Redis knows of a client
-- beyond its budgets: the connections it holds open on each instance, and
-- its penalty record (ratelimit.Guard, redisstore.NewGuard). Time is Redis
-- TIME, the one clock the instances share, unless the caller passes one.
--
-- A client's connections are one hash, "<prefix>{<client>}:conns": a field
-- per instance holding "<count> <lease end ms>". An entry whose lease has
-- ended is an instance that stopped renewing (it died): it is deleted and
-- not counted. Every write sets this instance's count to the absolute
-- value it sends (an instance serializes the calls of one client, so the
-- last one it sent is the truth), renews its lease, and sets the key's TTL
-- to the lease: no entry can outlive the key.
--
-- A key's penalty record is one hash, "<prefix>{<key>}:pen": s the score,
-- t the ms of the score, u the ms its ban ends (0: never banned), k the
-- strikes (bans so far). Its TTL is PenaltyMemory past the later of now
-- and the ban's end.
--
-- ARGV[1] the operation, ARGV[2] now in unix ms ("0": Redis TIME).
--   "h" hold: KEYS conns, pen; ARGV[3] instance, [4] the count this
--       instance holds with this connection, [5] the cap (0: none),
--       [6] the lease in ms. Reply {1, 0, total} admitted and counted;
--       {0, 0, total} over the cap, nothing written; {2, wait_ms, 0} the
--       client is banned for wait_ms more, nothing written.
--   "s" set: KEYS conns; ARGV[3] instance, [4] its count (0: the entry is
--       deleted), [5] the lease in ms. Reply {1, 0, total}.
--   "v" violate: KEYS pen; ARGV[3] points, [4] threshold, [5] half-life
--       ms, [6] ban ms, [7] max ban ms, [8] memory ms. Reply {0, 0, k} no
--       ban; {1, ban_ms, k} this call started a ban; {2, wait_ms, k}
--       banned already (the points are not added).
--   "b" banned?: KEYS pen. Reply {2, wait_ms, k} or {0, 0, k}.

local tonumber, floor, match, format = tonumber, math.floor, string.match, string.format

local op, now = ARGV[1], tonumber(ARGV[2])
if not now or now <= 0 then
  if not redis.REDIS_VERSION and redis.replicate_commands then
    redis.replicate_commands()
  end
  local tm = redis.call('TIME')
  now = tm[1] * 1000 + floor(tm[2] / 1000)
end

-- banWait returns the ms left of the ban in pen, 0 for none, and strikes.
local function banWait(pen)
  local u, k = unpack(redis.call('HMGET', pen, 'u', 'k'))
  u, k = tonumber(u) or 0, tonumber(k) or 0
  if u > now then return u - now, k end
  return 0, k
end

-- others sums the live entries of conns but inst's, deleting dead ones.
local function others(conns, inst)
  local all = redis.call('HGETALL', conns)
  local total = 0
  for i = 1, #all, 2 do
    local n, exp = match(all[i + 1], '^(%d+) (%d+)$')
    n, exp = tonumber(n), tonumber(exp)
    if not n or exp <= now then
      redis.call('HDEL', conns, all[i])
    elseif all[i] ~= inst then
      total = total + n
    end
  end
  return total
end

local function set(conns, inst, n, lease)
  if n > 0 then
    redis.call('HSET', conns, inst, format('%d %d', n, now + lease))
  else
    redis.call('HDEL', conns, inst)
  end
  if redis.call('HLEN', conns) > 0 then
    redis.call('PEXPIRE', conns, lease)
  end
end

if op == 'h' then
  local wait = banWait(KEYS[2])
  if wait > 0 then return {2, wait, 0} end
  local inst, n, cap, lease = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
  local total = others(KEYS[1], inst)
  if cap > 0 and total + n > cap then return {0, 0, total} end
  set(KEYS[1], inst, n, lease)
  return {1, 0, total + n}
elseif op == 's' then
  local inst, n, lease = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
  local total = others(KEYS[1], inst)
  set(KEYS[1], inst, n, lease)
  return {1, 0, total + n}
elseif op == 'b' then
  local wait, k = banWait(KEYS[1])
  if wait > 0 then return {2, wait, k} end
  return {0, 0, k}
elseif op == 'v' then
  local pen = KEYS[1]
  local points, threshold, half, ban, maxBan, memory =
    tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
  local s, t, u, k = unpack(redis.call('HMGET', pen, 's', 't', 'u', 'k'))
  s, t, u, k = tonumber(s) or 0, tonumber(t) or now, tonumber(u) or 0, tonumber(k) or 0
  if u > now then return {2, u - now, k} end
  if now > t then s = s * 2 ^ (-(now - t) / half) end
  s = s + points
  -- Within a hundredth of a point is reached: the decay over the
  -- milliseconds between violations must not make the last of the
  -- threshold's one-point violations fall short (ratelimit.Penalty).
  if s + 0.01 < threshold then
    redis.call('HSET', pen, 's', format('%.17g', s), 't', format('%d', now))
    redis.call('PEXPIRE', pen, memory)
    return {0, 0, k}
  end
  local b = maxBan
  if k < 40 then b = math.min(ban * 2 ^ k, maxBan) end
  redis.call('HSET', pen, 's', '0', 't', format('%d', now), 'u', format('%d', now + b), 'k', k + 1)
  redis.call('PEXPIRE', pen, b + memory)
  return {1, b, k + 1}
end
return redis.error_reply('ERR sluice guard: unknown operation')
