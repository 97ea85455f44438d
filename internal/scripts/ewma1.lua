-- ewma1.lua: decide ONE message against its client's one or two windows:
-- the lean call of ewma.lua for a decision sent alone (nothing else
-- queued). The arithmetic, the stored values, the TTLs, the request ids and
-- the reply are exactly ewma.lua's for a call of one decision
-- (TestLeanEqualsBatch pins it); what it leaves out is the batch: no limit
-- lists, no list index, no table of values written earlier in the call,
-- and no window count but one or two (every limit sluice ships, and most an
-- operator writes), so that the windows are locals, not a table indexed in
-- loops. One GET and one SET of the decision's one key (an MGET with the
-- quota's key when a room goes with it, KEYS[2]). A store sends every
-- decision of one or two windows that goes out alone as this call (one of
-- more windows as ewma.lua deciding one): with a request id when its client
-- may resend a command (go-redis retries on), without one when it never
-- does (retries off: the id guards a retry, and without retries there is
-- none to guard; ids another gate keeps in the value are kept as they
-- are).
--
-- KEYS[1]  the key holding both windows of the decision (see ewma.lua's
--          "Stored value").
-- ARGV[1]  the call, packed as little-endian doubles (see ewma.lua's
--          "Packed"): now in whole unix ms (0, or a negative whole
--          number: Redis TIME); the cutoff in whole unix ms, 0 (or less)
--          for none: if Redis TIME is past it, nothing is decided or
--          written, and the reply is 'ERR sluice late: ...' (see
--          ewma.lua); then per window, one or two: rate R (finite),
--          half-life T in whole ms (>= 1), cost c (> 0, < R), what
--          ratelimit.Limit.Validate accepts. 40 or 64 bytes.
-- ARGV[2]  optionally the request id (as in ewma.lua; "" or none: none).
-- ARGV[3]  optionally 's': reply an admission with the value, as ewma.lua
--          does; without it an admission is the bare integer 0 (a table
--          and a bulk string less to build and send).
--
-- KEYS[2] optionally, with 16 bytes more in ARGV[1] after the windows (E
--          and W, whole numbers >= 1): a room check of an actor quota
--          decided with the message (ewma.lua's "Rooms" for a message of
--          two budgets, its windows' and the room's): KEYS[2] is the
--          actor's quota key. The message is written only if the room
--          admits too. An admission of both is replied as one without a
--          room; anything else as ewma.lua replies the two decisions:
--          the windows' wait and value (0, 0 or the would-be value if
--          they admitted, unwritten), then the room's (0, 0; or its wait
--          and 8 bytes, the window's start packed; or -1 and the error).
--
-- Reply: wait, value: 0 and the written value (admitted, with ARGV[3]
-- 's'; or the stored value, nothing charged, for a request id already
-- kept; without 's', either is the integer 0 alone); wait_ms >= 1 and
-- the decayed scores in a value's layout (refused, unwritten); or -1 and
-- 'ERR sluice ewma: malformed value at <key>' (nothing written). See
-- ewma.lua for wait_ms, the value and the TTL.
--
-- Its decay and wait search are ewma.lua's, spliced in from decay.lua and
-- waitms.lua; its search for a kept request id is ewma.lua's line for line
-- (TestLeanSharesPieces). Its reading of a stored value is ewma.lua's rule
-- (t, a score per window, then optionally ids; anything else fails)
-- written for one or two windows, held in locals rather than a table
-- indexed in loops, which is most of what makes it cheaper.

local MAX_WAIT = 1099511627776
local EXACT = 9007199254740992
local LN2 = 0.69314718055994531
local IDS = 4
local HUGE = math.huge
local find, sub, format, match, pack, unpack = string.find, string.sub, string.format, string.match, struct.pack, struct.unpack
local log, ceil, floor, ldexp = math.log, math.ceil, math.floor, math.ldexp

-- #include decay.lua
-- #include keptid.lua

