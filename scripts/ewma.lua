-- ewma.lua: decide several messages, each against every window of its
-- client, in one call; each decision atomically, in order.
--
-- A window's budget is a score S written at instant t (unix milliseconds).
-- At instant now it has decayed to S * 2^(-(now - t)/T), T being the
-- window's half-life. A message of cost c is admitted when, in EVERY window
-- of its decision, decayed + c <= R (no tolerance); then every window of it
-- is written as (decayed + c, max(now, t)). A refused message writes
-- nothing, so the wait a client is told stays true however often it knocks.
--
-- This is ratelimit.decide in Go (the memory store) bit for bit: the decay
-- 2^-x is not Lua's ^ (C pow, which differs from Go's math.Exp2 in the last
-- bit for about one x in eight, so that at an exact boundary an admission
-- would differ and a wait by 1 ms: TestPowIsNotExp2) but Go's own steps,
-- which both sides round alike (see decay); the admission test, the sums
-- and the wait search are the same IEEE operations. So one table of
-- instants gives the same admissions, the same waits to the ms and the same
-- scores to the last bit on both (TestScriptsAgreeWithGo). Only the log in
-- the wait's first estimate and in the TTL differs from Go's Log2: the one
-- only picks where the exact search starts, the other is a TTL.
--
-- Why several decisions per call: Redis runs every script on its one command
-- thread, and per call it pays the EVALSHA dispatch, a Lua string per key
-- and argument, the MGET, the TIME and the parsing of the limits. Sent as
-- one call, a batch of decisions shares the dispatch, one MGET of all keys,
-- one TIME, and the limits parsed once per distinct limit list.
--
-- KEYS        one key per decision, in order: the key holding every window
--             of that decision's limit list (see "Stored value"); the Go
--             store names it "<prefix>{client}:message:TYPE:<T_1>:...:<T_n>",
--             the half-lives in ms of its windows in order. Different
--             decisions may have different clients, which is legal only off
--             Redis Cluster, where a call's declared keys must share a slot:
--             there the store sends scripts.EWMACluster (Go), this source
--             with only the first key declared and the others after the
--             arguments, for the decisions of one master.
-- ARGV[1]     now in whole unix milliseconds; 0 (or a negative whole
--             number: the Go store's instants at or before the epoch) means
--             Redis TIME, so every gate instance shares one clock; anything
--             else (a fraction, not a number) is an error reply, since Go,
--             which decides at whole ms, never sends one. One instant for
--             the whole call: TIME runs at most once.
--             It may be followed by a space and a cutoff in whole unix ms: if
--             Redis TIME is past the cutoff, the call decides and writes
--             nothing and replies 'ERR sluice late: ...' (the gate has
--             given up on it, or will before the reply is back, and has
--             refused its messages as unavailable: they must not be
--             charged).
-- ARGV[2]     L >= 1, the number of limit lists that follow.
-- then        L limit lists, each: n >= 1, then per window: rate R,
--             half-life T in ms, cost c: refused unless what
--             ratelimit.Limit.Validate accepts (R finite, T a whole number
--             >= 1, c > 0, R > c).
-- then        per decision, two args: the index (1..L) of its limit list
--             (its windows are its next n keys) and its request id, or ""
--             for none.
--             The decisions are m = (args left)/2 >= 1 = #KEYS. Any of this violated is an error reply
--             for the whole call ('ERR sluice ewma: ...'); nothing is
--             written.
--
-- Request ids (no spaces, one width; 16 characters from the Go store):
-- go-redis retries a command whose reply was lost (EOF, reset) and its
-- auto-pipeliner may replay a batch; without ids, a repeated call that had
-- already been admitted would charge the client twice. The ids of the last
-- IDS admitted requests are kept after the windows in the key's value, and a repeat
-- of one of them (in a later call or later in the same call) is answered
-- {1, 0, stored scores} without charging. Refusals write nothing, so
-- repeating one is harmless. The guard fails only if more than IDS other
-- requests of the same key were admitted between an attempt and its retry
-- (a few ms apart): then the retry charges once more. A per-request dedup
-- key would close that gap at the price of a GET, a SET and a new key on
-- every decision (about half again the script's cost, measured).
--
-- Decisions run in order, and a later decision sees what an earlier one of
-- the same call wrote (two messages of one client in one batch): the values
-- are read with one MGET up front (GET for one decision), and every value
-- written during the call is kept in a table by key and consulted before
-- the MGET's.
--
-- Reply: one flat array; per decision, in order, 2 + n entries (n its
-- window count):
--   admitted        1, 0, score_1, ..., score_n (the written scores)
--   refused         0, wait_ms, score_1, ..., score_n (decayed, unwritten)
--   a seen id       1, 0, the stored scores (nothing charged)
--   an error        -1, message, then n empty strings: a malformed stored
--                   value ('ERR sluice ewma: malformed value at <key>',
--                   also a value with fewer windows than the list). That decision writes
--                   nothing; the call's other decisions are decided as
--                   usual. A malformed value is never read as a score.
--   wait_ms  the smallest whole number of ms w >= 1 such that the admission
--            test above, run at now+w against the unchanged scores, admits:
--            estimated as T*log2(S/(R-c)) from the stored score and then
--            found by running the test itself (gallop and bisect, see
--            waitms), so float error in log/pow can neither make an obedient
--            client be refused nor let one 1 ms early in, for any valid
--            limit. The largest over the refusing windows.
--   score_i  as a string: Redis truncates Lua numbers to integers on the
--            way out. %.17g rather than tostring (14 digits) so it
--            round-trips exactly.
--
-- Stored value of a decision's key: every window's "<score %.17g> <t ms>", in
-- the order of its limit list, then the recent request ids:
-- "<score_1> <t_1> ... <score_n> <t_n> <id>...". One key per decision rather
-- than per window: reading a decision is one GET and writing it one SET ...
-- PX (the longest of its windows' TTLs), which is most of what a script
-- call costs Redis beyond the call itself (about a fifth of a two-window
-- decision, measured). A one-window value is what a window's key held
-- before, "<score> <t> <id>...", under the same name.
--
-- Cost: this runs for every message. Beyond the commands (one MGET and one
-- TIME per call, one SET per decision admitted) an admitted decision must read
-- each window's digits (tonumber) and format one %.17g per window (the
-- reply, which is also the stored digits). Every other string made and every
-- call into C costs Redis about 0.1 us, measured: hence plain finds and subs
-- rather than a pattern with captures, the windows' values held in one table
-- for the call, the TTL handed to SET as digits, the request ids searched
-- and cut in place, and the limits parsed once per list. The exact decay
-- is the one cost taken on knowingly: Go's steps and a function call cost
-- 0.18 to 0.28 us a decay where an inline C pow cost 0.04 to 0.07
-- (BenchmarkLuaDecay, Redis 7.0 on a loaded 2-core machine), so about
-- +0.3 us on an admitted two-window decision (two decays) and +0.5 us on
-- a refused one (its wait search decays twice more), against calls of
-- 10 to 20 us (BenchmarkScriptCPU).

local MAX_WAIT = 1099511627776 -- 2^40 ms, as in Go: no overflow anywhere
local EXACT = 9007199254740992 -- 2^53: whole numbers of ms below it are exact
local LN2 = 0.69314718055994531
local IDS = 4
local HUGE = math.huge
-- Library functions used on every call, as locals (a register, not a table
-- lookup).
local tonumber, find, sub, byte, format = tonumber, string.find, string.sub, string.byte, string.format
local log, ceil, floor, ldexp = math.log, math.ceil, math.floor, math.ldexp
-- Allocation is the other cost per call (a table, a closure, each upvalue
-- of a closure, each time a table grows): so the decisions are one loop,
-- not a function per decision, the tables below are sized by their
-- constructors for the usual calls, and the script makes one closure per
-- call (decay, one upvalue) and the wait search only on a refusal.

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


-- Parse and check the whole call before touching anything. lim holds every
-- list: at lim[q+1] its window count n, then three numbers per window (rate,
-- half-life, cost). lo[l] is the q of list l, and lo[nl+d] that of decision
-- d's list.
local nk, na = #KEYS, #ARGV
local nl = na >= 2 and tonumber(ARGV[2])
-- Every list takes at least 4 args and a decision 2: this bounds the loop.
if not (nl and nl >= 1 and nl % 1 == 0 and 2 + 4 * nl + 2 <= na) then
  return redis.error_reply('ERR sluice ewma: want ARGV[2] = the number L >= 1 of limit lists, then the lists, then two args per decision')
end
local lim = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
local lo = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
local a, q = 3, 0 -- the next arg; the entries of lim so far
for l = 1, nl do
  local n = a <= na and tonumber(ARGV[a])
  if not (n and n >= 1 and n % 1 == 0 and a + 3 * n <= na) then
    return redis.error_reply('ERR sluice ewma: bad window count in limit list ' .. l)
  end
  lo[l], lim[q + 1] = q, n
  q = q + 1
  for j = a + 1, a + 3 * n, 3 do
    -- What ratelimit.Limit.Validate accepts: a finite rate, a half-life of
    -- a whole number of ms >= 1, a cost > 0 and below the rate (so finite).
    local r, p, c = tonumber(ARGV[j]), tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2])
    if not (r and p and c and r < HUGE and p >= 1 and p % 1 == 0 and c > 0 and r - c > 0) then
      return redis.error_reply('ERR sluice ewma: bad limit in limit list ' .. l)
    end
    lim[q + 1], lim[q + 2], lim[q + 3] = r, p, c
    q = q + 3
  end
  a = a + 1 + 3 * n
