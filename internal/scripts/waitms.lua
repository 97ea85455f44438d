-- waitms.lua: the wait search every EWMA script shares, written once and
-- spliced into ewma.lua and ewma1.lua at their include line for it
-- (package scripts, include). It assigns the script's local
-- waitms, and reads its decay (decay.lua) and its locals log, ceil, floor,
-- LN2 and MAX_WAIT. A script splices it where it first needs it, on a
-- refusal: a closure costs Redis an allocation, and most calls admit.
--
-- waitms returns the smallest w >= 1 such that score s written at ms at
-- admits cost c under rate r (half-life p ms) at now+w; the caller knows it
-- refuses at now. Step for step ratelimit.waitMs in Go: start from the
-- estimate T*log2(S/(R-c)), bracket the boundary by galloping (steps 1, 2,
-- 4, ...) and bisect. For any sane limit that is two probes (admits at w,
-- refuses at w-1); when R is barely above c, adding c absorbs most of R-c
-- and the boundary can be minutes from the estimate, but it is still found
-- exactly, in at most about 2*40 probes (waits are capped at 2^40 ms). The
-- estimate's log is not Go's Log2, but it only picks where the search
-- starts: the admission test is monotone in w (one ms moves the decayed
-- score by far more than a last bit for any period a time.Duration can
-- hold), so the smallest admitting w is the same wherever it starts.
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