local a = ARGV[1]
local la = a and #a
local scores = ARGV[3]
local room = #KEYS == 2 -- a room check goes with the message
if room and la then la = la - 16 end
if not ((la == 64 or la == 40) and (room or #KEYS == 1) and #ARGV <= 3 and (scores == nil or scores == 's')) then
  return redis.error_reply("ERR sluice ewma: want one key (and the quota's), then now, cutoff and three numbers for each of one or two windows packed (then the room's two), then optionally a request id and 's'")
end
local reqid = ARGV[2] or ''
-- The windows: rate, half-life and cost of the first (r1, p1, c1) and, when
-- two, of the second (r2, p2, c2), unpacked with now and the cutoff in one
-- call (a call into C is a cost of its own).
local two = la == 64
local now, cutoff, r1, p1, c1, r2, p2, c2
if two then
  now, cutoff, r1, p1, c1, r2, p2, c2 = unpack('<dddddddd', a)
else
  now, cutoff, r1, p1, c1 = unpack('<ddddd', a)
end
-- What ratelimit.Limit.Validate accepts (see ewma.lua).
if not (r1 < HUGE and p1 >= 1 and p1 % 1 == 0 and p1 < EXACT and c1 > 0 and r1 - c1 > 0) or
    two and not (r2 < HUGE and p2 >= 1 and p2 % 1 == 0 and p2 < EXACT and c2 > 0 and r2 - c2 > 0) then
  return redis.error_reply('ERR sluice ewma: bad limit in limit list 1')
end

local e, w -- the room's events and window
if room then
  e, w = unpack('<dd', a, la + 1)
  if not (e >= 1 and e % 1 == 0 and e < EXACT and w >= 1 and w % 1 == 0 and w < EXACT) then
    return redis.error_reply('ERR sluice ewma: bad room in limit list 2')
  end
end

-- #include clock.lua
local key = KEYS[1]
local v, rv
if room then
  local vs = redis.call('MGET', key, KEYS[2])
  v, rv = vs[1], vs[2]
else
  v = redis.call('GET', key)
end
if now <= 0 then
  now = clock
end

-- The room's verdict, first: ra, rb are its two entries of a reply (0, 0
-- when it admits).
local ra, rb = 0, 0
if room then
  local rwait, rstart
  do
    local v = rv
    -- #include room.lua
  end
  if not rwait then
    ra, rb = -1, 'ERR sluice ewma: malformed value at ' .. KEYS[2]
  elseif rwait > 0 then
    ra, rb = rwait, pack('<d', rstart)
  end
end

-- The stored value: its write time t, a score per window (s1, s2), where
-- its ids begin if any (idat); read strictly, by ewma.lua's rule.
local t, s1, s2, idat = 0, 0, 0, nil
if v then
  local l, w = #v, two and 24 or 16
  local bad = l < w
  if not bad then
    if two then
      t, s1, s2 = unpack('<ddd', v)
    else
      t, s1 = unpack('<dd', v)
    end
    bad = not (t >= 0 and t < EXACT and t % 1 == 0 and s1 >= 0 and s1 < HUGE and s2 >= 0 and s2 < HUGE)
    if l > w then idat = w + 1 end
  end
  if bad then
    return {-1, 'ERR sluice ewma: malformed value at ' .. key, room and ra or nil, room and rb or nil}
  end
end
local d1, d2 = decay(s1, t, now, p1), 0
local allowed = d1 + c1 <= r1
if two then
  d2 = decay(s2, t, now, p2)
  allowed = allowed and d2 + c2 <= r2
end

local seen -- whether reqid is one of v's ids (a repeat: charge nothing)
if idat and reqid ~= '' then
  seen = kept(v, idat, reqid)
end
if seen then
  -- A repeat of an admitted request: its stored value, nothing charged.
  if ra ~= 0 then return {0, scores and v or 0, ra, rb} end
  if not scores then return 0 end
  if room then return {0, v, 0, 0} end
  return {0, v}
end

if not allowed then
  local waitms
  -- #include waitms.lua
  local wait = 0
  if not (d1 + c1 <= r1) then
    wait = waitms(now, s1, t, p1, c1, r1)
  end
  if two then
    if not (d2 + c2 <= r2) then
      local x = waitms(now, s2, t, p2, c2, r2)
      if x > wait then wait = x end
    end
    return {wait, pack('<ddd', t, d1, d2), room and ra or nil, room and rb or nil}
  end
  return {wait, pack('<dd', t, d1), room and ra or nil, room and rb or nil}
end

if now > t then
  t = now
end
-- The TTL as ewma.lua writes it (see there): the longest of the windows'.
s1 = d1 + c1
local eps = r1 - c1
if c1 < eps then eps = c1 end
eps = eps / 1024
local ttl = ceil(p1 * log((s1 > eps and s1 or eps) / eps) / LN2) + 1
local val
if two then
  s2 = d2 + c2
  eps = r2 - c2
  if c2 < eps then eps = c2 end
  eps = eps / 1024
  local x = ceil(p2 * log((s2 > eps and s2 or eps) / eps) / LN2) + 1
  if x > ttl then ttl = x end
  val = pack('<ddd', t, s1, s2)
else
  val = pack('<dd', t, s1)
end
if ttl > 2 * MAX_WAIT then ttl = 2 * MAX_WAIT end
ttl = ttl + (t - now)
-- The value as ewma.lua writes it (see there): t, the scores, the ids.
if reqid ~= '' then
  if idat then
    val = val .. reqid .. sub(v, idat, idat + (IDS - 1) * #reqid - 1)
  else
    val = val .. reqid
  end
elseif idat then
  val = val .. sub(v, idat)
end
if ra ~= 0 then
  -- The room refused (or its value is malformed): nothing written.
  return {0, scores and val or 0, ra, rb}
end
redis.call('SET', key, val, 'PX', format('%d', ttl))
if not scores then return 0 end
if room then return {0, val, 0, 0} end
return {0, val}