end
-- ARGV[a] is now the first decision's list index.
local m = (na - a + 1) / 2
if m < 1 or m % 1 ~= 0 then
  return redis.error_reply('ERR sluice ewma: want two args per decision (limit list index, request id)')
end
local sum, most = 0, 0 -- the windows of all decisions; of the largest one
for d = 1, m do
  local l = tonumber(ARGV[a + 2 * d - 2])
  if not (l and l >= 1 and l <= nl and l % 1 == 0) then
    return redis.error_reply('ERR sluice ewma: bad limit list index of decision ' .. d)
  end
  q = lo[l]
  lo[nl + d] = q
  sum = sum + lim[q + 1]
  if lim[q + 1] > most then most = lim[q + 1] end
end
if m ~= nk then
  return redis.error_reply('ERR sluice ewma: want one key per decision')
end

-- now and the cutoff: whole numbers of ms (a Go int64, formatted), as
-- ratelimit decides at; a fraction or anything not a number is refused.
local now, cutoff = ARGV[1], nil
do
  local sp = find(now, ' ', 1, true)
  if sp then
    cutoff = tonumber(sub(now, sp + 1))
    now = sub(now, 1, sp - 1)
    if not (cutoff and cutoff % 1 == 0 and cutoff < EXACT) then
      return redis.error_reply('ERR sluice ewma: want a cutoff in whole unix ms after now')
    end
  end
  now = tonumber(now)
  if not (now and now % 1 == 0 and now < EXACT) then
    return redis.error_reply('ERR sluice ewma: want ARGV[1] = now in whole unix ms (0: Redis TIME)')
  end
