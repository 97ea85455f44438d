-- ewma1.lua: decide ONE message against every window of its client: the
-- lean call of ewma.lua for a decision sent alone (nothing else queued).
-- The arithmetic, the stored values, the TTLs, the request ids and the
-- reply are exactly ewma.lua's for a call of one decision
-- (TestLeanEqualsBatch pins it); what it leaves out is the batch: no limit
-- lists, no list index, no table of values written earlier in the call.
-- One GET and one SET of the decision's one key. A store sends every
-- decision that goes out alone as this call: with a request id when its
-- client may resend a command (go-redis retries on), without one when it
-- never does (retries off: the id guards a retry, and without retries there
-- is none to guard; ids another gate keeps in the value are kept as they
-- are).
--
-- KEYS     one key, holding every window of the decision (see ewma.lua's
--          "Stored value").
-- ARGV[1]  now in whole unix ms; 0 (or a negative whole number) means
--          Redis TIME; anything else is an error reply, as in ewma.lua.
-- ARGV[2]  the cutoff in whole unix ms, 0 (or less) for none: if Redis
--          TIME is past it, nothing is decided or written, and the reply is
--          'ERR sluice late: ...' (see ewma.lua).
-- ARGV[3…] per window: rate R (finite), half-life T in whole ms (>= 1),
--          cost c (> 0, < R): what ratelimit.Limit.Validate accepts;
--          then optionally the request id (as in ewma.lua; "" is none).
--          Three args per window tell the two apart.
--
-- Reply: 1, 0, score_1, ..., score_n (admitted, the written scores; or
-- the stored scores, nothing charged, for a request id already kept);
-- 0, wait_ms, score_1, ..., score_n (refused, decayed, unwritten); or -1,
-- 'ERR sluice ewma: malformed value at <key>', n empty strings (nothing
-- written). See ewma.lua for wait_ms, the scores' format and the TTL.
--
-- Its pieces are ewma.lua's, line for line (TestLeanSharesPieces compares
-- them): decay, which is bit for bit Go's decision (see ewma.lua), the
-- strict reading of a stored value, the search for a kept request id and
-- the wait search waitms.

local MAX_WAIT = 1099511627776
local EXACT = 9007199254740992
local LN2 = 0.69314718055994531
local IDS = 4
local HUGE = math.huge
local tonumber, find, sub, byte, format = tonumber, string.find, string.sub, string.byte, string.format
local log, ceil, floor, ldexp = math.log, math.ceil, math.floor, math.ldexp

-- decay returns score s written at ms t, seen at ms now, under half-life p
-- ms: s * 2^-x with x = (now - t)/p, as ratelimit.decayAt does in Go, and
-- bit for bit the same: 2^-x is computed by the steps of Go's own exp2
-- (argument reduction to |k - x| <= 1/2, its polynomial, ldexp), each an
-- IEEE double operation that Lua and Go (ratelimit.exp2neg, which forbids
-- fused multiply-adds) both round the same way. Not Lua's 2^-x: that is C
-- pow, which differs from Go's math.Exp2 in the last bit for about one x
-- in eight (TestPowIsNotExp2), and a last bit decides an admission at an
-- exact boundary. The admission test and the wait search both use this one
-- function, so they cannot disagree.
local function decay(s, t, now, p)
  if now <= t then
    return s -- a score never decays for time that has not passed
  end
  local x = (now - t) / p
  if x > 1074 then
    return 0 -- 2^-x is below half the smallest double (Go's exp2 says 0 too)
  end
  local k = x + 0.5
  k = k - k % 1 -- floor(x + 0.5), exactly, without a call
  local u = k - x
  local hi, lo = u * 6.93147180369123816490e-01, -u * 1.90821492927058770002e-10
  local r = hi - lo
  local q = r * r
  local c = r - q * (1.66666666666666657415e-01 + q * (-2.77777777770155933842e-03 + q * (6.61375632143793436117e-05 + q * (-1.65339022054652515390e-06 + q * 4.13813679705723846039e-08))))
  return s * ldexp(1 - ((lo - r * c / (2 - c)) - hi), -k)
end

local na = #ARGV
local n = (na - 2) / 3
local reqid = ''
if n % 1 ~= 0 then
  n = (na - 3) / 3
  reqid = ARGV[na]
end
if #KEYS ~= 1 or n < 1 or n % 1 ~= 0 then
  return redis.error_reply('ERR sluice ewma: want one key, now, cutoff and three args per window')
end
-- win holds per window i at 7i-6 .. 7i: rate, half-life, cost, stored
-- score, decayed score, write time, its stored digits.
local win = n == 1 and {0, 0, 0, 0, 0, 0, 0} or n == 2 and {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0} or {}
for i = 1, n do
  local j, k = 3 * i, 7 * i
  -- What ratelimit.Limit.Validate accepts (see ewma.lua).
  local r, p, c = tonumber(ARGV[j]), tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2])
  if not (r and p and c and r < HUGE and p >= 1 and p % 1 == 0 and c > 0 and r - c > 0) then
    return redis.error_reply('ERR sluice ewma: bad limit in limit list 1')
  end
  win[k - 6], win[k - 5], win[k - 4] = r, p, c
