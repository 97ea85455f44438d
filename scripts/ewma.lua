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
-- ARGV[2]     request id (no spaces, one width), or "" for none. go-redis retries a
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
--            the stored score and then found by running the test itself
--            (gallop and bisect, see waitms), so float error in log/pow can
--            neither make an obedient client be refused nor let one 1 ms
--            early in, for any valid limit.
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

-- A stored value is read strictly: "<score> <t>" and, in the first window,
-- " <id>..." after it. The score must be a finite number >= 0 and t a whole
-- number of ms; anything else (a hand-edited key, another program's value)
-- is refused rather than read as a score of zero or NaN. (Inline, not a
-- function: this runs on every message, and a closure is an allocation.)
local reqid = ARGV[2]
local ids = ''
local s1, t1, ts1 -- the first window, parsed once
local v = vals[1]
if v then
  local ss, ts, rest = string.match(v, '^(%S+) (%d+)(.*)$')
  s1, t1 = tonumber(ss), tonumber(ts)
  if not (s1 and t1 and s1 >= 0 and s1 < math.huge and t1 < 2 ^ 53 and (rest == '' or string.byte(rest, 1) == 32)) then
    return redis.error_reply('ERR sluice ewma: malformed value at ' .. KEYS[1])
  end
  ts1, ids = ts, string.sub(rest, 2)
  if reqid ~= '' and ids ~= '' then
    -- Is reqid one of the space-separated ids? A plain find, checked at
    -- the boundaries (no padded copies of either).
    local k, m, l = 1, #reqid, #ids
    local seen = false
    while true do
      local p = string.find(ids, reqid, k, true)
      if not p then
        break
      end
      local q = p + m
      if (p == 1 or string.byte(ids, p - 1) == 32) and (q > l or string.byte(ids, q) == 32) then
        seen = true
        break
      end
      k = p + 1
    end
    if seen then
      -- A repeat of an admitted request: answer as admitted, charge nothing.
      local reply = {1, 0}
      for i = 1, n do
        local w = vals[i]
        if not w then
          return redis.error_reply('ERR sluice ewma: window missing for a seen request at ' .. KEYS[i])
        end
        local ss, ts, rest = string.match(w, '^(%S+) (%d+)(.*)$')
        local s, t = tonumber(ss), tonumber(ts)
        if not (s and t and s >= 0 and s < math.huge and t < 2 ^ 53 and (rest == '' or string.byte(rest, 1) == 32)) then
          return redis.error_reply('ERR sluice ewma: malformed value at ' .. KEYS[i])
        end
        reply[i + 2] = ss
      end
      return reply
    end
  end
end

local now = tonumber(ARGV[1])
if not now or now <= 0 then
  -- Redis < 5 needs effect replication before a write that follows TIME;
  -- on Redis >= 7 this is a no-op.
  if redis.replicate_commands then
    redis.replicate_commands()
  end
  local tm = redis.call('TIME')
  now = tm[1] * 1000 + math.floor(tm[2] / 1000)
end

-- Decide every window. st holds, per window, seven values: rate, period,
-- cost, stored score, decayed score, write time and its stored digits (one
-- flat table, sized by its constructor for two windows: this runs on every
-- message, and growing a table reallocates it).
local st = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
local allowed = true
for i = 1, n do
  local j = 3 * i
  local r, p, c = tonumber(ARGV[j]), tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2])
  if not (r and p and c and p >= 1 and c > 0 and r - c > 0) then
    return redis.error_reply('ERR sluice ewma: bad limit for ' .. KEYS[i])
  end
  local s, t, ts = 0, 0, false
  if i == 1 then
    if v then
      s, t, ts = s1, t1, ts1
    end
  else
    local w = vals[i]
    if w then
      local ss, rest
      ss, ts, rest = string.match(w, '^(%S+) (%d+)(.*)$')
      s, t = tonumber(ss), tonumber(ts)
      if not (s and t and s >= 0 and s < math.huge and t < 2 ^ 53 and (rest == '' or string.byte(rest, 1) == 32)) then
        return redis.error_reply('ERR sluice ewma: malformed value at ' .. KEYS[i])
      end
    end
  end
  local d = s
  if now > t then
    local x = (now - t) / p
    if x > 1100 then d = 0 else d = s * 2 ^ (-x) end
  end
  local k = 7 * i
  st[k - 6], st[k - 5], st[k - 4], st[k - 3], st[k - 2], st[k - 1], st[k] = r, p, c, s, d, t, ts
  if not (d + c <= r) then
    allowed = false
  end