end
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

local vals = nk == 1 and {redis.call('GET', KEYS[1])} or redis.call('MGET', unpack(KEYS))

if now <= 0 then
  now = clock
end
local nowstr -- now's digits, formatted at most once

-- The reply, sized by its constructor for one decision of one or two
-- windows; o is its entries so far.
local tot = sum + 2 * m
local reply = tot == 4 and {false, false, false, false} or tot == 3 and {false, false, false} or {}
local o = 0
-- The values written during this call that a later decision may read, by
-- key (made on the first such write); newer than the MGET's.
local wr
-- The windows of the decision being decided: per window i at 7i-6 .. 7i,
-- its rate, half-life, cost, stored score, decayed score, write time and
-- that time's stored digits. One table for the call, sized for the largest
-- decision when that has one or two windows (every limit sluice ships).
local win = most <= 2 and {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0} or {}

-- t's digits and value as last read (see the reading below).
local lastts, lastt
-- The wait search, made on the first refusal of the call: a closure costs
-- (see Cost), and most calls admit.
local waitms

-- Decide every message, in order. Message dn has the key KEYS[dn], which
-- holds all n of its windows, the limits after lim[q] and the request id
-- reqid.
for dn = 1, m do
  local q = lo[nl + dn]
  local n = lim[q + 1]
  local reqid = ARGV[a + 2 * dn - 1]
  local key = KEYS[dn]
  local v = wr and wr[key] or vals[dn]
  local idat -- where the ids begin in v, if it has any
  local seen -- whether reqid is one of v's ids (a repeat: charge nothing)
  local err
  local allowed = true
  -- The windows' fields, "<score> <t>" each, one after the other: pos is
  -- where window i's begin.
  local pos = 1
  for i = 1, n do
    local s, t, ts = 0, 0, false
    if v then
      -- Read strictly: "<score> <t>" per window, then optionally " <id>...";
      -- anything else (a field missing, junk digits, a negative or
      -- non-finite score, a fractional t) fails this decision and is never
      -- read as a score. Plain finds and subs, no pattern: each string made
      -- costs. Windows written at one instant share t's digits, read once.
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
        err = 'ERR sluice ewma: malformed value at ' .. key
        break
      end
      if i < n then
        pos = sb + 1
      elseif sb and sb < #v then
        idat = sb + 1
      end
    end
    local j, k = q + 3 * i - 1, 7 * i
    local r, p, c = lim[j], lim[j + 1], lim[j + 2]
    local d = decay(s, t, now, p)
    win[k - 6], win[k - 5], win[k - 4], win[k - 3], win[k - 2], win[k - 1], win[k] = r, p, c, s, d, t, ts
    if not (d + c <= r) then
      allowed = false
    end
  end
  if not err and idat and reqid ~= '' then
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

  if err then
    -- Nothing written for this decision; the others go on.
    reply[o + 1], reply[o + 2] = -1, err
    for i = 3, n + 2 do
      reply[o + i] = ''
    end
  elseif seen then
    -- A repeat of an admitted request: its stored scores, nothing charged.
    reply[o + 1], reply[o + 2] = 1, 0
    local p = 1
    for i = 1, n do
      local sa = find(v, ' ', p, true)
      reply[o + i + 2] = sub(v, p, sa - 1)
      p = find(v, ' ', sa + 1, true) + 1
    end
  elseif not allowed then
    if not waitms then
      -- waitms returns the smallest w >= 1 such that score s written at ms at
      -- admits cost c under rate r (half-life p ms) at now+w; the caller
      -- knows it refuses at now. Step for step ratelimit.waitMs in Go: start
      -- from the estimate T*log2(S/(R-c)), bracket the boundary by galloping
      -- (steps 1, 2, 4, ...) and bisect. For any sane limit that is two
      -- probes (admits at w, refuses at w-1); when R is barely above c,
      -- adding c absorbs most of R-c and the boundary can be minutes from the
      -- estimate, but it is still found exactly, in at most about 2*40 probes
      -- (waits are capped at 2^40 ms). The estimate's log is not Go's Log2,
      -- but it only picks where the search starts: the admission test is
      -- monotone in w (one ms moves the decayed score by far more than a last
      -- bit for any period a time.Duration can hold), so the smallest
      -- admitting w is the same wherever it starts.
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
    end
    local wait = 0
    for i = 1, n do
      local k = 7 * i
      local r, p, c, s, d, t = win[k - 6], win[k - 5], win[k - 4], win[k - 3], win[k - 2], win[k - 1]
      if not (d + c <= r) then
        local w = waitms(now, s, t, p, c, r)
        if w > wait then wait = w end
      end
      reply[o + i + 2] = format('%.17g', d)
    end
    reply[o + 1], reply[o + 2] = 0, wait
  else
    -- Admitted: write every window, in one value.
    reply[o + 1], reply[o + 2] = 1, 0
    local ttl = 0
    for i = 1, n do
      local k = 7 * i
      local r, p, c, d, t, ts = win[k - 6], win[k - 5], win[k - 4], win[k - 2], win[k - 1], win[k]
      local s = d + c
      if now > t then
        t = now
        if not nowstr then
          nowstr = format('%d', now)
        end
        win[k] = nowstr
      end
      -- TTL: keep the key until every window's score is negligible: for a
      -- window, eps = min(c, R-c)/1024 (forgetting it then gives a client
      -- at most 1/1024 of a message), that is T*log2(S/eps) ms; the key's
      -- is the largest over its windows. Since eps <= R-c this is never
      -- shorter than the longest wait the key can still report,
      -- T*log2(S/(R-c)); since S <= R it is at most
      -- T*log2(1024*R/min(c, R-c)): 10 to 30 half-lives for any sane limit.
      -- +1 covers the rounding. (If t is ahead of now, the score starts
      -- decaying only at t; the TTL counts from now and would be short by
      -- t-now, so that is added.) Capped at 2*MAX_WAIT (70 years), twice
      -- the longest wait ever reported: absurd limits (a ten-year half-life
      -- with R a hair above c) would otherwise ask for centuries, which
      -- overflows some Redis-compatible servers' expiry arithmetic. It goes
      -- to SET as digits: redis.call formats a number argument with %.17g,
      -- which costs more than %d here. (min and max are written as
      -- comparisons: the same result, without a call.)
      local eps = r - c
      if c < eps then eps = c end
      eps = eps / 1024
      local x = ceil(p * log((s > eps and s or eps) / eps) / LN2) + 1
      if x > 2 * MAX_WAIT then x = 2 * MAX_WAIT end
      x = x + (t - now)
      if x > ttl then ttl = x end
      reply[o + i + 2] = format('%.17g', s)
    end
    -- The ids after the windows: the last IDS admitted, newest first. Ids
    -- are of one width (16 characters from the Go store), so keeping IDS-1
    -- old ones is one string.sub; an id of another width is at worst cut
    -- short, and a cut id never matches (the seen check looks at the
    -- boundaries).
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
    -- One string, made by one concatenation for one or two windows.
    local val
    if n == 1 then
      val = reply[o + 3] .. ' ' .. win[7] .. tail
    elseif n == 2 then
      val = reply[o + 3] .. ' ' .. win[7] .. ' ' .. reply[o + 4] .. ' ' .. win[14] .. tail
    else
      val = reply[o + 3] .. ' ' .. win[7]
      for i = 2, n do
        val = val .. ' ' .. reply[o + i + 2] .. ' ' .. win[7 * i]
      end
      val = val .. tail
    end
    redis.call('SET', key, val, 'PX', format('%d', ttl))
    if dn < m then
      -- A later decision of this call may read this key.
      if not wr then
        wr = {}
      end
      wr[key] = val
    end
  end
  o = o + 2 + n
end
return reply