end

local now, cutoff = tonumber(ARGV[1]), tonumber(ARGV[2])
if not (now and now % 1 == 0 and now < EXACT) then
  return redis.error_reply('ERR sluice ewma: want ARGV[1] = now in whole unix ms (0: Redis TIME)')
end
if not (cutoff and cutoff % 1 == 0 and cutoff < EXACT) then
  return redis.error_reply('ERR sluice ewma: want ARGV[2] = a cutoff in whole unix ms (0: none)')
end
if cutoff <= 0 then cutoff = nil end
local clock
if cutoff or now <= 0 then
  if not redis.REDIS_VERSION and redis.replicate_commands then
    redis.replicate_commands()
  end
  local tm = redis.call('TIME')
  clock = tm[1] * 1000 + floor(tm[2] / 1000)
  if cutoff and clock > cutoff then
    return redis.error_reply('ERR sluice late: past the cutoff, nothing decided')
  end
end
local key = KEYS[1]
local v = redis.call('GET', key)
if now <= 0 then
  now = clock
end

local reply = n == 1 and {false, false, false} or n == 2 and {false, false, false, false} or {}
local allowed = true
local idat -- where the ids begin in v, if it has any
local lastts, lastt -- t's digits and value as last read
local pos = 1
for i = 1, n do
  local s, t, ts = 0, 0, false
  if v then
    -- Read strictly, as ewma.lua reads (the same lines): "<score> <t>" per
    -- window, then optionally " <id>..."; anything else fails.
    local sa = find(v, ' ', pos, true)
    local sb
    if sa then
      sb = find(v, ' ', sa + 1, true)
      ts = sub(v, sa + 1, (sb or 0) - 1)
      s = tonumber(sub(v, pos, sa - 1))
      if ts == lastts then
        t = lastt
      else
        t = tonumber(ts)
        lastts, lastt = ts, t
      end
    end
    if not (sa and (sb or i == n) and s and t and s >= 0 and s < HUGE and t >= 0 and t < EXACT and t % 1 == 0) then
      reply[1], reply[2] = -1, 'ERR sluice ewma: malformed value at ' .. key
      for j = 3, n + 2 do
        reply[j] = ''
      end
      return reply
    end
    if i < n then
      pos = sb + 1
    elseif sb and sb < #v then
      idat = sb + 1
    end
  end
  local k = 7 * i
  local r, p, c = win[k - 6], win[k - 5], win[k - 4]
  local d = decay(s, t, now, p)
  win[k - 3], win[k - 2], win[k - 1], win[k] = s, d, t, ts
  if not (d + c <= r) then
    allowed = false
  end
end

local seen -- whether reqid is one of v's ids (a repeat: charge nothing)
if idat and reqid ~= '' then
  -- Is reqid one of the kept ids? Searched in place, whole ids only.
  local k, w, l = idat, #reqid, #v
  while true do
    local p = find(v, reqid, k, true)
    if not p then
      break
    end
    local e = p + w
    if (p == idat or byte(v, p - 1) == 32) and (e > l or byte(v, e) == 32) then
      seen = true
      break
    end
    k = p + 1
  end
end
if seen then
  -- A repeat of an admitted request: its stored scores, nothing charged.
  reply[1], reply[2] = 1, 0
  local p = 1
  for i = 1, n do
    local sa = find(v, ' ', p, true)
    reply[i + 2] = sub(v, p, sa - 1)
    p = find(v, ' ', sa + 1, true) + 1
  end
  return reply
end