end

if not allowed then
  -- waitms returns the smallest w >= 1 such that score s written at ms at
  -- admits cost c under rate r (half-life p ms) at now+w; the caller knows it
  -- refuses at now. Same steps as ratelimit.waitMs in Go: start from the
  -- estimate T*log2(S/(R-c)), bracket the boundary by galloping (steps 1, 2,
  -- 4, ...) and bisect. For any sane limit that is two probes (admits at w,
  -- refuses at w-1); when R is barely above c, adding c absorbs most of R-c
  -- and the boundary can be minutes from the estimate, but it is still found
  -- exactly, in at most about 2*40 probes (waits are capped at 2^40 ms).
  local function waitms(now, s, at, p, c, r)
    local function admits(w)
      local t = now + w
      local d = s
      if t > at then
        local x = (t - at) / p
        if x > 1100 then d = 0 else d = s * 2 ^ (-x) end
      end
      return d + c <= r
    end
    local d = p * math.log(s / (r - c)) / LN2
    if not (d < MAX_WAIT) then d = MAX_WAIT end
    local w = at + math.ceil(d) - now
    if w < 1 then w = 1 end
    if w > MAX_WAIT then w = MAX_WAIT end
    -- Bracket the boundary: lo refuses (0 is known to), hi admits.
    local lo, hi
    local step = 1
    if admits(w) then
      hi = w
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
      lo = w
      while true do
        if lo + step >= MAX_WAIT then
          if not admits(MAX_WAIT) then
            return MAX_WAIT -- the longest wait reported, as in Go
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
  local reply = {0, 0}
  for i = 1, n do
    local k = 7 * i
    local r, p, c, s, d, t = st[k - 6], st[k - 5], st[k - 4], st[k - 3], st[k - 2], st[k - 1]
    if not (d + c <= r) then
      local w = waitms(now, s, t, p, c, r)
      if w > wait then wait = w end
    end
    reply[i + 2] = string.format('%.17g', d)
  end
  reply[2] = wait
  return reply
end

local reply = {1, 0}
local nowstr -- now's digits, formatted at most once
for i = 1, n do
  local k = 7 * i
  local r, p, c, s, t, ts = st[k - 6], st[k - 5], st[k - 4], st[k - 2] + st[k - 4], st[k - 1], st[k]
  if now > t or not ts then
    t = now
    if not nowstr then
      nowstr = string.format('%d', now)
    end
    ts = nowstr
  end
  local str = string.format('%.17g', s)
  -- TTL: keep the key until its score is negligible, eps = min(c, R-c)/1024
  -- (forgetting it then gives a client at most 1/1024 of a message), that
  -- is T*log2(S/eps) ms. Since eps <= R-c this is never shorter than the
  -- longest wait the key can still report, T*log2(S/(R-c)); since S <= R
  -- it is at most T*log2(1024*R/min(c, R-c)): 10 to 30 half-lives for any
  -- sane limit. +1 covers the rounding. (If t is ahead of now, the score
  -- starts decaying only at t; the TTL counts from now and would be short
  -- by t-now, so that is added.) Capped at 2*MAX_WAIT (70 years), twice
  -- the longest wait ever reported: absurd limits (a ten-year half-life with
  -- R a hair above c) would otherwise ask for centuries, which overflows
  -- some Redis-compatible servers' expiry arithmetic.
  local eps = math.min(c, r - c) / 1024
  local ttl = math.min(math.ceil(p * math.log(math.max(s, eps) / eps) / LN2) + 1, 2 * MAX_WAIT) + (t - now)
  local val
  if i ~= 1 or (reqid == '' and ids == '') then
    val = str .. ' ' .. ts
  elseif reqid == '' then
    val = str .. ' ' .. ts .. ' ' .. ids
  elseif ids == '' then
    val = str .. ' ' .. ts .. ' ' .. reqid
  else
    -- Keep the last IDS request ids, newest first. Ids are of one width (16
    -- characters from the Go store), so keeping IDS-1 old ones is one
    -- string.sub; an id of another width is at worst cut short, and a cut
    -- id never matches (the seen check looks at the boundaries).
    val = str .. ' ' .. ts .. ' ' .. reqid .. ' ' .. string.sub(ids, 1, (IDS - 1) * (#reqid + 1) - 1)
  end
  redis.call('SET', KEYS[i], val, 'PX', ttl)
  reply[i + 2] = str
end
return reply
