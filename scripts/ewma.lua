-- ewma.lua: decide one message against every window of one key, atomically.
--
-- A window's budget is a score S written at instant t (unix milliseconds).
-- At instant now it has decayed to S * 2^(-(now - t)/T), T being the
-- window's half-life. A message of cost c is admitted when, in EVERY window,
-- decayed + c <= R (no tolerance); then every window is written as
-- (decayed + c, max(now, t)). A refused message writes nothing, so the wait a
-- client is told stays true however often it knocks.
--
-- This is the same arithmetic, step for step, as ratelimit.decide in Go (the
-- memory store), so one table of instants gives the same decisions on both.
--
-- KEYS[1..n]  one key per window; all carry the same {client} hash tag, so
--             the script is legal on Redis Cluster.
-- ARGV[1]     now in unix milliseconds; "0" (or anything not a positive
--             number) means Redis TIME, so every gate instance shares one
--             clock.
-- ARGV[2]     request id (no spaces), or "" for none. go-redis retries a
--             command whose reply was lost (EOF, reset) and its
--             auto-pipeliner may replay a batch; without this, a repeated
--             call that had already been admitted would charge the client
--             twice. The ids of the last IDS admitted requests are kept in
--             the first window's value, and a repeat of one of them returns
--             {1, 0, stored scores} without charging. Refusals write
--             nothing, so repeating one is harmless. The guard fails only if
--             more than IDS other requests of the same key were admitted
--             between an attempt and its retry (a few ms apart): then the
--             retry charges once more. A per-request dedup key would close
--             that gap at the price of a GET, a SET and a new key on every
--             call (about half again the script's cost, measured).
-- ARGV[3..]   per window: rate R, half-life T in ms, cost c.
--
-- Reply: {allowed (0|1), wait_ms, score_1, ..., score_n}.
--   wait_ms  0 when admitted; else the smallest whole number of ms w >= 1
--            such that the admission test above, run at now+w against the
--            unchanged scores, admits: estimated as T*log2(S/(R-c)) from
--            the stored score and then checked by running the test itself
--            at now+w and now+w-1, so float error in log/pow can neither
--            make an obedient client be refused nor let one 1 ms early in.
--            The largest over the refusing windows.
--   score_i  the written score when admitted, the decayed unwritten one
--            when refused, as a string: Redis truncates Lua numbers to
--            integers on the way out. %.17g rather than tostring (14
--            digits) so it round-trips exactly.
--
-- Stored value of a window: "<score %.17g> <t ms>", one string per key, so
-- reading all windows is one MGET and writing one is a SET ... PX. The first
-- window's value goes on with the recent request ids: "<score> <t> <id>...".

local MAX_WAIT = 1099511627776 -- 2^40 ms, as in Go: no overflow anywhere
local LN2 = 0.69314718055994531
local IDS = 4

local n = #KEYS
if n < 1 or #ARGV ~= 2 + 3 * n then
  return redis.error_reply('ERR sluice ewma: want n keys and 2+3n args')
end

local vals = redis.call('MGET', unpack(KEYS))

local reqid = ARGV[2]
local ids = ''
if vals[1] then
  ids = string.match(vals[1], '^%S+ %S+ ?(.*)$') or ''
end
if reqid ~= '' and string.find(' ' .. ids .. ' ', ' ' .. reqid .. ' ', 1, true) then
  -- A repeat of an admitted request: answer as admitted, charge nothing.
  local reply = {1, 0}
  for i = 1, n do
    if not vals[i] then
      return redis.error_reply('ERR sluice ewma: window missing for a seen request at ' .. KEYS[i])
    end
    reply[i + 2] = string.match(vals[i], '^%S+')
  end
  return reply
end

local now = tonumber(ARGV[1])
if now == nil or now <= 0 then
  -- Redis < 5 needs effect replication before a write that follows TIME;
  -- on Redis >= 7 this is a no-op.
  if redis.replicate_commands then
    redis.replicate_commands()
  end
  local tm = redis.call('TIME')
  now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
end

-- decay returns score s written at ms at, as seen at ms t.
local function decay(s, at, t, period)
  local dt = t - at
  if dt <= 0 then
    return s -- a score never decays for time that has not passed
  end
  local x = dt / period
  if x > 1100 then
    return 0 -- below the smallest double; Go skips the subnormals too
  end
  return s * 2 ^ (-x)
end

-- waitms returns the smallest w >= 1 such that score s written at at admits
-- cost c under rate r at now+w; the caller knows it refuses at now.
local function waitms(s, at, period, c, r)
  local d = period * math.log(s / (r - c)) / LN2
  if not (d < MAX_WAIT) then
    d = MAX_WAIT
  end
  local w = at + math.ceil(d) - now
  if w < 1 then w = 1 end
  if w > MAX_WAIT then w = MAX_WAIT end
  local k = 0
  while k < 16 and w < MAX_WAIT and not (decay(s, at, now + w, period) + c <= r) do
    w = w + 1
    k = k + 1
  end
  k = 0
  while k < 16 and w > 1 and decay(s, at, now + w - 1, period) + c <= r do
    w = w - 1
    k = k + 1
  end
  return w
end

local rate, period, cost = {}, {}, {}
local score, at = {}, {}
local allowed = true
local wait = 0
for i = 1, n do
  rate[i] = tonumber(ARGV[3 * i])
  period[i] = tonumber(ARGV[3 * i + 1])
  cost[i] = tonumber(ARGV[3 * i + 2])
  if not (rate[i] and period[i] and cost[i] and period[i] >= 1 and cost[i] > 0 and rate[i] - cost[i] > 0) then
    return redis.error_reply('ERR sluice ewma: bad limit for ' .. KEYS[i])
  end
  local s, t = 0, 0
  local v = vals[i]
  if v then
    local ss, ts = string.match(v, '^(%S+) (%S+)')
    s, t = tonumber(ss), tonumber(ts)
    if s == nil or t == nil then
      return redis.error_reply('ERR sluice ewma: malformed value at ' .. KEYS[i])
    end
  end
  local d = decay(s, t, now, period[i])
  score[i], at[i] = d, t
  if not (d + cost[i] <= rate[i]) then
    allowed = false
    local w = waitms(s, t, period[i], cost[i], rate[i])
    if w > wait then wait = w end
  end
end

local reply
if allowed then
  reply = {1, 0}
  for i = 1, n do
    local s = score[i] + cost[i]
    local t = at[i]
    if now > t then t = now end
    local str = string.format('%.17g', s)
    -- TTL: keep the key until its score is negligible, eps = min(c, R-c)/1024
    -- (forgetting it then gives a client at most 1/1024 of a message), that
    -- is T*log2(S/eps) ms. Since eps <= R-c this is never shorter than the
    -- longest wait the key can still report, T*log2(S/(R-c)); since S <= R
    -- it is at most T*log2(1024*R/min(c, R-c)): 10 to 30 half-lives for any
    -- sane limit. +1 covers the rounding. (If t is ahead of now, the score
    -- starts decaying only at t; the TTL counts from now and would be short
    -- by t-now, so that is added.)
    local eps = math.min(cost[i], rate[i] - cost[i]) / 1024
    local ttl = math.ceil(period[i] * math.log(math.max(s, eps) / eps) / LN2) + 1 + (t - now)
    local v = str .. ' ' .. string.format('%d', t)
    if i == 1 then
      -- Keep the last IDS request ids, newest first.
      local kept = {}
      if reqid ~= '' then kept[1] = reqid end
      for id in string.gmatch(ids, '%S+') do
        if #kept >= IDS then break end
        kept[#kept + 1] = id
      end
      if #kept > 0 then
        v = v .. ' ' .. table.concat(kept, ' ')
      end
    end
    redis.call('SET', KEYS[i], v, 'PX', ttl)
    reply[i + 2] = str
  end
else
  reply = {0, wait}
  for i = 1, n do
    reply[i + 2] = string.format('%.17g', score[i])
  end
end
return reply
