-- keptid.lua: the search for a kept request id every EWMA script shares,
-- written once and spliced into ewma.lua and ewma1.lua at their include
-- line for it (package scripts, include). It reads the local find
-- (string.find) of the script it is spliced into.
--
-- kept reports whether reqid is one of the ids stored in v from byte idat
-- on: ids of reqid's length, back to back. Searched in place, whole ids
-- only: a match that does not start on an id's boundary is part of two
-- ids, and the search goes on past it.
local function kept(v, idat, reqid)
  local k, w = idat, #reqid
  while true do
    local p = find(v, reqid, k, true)
    if not p then
      return false
    end
    if (p - idat) % w == 0 then
      return true
    end
    k = p + 1
  end
end
