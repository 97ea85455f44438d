-- refund.lua: undo one admission of a message whose budgets span masters
-- of a Redis Cluster, when another master refused the message (see
-- redisstore.Store.DecideAll). The admission added cost c to every window
-- of the key at instant t0; the score is a sum decaying as one, so what
-- that charge still weighs at the value's instant t1 >= t0 is
-- c * 2^-((t1 - t0)/T), and that is taken off each window's score (never
-- below 0). The value's instant, its request ids and the key's TTL are
-- kept: decisions made since the charge stay as they were, and a client
-- that raced it saw at most c more per window, for at most one round trip
-- (the refund's).
--
-- KEYS[1]  the decision's key (one call per key: the keys of one message
--          are in different slots).
-- ARGV[1]  packed little-endian doubles: t0 (the t of the value the
--          admission wrote, whole unix ms), then per window of the key, in
--          order, its half-life T in ms and its cost c.
-- Reply: 1 when refunded, 0 when the key is gone (it expired: nothing is
-- left to refund). A value shorter than the windows, or arguments that are
-- not as above, is an error reply and nothing is written.

local unpack, pack, sub = struct.unpack, struct.pack, string.sub
local ldexp = math.ldexp
-- #include decay.lua

local a = ARGV[1]
local la = a and #a or 0
local n = (la - 8) / 16
if not (la >= 24 and n % 1 == 0) then
  return redis.error_reply('ERR sluice refund: want t0, then a half-life and a cost per window, packed')
end
local v = redis.call('GET', KEYS[1])
if not v then
  return 0
end
if #v < 8 + 8 * n then
  return redis.error_reply('ERR sluice refund: malformed value at ' .. KEYS[1])
end
local t0 = unpack('<d', a)
local t1 = unpack('<d', v)
local val = pack('<d', t1)
for i = 1, n do
  local p, c = unpack('<dd', a, 9 + 16 * (i - 1))
  local s = unpack('<d', v, 1 + 8 * i)
  if not (p >= 1 and c > 0 and s >= 0) then
    return redis.error_reply('ERR sluice refund: bad window ' .. i)
  end
  s = s - decay(c, t0, t1, p)
  if not (s > 0) then
    s = 0
  end
  val = val .. pack('<d', s)
end
val = val .. sub(v, 9 + 8 * n)
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then
  redis.call('SET', KEYS[1], val, 'PX', ttl)
else
  redis.call('SET', KEYS[1], val)
end
return 1
