-- quota.lua: the actor quota in Redis, shared by every gate instance. The
-- same fixed windows as ratelimit.Quota (windows of W ms aligned on the unix
-- epoch, at most E events per actor in each), numbered here from Redis TIME,
-- the one clock every instance shares.
--
-- One key per actor; its value is the window it counts and that window's
-- count, "<window> <count>" or "<window> <count> <request id>" (decimal, the
-- id hex), and its TTL the rest of that window plus a margin (a second, or
-- the window if shorter), so the key is gone soon after its window ends and
-- Redis's memory for the quota is bounded by time. A value naming an older
-- window is a fresh window (count 0): a key outliving its window by the
-- margin is harmless. A single Add or Exceeded touches the actor's key
-- (and an Add its seen key, in the actor's slot), declared in KEYS, so the
-- call is legal on a cluster (and routed by it) whatever the window; the
-- batch Add below, of many actors, is sent only where keys may be any
-- (one Redis).
--
-- KEYS[1] the actor's key, e.g. "sluice:{q:<pubkey>}:quota:60000".
-- KEYS[2] (an Add's, optional) the event's seen key, in the actor's slot,
--         e.g. "sluice:{q:<pubkey>}:seen:<event id>": an Add whose seen key
--         exists is an event charged in this window already (from any
--         connection or instance) and is answered added, uncounted; else
--         the key is made, with a TTL of the window. These keys are as
--         bounded as the counts: one per event accepted in a window, gone
--         a window later.
-- ARGV[1] the operation: "x" (Exceeded: read only) or "a" (Add: charge one).
-- ARGV[2] E, events per window (>= 1).
-- ARGV[3] W, the window in ms (>= 1).
-- ARGV[4] now in unix ms; "0" (or anything not a positive number) means
--         Redis TIME.
-- ARGV[5] the cutoff in unix ms, "0" for none: if Redis TIME is past it,
--         nothing is decided or written, and the reply is 'ERR sluice late:
--         ...' (the caller's deadline has passed; see ewma.lua).
-- ARGV[6] the request id of an Add ("" for none): an Add whose id is the
--         one stored is a resend of a call that was counted (go-redis
--         retried after a lost reply) and is answered added, uncounted.
-- ARGV[7] (optional) the event's created_at in unix ms, "0" for unknown: an
--         Add of an event created more than W before now is answered
--         added, uncounted (copies of old events are not their author's
--         charge).
--
-- The batch Add, "A": many charges in one call (the Quota's sender on one
-- Redis, where a call's keys may be any): KEYS are two per charge, the
-- actor's key and the event's seen key, in order; ARGV[1] "A", ARGV[2..5]
-- E, W, now and the cutoff as above, then one created_at per charge
-- (ARGV[5+i], as ARGV[7]; "0": unknown). No request id: a charge resent
-- whole finds its seen key and is not counted again (answered added, or
-- refused if it was the one that filled the quota). Each charge is
-- an Add as below, in order, so a later charge of the same actor sees an
-- earlier one's count. Reply: three integers per charge, in order, as an
-- Add's; a charge whose actor's value is malformed is -1, 0, 0 and writes
-- nothing, and the others are charged.
--
-- Reply: {flag, wait_ms, count}, integers.
--   "x": 1, wait, count when the actor has used its quota (count >= E) in
--        the window containing now, or in a newer one already opened (a late
--        caller: an explicit now behind Redis's, or a clock gone back after
--        a failover), wait the ms until that window ends (>= 1); else
--        0, 0, count.
--   "a": 1, 0, count after the charge; or 0, wait, count (at the limit:
--        nothing counted, wait as for "x").
-- A stored value that is not of the shape above, or a key of another type,
-- is 'ERR sluice quota: malformed value at <key>' and nothing is written:
-- never a count of zero.

local tonumber, floor, match, format = tonumber, math.floor, string.match, string.format

local op, events, win = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local m = op == 'A' and #KEYS / 2 -- the charges of a batch Add
if m then
  if not (m >= 1 and m % 1 == 0 and #ARGV == 5 + m and events and events >= 1 and win and win >= 1) then
    return redis.error_reply('ERR sluice quota: want two keys per charge and op, events, window, now, cutoff, a created_at per charge')
  end
elseif #KEYS < 1 or #KEYS > 2 or #ARGV < 6 or #ARGV > 7 or (op ~= 'x' and op ~= 'a')
    or not (events and events >= 1 and win and win >= 1) then
  return redis.error_reply('ERR sluice quota: want one key and op, events, window, now, cutoff, id')
end
local now, cutoff = tonumber(ARGV[4]), tonumber(ARGV[5])
if cutoff and cutoff <= 0 then cutoff = nil end
if cutoff or not now or now <= 0 then
  if not redis.REDIS_VERSION and redis.replicate_commands then
    redis.replicate_commands()
  end
  local tm = redis.call('TIME')
  local clock = tm[1] * 1000 + floor(tm[2] / 1000)
  if cutoff and clock > cutoff then
    return redis.error_reply('ERR sluice late: past the cutoff, nothing decided')
  end
  if not now or now <= 0 then now = clock end
end
now = floor(now)
local w = floor(now / win)
-- Exact integers below 2^53, but a quotient can round up to the next integer.
if w * win > now then w = w - 1 elseif (w + 1) * win <= now then w = w + 1 end
local margin = win < 1000 and win or 1000

-- window reads key's value: the window it counts (ours, or a newer one a
-- faster caller opened: we are late, and count there rather than roll
-- back, as ratelimit.Quota does), its count and its request id; nil for a
-- value of another shape.
local function window(key)
  local v = redis.pcall('GET', key)
  if not v then return w, 0, '' end
  local a, b, c
  if type(v) == 'string' then
    a, b = match(v, '^(%d+) (%d+)$')
    if not a then a, b, c = match(v, '^(%d+) (%d+) (%x+)$') end
  end
  if not a then return nil end
  a, b = tonumber(a), tonumber(b)
  if a >= w then return a, b, c or '' end
  return w, 0, ''
end

-- add charges one event to key (see "a"), seen its seen key (or nil),
-- created its created_at in ms (0: unknown), id the call's request id.
local function add(key, seen, id, sw, count, sid, created)
  local wait = (sw + 1) * win - now
  if id ~= '' and sid == id then return 1, 0, count end
  if created and created > 0 and created < now - win then return 1, 0, count end
  if count >= events then return 0, wait, count end
  if seen and not redis.call('SET', seen, '1', 'NX', 'PX', format('%.0f', win)) then
    return 1, 0, count
  end
  count = count + 1
  local val = format('%.0f %.0f', sw, count)
  if id ~= '' then val = val .. ' ' .. id end
  redis.call('SET', key, val, 'PX', format('%.0f', wait + margin))
  return 1, 0, count
end

if m then
  local reply = {}
  for i = 1, m do
    local key = KEYS[2 * i - 1]
    local sw, count = window(key)
    local o = 3 * i
    if sw then
      reply[o - 2], reply[o - 1], reply[o] = add(key, KEYS[2 * i], '', sw, count, '', tonumber(ARGV[5 + i]))
    else
      reply[o - 2], reply[o - 1], reply[o] = -1, 0, 0
    end
  end
  return reply
end

local key = KEYS[1]
local sw, count, sid = window(key)
if not sw then
  return redis.error_reply('ERR sluice quota: malformed value at ' .. key)
end
if op == 'x' then
  if count >= events then return {1, (sw + 1) * win - now, count} end
  return {0, 0, count}
end
local flag, wait
flag, wait, count = add(key, KEYS[2], ARGV[6], sw, count, sid, tonumber(ARGV[7] or '0'))
return {flag, wait, count}