if not allowed then
  local waitms
  -- waitms (ewma.lua's, word for word) returns the smallest w >= 1 such that
  -- score s written at ms at admits cost c under rate r (half-life p ms) at
  -- now+w; the caller knows it refuses at now. Step for step ratelimit.waitMs
  -- in Go: start from the estimate T*log2(S/(R-c)), bracket the boundary by
  -- galloping (steps 1, 2, 4, ...) and bisect. For any sane limit that is two
  -- probes (admits at w, refuses at w-1); when R is barely above c, adding c
  -- absorbs most of R-c and the boundary can be minutes from the estimate,
  -- but it is still found exactly, in at most about 2*40 probes (waits are
  -- capped at 2^40 ms). The estimate's log is not Go's Log2, but it only
  -- picks where the search starts: the admission test is monotone in w (one
  -- ms moves the decayed score by far more than a last bit for any period a
  -- time.Duration can hold), so the smallest admitting w is the same wherever
  -- it starts.
  waitms = function(now, s, at, p, c, r)
    local d = p * log(s / (r - c)) / LN2
    if not (d < MAX_WAIT) then d = MAX_WAIT end -- also catches NaN
    local w = at + ceil(d) - now
    if w < 1 then w = 1 end
    if w > MAX_WAIT then w = MAX_WAIT end
    -- Bracket the boundary: lo refuses (0 is known to), hi admits.
    local lo, hi
    local step = 1
    if decay(s, at, now + w, p) + c <= r then
      hi = w
      while true do
        if hi - step <= 0 then
          lo = 0
          break
        end
        if not (decay(s, at, now + (hi - step), p) + c <= r) then
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
          if not (decay(s, at, now + MAX_WAIT, p) + c <= r) then
            return MAX_WAIT -- the longest wait reported, as in Go
          end
          hi = MAX_WAIT
          break
        end
        if decay(s, at, now + lo + step, p) + c <= r then
          hi = lo + step
          break
        end
        lo = lo + step
        step = step * 2
      end
    end
    while hi - lo > 1 do
      local mid = lo + floor((hi - lo) / 2)
      if decay(s, at, now + mid, p) + c <= r then hi = mid else lo = mid end
    end
    return hi
  end
  local wait = 0
  for i = 1, n do
    local k = 7 * i
    local r, p, c, s, d, t = win[k - 6], win[k - 5], win[k - 4], win[k - 3], win[k - 2], win[k - 1]
    if not (d + c <= r) then
      local x = waitms(now, s, t, p, c, r)
      if x > wait then wait = x end
    end
    reply[i + 2] = format('%.17g', d)
  end
  reply[1], reply[2] = 0, wait
  return reply
end

reply[1], reply[2] = 1, 0
local nowstr
local ttl = 0
for i = 1, n do
  local k = 7 * i
  local r, p, c, d, t = win[k - 6], win[k - 5], win[k - 4], win[k - 2], win[k - 1]
  local s = d + c
  if now > t then
    t = now
    if not nowstr then
      nowstr = format('%d', now)
    end
    win[k] = nowstr
  end
  -- The TTL as ewma.lua writes it (see there): the longest of the windows'.
  local eps = r - c
  if c < eps then eps = c end
  eps = eps / 1024
  local x = ceil(p * log((s > eps and s or eps) / eps) / LN2) + 1
  if x > 2 * MAX_WAIT then x = 2 * MAX_WAIT end
  x = x + (t - now)
  if x > ttl then ttl = x end
  reply[i + 2] = format('%.17g', s)
end
-- The ids after the windows, as ewma.lua keeps them (see there).
local tail = ''
if reqid ~= '' then
  if idat then
    tail = ' ' .. reqid .. ' ' .. sub(v, idat, idat + (IDS - 1) * (#reqid + 1) - 2)
  else
    tail = ' ' .. reqid
  end
elseif idat then
  tail = sub(v, idat - 1)
end
local val
if n == 1 then
  val = reply[3] .. ' ' .. win[7] .. tail
elseif n == 2 then
  val = reply[3] .. ' ' .. win[7] .. ' ' .. reply[4] .. ' ' .. win[14] .. tail
else
  val = reply[3] .. ' ' .. win[7]
  for i = 2, n do
    val = val .. ' ' .. reply[i + 2] .. ' ' .. win[7 * i]
  end
  val = val .. tail
end
redis.call('SET', key, val, 'PX', format('%d', ttl))
return reply
