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
-- ARGV[1]  the call, packed as little-endian doubles (see ewma.lua's
--          "Packed"): now in whole unix ms (0, or a negative whole
--          number: Redis TIME); the cutoff in whole unix ms, 0 (or less)
--          for none: if Redis TIME is past it, nothing is decided or
--          written, and the reply is 'ERR sluice late: ...' (see
--          ewma.lua); then per window: rate R (finite), half-life T in
--          whole ms (>= 1), cost c (> 0, < R), what
--          ratelimit.Limit.Validate accepts. 16 + 24n bytes.
-- ARGV[2]  optionally the request id (as in ewma.lua; "" or none: none).
-- ARGV[3]  optionally 's': reply an admission with the value, as ewma.lua
--          does; without it an admission is the bare integer 0 (a table
--          and a bulk string less to build and send: ~6k of Redis's
--          ~84k instructions per call, BenchmarkScriptInstructions).
--
-- Reply: wait, value: 0 and the written value (admitted, with ARGV[3]
-- 's'; or the stored value, nothing charged, for a request id already
-- kept; without 's', either is the integer 0 alone); wait_ms >= 1 and
-- the decayed scores in a value's layout (refused, unwritten); or -1 and
-- 'ERR sluice ewma: malformed value at <key>' (nothing written). See
-- ewma.lua for wait_ms, the value and the TTL.
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
local find, sub, format, pack, unpack = string.find, string.sub, string.format, struct.pack, struct.unpack
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

local a = ARGV[1]
local n = a and (#a - 16) / 24
local scores = ARGV[3]
if not (#KEYS == 1 and n and n >= 1 and n % 1 == 0 and #ARGV <= 3 and (scores == nil or scores == 's')) then
  return redis.error_reply("ERR sluice ewma: want one key, then now, cutoff and three numbers per window packed, then optionally a request id and 's'")
end
local reqid = ARGV[2] or ''
-- win holds per window i at 5i-4 .. 5i: rate, half-life, cost, stored
-- score, decayed score.
-- One or two windows (every limit sluice ships) are unpacked with now and
-- the cutoff in one call: a call into C is a cost of its own (see
-- ewma.lua's "Cost").
local win, now, cutoff
if n == 2 then
  win = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
  now, cutoff, win[1], win[2], win[3], win[6], win[7], win[8] = unpack('<dddddddd', a)
elseif n == 1 then
  win = {0, 0, 0, 0, 0}
  now, cutoff, win[1], win[2], win[3] = unpack('<ddddd', a)
else
  win = {}
  now, cutoff = unpack('<dd', a)
  for i = 1, n do
    local k = 5 * i
    win[k - 4], win[k - 3], win[k - 2] = unpack('<ddd', a, 24 * i - 7)
  end
end
for i = 1, n do
  local k = 5 * i
  -- What ratelimit.Limit.Validate accepts (see ewma.lua).
  local r, p, c = win[k - 4], win[k - 3], win[k - 2]
  if not (r < HUGE and p >= 1 and p % 1 == 0 and p < EXACT and c > 0 and r - c > 0) then
    return redis.error_reply('ERR sluice ewma: bad limit in limit list 1')
  end
end

if not (now % 1 == 0 and now < EXACT) then
  return redis.error_reply('ERR sluice ewma: want now in whole unix ms (0: Redis TIME)')
end
if not (cutoff % 1 == 0 and cutoff < EXACT) then
  return redis.error_reply('ERR sluice ewma: want a cutoff in whole unix ms (0: none)')
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

local allowed = true
local t, idat = 0, nil -- the value's write time; where its ids begin, if any
if v then
  -- Read strictly, as ewma.lua reads (the same lines): t, then a score per
  -- window, then optionally ids; anything else fails.
  local l, bad = #v, true
  if l >= 8 * n + 8 then
    -- t and the scores: one or two windows in one unpack (a call
    -- into C each)
    if n == 2 then
      t, win[4], win[9] = unpack('<ddd', v)
    elseif n == 1 then
      t, win[4] = unpack('<dd', v)
    else
      t = unpack('<d', v)
      for i = 1, n do
        win[5 * i - 1] = unpack('<d', v, 8 * i + 1)
      end
    end
    bad = not (t >= 0 and t < EXACT and t % 1 == 0)
    for i = 1, n do
      local s = win[5 * i - 1]
      if not (s >= 0 and s < HUGE) then bad = true end
    end
    if l > 8 * n + 8 then idat = 8 * n + 9 end
  end
  if bad then
    return {-1, 'ERR sluice ewma: malformed value at ' .. key}
  end
else
  for i = 1, n do win[5 * i - 1] = 0 end
end
for i = 1, n do
  local k = 5 * i
  local d = decay(win[k - 1], t, now, win[k - 3])
  win[k] = d
  if not (d + win[k - 2] <= win[k - 4]) then
    allowed = false
  end
end

local seen -- whether reqid is one of v's ids (a repeat: charge nothing)
if idat and reqid ~= '' then
  -- Is reqid one of the kept ids? Searched in place, whole ids only.
  local k, w = idat, #reqid
  while true do
    local p = find(v, reqid, k, true)
    if not p then
      break
    end
    if (p - idat) % w == 0 then
      seen = true
      break
    end
    k = p + 1
  end
end
if seen then
  if not scores then return 0 end
  return {0, v} -- a repeat of an admitted request: its stored value, nothing charged
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
  local val = pack('<d', t)
  for i = 1, n do
    local k = 5 * i
    local r, p, c, s, d = win[k - 4], win[k - 3], win[k - 2], win[k - 1], win[k]
    if not (d + c <= r) then
      local x = waitms(now, s, t, p, c, r)
      if x > wait then wait = x end
    end
    val = val .. pack('<d', d)
  end
  return {wait, val}
end

if now > t then
  t = now
end
local ttl = 0
for i = 1, n do
  local k = 5 * i
  local r, p, c = win[k - 4], win[k - 3], win[k - 2]
  local s = win[k] + c
  win[k] = s
  -- The TTL as ewma.lua writes it (see there): the longest of the windows'.
  local eps = r - c
  if c < eps then eps = c end
  eps = eps / 1024
  local x = ceil(p * log((s > eps and s or eps) / eps) / LN2) + 1
  if x > 2 * MAX_WAIT then x = 2 * MAX_WAIT end
  x = x + (t - now)
  if x > ttl then ttl = x end
end
-- The value as ewma.lua writes it (see there): t, the scores, the ids.
local val
if n == 1 then
  val = pack('<dd', t, win[5])
elseif n == 2 then
  val = pack('<ddd', t, win[5], win[10])
else
  val = pack('<d', t)
  for i = 1, n do
    val = val .. pack('<d', win[5 * i])
  end
end
if reqid ~= '' then
  if idat then
    val = val .. reqid .. sub(v, idat, idat + (IDS - 1) * #reqid - 1)
  else
    val = val .. reqid
  end
elseif idat then
  val = val .. sub(v, idat)
end
redis.call('SET', key, val, 'PX', format('%d', ttl))
if not scores then return 0 end
return {0, val}
