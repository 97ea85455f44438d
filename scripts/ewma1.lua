-- ewma1.lua: decide ONE message against every window of its client: the
-- lean call of ewma.lua for a decision sent alone (nothing else queued).
-- The arithmetic, the stored values, the TTLs and the reply are exactly
-- ewma.lua's for a call of one decision with request id "" (TestLeanEqualsBatch
-- pins it); what it leaves out is the batch: no limit lists, no list index,
-- no request id to look for or to keep, no table of values written earlier
-- in the call. A store sends it only on a client that never resends a
-- command (go-redis retries off): the request id guards a retry, and
-- without retries there is none to guard. Ids another gate keeps in the
-- first window's value are kept as they are.
--
-- KEYS     the windows of the decision, all with one {client} hash tag.
-- ARGV[1]  now in unix ms; "0" (or anything not a positive number) means
--          Redis TIME.
-- ARGV[2]  the cutoff in unix ms, "0" for none: if Redis TIME is past it,
--          nothing is decided or written, and the reply is 'ERR sluice
--          late: ...' (see ewma.lua).
-- ARGV[3…] per window: rate R, half-life T in ms (>= 1), cost c (> 0, < R).
--
-- Reply: 1, 0, score_1, ..., score_n (admitted, the written scores);
-- 0, wait_ms, score_1, ..., score_n (refused, decayed, unwritten); or -1,
-- 'ERR sluice ewma: malformed value at <key>', n empty strings (nothing
-- written). See ewma.lua for wait_ms, the scores' format and the TTL.

local MAX_WAIT = 1099511627776
local LN2 = 0.69314718055994531
local HUGE = math.huge
local tonumber, find, sub, format = tonumber, string.find, string.sub, string.format
local log, ceil = math.log, math.ceil

local n, na = #KEYS, #ARGV
if n < 1 or na ~= 2 + 3 * n then
  return redis.error_reply('ERR sluice ewma: want now, cutoff and three args per window')
end
-- w holds per window: rate, half-life, cost, stored score, decayed score,
-- write time, its stored digits.
local w = n == 1 and {0, 0, 0, 0, 0, 0, 0} or n == 2 and {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0} or {}
for i = 1, n do
  local j = 3 * i
  local r, p, c = tonumber(ARGV[j]), tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2])
  if not (r and p and c and p >= 1 and c > 0 and r - c > 0) then
    return redis.error_reply('ERR sluice ewma: bad limit in limit list 1')
  end
  local k = 7 * i - 7
  w[k + 1], w[k + 2], w[k + 3] = r, p, c
end

local now, cutoff = tonumber(ARGV[1]), tonumber(ARGV[2])
if cutoff and cutoff <= 0 then cutoff = nil end
local clock
if cutoff or not now or now <= 0 then
  if not redis.REDIS_VERSION and redis.replicate_commands then
    redis.replicate_commands()
  end
  local tm = redis.call('TIME')
  clock = tm[1] * 1000 + math.floor(tm[2] / 1000)
  if cutoff and clock > cutoff then
    return redis.error_reply('ERR sluice late: past the cutoff, nothing decided')
  end
end
local vals = n == 1 and {redis.call('GET', KEYS[1])} or redis.call('MGET', unpack(KEYS))
if not now or now <= 0 then
  now = clock
end

local reply = n == 1 and {false, false, false} or n == 2 and {false, false, false, false} or {}
local allowed = true
local tail = '' -- the ids after the first window's score and time, if any
local lastts, lastt
for i = 1, n do
  local v = vals[i]
  local s, t, ts = 0, 0, false
  if v then
    local a = find(v, ' ', 1, true)
    local b = a and find(v, ' ', a + 1, true)
    if a then
      ts = sub(v, a + 1, (b or 0) - 1)
      s = tonumber(sub(v, 1, a - 1))
      if ts == lastts then
        t = lastt
      else
        t = tonumber(ts)
        lastts, lastt = ts, t
      end
    end
    if not (a and s and t and s >= 0 and s < HUGE and t >= 0 and t < 2 ^ 53 and t % 1 == 0) then
      reply[1], reply[2] = -1, 'ERR sluice ewma: malformed value at ' .. KEYS[i]
      for j = 3, n + 2 do
        reply[j] = ''
      end
      return reply
    end
    if i == 1 and b and b < #v then
      tail = sub(v, b)
    end
  end
  local k = 7 * i - 7
  local r, p, c = w[k + 1], w[k + 2], w[k + 3]
  local d = s
  if now > t then
    local x = (now - t) / p
    if x > 1100 then d = 0 else d = s * 2 ^ (-x) end
  end
  w[k + 4], w[k + 5], w[k + 6], w[k + 7] = s, d, t, ts
  if not (d + c <= r) then
    allowed = false
  end
end

if not allowed then
  -- The smallest w >= 1 at which the window admits (see ewma.lua's waitms).
  local function waitms(s, at, p, c, r)
    local function admits(x)
      local t = now + x
      local d = s
      if t > at then
        local y = (t - at) / p
        if y > 1100 then d = 0 else d = s * 2 ^ (-y) end
      end
      return d + c <= r
    end
    local d = p * math.log(s / (r - c)) / LN2
    if not (d < MAX_WAIT) then d = MAX_WAIT end
    local x = at + math.ceil(d) - now
    if x < 1 then x = 1 end
    if x > MAX_WAIT then x = MAX_WAIT end
    local lo, hi
    local step = 1
    if admits(x) then
      hi = x
      while true do
        if hi - step <= 0 then
          lo = 0
          break
        end
        if not admits(hi - step) then
          lo = hi - step
          break
        end
        hi = hi - step
        step = step * 2
      end
    else
      lo = x
      while true do
        if lo + step >= MAX_WAIT then
          if not admits(MAX_WAIT) then
            return MAX_WAIT
          end
          hi = MAX_WAIT
          break
        end
        if admits(lo + step) then
          hi = lo + step
          break
        end
        lo = lo + step
        step = step * 2
      end
    end
    while hi - lo > 1 do
      local mid = lo + math.floor((hi - lo) / 2)
      if admits(mid) then hi = mid else lo = mid end
    end
    return hi
  end
  local wait = 0
  for i = 1, n do
    local k = 7 * i - 7
    local r, p, c, s, d, t = w[k + 1], w[k + 2], w[k + 3], w[k + 4], w[k + 5], w[k + 6]
    if not (d + c <= r) then
      local x = waitms(s, t, p, c, r)
      if x > wait then wait = x end
    end
    reply[i + 2] = format('%.17g', d)
  end
  reply[1], reply[2] = 0, wait
  return reply
end

reply[1], reply[2] = 1, 0
local nowstr
for i = 1, n do
  local k = 7 * i - 7
  local r, p, c, d, t, ts = w[k + 1], w[k + 2], w[k + 3], w[k + 5], w[k + 6], w[k + 7]
  local s = d + c
  if now > t then
    t = now
    if not nowstr then
      nowstr = format('%d', now)
    end
    ts = nowstr
  end
  local str = format('%.17g', s)
  local eps = r - c
  if c < eps then eps = c end
  eps = eps / 1024
  local ttl = ceil(p * log((s > eps and s or eps) / eps) / LN2) + 1
  if ttl > 2 * MAX_WAIT then ttl = 2 * MAX_WAIT end
  ttl = ttl + (t - now)
  local val = str .. ' ' .. ts
  if i == 1 then
    val = val .. tail
  end
  redis.call('SET', KEYS[i], val, 'PX', format('%d', ttl))
  reply[i + 2] = str
end
return reply
