-- room.lua: a room check of an actor quota (ewma.lua's "Rooms"), written
-- once and spliced into ewma.lua and ewma1.lua at their include line for it
-- (package scripts, include). It reads the quota key's value v (false: no
-- key), E events per window of w ms, the call's now, floor, match and
-- tonumber, and sets the script's rwait and rstart: rwait 0 when the actor
-- has room; else the ms until the window that is full ends, and rstart
-- that window's start in ms; rwait nil for a value not of quota.lua's
-- shape (never a count of zero).
do
  local sw = floor(now / w)
  -- Exact integers below 2^53, but a quotient can round up to the next
  -- integer (as in quota.lua).
  if sw * w > now then sw = sw - 1 elseif (sw + 1) * w <= now then sw = sw + 1 end
  local count = 0
  rwait = 0
  if v then
    local vw, vc = match(v, '^(%d+) (%d+)$')
    if not vw then vw, vc = match(v, '^(%d+) (%d+) %x+$') end
    if not vw then
      rwait = nil
    elseif tonumber(vw) >= sw then
      -- This window, or a newer one a faster caller opened.
      sw, count = tonumber(vw), tonumber(vc)
    end
  end
  if rwait and count >= e then
    rwait, rstart = (sw + 1) * w - now, sw * w
  end
end
