-- ewma.lua: decide several messages, each against every window of its
-- client, in one call; each decision atomically, in order. A message that
-- pays several budgets (keys) is one group of consecutive decisions,
-- admitted only if every one of them admits and written only then.
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
--             store names it "<prefix>{client}:message:TYPE:<T_1>:...:<T_n>:bin",
--             the half-lives in ms of its windows in order. Different
--             decisions may have different clients, which is legal only off
--             Redis Cluster, where a call's declared keys must share a slot:
--             there the store sends scripts.EWMACluster (Go), this source
--             with only the first key declared and the others after the
--             arguments, for the decisions of one master.
-- ARGV[1]     the call's numbers, packed (see "Packed"): now in whole unix
--             milliseconds, 0 (or a negative whole number: the Go store's
--             instants at or before the epoch) meaning Redis TIME, so every
--             gate instance shares one clock; the cutoff in whole unix ms,
--             0 (or less) for none; L >= 1, the number of limit lists; then
--             the L limit lists, each: n >= 1, then per window: rate R,
--             half-life T in ms, cost c: refused unless what
--             ratelimit.Limit.Validate accepts (R finite, T a whole number
--             >= 1, c > 0, R > c); or n = 0, then E >= 1 and W >= 1, whole
--             numbers: a room list (see Rooms). A fraction where a whole number is
--             wanted is an error reply, since Go, which decides at whole ms,
--             never sends one. One instant for the whole call: TIME runs at
--             most once. If Redis TIME is past the cutoff, the call decides
--             and writes nothing and replies 'ERR sluice late: ...' (the
--             gate has given up on it, or will before the reply is back,
--             and has refused its messages as unavailable: they must not be
--             charged).
-- ARGV[2]     two bytes per decision, in order: the index (1..L) of its
--             limit list (its windows are its key's), a little-endian
--             uint16, with its top bit (32768) set when its admission is
--             to be replied with the value written (see Reply; only
--             sluice's conformance tests ask), and bit 14 (16384) set
--             when it is joined with the next decision: the two are
--             budgets of one message (see Groups). The decisions are
--             m = #ARGV[2]/2 >= 1 = #KEYS; the last is joined with none.
-- ARGV[3...]  either nothing (no request ids) or one request id per
--             decision, "" for none.
--             Any of this violated is an error reply for the whole call
--             ('ERR sluice ewma: ...'); nothing is written.
--
-- Packed: little-endian IEEE doubles, one after the other (Lua's struct
-- "<d"). A number sent as digits costs Redis a Lua string per argument and a
-- strtod per read, and one written as digits a sprintf per score. Whole
-- numbers below 2^53, every instant and half-life here, are exact.
--
-- Request ids (one width; 16 bytes from the Go store): go-redis retries a
-- command whose reply was lost (EOF, reset) and its auto-pipeliner may
-- replay a batch; without ids, a repeated call that had already been
-- admitted would charge the client twice. The ids of the last IDS admitted
-- requests are kept after the windows in the key's value, and a repeat of
-- one of them (in a later call or later in the same call) is answered with
-- the stored value without charging. Refusals write nothing, so repeating
-- one is harmless. The guard fails only if more than IDS other requests of
-- the same key were admitted between an attempt and its retry (a few ms
-- apart): then the retry charges once more. A per-request dedup key would
-- close that gap at the price of a GET, a SET and a new key on every
-- decision.
--
-- Decisions run in order, and a later decision sees what an earlier one of
-- the same call wrote (two messages of one client in one batch): the values
-- are read with one MGET up front (GET for one decision), and every value
-- written during the call is kept in a table by key and consulted before
-- the MGET's.
--
-- Groups: consecutive decisions joined by bit 14 are one message paying
-- several budgets (its type's, a kind class's, an aggregate's). Each is
-- decided as above, and each admission is written only when every
-- decision of the group admitted: otherwise the group writes nothing, its
-- refusals reply their waits (the message's wait is the largest) and its
-- decisions that would have admitted reply 0, 0 (or their would-be value)
-- unwritten; the caller reads the group's verdict from all its entries.
-- A decision of a group with an error (-1) leaves the whole group
-- unwritten too. A group's keys are distinct.
--
-- Rooms: a decision whose list is a room list (n = 0, E, W) is a room
-- check of an actor quota, decided with the message's other budgets and
-- never written: its key is the actor's quota key, whose value
-- internal/scripts/quota.lua keeps ("<window> <count>", or with " <id>"
-- after; windows of W ms aligned on the unix epoch, numbered from this
-- call's now). It refuses while the count in the window of now (or in a
-- newer one already opened) is E or more, its wait the ms until that
-- window ends; it admits otherwise, and its group is then written as if
-- it were not there. So a message refused by its author's quota writes
-- nothing, and one refused by a window is not counted by the quota
-- either (the quota counts on the relay's OK). Its admission is replied
-- 0, 0 whatever its index's top bit; its refusal wait_ms and 8 bytes, the
-- window's start in ms packed, in a value's layout with no score. A value
-- not of quota.lua's shape is an error as a malformed window value is.
--
-- Reply: one flat array, two entries per decision, in order:
--   admitted        0, the value written (see "Stored value") if its index
--                   has the top bit, else 0, 0 (a bulk string less to
--                   build, send and read per admission: the gate needs
--                   only the verdict)
--   refused         wait_ms, the decayed scores (unwritten) in a value's
--                   layout: the stored t, then a score per window
--   a seen id       0, the stored value (nothing charged), or 0, 0 as an
--                   admission
--   an error        -1, a message: a malformed stored value ('ERR sluice
--                   ewma: malformed value at <key>', also a value shorter
--                   than the list's windows). That decision writes
--                   nothing; the call's other decisions are decided as
--                   usual. A malformed value is never read as a score.
--   wait_ms  the smallest whole number of ms w >= 1 such that the admission
--            test above, run at now+w against the unchanged scores, admits:
--            estimated as T*log2(S/(R-c)) from the stored score and then
--            found by running the test itself (gallop and bisect, see
--            waitms), so float error in log/pow can neither make an obedient
--            client be refused nor let one 1 ms early in, for any valid
--            limit. The largest over the refusing windows.
--
-- Stored value of a decision's key, packed: t, the instant (whole unix ms)
-- every window was last written at, then each window's score as written
-- then, in the order of its limit list, then the recent request ids, one
-- after the other, newest first: 8 + 8n bytes and the ids. One t for all
-- windows: they are always written together, at max(now, t). One key per
-- decision rather than per window: reading a decision is one GET and
-- writing it one SET ... PX (the longest of its windows' TTLs), which is
-- most of what a script call costs Redis beyond the call itself. The
-- ":bin" that ends the key name tells this layout from the digits earlier
-- versions wrote ("<score> <t> ..." under the same name without it): a
-- gate of either kind never reads the other's value as its own.
--
-- Cost: this runs for every message. Beyond the commands (one MGET and one
-- TIME per call, one SET per decision admitted) a decision unpacks its
-- value and packs the one it writes. Every string made and every call into
-- C costs Redis time on its one command thread: hence the numbers packed,
-- the windows' values held in one table for the call, the TTL handed to SET
-- as digits, the request ids searched and cut in place, the limits
-- unpacked once per list, and a stored value of one or two windows
-- unpacked in one call. The exact decay (decay.lua: Go's steps and a
-- function call, where C pow would be one operation) is the one cost taken
-- on knowingly, for decisions identical to the memory store's
-- (docs/BENCHMARKS.md has its price).

local MAX_WAIT = 1099511627776 -- 2^40 ms, as in Go: no overflow anywhere
local EXACT = 9007199254740992 -- 2^53: whole numbers of ms below it are exact
local LN2 = 0.69314718055994531
local IDS = 4
local HUGE = math.huge
-- Library functions used on every call, as locals (a register, not a table
-- lookup).
local tunpack = unpack -- Lua's: struct's takes the name below
local find, sub, byte, format, match, pack, unpack = string.find, string.sub, string.byte, string.format, string.match, struct.pack, struct.unpack
local log, ceil, floor, ldexp = math.log, math.ceil, math.floor, math.ldexp
-- Allocation is the other cost per call (a table, a closure, each upvalue
-- of a closure, each time a table grows): so the decisions are one loop,
-- not a function per decision, the tables below are sized by their
-- constructors for the usual calls, and the script makes two closures per
-- call (decay and kept, one upvalue each) and the wait search only on a
-- refusal.

-- #include decay.lua
-- #include keptid.lua


-- Parse and check the whole call before touching anything. lim holds every
-- list: at lim[q+1] its window count n, then three numbers per window (rate,
-- half-life, cost); for a room list 0, then E and W. lo[l] is the q of list l, and lo[nl+d] that of decision
-- d's list.
local nk, na = #KEYS, #ARGV
local a, ix = ARGV[1], ARGV[2]
local la = a and #a or 0
if not (ix and la >= 24) then
  return redis.error_reply('ERR sluice ewma: want now, cutoff, the number L >= 1 of limit lists and the lists packed, then a list index per decision')
end
local now, cutoff, nl = unpack('<ddd', a)
-- Every list takes at least 3 numbers: this bounds the loop.
if not (nl >= 1 and nl % 1 == 0 and 24 + 24 * nl <= la) then
  return redis.error_reply('ERR sluice ewma: want the number L >= 1 of limit lists, then the lists')
end
local lim = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
local lo = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
local at, q = 25, 0 -- the next number's byte; the entries of lim so far
for l = 1, nl do
  local n = at + 8 <= la + 1 and unpack('<d', a, at)
  lo[l] = q
  if n == 0 and at + 24 <= la + 1 then
    -- A room list: E events per window of W ms (see Rooms).
    local e, w = unpack('<dd', a, at + 8)
    if not (e >= 1 and e % 1 == 0 and e < EXACT and w >= 1 and w % 1 == 0 and w < EXACT) then
      return redis.error_reply('ERR sluice ewma: bad room in limit list ' .. l)
    end
    lim[q + 1], lim[q + 2], lim[q + 3] = 0, e, w
    q = q + 3
    at = at + 24
  elseif not (n and n >= 1 and n % 1 == 0 and at + 8 + 24 * n <= la + 1) then
    return redis.error_reply('ERR sluice ewma: bad window count in limit list ' .. l)
  else
    lim[q + 1] = n
    q = q + 1
    for j = at + 8, at + 24 * n - 16, 24 do
      -- What ratelimit.Limit.Validate accepts: a finite rate, a half-life
      -- of a whole number of ms >= 1, a cost > 0 and below the rate (so
      -- finite).
      local r, p, c = unpack('<ddd', a, j)
      if not (r < HUGE and p >= 1 and p % 1 == 0 and p < EXACT and c > 0 and r - c > 0) then
        return redis.error_reply('ERR sluice ewma: bad limit in limit list ' .. l)
      end
      lim[q + 1], lim[q + 2], lim[q + 3] = r, p, c
      q = q + 3
    end
    at = at + 8 + 24 * n
  end
end
if at ~= la + 1 then
  return redis.error_reply('ERR sluice ewma: want nothing packed after the limit lists')
end
local m = #ix / 2
if not (m >= 1 and m == nk and (na == 2 or na == 2 + m)) then
  return redis.error_reply('ERR sluice ewma: want one key and one list index per decision, and a request id for each or none')
end
local sum, most = 0, 0 -- the windows of all decisions; of the largest one
local keep -- keep[d]: decision d's admission is replied with its value
local joined -- joined[d]: decision d is joined with d+1 (see Groups)
for d = 1, m do
  local l, h = byte(ix, 2 * d - 1, 2 * d)
  if h >= 128 then
    h = h - 128
    keep = keep or {}
    keep[d] = true
  end
  if h >= 64 then
    h = h - 64
    if d == m then
      return redis.error_reply('ERR sluice ewma: the last decision is joined with none')
    end
    joined = joined or {}
    joined[d] = true
  end
  l = l + 256 * h
  if not (l >= 1 and l <= nl) then
    return redis.error_reply('ERR sluice ewma: bad limit list index of decision ' .. d)
  end
  q = lo[l]
  lo[nl + d] = q
  sum = sum + lim[q + 1]
  if lim[q + 1] > most then most = lim[q + 1] end
end

-- now and the cutoff: whole numbers of ms (a Go int64), as ratelimit
-- decides at; a fraction is refused.
-- #include clock.lua

local vals = nk == 1 and {redis.call('GET', KEYS[1])} or redis.call('MGET', tunpack(KEYS))

if now <= 0 then
  now = clock
end

-- The reply: two entries per decision, sized by its constructor for one.
local reply = m == 1 and {false, false} or {}
-- The values written during this call that a later decision may read, by
-- key (made on the first such write); newer than the MGET's.
local wr
-- The windows of the decision being decided: per window i at 5i-4 .. 5i,
-- its rate, half-life, cost, stored score and decayed score. One table for
-- the call, sized for the largest decision when that has one or two windows
-- (every limit sluice ships).
local win = most <= 2 and {0, 0, 0, 0, 0, 0, 0, 0, 0, 0} or {}

-- The wait search, made on the first refusal of the call: a closure costs
-- (see Cost), and most calls admit.
local waitms

-- The open group (see Groups): whether every decision of it so far
-- admitted, and its admissions waiting for the group's end: per admission
-- its key, value, TTL and decision number.
local gok, pend, np = true, nil, 0

-- Decide every message, in order. Message dn has the key KEYS[dn], which
-- holds all n of its windows, the limits after lim[q] and the request id
-- reqid.
for dn = 1, m do
  local q = lo[nl + dn]
  local n = lim[q + 1]
  local reqid = ARGV[2 + dn] or ''
  local key = KEYS[dn]
  local v = wr and wr[key] or vals[dn]
  local seen -- whether reqid is one of v's ids (a repeat: charge nothing)
  local err
  local allowed = true
  if n == 0 then
    -- A room check (see Rooms): the quota's count read, nothing written.
    local e, w = lim[q + 2], lim[q + 3]
    local rwait, rstart
    -- #include room.lua
    local o = 2 * dn
    if not rwait then
      err = 'ERR sluice ewma: malformed value at ' .. key
      reply[o - 1], reply[o] = -1, err
    elseif rwait > 0 then
      allowed = false
      reply[o - 1], reply[o] = rwait, pack('<d', rstart)
    else
      reply[o - 1], reply[o] = 0, 0
    end
  else
    for i = 1, n do
      local j, k = q + 3 * i - 1, 5 * i
      win[k - 4], win[k - 3], win[k - 2], win[k - 1] = lim[j], lim[j + 1], lim[j + 2], 0
    end
    local t, idat = 0, nil -- the value's write time; where its ids begin, if any
    if v then
      -- Read strictly: t, then a score per window, then optionally ids;
      -- anything else (a value too short, a negative or non-finite score, a
      -- fractional t) fails this decision and is never read as a score.
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
        err = 'ERR sluice ewma: malformed value at ' .. key
      end
    end
    if not err then
      for i = 1, n do
        local k = 5 * i
        local d = decay(win[k - 1], t, now, win[k - 3])
        win[k] = d
        if not (d + win[k - 2] <= win[k - 4]) then
          allowed = false
        end
      end
    end
    if not err and idat and reqid ~= '' then
      seen = kept(v, idat, reqid)
    end

    local o = 2 * dn
    if err then
      -- Nothing written for this decision; the others go on.
      reply[o - 1], reply[o] = -1, err
    elseif seen then
      -- A repeat of an admitted request: its stored value, nothing charged.
      reply[o - 1], reply[o] = 0, keep and keep[dn] and v or 0
    elseif not allowed then
      if not waitms then
        -- #include waitms.lua
      end
      local wait = 0
      local val = pack('<d', t)
      for i = 1, n do
        local k = 5 * i
        local r, p, c, s, d = win[k - 4], win[k - 3], win[k - 2], win[k - 1], win[k]
        if not (d + c <= r) then
          local w = waitms(now, s, t, p, c, r)
          if w > wait then wait = w end
        end
        val = val .. pack('<d', d)
      end
      reply[o - 1], reply[o] = wait, val
    else
      -- Admitted: write every window, in one value, at max(now, t).
      if now > t then
        t = now
      end
      local ttl = 0
      for i = 1, n do
        local k = 5 * i
        local r, p, c = win[k - 4], win[k - 3], win[k - 2]
        local s = win[k] + c
        win[k] = s
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
      end
      -- The value: t, the scores, then the ids, the last IDS admitted, newest
      -- first. Ids are of one width (16 bytes from the Go store), so keeping
      -- IDS-1 old ones is one string.sub; an id of another width is at worst
      -- cut short, and a cut id never matches (the seen check looks at the
      -- boundaries).
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
      reply[o - 1], reply[o] = 0, keep and keep[dn] and val or 0
      if gok and np == 0 and not (joined and joined[dn]) then
        -- A message of one budget (or the last of a group none of whose
        -- earlier decisions refused or waits to be written): written at once.
        redis.call('SET', key, val, 'PX', format('%d', ttl))
        if dn < m then
          -- A later decision of this call may read this key.
          if not wr then
            wr = {}
          end
          wr[key] = val
        end
      else
        pend = pend or {}
        pend[np + 1], pend[np + 2], pend[np + 3], pend[np + 4] = key, val, ttl, dn
        np = np + 4
      end
    end
  end
  if err or not (seen or allowed) then
    gok = false
  end
  if not (joined and joined[dn]) then
    -- The group (or the lone decision) ends here: its admissions are
    -- written only if all of it admitted.
    if gok then
      for i = 1, np, 4 do
        redis.call('SET', pend[i], pend[i + 1], 'PX', format('%d', pend[i + 2]))
        if pend[i + 3] < m then
          if not wr then
            wr = {}
          end
          wr[pend[i]] = pend[i + 1]
        end
      end
    end
    gok, np = true, 0
  end
end
return reply
